"""The image's runtime, in process: settings, providers, validation, every endpoint.

The same code runs in the containers (tests/e2e); here each case costs milliseconds."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from gpux_pack.pipeline.build import load, plan_for
from gpux_pack.plan import Options
from gpux_pack.providers import EP_NAMES
from gpux_pack.ui import Reporter
from gpux_pack.runtime import warmup
from gpux_pack.runtime.session import Model
from gpux_pack.runtime.settings import ConfigurationError, Settings, StartupError
from gpux_pack.runtime.server import App

ROOT = Path(__file__).resolve().parents[2]


def spec_dir(tmp_path: Path, example: str, provider: str = "cpu", warmup: str | None = None) -> Path:
    """gpux.json + model as the image holds them, from the real planning code."""
    loaded = load(ROOT / "examples" / example)
    plan = plan_for(loaded, provider, "test", Options(warmup=warmup), None, Reporter(quiet=True), pull=False)
    spec = plan.gpux_json
    (tmp_path / "model").mkdir()
    for name in loaded.model.files:
        shutil.copy(loaded.model.path.parent / name, tmp_path / "model" / name)
    (tmp_path / "gpux.json").write_text(json.dumps(spec))
    return tmp_path


def settings(folder: Path, **env: str) -> Settings:
    return Settings.load({"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache"), **env})


class Client:
    """Drives the ASGI app directly: no sockets, same code paths as uvicorn."""

    def __init__(self, app: App):
        self.app = app

    def request(self, method: str, path: str, body: bytes | str | object = b"", headers=None):
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        sent = self.raw(method, path, body.encode() if isinstance(body, str) else body, headers)
        return sent[0]["status"], json.loads(sent[1]["body"]), dict(sent[0]["headers"])

    def raw(self, method: str, path: str, body: bytes, headers=None) -> list[dict]:
        scope = {"type": "http", "method": method, "path": path, "headers": headers or []}
        sent: list[dict] = []

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            if message["type"] == "http.response.body" and len(sent) > 1:  # an answer sent in pieces: one
                assert sent[-1]["more_body"], "a piece after the last"
                sent[-1] = {**message, "body": bytes(sent[-1]["body"]) + bytes(message["body"])}
            else:
                sent.append(message)

        asyncio.run(self.app(scope, receive, send))
        return sent


@pytest.fixture
def mlp(tmp_path):
    model = Model.load(settings(spec_dir(tmp_path, "mlp")))
    app = App(model, "test")
    app.start_warmup()
    assert app.ready.wait(10)
    return Client(app)


def reference(example: str, feeds: dict) -> list:
    return ort.InferenceSession(str(ROOT / "examples" / example / "model.onnx")).run(None, feeds)


def test_predict_and_v2_match_onnxruntime(mlp):
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    logits, probs = reference("mlp", {"features": x})
    status, body, _ = mlp.request("POST", "/predict", {"features": x.tolist()})
    assert status == 200
    np.testing.assert_allclose(body["probs"], probs, atol=1e-6)
    status, body, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", {
        "id": "r1", "inputs": [{"name": "features", "shape": [8, 4], "datatype": "FP32", "data": x.ravel().tolist()}],
        "outputs": [{"name": "logits"}]})
    assert status == 200 and body["id"] == "r1" and body["model_version"] == "1.0.0"
    [out] = body["outputs"]
    assert out["name"] == "logits" and out["shape"] == [8, 3] and out["datatype"] == "FP32"
    np.testing.assert_allclose(np.reshape(out["data"], (8, 3)), logits, atol=1e-6)


def test_metadata_health_info(mlp):
    assert mlp.request("GET", "/health")[:2] == (200, {"status": "healthy", "model": "iris-mlp", "ready": True})
    assert mlp.request("GET", "/v2/health/live")[0] == 200
    assert mlp.request("GET", "/v2/models/iris-mlp/ready")[0] == 200
    assert mlp.request("GET", "/v2/models/iris-mlp/versions/1.0.0/ready")[0] == 200
    status, meta, _ = mlp.request("GET", "/v2/models/iris-mlp")
    assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]
    status, info, _ = mlp.request("GET", "/info")
    assert info["execution_providers"]["active"] == ["CPUExecutionProvider"]
    assert info["warmup"]["state"] == "done" and info["onnxruntime"] == ort.__version__


BAD = [
    ("POST", "/predict", b"{not json", 400, "malformed JSON"),
    ("POST", "/predict", b"", 400, "empty body"),
    ("POST", "/predict", [1, 2], 400, "must be a JSON object"),
    ("POST", "/predict", {"feature": [[1, 2, 3, 4]]}, 400, "unknown input 'feature'"),
    ("POST", "/predict", {}, 400, "missing required input 'features'"),
    ("POST", "/predict", {"features": [[1, 2, 3]]}, 400, "dimension 1 must be 4"),
    ("POST", "/predict", {"features": [1, 2, 3, 4]}, 400, "expected rank 2"),
    ("POST", "/predict", {"features": [[1, 2, 3, 4], [1, 2]]}, 400, "ragged"),
    ("POST", "/predict", {"features": [["a", "b", "c", "d"]]}, 400, "got strings"),
    ("POST", "/predict", {"features": [[True, False, True, False]]}, 400, "got booleans"),
    ("POST", "/predict", {"features": [[1, None, 3, 4]]}, 400, "expected float32 values"),
    ("POST", "/predict", {"features": {"a": 1}}, 400, "got an object"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP64", "data": [1, 2, 3, 4]}]}, 400, "datatype FP64 does not match the model's FP32"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}, 400, "needs 8 values, got 4"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": []}, 400, "non-empty list"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32"}]}, 400, "'data' is missing"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}], "outputs": [{"name": "nope"}]}, 400, "unknown output 'nope'"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4], "parameters": {"binary_data_size": 16}}]}, 400, "does not fit the 0 bytes of binary data"),
    ("POST", "/v2/models/other/infer", {"inputs": []}, 404, "unknown model 'other'"),
    ("GET", "/v2/models/iris-mlp/versions/9", b"", 404, "unknown version '9'"),
    ("GET", "/nope", b"", 404, "no such endpoint"),
    ("GET", "/predict", b"", 405, "use POST"),
]


@pytest.mark.parametrize("method, path, body, status, words", BAD, ids=[b[4] for b in BAD])
def test_bad_requests_name_the_problem_and_leave_the_server_serving(mlp, method, path, body, status, words):
    got, answer, headers = mlp.request(method, path, body)
    assert got == status and words in answer["error"]
    if status == 405:
        assert headers[b"allow"] == b"POST"
    assert mlp.request("POST", "/predict", {"features": [[1, 2, 3, 4]]})[0] == 200


def test_body_limit(tmp_path):
    model = Model.load(settings(spec_dir(tmp_path, "mlp"), GPUX_MAX_BODY_BYTES="100"))
    client = Client(App(model))
    client.app.ready.set()
    status, body, _ = client.request("POST", "/predict", {"features": [[1.0] * 4] * 20})
    assert status == 413 and "exceeds the limit of 100" in body["error"]
    status, _, _ = client.request("POST", "/predict", b"{}", headers=[(b"content-length", b"5000")])
    assert status == 413


def test_503_until_warm(tmp_path):
    client = Client(App(Model.load(settings(spec_dir(tmp_path, "mlp")))))
    assert client.request("GET", "/v2/health/ready")[0] == 503
    assert client.request("GET", "/health")[:2] == (503, {"status": "warming up", "model": "iris-mlp", "ready": False})
    status, body, _ = client.request("POST", "/predict", {"features": [[1, 2, 3, 4]]})
    assert status == 503 and "warming up" in body["error"]


def test_int64_inputs_and_shared_dims(tmp_path):
    client = Client(App(Model.load(settings(spec_dir(tmp_path, "text-classifier")))))
    client.app.ready.set()
    ids, mask = [[5, 6, 7, 0], [8, 9, 0, 0]], [[1, 1, 1, 0], [1, 1, 0, 0]]
    status, body, _ = client.request("POST", "/predict", {"input_ids": ids, "attention_mask": mask})
    [expected] = reference("text-classifier", {"input_ids": np.array(ids), "attention_mask": np.array(mask)})
    assert status == 200
    np.testing.assert_allclose(body["logits"], expected, atol=1e-6)
    status, body, _ = client.request("POST", "/predict", {"input_ids": [[1.5, 2, 3]], "attention_mask": [[1, 1, 1]]})
    assert status == 400 and "expected int64 integers, got numbers" in body["error"]
    status, body, _ = client.request("POST", "/predict", {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1]]})
    assert status == 400 and "dimension 'sequence' is 2 here but 3 in input 'input_ids'" in body["error"]
    status, body, _ = client.request("POST", "/predict", {"input_ids": [[2**70]], "attention_mask": [[1]]})
    assert status == 400 and "input 'input_ids'" in body["error"]
    # an index out of the embedding's range is the model's own error: 400, and still serving
    status, body, _ = client.request("POST", "/predict", {"input_ids": [[5000]], "attention_mask": [[1]]})
    assert status == 400 and "rejected the inputs" in body["error"]
    assert client.request("POST", "/predict", {"input_ids": ids, "attention_mask": mask})[0] == 200


def test_provider_override_and_fallback(tmp_path, caplog):
    folder = spec_dir(tmp_path, "mlp", provider="cuda")
    model = Model.load(settings(folder))  # no CUDA here: loud fallback to CPU
    assert model.requested[0] == "CUDAExecutionProvider"
    assert model.active == ["CPUExecutionProvider"]
    assert "FALLBACK" in caplog.text and "GPUX_REQUIRE_PROVIDER=1" in caplog.text
    with pytest.raises(StartupError, match="GPUX_REQUIRE_PROVIDER=1: CUDAExecutionProvider is not active"):
        Model.load(settings(folder, GPUX_REQUIRE_PROVIDER="1"))
    s = settings(folder, GPUX_PROVIDERS="cpu")
    assert [n for n, _ in s.providers] == ["CPUExecutionProvider"]
    with pytest.raises(StartupError, match="unknown provider 'tpu'"):
        settings(folder, GPUX_PROVIDERS="tpu")


def test_warmup_leaves_no_profile_in_the_temporary_folder(tmp_path, monkeypatch):
    """ONNX Runtime creates warmup's profile file when the session loads: it goes when warmup has
    read it, when the load fails after the session, and with a model dropped before its warmup."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    folder = spec_dir(tmp_path, "mlp", provider="cuda")  # no CUDA here: served on CPU, and profiled
    model = Model.load(settings(folder))
    assert [p.name for p in scratch.iterdir()][0].startswith("gpux-warmup-")  # there while it runs
    assert warmup.run(model)["partition"] == {"CPUExecutionProvider": 3}  # after fusion
    assert list(scratch.iterdir()) == []
    with pytest.raises(StartupError, match="is not active"):
        Model.load(settings(folder, GPUX_REQUIRE_PROVIDER="1"))
    gc.collect()
    assert list(scratch.iterdir()) == []
    Model.load(settings(folder))  # never warmed up
    gc.collect()
    assert list(scratch.iterdir()) == []


