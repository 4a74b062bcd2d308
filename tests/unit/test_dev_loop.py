"""The dev loop without Docker: `serve` (reload, Ctrl-C, provider choice), `predict PATH` and
`init`, each as users run it (a separate gpux-pack process), compared with onnxruntime in process.

The same `Serving` helper drives tests/e2e/test_dev_loop.py, which compares `serve` with the image."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import requests
import yaml
from onnx import numpy_helper

from gpux_pack.pipeline import build
from tests.conftest import EXAMPLES, ROOT, copy_example, free_port, run_cli

# -- helpers (also used by the e2e tests) ------------------------------------------------------


def reference(model: Path, feeds: dict) -> dict[str, np.ndarray]:
    """onnxruntime in this process: what every answer is compared with."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def bump_weights(model: Path) -> None:
    """Change the model's last initializer (the output layer's bias): every output changes."""
    proto = onnx.load(str(model))
    init = proto.graph.initializer[-1]
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(0.5), init.name))
    onnx.save(proto, str(model))


def group_alive(pgid: int) -> list[str]:
    """Live (not zombie) processes of a process group, as 'pid cmdline'."""
    alive = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _ppid, group = stat.rsplit(")", 1)[1].split()[:3]
        if int(group) == pgid and state != "Z":
            alive.append(f"{proc.name} {cmd}")
    return alive


def refuses(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


class Serving:
    """`gpux-pack serve FOLDER --port P` in its own process group (as a terminal runs it), its
    stdout and stderr in files."""

    def __init__(self, folder: Path, logs: Path, *extra: str, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        logs.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = logs / "serve.out", logs / "serve.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpux_pack", "serve", str(folder), "--port", str(self.port), *extra],
                cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
            )

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.url + path, timeout=10, **kw)

    def post(self, path: str, **kw) -> requests.Response:
        return requests.post(self.url + path, timeout=10, **kw)

    def wait(self, what: str, check, timeout: float = 60) -> None:
        """Poll `check()` until it is true, with a deadline; fail with serve's stderr."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"serve exited ({self.proc.returncode}) while waiting for {what}:\n{self.stderr[-3000:]}")
            try:
                if check():
                    return
            except requests.RequestException:
                pass  # down between two servers, or not up yet
            time.sleep(0.1)
        pytest.fail(f"no {what} within {timeout:g}s:\n{self.stderr[-3000:]}")

    def wait_ready(self, timeout: float = 60) -> None:
        self.wait("readiness", lambda: self.get("/v2/health/ready").status_code == 200, timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # serve's own stop, which removes its staging folder
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for left in group_alive(self.proc.pid):
            os.kill(int(left.split()[0]), signal.SIGKILL)


@pytest.fixture
def serving(tmp_path):
    started: list[Serving] = []

    def start(folder: Path, *extra: str) -> Serving:
        s = Serving(folder, tmp_path / f"logs{len(started)}", *extra)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def predict_line(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_outputs(got: dict, expected: dict, atol: float = 1e-5) -> None:
    got = {k: v for k, v in got.items() if k not in ("labels", "predicted")}  # GPUX's labels: see test_preprocess
    expected = {k: v for k, v in expected.items() if k not in ("labels", "predicted")}
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        have = np.asarray(got[name])
        assert have.shape == want.shape, (name, have.shape, want.shape)
        if want.dtype == object or want.dtype.kind in "US":
            assert have.astype(str).tolist() == want.astype(str).tolist(), name
        else:
            np.testing.assert_allclose(have, want, atol=atol, rtol=0, err_msg=name)


def one_error_line(proc: subprocess.CompletedProcess, *words: str, after: tuple[str, ...] = ()) -> str:
    """Exit 2 and one `error:` line holding `words`; before it only lines starting with `after`
    (for an image: the line saying a container starts)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    *before, line = proc.stderr.strip().splitlines() or [""]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert all(after and b.startswith(after) for b in before), proc.stderr
    assert line.startswith("error: "), proc.stderr
    for w in words:
        assert w in line, (w, line)
    return line