def test_warmup_never_is_ready_at_once(tmp_path):
    app = App(Model.load(settings(spec_dir(tmp_path, "mlp", warmup="never"))))
    app.start_warmup()
    assert app.ready.is_set() and app.model.warmup_state == {"state": "skipped"}


def test_cli_predict_and_info(tmp_path, capsys, monkeypatch):
    from gpux_pack.runtime.__main__ import main

    folder = spec_dir(tmp_path, "mlp")
    monkeypatch.setenv("GPUX_CONFIG", str(folder / "gpux.json"))
    assert main(["predict", "--input", '{"features": [[1, 2, 3, 4]]}']) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"logits", "probs"}
    assert main(["predict", "--input", '{"features": [[1, 2]]}']) == 2
    assert "dimension 1 must be 4" in capsys.readouterr().err
    assert main(["info"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "iris-mlp"


def test_runtime_imports_only_its_own_libraries():
    """The runtime folder is copied alone into images holding numpy, onnxruntime, uvicorn,
    orjson and prometheus-client."""
    import ast
    import sys

    allowed = set(sys.stdlib_module_names) | {"numpy", "onnxruntime", "uvicorn", "orjson", "prometheus_client",
                                              "grpc", "google"}  # the last two only with serving.grpc_port
    for path in (ROOT / "gpux_pack" / "runtime").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


# -- GPUX_* variables: one line naming the variable, exit 2 ---------------------------------------

BAD_ENV = [
    ("GPUX_PORT", "http", "expected a port number from 1 to 65535"),
    ("GPUX_PORT", "0", "expected a port number from 1 to 65535"),
    ("GPUX_PORT", "65536", "expected a port number from 1 to 65535"),
    ("GPUX_PORT", "80.5", "expected a port number"),
    ("GPUX_HOST", "my-host", "expected an IP address"),
    ("GPUX_HOST", "300.1.1.1", "expected an IP address"),
    ("GPUX_HOST", "[::]", "expected an IP address"),
    ("GPUX_LOG_LEVEL", "verbose", "expected one of critical, error, warning, info, debug"),
    ("GPUX_PROVIDERS", "tpu", "unknown provider 'tpu' (use cpu, cuda, tensorrt, rocm, migraphx, openvino)"),
    ("GPUX_PROVIDERS", "cuda,CUDAExecutionProvider", "'CUDAExecutionProvider' is named twice"),
    ("GPUX_PROVIDERS", ",", "names no provider"),
    ("GPUX_REQUIRE_PROVIDER", "maybe", "expected 1 or 0 (true/false, yes/no)"),
    ("GPUX_CACHE_DIR", "cache", "expected an absolute path"),
    ("GPUX_CACHE_DIR", "/tmp/a\0b", "contains a NUL byte"),
    ("GPUX_MAX_BODY_BYTES", "0", "expected a positive whole number of bytes"),
    ("GPUX_MAX_BODY_BYTES", "64MiB", "expected a positive whole number of bytes"),
    ("GPUX_MAX_WORKERS", "0", "expected a whole number from 1 to 256"),
    ("GPUX_MAX_WORKERS", "257", "expected a whole number from 1 to 256"),
    ("GPUX_MAX_WORKERS", "9" * 5000, "expected a whole number from 1 to 256"),
    ("GPUX_TIMEOUT", "abc", "expected a number of seconds, more than 0 and at most 86400"),
    ("GPUX_TIMEOUT", "0", "expected a number of seconds"),
    ("GPUX_TIMEOUT", "-1", "expected a number of seconds"),
    ("GPUX_TIMEOUT", "inf", "expected a number of seconds"),
    ("GPUX_TIMEOUT", "nan", "expected a number of seconds"),
    ("GPUX_TIMEOUT", "86401", "expected a number of seconds"),
    ("GPUX_CONFIG", "/does/not/exist.json", "No such file or directory"),
]


def tiny_dir(tmp_path: Path, ir_version: int = 7) -> Path:
    """y = x * scale + bias, written by hand: `scale` is an initializer listed in "inputs" with
    required: false, `bias` one listed only in "overridable_inputs" (what the packager writes
    for the weights an old exporter lists as graph inputs)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["xs"]), helper.make_node("Add", ["xs", "bias"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(np.ones(3, np.float32), "scale"),
         numpy_helper.from_array(np.array([1, 2, 3], np.float32), "bias")])
    opset = 9 if ir_version == 3 else 13
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    (tmp_path / "model").mkdir()
    onnx.save(model, str(tmp_path / "model" / "tiny.onnx"))
    spec = {
        "name": "tiny", "version": "1", "model": {"path": "model/tiny.onnx"},
        "inputs": [{"name": "x", "type": "float32", "shape": ["batch", 3]},
                   {"name": "scale", "type": "float32", "shape": [3], "required": False}],
        "overridable_inputs": [{"name": "bias", "type": "float32", "shape": [3], "required": False}],
        "outputs": [{"name": "y", "type": "float32", "shape": ["batch", 3]}],
        "execution_providers": [["CPUExecutionProvider", {}]], "provider_names": EP_NAMES,
    }
    (tmp_path / "gpux.json").write_text(json.dumps(spec))
    return tmp_path


@pytest.mark.parametrize("key, value, words", BAD_ENV, ids=[f"{k}={v[:12]!r}" for k, v, _ in BAD_ENV])
def test_bad_variable_is_one_line_naming_it(tmp_path, key, value, words):
    with pytest.raises(ConfigurationError) as caught:
        settings(tiny_dir(tmp_path), **{key: value})
    message = str(caught.value)
    assert message.startswith(f"{key}=") and words in message and "\n" not in message
    assert caught.value.exit_code == 2 and isinstance(caught.value, StartupError)


def test_good_variables_are_taken(tmp_path):
    folder = tiny_dir(tmp_path)
    s = settings(folder, GPUX_PORT=" 9000", GPUX_HOST="::", GPUX_LOG_LEVEL="DEBUG", GPUX_REQUIRE_PROVIDER="yes",
                 GPUX_PROVIDERS="OpenVINOExecutionProvider, cpu", GPUX_MAX_BODY_BYTES="100",
                 GPUX_MAX_WORKERS="256", GPUX_TIMEOUT="0.5")
    assert (s.port, s.host, s.log_level, s.require_provider) == (9000, "::", "debug", True)
    assert [n for n, _ in s.providers] == ["OpenVINOExecutionProvider", "CPUExecutionProvider"]
    assert (s.max_body_bytes, s.max_workers, s.timeout) == (100, 256, 0.5)
    for host in ("127.0.0.1", "localhost", "fe80::1"):
        assert settings(folder, GPUX_HOST=host).host == host
    for flag, value in (("", False), ("0", False), ("No", False), ("TRUE", True), ("1", True)):
        assert settings(folder, GPUX_REQUIRE_PROVIDER=flag).require_provider is value
    # empty means unset: the config's values, then the runtime's defaults
    s = settings(folder, GPUX_PORT="", GPUX_TIMEOUT="", GPUX_MAX_WORKERS="", GPUX_HOST="", GPUX_PROVIDERS="")
    assert (s.port, s.timeout, s.max_workers, s.host) == (8080, 30.0, 1, "0.0.0.0")  # cpu: one worker


def test_bad_config_file(tmp_path, monkeypatch):
    import gpux_pack.runtime.settings as settings_module

    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"name": "x"}')
    cases = [(tmp_path, "not a regular file"), (tmp_path / "broken.json", "not valid JSON"),
             (tmp_path / "other.json", "not a gpux.json (it lacks version, model")]
    for path, words in cases:
        with pytest.raises(ConfigurationError, match=re.escape(f"GPUX_CONFIG={path}: {words}")):
            Settings.load({"GPUX_CONFIG": str(path)})
    # the image's own gpux.json missing is the image's fault, not a variable's: exit 1
    monkeypatch.setattr(settings_module, "DEFAULT_CONFIG", str(tmp_path / "gone.json"))
    with pytest.raises(StartupError, match="cannot read the model config") as caught:
        Settings.load({})
    assert caught.value.exit_code == 1


def test_cli_exit_codes(tmp_path, capsys, monkeypatch):
    """A bad variable: exit 2 and one stderr line; any other start-up failure stays exit 1."""
    from gpux_pack.runtime.__main__ import main

    folder = tiny_dir(tmp_path)
    monkeypatch.setenv("GPUX_CONFIG", str(folder / "gpux.json"))
    monkeypatch.setenv("GPUX_TIMEOUT", "abc")
    assert main(["info"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gpux: GPUX_TIMEOUT=abc: expected a number of seconds, more than 0 and at most 86400"]
    monkeypatch.delenv("GPUX_TIMEOUT")
    (folder / "model" / "tiny.onnx").unlink()
    assert main(["info"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("gpux: cannot start CPUExecutionProvider")


# -- signals ---------------------------------------------------------------------------------------


def test_signal_handler_by_stage(monkeypatch, capsys):
    """Before the load: exit 0. Loading: one line, 128+signal. Serving: the server stops itself."""
    import signal

    from gpux_pack.runtime import __main__ as entry

    exits: list[int] = []
    monkeypatch.setattr(entry.os, "_exit", exits.append)
    monkeypatch.setattr(entry, "_STATE", {"doing": None, "server": None})
    entry._on_signal(signal.SIGTERM, None)
    assert exits == [0] and capsys.readouterr().err == ""
    entry._STATE["doing"] = "loading the model"
    entry._on_signal(signal.SIGTERM, None)
    entry._on_signal(signal.SIGINT, None)
    assert exits == [0, 143, 130]
    assert capsys.readouterr().err.splitlines() == [
        "gpux: stopped by SIGTERM while loading the model", "gpux: stopped by SIGINT while loading the model"]

    class Server:
        should_exit = False

    entry._STATE["server"] = server = Server()
    entry._on_signal(signal.SIGTERM, None)  # before uvicorn's handler, or re-raised after its drain
    assert server.should_exit and exits == [0, 143, 130]


def test_sigterm_mid_load_exits_143_at_once(tmp_path):
    """The real process, its model a FIFO: ONNX Runtime blocks reading it, as on a slow disk."""
    import os
    import signal
    import subprocess
    import sys
    import time

    folder = tiny_dir(tmp_path)
    fifo = folder / "model" / "slow.onnx"
    os.mkfifo(fifo)
    spec = json.loads((folder / "gpux.json").read_text())
    spec["model"]["path"] = "model/slow.onnx"
    (folder / "gpux.json").write_text(json.dumps(spec))
    env = {**os.environ, "GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "gpux_pack.runtime", "info"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    writer = None
    try:
        deadline = time.monotonic() + 60
        while writer is None:  # opening the FIFO's other end succeeds once ONNX Runtime reads it
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the model load never started"
                time.sleep(0.01)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        assert time.monotonic() - started < 2
        assert proc.returncode == 143
        assert err.decode().splitlines() == ["gpux: stopped by SIGTERM while loading the model"]
    finally:
        proc.kill()
        proc.wait()
        if writer is not None:
            os.close(writer)


# -- bodies, /info, overridable inputs ------------------------------------------------------------


def test_deep_json_is_400_and_the_server_goes_on(mlp):
    status, body, _ = mlp.request("POST", "/predict", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and body["error"] == "the JSON body is nested deeper than 1024 levels"
    status, body, _ = mlp.request("POST", "/predict", b'{"features": ' + b"[" * 1024 + b"]" * 1024 + b"}")
    assert status == 400 and "nested deeper than 1024 levels" in body["error"]
    # brackets inside strings do not nest: a v2 request id full of them is fine
    x = [1.0, 2.0, 3.0, 4.0]
    status, body, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", {
        "id": '[{\\"' * 1000, "inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": x}]})
    assert status == 200 and body["id"] == '[{\\"' * 1000
    # 1,000 levels deep is JSON we parse; the input is then refused for its shape, as a 400
    status, body, _ = mlp.request("POST", "/predict", b'{"features": ' + b"[" * 1000 + b"1" + b"]" * 1000 + b"}")
    assert status == 400 and "input 'features'" in body["error"]
    assert mlp.request("POST", "/predict", {"features": [x]})[0] == 200


def test_info_never_500s_on_odd_metadata(mlp):
    mlp.app.model.spec["metadata"] = {"nan": float("nan"), "inf": float("-inf"), "np": np.float32(1.5),
                                      "set": {1}, "bytes": b"ab", "ok": [1, "a", None]}
    status, info, _ = mlp.request("GET", "/info")
    assert status == 200
    assert info["metadata"] == {"nan": None, "inf": None, "np": 1.5, "set": "{1}", "bytes": "ab", "ok": [1, "a", None]}


def test_answers_fall_back_to_plain_json():
    from gpux_pack.runtime.tensors import dumps

    body = dumps({"a": float("nan"), "b": np.int64(3), "c": object, "d": np.array([1.5, np.inf], np.float16)})
    assert json.loads(body) == {"a": None, "b": 3, "c": "<class 'object'>", "d": [1.5, None]}


@pytest.fixture
def tiny(tmp_path):
    app = App(Model.load(settings(tiny_dir(tmp_path))), "test")
    app.start_warmup()
    assert app.ready.wait(10)
    return Client(app)


def test_overridable_inputs_are_accepted_not_listed(tiny):
    model = tiny.app.model
    assert [s.name for s in model.overridable] == ["bias"]
    assert [s.name for s in model.inputs] == ["x", "scale"]
    assert [list(f) for f in warmup.generated_inputs(model)] == [["x"]]  # neither generated nor required
    assert model.warmup_state["state"] == "done"
    assert [i["name"] for i in tiny.request("GET", "/info")[1]["inputs"]] == ["x", "scale"]
    assert [i["name"] for i in tiny.request("GET", "/v2/models/tiny")[1]["inputs"]] == ["x", "scale"]

    x = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert tiny.request("POST", "/predict", {"x": x})[1] == {"y": [[2.0, 3.0, 4.0], [1.0, 2.0, 3.0]]}
    status, body, _ = tiny.request("POST", "/predict", {"x": x, "bias": [10, 20, 30], "scale": [2, 2, 2]})
    assert status == 200 and body == {"y": [[12.0, 22.0, 32.0], [10.0, 20.0, 30.0]]}
    status, body, _ = tiny.request("POST", "/v2/models/tiny/infer", {"inputs": [
        {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]},
        {"name": "bias", "shape": [3], "datatype": "FP32", "data": [0, 0, 0]}]})
    assert status == 200 and body["outputs"][0]["data"] == [1.0, 1.0, 1.0]

    # validated like any input; never named in the list of inputs an error offers
    checks = [({"x": x, "bias": [1, 2]}, "input 'bias': dimension 0 must be 3"),
              ({"x": x, "bias": [[1, 2, 3]]}, "input 'bias': expected rank 1"),
              ({"x": x, "bias": ["a", "b", "c"]}, "input 'bias': expected float32 values, got strings"),
              ({"bias": [1, 2, 3]}, "missing required input 'x'"),
              ({"x": x, "weights": [1]}, "unknown input 'weights'; the model's inputs are: x, scale")]
    for request, words in checks:
        status, body, _ = tiny.request("POST", "/predict", request)
        assert status == 400 and body["error"].startswith(words)
    status, body, _ = tiny.request("POST", "/v2/models/tiny/infer", {"inputs": [
        {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]},
        {"name": "bias", "shape": [3], "datatype": "INT64", "data": [0, 0, 0]}]})
    assert status == 400 and body["error"] == "input 'bias': datatype INT64 does not match the model's FP32"


def test_ir3_initializers_are_not_overridable(tmp_path):
    """ONNX Runtime makes an IR-3 graph's initializer inputs constants: a clear 400, not its error."""
    client = Client(App(Model.load(settings(tiny_dir(tmp_path, ir_version=3)))))
    client.app.ready.set()
    assert client.app.model.overridable == []
    status, body, _ = client.request("POST", "/predict", {"x": [[0, 0, 0]], "bias": [1, 1, 1]})
    assert status == 400 and body["error"].startswith("unknown input 'bias'")
    assert client.request("POST", "/predict", {"x": [[0, 0, 0]]})[1] == {"y": [[1.0, 2.0, 3.0]]}


# -- the binary tensor extension, .npy bodies, budgets -----------------------------------------

def _binary(header: dict, blob: bytes, length: str | None = None):
    head = json.dumps(header).encode()
    return head + blob, [(b"inference-header-content-length", (length or str(len(head))).encode())]


@pytest.mark.parametrize("header, blob, length, words", [
    ({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
     b"\0" * 12, None, "binary_data_size 16 does not fit the 12 bytes"),
    ({"inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
     b"\0" * 16, None, "the shape needs 32 bytes of FP32, binary_data_size is 16"),
    ({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
     b"\0" * 20, None, "4 bytes of binary data that no input claims"),
    ({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
     b"\0" * 16, "x1", "Inference-Header-Content-Length 'x1'"),
    ({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4],
                  "parameters": {"binary_data_size": 0}}]}, b"", None, "both 'data' and binary_data_size"),
])
def test_binary_requests_name_what_is_wrong(mlp, header, blob, length, words):
    body, headers = _binary(header, blob, length)
    status, answer, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", body, headers)
    assert status == 400 and words in answer["error"], answer


def test_binary_in_and_out_equal_json(mlp):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    body, headers = _binary({"inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32",
                                         "parameters": {"binary_data_size": 32}}],
                             "outputs": [{"name": "probs", "parameters": {"binary_data": True}}], "id": "r1"},
                            x.tobytes())
    sent = mlp.raw("POST", "/v2/models/iris-mlp/infer", body, headers)
    start, payload = sent[0], sent[1]["body"]
    hdrs = dict(start["headers"])
    n = int(hdrs[b"inference-header-content-length"])
    head = json.loads(payload[:n])
    assert head["id"] == "r1" and [o["name"] for o in head["outputs"]] == ["probs"]
    probs = np.frombuffer(payload[n:], np.float32).reshape(head["outputs"][0]["shape"])
    status, answer, _ = mlp.request("POST", "/predict", {"features": x.tolist()})
    np.testing.assert_array_equal(probs, np.array(answer["probs"], np.float32))


def test_npy_body_on_predict(mlp):
    import io

    x = np.ones((3, 4), np.float32)
    buf = io.BytesIO()
    np.save(buf, x)
    status, answer, _ = mlp.request("POST", "/predict", buf.getvalue(), [(b"content-type", b"application/x-npy")])
    assert status == 200 and np.shape(answer["probs"]) == (3, 3)
    status, answer, _ = mlp.request("POST", "/predict", b"not npy", [(b"content-type", b"application/x-npy")])
    assert status == 400 and "not a .npy array" in answer["error"]


def test_a_request_over_the_tensor_budget_is_413_before_converting(tmp_path):
    folder = spec_dir(tmp_path, "mlp")
    app = App(Model.load(settings(folder, GPUX_MAX_REQUEST_BYTES="1000")), "test")
    app.start_warmup()
    assert app.ready.wait(10)
    client = Client(app)
    status, answer, _ = client.request("POST", "/v2/models/iris-mlp/infer", {"inputs": [
        {"name": "features", "shape": [1000000, 4], "datatype": "FP32", "data": [1]}]})
    assert status == 413 and "GPUX_MAX_REQUEST_BYTES" in answer["error"]
    status, answer, _ = client.request("POST", "/predict", {"features": [[1, 2, 3, 4]] * 100})
    assert status == 413 and "intermediate tensors and outputs they imply" in answer["error"]


def test_cgroup_limits_size_threads_and_bodies(tmp_path):
    from gpux_pack.runtime import resources

    root = tmp_path / "cg"
    root.mkdir()
    (root / "cpu.max").write_text("150000 100000\n")
    (root / "memory.max").write_text(str(256 * 1024 * 1024) + "\n")
    lim = resources.limits(root)
    assert lim.cpus == min(2, resources.cpus(tmp_path / "none")) and lim.memory == 256 * 1024 * 1024
    s = Settings.load({"GPUX_CONFIG": str(spec_dir(tmp_path, "mlp") / "gpux.json")}, limits=lim)
    assert s.max_body_bytes == 16 * 1024 * 1024 and s.max_request_bytes == 32 * 1024 * 1024
    assert s.max_workers == 1 and s.threads == lim.cpus


@pytest.mark.parametrize("body, words", [
    ({"features": [["1", "2", "3", "4"]]}, "got strings"),
    ({"features": [[True, False, True, True]]}, "got booleans"),
    ({"features": [[1, None, 3, 4]]}, "or nulls"),
])
def test_numbers_as_text_are_still_refused(mlp, body, words):
    status, answer, _ = mlp.request("POST", "/predict", body)
    assert status == 400 and words in answer["error"], answer
    status, answer, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", {"inputs": [
        {"name": "features", "shape": [1, 4], "datatype": "FP32", "data": body["features"][0]}]})
    assert status == 400 and words in answer["error"], answer


def test_grpc_messages_match_tritonclients():
    """Field names, numbers, types and oneofs of every message, as tritonclient.grpc has them."""
    from tritonclient.grpc import service_pb2

    from gpux_pack.runtime import grpc_v2

    def fields(d):
        out = {f.name: (f.number, f.type, f.is_repeated, f.message_type.full_name if f.message_type else None,
                        f.containing_oneof.name if f.containing_oneof else None) for f in d.fields}
        out.update({f"nested {n.name}": fields(n) for n in d.nested_types})
        return out

    theirs = service_pb2.DESCRIPTOR
    for name, cls in grpc_v2.message_classes().items():
        ours, expected = fields(cls.DESCRIPTOR), fields(theirs.message_types_by_name[name])
        assert {k: v for k, v in expected.items() if k in ours} == ours, name
    service = theirs.services_by_name["GRPCInferenceService"]
    for method, (request, response) in grpc_v2.METHODS.items():
        m = service.methods_by_name[method]
        assert (m.input_type.name, m.output_type.name) == (request, response)


def _grpc_calls(app: App, calls: list[tuple[str, bytes]]) -> list[tuple[str, str]]:
    """Raw request bytes to gRPC methods of a server started on `app`, as a client that sends
    whatever it likes: (status code name, details) of each answer."""
    import socket

    import grpc

    from gpux_pack.runtime import grpc_v2

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def run() -> list[tuple[str, str]]:
        server = await grpc_v2.start(app, port, "127.0.0.1")
        out = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                for method, raw in calls:
                    call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}",
                                               request_serializer=None, response_deserializer=None)
                    try:
                        answer = await call(raw, timeout=30)
                        out.append(("OK", answer))
                    except grpc.aio.AioRpcError as e:
                        out.append((e.code().name, e.details()))
        finally:
            await server.stop(None)
        return out

    return asyncio.run(run())