# -- serve: reload and stop ----------------------------------------------------------------------


def test_serve_reloads_on_a_valid_change_and_keeps_serving_through_an_invalid_one(tmp_path, serving):
    project = copy_example("mlp", tmp_path)
    model, config = project / "model.onnx", project / "gpux.yml"
    x = np.random.default_rng(7).normal(size=(3, 4)).astype(np.float32)
    server = serving(project)
    server.wait_ready()

    first = server.get("/info").json()
    assert first["model"]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    before = server.post("/predict", json={"features": x.tolist()}).json()
    assert_outputs(before, reference(model, {"features": x}))

    # new weights: the server restarts on them, and answers as onnxruntime does on the new file
    bump_weights(model)
    new_sha = hashlib.sha256(model.read_bytes()).hexdigest()
    assert new_sha != first["model"]["sha256"]

    def reloaded() -> bool:
        info = server.get("/info").json()
        return info["model"]["sha256"] == new_sha and server.get("/v2/health/ready").status_code == 200

    server.wait("the new model's sha256 in /info", reloaded, timeout=30)
    assert "reloading: model.onnx changed" in server.stderr
    after = server.post("/predict", json={"features": x.tolist()}).json()
    expected = reference(model, {"features": x})
    assert_outputs(after, expected)
    assert not np.allclose(after["logits"], before["logits"], atol=1e-3)  # the reload is what changed them
    v2 = server.post("/v2/models/iris-mlp/infer", json={"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [3, 4], "data": x.ravel().tolist()}]}).json()
    assert_outputs({o["name"]: np.reshape(o["data"], o["shape"]) for o in v2["outputs"]}, expected)

    # an edit that does not validate: one warning, and the running server never stops answering
    good = config.read_text()
    config.write_text(good + "serving: [oops\n")

    def warned() -> bool:
        assert server.get("/v2/health/ready").status_code == 200, "the server stopped for an invalid edit"
        return "not reloaded" in server.stderr

    server.wait("'not reloaded' on stderr", warned, timeout=30)
    warning = [line for line in server.stderr.splitlines() if "not reloaded" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: ") and "gpux.yml" in warning[0], warning
    assert server.get("/info").json()["model"]["sha256"] == new_sha
    assert_outputs(server.post("/predict", json={"features": x.tolist()}).json(), expected)

    # fixing it (a new version) reloads again
    config.write_text(good.replace("version: 1.0.0", "version: 1.0.1"))
    server.wait("version 1.0.1 in /info", lambda: server.get("/info").json()["version"] == "1.0.1", timeout=30)
    server.wait_ready()
    assert server.get("/v2/models/iris-mlp").json()["versions"] == ["1.0.1"]

    # Ctrl-C (SIGINT to serve alone): the child is stopped too, exit 0
    os.kill(server.proc.pid, signal.SIGINT)
    assert server.proc.wait(20) == 0, server.stderr[-3000:]
    assert refuses(server.port)
    assert group_alive(server.proc.pid) == []
    assert "Traceback" not in server.stderr


@pytest.mark.parametrize("how", ["terminal ctrl-c", "sigterm"])
def test_serve_stops_with_its_server(tmp_path, serving, how):
    """Ctrl-C in a terminal signals the whole group (serve and its child); a process manager
    sends SIGTERM to serve alone: either way exit 0 within the drain, the port closed, nobody left."""
    server = serving(copy_example("mlp", tmp_path))
    server.wait_ready()
    start = time.monotonic()
    if how == "sigterm":
        os.kill(server.proc.pid, signal.SIGTERM)
    else:
        os.killpg(server.proc.pid, signal.SIGINT)
    assert server.proc.wait(20) == 0, server.stderr[-3000:]
    assert time.monotonic() - start < 20
    assert refuses(server.port)
    assert group_alive(server.proc.pid) == []
    assert "stopping" in server.stderr and "Traceback" not in server.stderr


def test_serve_exits_with_the_server_when_it_cannot_start(tmp_path):
    """A port already taken: the child's reason and its exit code, not a silent wait."""
    project = copy_example("mlp", tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("serve", str(project), "--port", str(port), cwd=ROOT, timeout=60)
    assert proc.returncode != 0, proc.stderr
    assert "Traceback" not in proc.stderr


# -- serve: the provider ------------------------------------------------------------------------

FAKE_OFFERED = """
import sys
from gpux_pack.pipeline import local
local.offered = lambda: ({"CPUExecutionProvider"}, "1.32.0", "onnxruntime")
from gpux_pack.cli import main
main(sys.argv[1:])
"""


def test_serve_provider_this_machine_lacks_is_one_line(tmp_path):
    """--provider cuda where onnxruntime has no CUDAExecutionProvider: exit 2, what to install."""
    project = copy_example("mlp", tmp_path)
    proc = subprocess.run([sys.executable, "-c", FAKE_OFFERED, "serve", str(project), "--provider", "cuda",
                           "--port", str(free_port())],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    line = one_error_line(proc, "CUDAExecutionProvider", "install onnxruntime-gpu", "--provider cpu")
    assert "1.32.0" in line
    # predict PATH chooses the same way
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    proc = subprocess.run([sys.executable, "-c", FAKE_OFFERED, "predict", str(project), "--provider", "cuda",
                           "-i", f"features={tmp_path / 'x.npy'}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    one_error_line(proc, "CUDAExecutionProvider", "install onnxruntime-gpu")


def test_auto_provider_needs_the_ep_and_the_device(tmp_path, monkeypatch):
    from gpux_pack import providers
    from gpux_pack.pipeline import build, local

    loaded = build.load(copy_example("mlp", tmp_path))
    eps = {"CPUExecutionProvider", "CUDAExecutionProvider", "OpenVINOExecutionProvider"}
    monkeypatch.setattr(local, "offered", lambda: (eps, "1.32.0", "onnxruntime-gpu"))
    monkeypatch.setattr(local, "present", lambda device: device.name == "nvidia")
    row, reason, _ = local.host_provider(loaded, None)
    assert row.name == "cuda" and "CUDAExecutionProvider" in reason and reason.startswith("auto:")
    monkeypatch.setattr(local, "present", lambda device: False)
    row, reason, _ = local.host_provider(loaded, None)
    assert row.name == "cpu" and reason.startswith("auto: no accelerator")
    row, reason, _ = local.host_provider(loaded, "cpu")  # asked for: no auto
    assert row.name == "cpu" and "--provider" in reason
    assert providers.get("cpu").ep in eps


def test_intel_gpu_is_an_intel_drm_card_not_any_dev_dri(tmp_path):
    """/dev/dri is any GPU's (NVIDIA's, a VM's virtual one): auto must not take it for Intel's."""
    from gpux_pack import providers
    from gpux_pack.pipeline.local import present

    dev, drm = tmp_path / "dev", tmp_path / "drm"
    (dev / "dri").mkdir(parents=True)
    (drm / "card0" / "device").mkdir(parents=True)
    (drm / "card0" / "device" / "vendor").write_text("0x10de\n")  # NVIDIA
    intel = providers.DEVICES["intel"]
    assert not present(intel, dev, drm)
    (drm / "card1" / "device").mkdir(parents=True)
    (drm / "card1" / "device" / "vendor").write_text("0x8086\n")
    assert present(intel, dev, drm)
    assert not present(providers.DEVICES["amd"], dev, drm)  # no /dev/kfd
    (dev / "kfd").touch()
    assert present(providers.DEVICES["amd"], dev, drm)


def test_a_change_is_seen_in_size_mtime_or_inode(tmp_path):
    from gpux_pack.commands.serve import snapshot

    f = tmp_path / "gpux.yml"
    f.write_text("a")
    first = snapshot((f,))
    os.utime(f, ns=(1, 1))
    second = snapshot((f,))
    assert second != first
    (tmp_path / "new").write_text("a")
    os.utime(tmp_path / "new", ns=(1, 1))
    os.replace(tmp_path / "new", f)  # an editor's atomic save: same size and mtime, another inode
    assert snapshot((f,)) != second
    f.unlink()
    assert snapshot((f,)) == (None,)


# -- predict PATH --------------------------------------------------------------------------------


@pytest.fixture
def mlp_inputs(tmp_path):
    x = np.random.default_rng(3).normal(size=(2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "x.json").write_text(json.dumps(x.tolist()))
    (tmp_path / "inputs.json").write_text(json.dumps({"features": x.tolist()}))
    return x


def test_predict_path_equals_onnxruntime(tmp_path, mlp_inputs):
    project = copy_example("mlp", tmp_path)
    expected = reference(project / "model.onnx", {"features": mlp_inputs})
    for given in (f"features={tmp_path / 'x.npy'}", f"features={tmp_path / 'x.json'}", str(tmp_path / "inputs.json")):
        assert_outputs(predict_line(run_cli("predict", str(project), "--input", given, cwd=ROOT)), expected)
    # the gpux.yml names the project as well as its folder
    proc = run_cli("predict", str(project / "gpux.yml"), "-i", f"features={tmp_path / 'x.npy'}", cwd=ROOT)
    assert_outputs(predict_line(proc), expected)


def test_predict_path_saves_outputs(tmp_path, mlp_inputs):
    project = copy_example("mlp", tmp_path)
    expected = reference(project / "model.onnx", {"features": mlp_inputs})
    out_dir = tmp_path / "out"
    proc = run_cli("predict", str(project), "--input", f"features={tmp_path / 'x.npy'}", "--output", str(out_dir))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["logits.npy", "probs.npy"]
    assert sorted(proc.stdout.split()) == sorted(str(out_dir / n) for n in ("logits.npy", "probs.npy"))
    saved = {p.stem: np.load(p) for p in out_dir.iterdir()}
    assert all(v.dtype == np.float32 for v in saved.values())
    assert_outputs(saved, expected)

    out_json = tmp_path / "out.json"
    proc = run_cli("predict", str(project), "--input", str(tmp_path / "inputs.json"), "--output", str(out_json))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out_json)
    assert_outputs(json.loads(out_json.read_text()), expected)

    # a folder that is a file: one line, exit 2
    one_error_line(run_cli("predict", str(project), "-i", str(tmp_path / "inputs.json"), "-o", str(tmp_path / "x.npy")),
                   f"--output {tmp_path / 'x.npy'}")


def test_predict_path_strings(tmp_path):
    project = copy_example("strings", tmp_path)
    words = np.array(["cat", "dog", "fish"], dtype=object)
    (tmp_path / "t.json").write_text(json.dumps({"text": words.tolist()}))
    np.save(tmp_path / "t.npy", words.astype(str))  # a unicode array: .npy files hold no Python objects
    expected = reference(project / "model.onnx", {"text": words})
    for given in (str(tmp_path / "t.json"), f"text={tmp_path / 't.npy'}"):
        assert_outputs(predict_line(run_cli("predict", str(project), "-i", given, cwd=ROOT)), expected)


def test_predict_path_bf16_in_and_out(tmp_path):
    """BF16 given as numbers (sent as bit patterns), answered as the float32 values its bits hold."""
    import ml_dtypes

    from tests.unit.test_bf16 import bf16_model

    project = bf16_model(tmp_path / "bf16")
    x = [[1.5, -2.25, 3.0, 0.1]]
    rounded = np.array(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    answer = predict_line(run_cli("predict", str(project), "-i", f"x={json.dumps(x)}", cwd=ROOT))
    np.testing.assert_array_equal(np.array(answer["z"], np.float32), rounded * 2 + 1)
    proc = run_cli("predict", str(project), "-i", f"x={json.dumps(x)}", "-o", str(tmp_path / "out"), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    y = np.load(tmp_path / "out" / "y.npy")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, (rounded * 2 + 1).astype(ml_dtypes.bfloat16).astype(np.float32))


def test_predict_refuses_bad_inputs_in_one_line(tmp_path, mlp_inputs):
    project = copy_example("mlp", tmp_path)
    np.save(tmp_path / "wide.npy", np.zeros((2, 5), np.float32))
    np.save(tmp_path / "flat.npy", np.zeros(4, np.float32))
    cases = {
        f"feats={tmp_path / 'x.npy'}": ("no input 'feats'", "features"),
        f"features={tmp_path / 'wide.npy'}": ("must be 4",),
        f"features={tmp_path / 'flat.npy'}": (),
        f"features={tmp_path / 'missing.npy'}": ("No such file",),
        str(tmp_path / "missing.json"): ("No such file",),
        str(tmp_path / "x.npy"): ("NAME=",),  # a .npy without a name
        str(tmp_path / "x.json"): ("object of input names",),  # a JSON list without a name
        f"features={tmp_path / 'x.txt'}": ("NAME=FILE.npy",),
    }
    for given, words in cases.items():
        line = one_error_line(run_cli("predict", str(project), "--input", given, cwd=ROOT), *words)
        assert f"--input {given}" in line or "--input: " in line, line
    # the same name twice
    one_error_line(run_cli("predict", str(project), "-i", f"features={tmp_path / 'x.npy'}",
                           "-i", str(tmp_path / "inputs.json"), cwd=ROOT), "features", "more than once")


def test_read_inputs_and_the_request_they_make():
    """The pieces in process: what a file holds reaches the runtime as the input's dtype; what is
    found before the runtime starts is a PredictError, the rest the runtime's own check."""
    from gpux_pack.commands.predict import Given, PredictError
    from gpux_pack.inference import Input, encode
    from gpux_pack.runtime.tensors import RequestError, ServedTensor
    from gpux_pack.runtime.v2 import decode_rest, split_binary

    specs = [ServedTensor("a", "float32", ("batch", 2)), ServedTensor("b", "int64", ("batch",))]

    def feeds(specs, given):  # encoded here, decoded by the runtime as `predict PATH` and an image decode it
        request = encode([Input(s.name, s.datatype) for s in specs], given)
        header, blobs = split_binary(request.body, str(request.header_length))
        return decode_rest(header, specs, [], blobs=blobs)[0]

    out = feeds(specs, [Given("a", np.ones((3, 2), np.float64), "--input a=a.npy"), Given("b", [1, 2, 3], "--input b")])
    assert out["a"].dtype == np.float32 and out["b"].dtype == np.int64
    with pytest.raises(RequestError, match="batch"):  # the named dimension must agree across inputs
        feeds(specs, [Given("a", np.ones((3, 2), np.float32), "x"), Given("b", [1, 2], "y")])
    with pytest.raises(PredictError, match="missing b"):
        feeds(specs, [Given("a", np.ones((3, 2), np.float32), "x")])
    with pytest.raises(PredictError, match="takes int64"):
        feeds(specs, [Given("a", np.ones((3, 2), np.float32), "x"), Given("b", np.ones(3, np.float32), "y")])


# -- init ----------------------------------------------------------------------------------------


def graph_io(model: Path) -> tuple[dict, dict]:
    """name -> (type, shape) as the graph has them, shapes with a name for a dynamic dimension."""
    from onnx.helper import tensor_dtype_to_np_dtype

    proto = onnx.load(str(model))
    inits = {i.name for i in proto.graph.initializer}

    def io(values) -> dict:
        out = {}
        for v in values:
            tt = v.type.tensor_type
            dtype = "string" if tt.elem_type == onnx.TensorProto.STRING else str(tensor_dtype_to_np_dtype(tt.elem_type))
            out[v.name] = (dtype, [d.dim_param or d.dim_value for d in tt.shape.dim])
        return out

    return io(v for v in proto.graph.input if v.name not in inits), io(proto.graph.output)


@pytest.mark.parametrize("example", ["mlp", "text-classifier", "strings"])
def test_init_writes_the_graphs_inputs_and_outputs(tmp_path, example):
    folder = tmp_path / "my-model"
    folder.mkdir()
    model = folder / "model.onnx"
    model.write_bytes((EXAMPLES / example / "model.onnx").read_bytes())
    proc = run_cli("init", str(model), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load((folder / "gpux.yml").read_text())
    inputs, outputs = graph_io(model)

    def numbers(io):  # GPUX reads only numbers: a named (dynamic) dimension is written -1
        return {k: (t, [d if isinstance(d, int) and d > 0 else -1 for d in shape]) for k, (t, shape) in io.items()}

    assert {k: (v["type"], v["shape"]) for k, v in written["inputs"].items()} == numbers(inputs)
    assert {k: (v["type"], v["shape"]) for k, v in written["outputs"].items()} == numbers(outputs)
    assert written["name"] == "my-model" and written["model"]["source"] == "./model.onnx"
    from gpux.config.parser import GPUXConfigParser  # GPUX 0.1.1's own parser reads it too

    assert GPUXConfigParser().parse_file(folder / "gpux.yml").name == "my-model"
    # what it wrote is a project as is: it loads as a build loads it, and predicts as onnxruntime does
    assert build.load(folder).project.config.name == "my-model"
    if example == "mlp":
        x = np.ones((1, 4), np.float32)
        np.save(tmp_path / "x.npy", x)
        got = predict_line(run_cli("predict", str(folder), "-i", f"features={tmp_path / 'x.npy'}", cwd=ROOT))
        assert_outputs(got, reference(model, {"features": x}))


def test_init_keeps_an_existing_config_unless_forced(tmp_path):
    model = tmp_path / "iris.onnx"
    model.write_bytes((EXAMPLES / "mlp" / "model.onnx").read_bytes())
    (tmp_path / "gpux.yml").write_text("# mine\n")
    one_error_line(run_cli("init", str(model), cwd=ROOT), "exists", "--force")
    assert (tmp_path / "gpux.yml").read_text() == "# mine\n"
    proc = run_cli("init", str(model), "--force", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load((tmp_path / "gpux.yml").read_text())["name"] == "iris"  # the model file's stem


def test_init_output_folder_and_file(tmp_path):
    model = tmp_path / "models" / "model.onnx"
    model.parent.mkdir()
    model.write_bytes((EXAMPLES / "mlp" / "model.onnx").read_bytes())
    # a folder that does not exist yet: made, and the model named relative to it
    proc = run_cli("init", str(model), "--output", str(tmp_path / "project"), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load((tmp_path / "project" / "gpux.yml").read_text())
    assert written["model"]["source"] == "../models/model.onnx"
    assert build.load(tmp_path / "project").model.path == model.resolve()
    # a file named as a config is; any other name is refused
    proc = run_cli("init", str(model), "--output", str(tmp_path / "other" / "gpux.yaml"), cwd=ROOT)
    assert proc.returncode == 0 and (tmp_path / "other" / "gpux.yaml").is_file(), proc.stderr
    one_error_line(run_cli("init", str(model), "--output", str(tmp_path / "conf.yml"), cwd=ROOT), "gpux.yml")
    one_error_line(run_cli("init", str(tmp_path / "nothing.onnx"), cwd=ROOT), "nothing.onnx")
    (tmp_path / "m.pt").write_bytes(b"x")
    one_error_line(run_cli("init", str(tmp_path / "m.pt"), cwd=ROOT), ".onnx")


def test_init_quotes_names_yaml_would_misread(tmp_path):
    """Tensor names such as 'yes', 'null' or '1e3' stay strings; the file round-trips."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["yes"], ["null"]), helper.make_node("Identity", ["1e3"], ["x: y"])],
        "g",
        [helper.make_tensor_value_info("yes", TensorProto.FLOAT, ["n", 2]),
         helper.make_tensor_value_info("1e3", TensorProto.INT64, [None, 3])],
        [helper.make_tensor_value_info("null", TensorProto.FLOAT, ["n", 2]),
         helper.make_tensor_value_info("x: y", TensorProto.INT64, [None, 3])],
    )
    model = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    proc = run_cli("init", str(model), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load((tmp_path / "gpux.yml").read_text())
    assert list(written["inputs"]) == ["yes", "1e3"] and list(written["outputs"]) == ["null", "x: y"]
    assert written["inputs"]["1e3"]["shape"] == [-1, 3]
    assert [t.name for t in build.load(tmp_path).project.config.inputs] == ["yes", "1e3"]


def test_init_lists_a_sequence_output_without_a_type(tmp_path):
    """gpux.yml has no word for a sequence (an sklearn ZipMap, a SequenceConstruct): listed without a
    type, the file still loads, and the model's own type is served."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("SequenceConstruct", ["x"], ["s"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2]),
         helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, ["n", 2])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "seq.onnx"))
    proc = run_cli("init", str(tmp_path / "seq.onnx"), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load((tmp_path / "gpux.yml").read_text())
    assert written["outputs"] == {"y": {"type": "float32", "shape": [-1, 2]}, "s": {}}
    loaded = build.load(tmp_path)
    assert [t.name for t in loaded.project.config.outputs] == ["y", "s"]


def test_predict_path_answers_as_predict_does_labels_and_a_picture_by_path(tmp_path, mlp_inputs):
    """GPUX's labels and each row's top one, as /predict answers; an image given as its file
    (`--input image=cat.png`), decoded by the model's preprocessing, its letterbox's geometry too."""
    from tests import image_project

    project = copy_example("mlp", tmp_path)
    answer = predict_line(run_cli("predict", str(project), "-i", f"features={tmp_path / 'x.npy'}", cwd=ROOT))
    assert answer["labels"] == ["setosa", "versicolor", "virginica"] and len(answer["predicted"]) == 2
    out_dir = tmp_path / "out"
    proc = run_cli("predict", str(project), "-i", f"features={tmp_path / 'x.npy'}", "-o", str(out_dir), cwd=ROOT)
    assert proc.returncode == 0 and sorted(p.name for p in out_dir.iterdir()) == ["logits.npy", "probs.npy"]

    pictures = image_project.make(tmp_path / "pictures", preprocessing="  resize: [32, 32]\n  normalize: none\n"
                                                                         "  letterbox: true")
    (tmp_path / "cat.png").write_bytes(image_project.picture(width=64, height=40))
    answer = predict_line(run_cli("predict", str(pictures), "-i", f"image={tmp_path / 'cat.png'}", cwd=ROOT))
    expected = image_project.reference((tmp_path / "cat.png").read_bytes(), normalize=False, letterbox=True)
    np.testing.assert_allclose(np.array(answer["seen"], np.float32), expected, atol=1e-5, rtol=0)
    assert answer["letterbox"] == [{"scale": 0.5, "offset": [0, 6], "size": [64, 40]}]
    one_error_line(run_cli("predict", str(project), "-i", f"features={tmp_path / 'cat.png'}", cwd=ROOT), "features")
    one_error_line(run_cli("predict", str(pictures), "-i", str(tmp_path / "cat.png"), cwd=ROOT), "NAME=")