def _infer_request(**fields) -> bytes:
    from gpux_pack.runtime import grpc_v2

    request = grpc_v2.message_classes()["ModelInferRequest"](model_name=fields.pop("model_name", "iris-mlp"))
    x = fields.pop("x", np.ones((2, 4), np.float32))
    request.inputs.add(name=fields.pop("name", "features"), datatype="FP32", shape=fields.pop("shape", x.shape))
    request.raw_input_contents.append(x.tobytes())
    return request.SerializeToString()


def test_grpc_answers_client_mistakes_with_their_status_codes_and_no_traceback(mlp, caplog, capfd):
    """Bytes that are no protobuf message (grpc used to answer UNKNOWN and log a traceback),
    for every method, and each client mistake: its status code, one line, nothing logged."""
    from gpux_pack.runtime import grpc_v2

    good = _infer_request()
    calls = [(method, b"\xff\xff\xff") for method in grpc_v2.METHODS]
    calls += [("ModelInfer", good[:-5]),  # truncated inside raw_input_contents
              ("ModelInfer", _infer_request(model_name="nope")),
              ("ModelInfer", _infer_request(name="feature")),
              ("ModelInfer", _infer_request(shape=[1 << 40, 4])),
              ("ModelInfer", _infer_request(shape=[3, 4])),
              ("ModelInfer", good)]
    with caplog.at_level("DEBUG"):
        answers = _grpc_calls(mlp.app, calls)
    parse = [(code, details.split(" (")[0]) for code, details in answers[:len(grpc_v2.METHODS) + 1]]
    assert parse == [("INVALID_ARGUMENT", f"{method}: the request is not a valid {request}")
                     for method, (request, _) in [*grpc_v2.METHODS.items(), ("ModelInfer", ("ModelInferRequest", ""))]]
    codes = [code for code, _ in answers[len(grpc_v2.METHODS) + 1:]]
    assert codes == ["NOT_FOUND", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", "OK"]
    assert "unknown model 'nope'" in answers[-5][1] and "unknown input 'feature'" in answers[-4][1]
    response = grpc_v2.message_classes()["ModelInferResponse"].FromString(answers[-1][1])
    [logits, probs] = reference("mlp", {"features": np.ones((2, 4), np.float32)})
    assert [o.name for o in response.outputs] == ["logits", "probs"]
    np.testing.assert_allclose(np.frombuffer(response.raw_output_contents[1], np.float32).reshape(2, 3), probs,
                               atol=1e-6)
    for _, details in answers[:-1]:
        assert details and "\n" not in details and "Traceback" not in details
    assert not [r for r in caplog.records if r.exc_info or r.levelname in ("ERROR", "CRITICAL")], caplog.text
    assert "Traceback" not in caplog.text + "".join(capfd.readouterr())


def test_grpc_is_unavailable_until_ready_and_while_shutting_down(tmp_path):
    app = App(Model.load(settings(spec_dir(tmp_path, "mlp"))), "test")
    [(code, details)] = _grpc_calls(app, [("ModelInfer", _infer_request())])
    assert code == "UNAVAILABLE" and "warming up" in details
    app.start_warmup()
    assert app.ready.wait(10)
    app.scheduler.close()
    [(code, details)] = _grpc_calls(app, [("ModelInfer", _infer_request())])
    assert code == "UNAVAILABLE" and "shutting down" in details


def test_grpc_typed_contents_that_do_not_fit_their_datatype_are_a_client_mistake():
    """300 in int_contents for an INT8 input: numpy's OverflowError became UNKNOWN and a traceback."""
    from types import SimpleNamespace

    from gpux_pack.runtime import grpc_v2
    from gpux_pack.runtime.tensors import RequestError, ServedTensor

    spec = ServedTensor("x", "int8", (-1,))
    model = SimpleNamespace(inputs=[spec], overridable=(), outputs=[])
    request = grpc_v2.message_classes()["ModelInferRequest"](model_name="m")
    request.inputs.add(name="x", datatype="INT8", shape=[2]).contents.int_contents.extend([1, 300])
    with pytest.raises(RequestError, match="input 'x': contents do not fit INT8") as e:
        grpc_v2.decode(request, model, 1 << 20)
    assert e.value.status == 400


def _two_cpus(folder: Path, **env: str) -> Settings:
    from gpux_pack.runtime import resources

    return Settings.load({"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache"), **env},
                         limits=resources.Limits(cpus=2, memory=8 << 30, memory_from="cgroup"))


def _heavy(folder: Path) -> Path:
    """The mlp's gpux.json over a model with its inputs and outputs whose run is milliseconds even
    at batch 1: features -> a 384x384 matrix (an outer product) -> four 384x384 MatMuls -> mean."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {"w_in": rng.random((4, 384)), "ones": np.ones((1, 384)), "w_out": rng.random((384, 3))}
    weights.update({f"w{i}": rng.random((384, 384)) / 384 for i in range(4)})
    nodes = [helper.make_node("MatMul", ["features", "w_in"], ["h"]),
             helper.make_node("Transpose", ["h"], ["col"], perm=[1, 0]),
             helper.make_node("MatMul", ["col", "ones"], ["m0"])]
    nodes += [helper.make_node("MatMul", [f"m{i}", f"w{i}"], [f"m{i + 1}"]) for i in range(4)]
    nodes += [helper.make_node("ReduceMean", ["m4"], ["mean"], axes=[0], keepdims=1),
              helper.make_node("MatMul", ["mean", "w_out"], ["logits"]),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    graph = helper.make_graph(
        nodes, "heavy", [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3]) for n in ("logits", "probs")],
        [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model" / "model.onnx")
    return folder


def test_threads_are_chosen_by_a_rule_the_same_on_every_start(tmp_path):
    """A run too cheap for parallelism to pay (a tiny MLP): 1 thread, on each of 10 starts."""
    chosen = []
    for i in range(10):
        (tmp_path / str(i)).mkdir()
        model = Model.load(_two_cpus(spec_dir(tmp_path / str(i), "mlp")))
        assert model.threads["intra_op"] == 2 and model.threads["chosen"] == "cpus" and "no run timed" in \
            model.threads["why"]
        assert warmup.run(model)["state"] == "done"
        threads = warmup.tune_threads(model)
        assert threads["chosen"] == "rule" and 0 < threads["run_ms"] < warmup.ONE_THREAD_MS, threads
        chosen.append(threads["intra_op"])
    assert chosen == [1] * 10
    assert "too cheap for parallelism to pay; 1 thread" in threads["why"] and f"{threads['run_ms']:g} ms" in \
        threads["why"]
    feeds = {"features": np.array([[5.1, 3.5, 1.4, 0.2]], np.float32)}
    expected = reference("mlp", feeds)
    assert all(np.allclose(model.run(feeds)[k], v, atol=1e-6) for k, v in zip(("logits", "probs"), expected))


def test_a_model_whose_run_is_not_cheap_keeps_every_cpu_without_a_second_session(tmp_path, monkeypatch):
    model = Model.load(_two_cpus(_heavy(spec_dir(tmp_path, "mlp"))))
    loaded = model.session
    monkeypatch.setattr(ort, "InferenceSession", None)  # tune_threads must not load another session
    warmup.run(model)
    threads = warmup.tune_threads(model)
    assert threads["intra_op"] == 2 and threads["chosen"] == "rule" and threads["run_ms"] >= 1, threads
    assert threads["why"] == f"a run takes {threads['run_ms']:g} ms on 2 threads (>= 0.25 ms): every CPU the " \
        "container has (2)"
    assert model.session is loaded


@pytest.mark.parametrize(("costs", "median", "runs"), [
    ([0.05, 3.0, 0.05, 0.05, 0.05], 0.05, 5),  # a cheap model with one run a busy machine slowed
    ([0.3, 0.1, 0.4, 0.1, 0.1, 0.1], 0.1, 6),
    ([1.0, 1.2, 0.9, 1.1], 1.05, 4),  # four of seven on one side: settled
    ([5.0, 9.0], 7.0, 2),  # two runs ten times over the threshold: settled
])
def test_the_rule_reads_a_median_and_stops_once_its_side_is_settled(monkeypatch, costs, median, runs):
    from types import SimpleNamespace

    stamps = iter([t for ms in costs for t in (0.0, ms / 1000)])  # perf_counter before and after each run
    monkeypatch.setattr(warmup, "time", SimpleNamespace(perf_counter=lambda: next(stamps)))
    count: list[int] = []
    assert warmup._run_cost(lambda: count.append(1), 0.25) == pytest.approx(median)
    assert len(count) == runs


def test_gpux_threads_wins_and_info_says_why(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fixed = Model.load(_two_cpus(spec_dir(tmp_path / "a", "mlp"), GPUX_THREADS="2"))
    warmup.run(fixed)
    assert warmup.tune_threads(fixed) == {"intra_op": 2, "chosen": "GPUX_THREADS", "why": "GPUX_THREADS=2"}
    app = App(Model.load(_two_cpus(spec_dir(tmp_path / "b", "mlp"))), "test")
    app.start_warmup()
    assert app.ready.wait(10)
    status, info, _ = Client(app).request("GET", "/info")
    assert status == 200 and info["threads"] == app.model.threads and info["threads"]["intra_op"] == 1
    assert info["threads"]["chosen"] == "rule" and info["threads"]["why"].startswith("a run takes ")


def test_grpc_charges_a_message_before_parsing_it_and_counts_one_refusal(tmp_path):
    """The gRPC path reserved its budget only after the message was received and parsed: eight
    6 MiB calls in a 256 MiB container were OOM-killed. Now the message's size is charged first,
    and a full budget is UNAVAILABLE before any parsing, counted once, as memory."""
    from gpux_pack.runtime.resources import Limits

    folder = spec_dir(tmp_path, "mlp")
    env = {"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache")}
    app = App(Model.load(Settings.load(env, limits=Limits(1, 512 << 20, "cgroup"))), "test")  # 256 MiB in flight
    app.start_warmup()
    assert app.ready.wait(10)
    big = _infer_request(x=np.ones((200_000, 4), np.float32))  # 3.2 MB: 3x that and 2 MiB charged to parse
    held = app.budget.hold(250 << 20)
    try:
        [(code, details)] = _grpc_calls(app, [("ModelInfer", big)])
    finally:
        app.budget.release(held)
    assert code == "UNAVAILABLE" and "in flight" in details, details
    assert app.metrics.refused.values == {"memory": 1} and app.budget.in_flight_bytes == 0
    [(code, _)] = _grpc_calls(app, [("ModelInfer", _infer_request(x=np.ones((20_000, 4), np.float32)))])
    assert code == "OK" and app.budget.in_flight_bytes == 0



def test_grpc_reads_a_bounded_number_and_size_of_messages_at_once():
    """grpc reads a call's whole message before a handler can refuse it, and holds it about four
    times: what it may read at once is bounded up front, within the in-flight budget (16 calls,
    each a 64th of it)."""
    from types import SimpleNamespace

    from gpux_pack.runtime import grpc_v2, resources

    def limits(mib: int) -> tuple[int, int]:
        lim = resources.Limits(2, mib << 20, "cgroup")
        return grpc_v2.call_limits(SimpleNamespace(max_queue=16, max_body_bytes=resources.default_body_bytes(lim),
                                                   max_in_flight_bytes=resources.default_in_flight_bytes(lim)))

    assert [limits(m) for m in (128, 256, 1024, 4096, 16384)] == [
        (16, 1 << 20), (16, 2 << 20), (16, 8 << 20), (16, 32 << 20), (16, 64 << 20)]


def test_rest_and_grpc_refuse_the_same_mistakes_with_the_same_messages(mlp):
    """One checker (runtime/v2.py): each bad request, sent as REST JSON, REST binary and gRPC (raw
    and typed contents), gets one message whatever the transport; a good one passes all four. Values
    that do not fill the shape are told in the form they came in: bytes for REST binary data and
    gRPC raw contents, values for JSON data and typed contents."""
    from gpux_pack.runtime import grpc_v2

    ok = np.ones((2, 4), np.float32)
    cases = {  # what is wrong -> (input name, datatype, shape, values, outputs asked for)
        "unknown input": ("feature", "FP32", [2, 4], ok, None),
        "datatype": ("features", "FP64", [2, 4], ok.astype(np.float64), None),
        "negative dimension": ("features", "FP32", [-2, 4], ok, None),
        "count": ("features", "FP32", [3, 4], ok, None),
        "rank": ("features", "FP32", [8], ok, None),
        "fixed dimension": ("features", "FP32", [4, 2], ok, None),
        "budget": ("features", "FP32", [1 << 40, 4], ok, None),
        "unknown output": ("features", "FP32", [2, 4], ok, ["logit"]),
        "output twice": ("features", "FP32", [2, 4], ok, ["probs", "probs"]),
        "good": ("features", "FP32", [2, 4], ok, ["probs"]),
    }

    def rest(name, datatype, shape, x, outputs, binary):
        item = {"name": name, "datatype": datatype, "shape": shape}
        tail = b""
        if binary:
            tail = x.tobytes()
            item["parameters"] = {"binary_data_size": len(tail)}
        else:
            item["data"] = x.ravel().tolist()
        doc = {"inputs": [item], **({"outputs": [{"name": o} for o in outputs]} if outputs else {})}
        header = json.dumps(doc).encode()
        headers = [(b"inference-header-content-length", str(len(header)).encode())] if binary else []
        status, body, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", header + tail, headers=headers)
        return "OK" if status == 200 else body["error"]

    def grpc_message(name, datatype, shape, x, outputs, typed):
        request = grpc_v2.message_classes()["ModelInferRequest"](model_name="iris-mlp")
        item = request.inputs.add(name=name, datatype=datatype, shape=shape)
        if typed:
            getattr(item.contents, "fp64_contents" if datatype == "FP64" else "fp32_contents").extend(x.ravel().tolist())
        else:
            request.raw_input_contents.append(x.tobytes())
        for o in outputs or ():
            request.outputs.add(name=o)
        return request.SerializeToString()

    calls = [("ModelInfer", grpc_message(*case, typed)) for case in cases.values() for typed in (False, True)]
    answers = iter(_grpc_calls(mlp.app, calls))
    for what, case in cases.items():
        as_json, as_binary = rest(*case, binary=False), rest(*case, binary=True)
        raw, typed = ("OK" if code == "OK" else details for code, details in (next(answers), next(answers)))
        assert as_json == typed and as_binary == raw, (what, as_json, typed, as_binary, raw)
        assert what == "count" or as_json == as_binary, (what, as_json, as_binary)
        assert (as_json == "OK") == (what == "good"), (what, as_json)
    assert "needs 12 values, got 8" in rest(*cases["count"], binary=False)
    assert "needs 48 bytes of FP32, binary_data_size is 32" in rest(*cases["count"], binary=True)
