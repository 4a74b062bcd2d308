"""Builds: layer reuse, render + plain build, failures that keep earlier tags, baked warmup."""

import io
import json
import os
import subprocess
import sys
import tarfile

import docker
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.conftest import (BASE_IMAGE, EXAMPLES, assert_history_matches_layers, build_image, copy_example, run_cli,
                            serve)

pytestmark = pytest.mark.e2e

SAME_TIME = {"SOURCE_DATE_EPOCH": "1767225600"}  # every build of these tests claims one creation time


def layers(client, ref: str) -> list[str]:
    return client.images.get(ref).attrs["RootFS"]["Layers"]


def change_weights(model_path) -> None:
    model = onnx.load(str(model_path))
    for init in model.graph.initializer:
        if init.name == "b2":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(1.0), "b2"))
    onnx.save(model, str(model_path))


def test_model_change_rebuilds_only_the_model_layers(tmp_path, docker_client, tags, request):
    # a base of its own name: its runtime base image cannot exist yet, so the first build makes it
    base = tags("layers-base:1")
    docker_client.images.get(BASE_IMAGE).tag(base)
    project = copy_example("mlp", tmp_path)
    first = build_image(project, tags("layers:a"), "--base-image", base, env=SAME_TIME)
    assert first["runtime_base_built"] and first["runtime_base"].startswith("gpux-pack/runtime-cpu:")
    runtime = docker_client.images.get(first["runtime_base"])
    request.addfinalizer(lambda: docker_client.images.remove(first["runtime_base"], force=True))
    assert layers(docker_client, first["tag"])[:-1] == runtime.attrs["RootFS"]["Layers"]  # the small model: one layer
    assert runtime.attrs["Config"]["Entrypoint"] == ["/usr/bin/python3", "-m", "gpux_runtime"]
    again = build_image(project, tags("layers:b"), "--base-image", base, env=SAME_TIME)
    # unchanged project: the very same image, assembled on the host (nothing ran); only the
    # model's layers were sent
    assert not again["runtime_base_built"] and again["runtime_base"] == first["runtime_base"]
    assert first["assembled"] and again["assembled"] and again["steps"] == 0
    assert again["id"] == first["id"]
    assert again["context_bytes"] < (project / "model.onnx").stat().st_size + 20_000

    change_weights(project / "model.onnx")
    changed = build_image(project, tags("layers:c"), "--base-image", base, env=SAME_TIME)
    assert not changed["runtime_base_built"]
    before, after = layers(docker_client, first["tag"]), layers(docker_client, changed["tag"])
    assert len(before) == len(after)
    assert before[:-1] == after[:-1], "base, packages and runtime layers must be reused"
    assert before[-1] != after[-1]  # model/ and gpux.json (its sha256), in one layer for a small model
    assert changed["assembled"]
    labels = docker_client.images.get(changed["tag"]).labels
    assert labels["io.gpux.model.sha256"] != docker_client.images.get(first["tag"]).labels["io.gpux.model.sha256"]
    with serve(changed["tag"]) as server:  # and it serves the new weights
        out = server.post("/predict", json={"features": [[0, 0, 0, 0]]}).json()["logits"][0]
    with serve(first["tag"]) as server:
        old = server.post("/predict", json={"features": [[0, 0, 0, 0]]}).json()["logits"][0]
    np.testing.assert_allclose(np.array(out) - np.array(old), [1.0, 1.0, 1.0], atol=1e-5)


def test_a_new_graph_is_checked_by_a_second_process_and_the_build_never_imports_onnx(tmp_path, tags):
    """`gpux-pack build` of a model whose checks are not cached: the checks run in the process it
    starts once the replay declines (prechecks.py), so its own imports (-X importtime, which the
    second process does not inherit on stderr) hold no onnx; the image is built all the same."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the second process runs only with a second CPU")
    project = copy_example("mlp", tmp_path)
    model = onnx.load(str(project / "model.onnx"))
    named = f"through_{os.getpid()}_{tmp_path.name}"  # a graph no earlier build checked
    first = model.graph.node[0]
    model.graph.node.insert(0, onnx.helper.make_node("Identity", [first.input[0]], [named]))
    first.input[0] = named
    onnx.save(model, str(project / "model.onnx"))
    tag = tags("iris-mlp:prechecked")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpux_pack", "build", str(project),
                           "--base-image", BASE_IMAGE, "--tag", tag, "--json", "-q"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "gpux_pack.pipeline.build" in imported  # the build's own imports are what was read
    assert "onnx" not in imported
    assert json.loads(proc.stdout)["images"][0]["tag"] == tag


def test_render_then_plain_build_gives_the_same_image(tmp_path, docker_client, tags):
    project = copy_example("mlp", tmp_path)
    built = build_image(project, tags("render:cli"), env=SAME_TIME)
    out = tmp_path / "context"
    proc = run_cli("render", str(project), "--provider", "cpu", "--base-image", BASE_IMAGE,
                   "--output", str(out), env=SAME_TIME)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(out / "packages.tar") as packages:
        assert "opt/gpux/site-packages/onnxruntime/__init__.py" in packages.getnames()
    dockerfile = (out / "Dockerfile").read_text()
    assert "\nRUN " not in dockerfile and f"\nFROM {BASE_IMAGE}\n" in dockerfile
    # the docker CLI, as a user runs it: the same layers as `gpux-pack build` made through its
    # runtime base image (the image ids differ only by their build history)
    plain = tags("render:plain")
    proc = subprocess.run(["docker", "build", "-q", "-t", plain, str(out)], capture_output=True, text=True,
                          env={**os.environ, "DOCKER_BUILDKIT": "0"}, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert built["assembled"], "gpux-pack build assembles the image on the host"
    assert layers(docker_client, plain) == layers(docker_client, built["tag"])
    ours, theirs = (docker_client.images.get(ref).attrs for ref in (built["tag"], plain))
    for key in ("Env", "User", "WorkingDir", "Entrypoint", "Cmd", "Healthcheck", "ExposedPorts", "Labels"):
        assert ours["Config"][key] == theirs["Config"][key], key
    assert (ours["Architecture"], ours["Os"]) == (theirs["Architecture"], theirs["Os"])
    with serve(plain) as server:
        r = server.post("/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]})
        assert r.status_code == 200 and len(r.json()["probs"][0]) == 3


def test_image_is_slim_non_root_and_read_only(mlp_image, docker_client):
    image = docker_client.images.get(mlp_image["tag"])
    assert image.attrs["Config"]["User"] == "10001:10001"
    assert image.attrs["Config"]["Entrypoint"] == ["/usr/bin/python3", "-m", "gpux_runtime"]
    probe = (
        "import importlib.util as u, json, os, shutil; "
        "print(json.dumps({'uid': os.getuid(), "
        "'present': [m for m in ('docker', 'jinja2', 'typer', 'yaml', 'pydantic', 'rich', 'onnx', 'pip', 'uv') if u.find_spec(m)], "
        "'compilers': [c for c in ('gcc', 'cc', 'g++', 'clang') if shutil.which(c)], "
        "'pip_cache': os.path.exists('/root/.cache/pip') or os.path.exists('/tmp/wheels'), "
        "'writable_root': os.access('/opt/gpux', os.W_OK)}))"
    )
    out = docker_client.containers.run(
        image.id, entrypoint=["python3", "-c", probe], remove=True,
        read_only=True, tmpfs={"/tmp": "rw"},
    )
    facts = json.loads(out)
    assert facts == {"uid": 10001, "present": [], "compilers": [], "pip_cache": False, "writable_root": False}
    base = docker_client.images.get(image.attrs["Config"]["Labels"]["org.opencontainers.image.base.name"])
    above = (image.attrs["Size"] - base.attrs["Size"]) / 1e6
    # 96 MB on onnxruntime 1.31.1; 1.32.0 (the first to load IR 14) ships a 5.6 MB larger, stripped
    # x86_64 module (36.0 MB against 30.4); pysimdjson's module adds 7.3 MB (a body's number arrays
    # read without a Python object per number: 4x GPUX's requests a second), the wheels' C sources
    # trimmed take 0.7 MB off: the ceiling moves by that and no more
    assert above <= 110, f"the cpu image is {above:.1f} MB above its base"


def test_history_lines_carry_their_layers_sizes(mlp_image, docker_client):
    """`docker history` of a model image and of its runtime base image: each line that adds a
    layer shows that layer's size (issue 18: the runtime base's `ADD cache.tar /`, a layer of
    folders only, was written as no layer, and every later size went one line off)."""
    for ref in (mlp_image["runtime_base"], mlp_image["tag"]):
        assert_history_matches_layers(docker_client, ref)
    shown = {h["CreatedBy"].rsplit(": ", 1)[-1]: h["Size"] for h in docker_client.api.history(mlp_image["tag"])}
    # the small model and gpux.json share one layer (plan.one_layer)
    assert shown["ADD cache.tar /"] == 0 and shown["ADD app.tar /"] > (EXAMPLES / "mlp" / "model.onnx").stat().st_size
    assert "ADD model.tar /" not in shown and shown["ADD packages.tar /"] > 50_000_000


HTTP_ERRORS = [
    ("post", "/predict", {"data": b"{oops"}, 400, "malformed JSON"),
    ("post", "/predict", {"json": {"petals": [[1, 2, 3, 4]]}}, 400, "unknown input 'petals'"),
    ("post", "/predict", {"json": {}}, 400, "missing required input 'features'"),
    ("post", "/predict", {"json": {"features": [["a", "b", "c", "d"]]}}, 400, "got strings"),
    ("post", "/predict", {"json": {"features": [[1, 2]]}}, 400, "dimension 1 must be 4"),
    ("post", "/predict", {"json": {"features": [[1, 2, 3, 4], [1]]}}, 400, "ragged"),
    ("post", "/v2/models/iris-mlp/infer", {"json": {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "INT64", "data": [1, 2, 3, 4]}]}}, 400, "datatype INT64"),
    ("post", "/v2/models/iris-mlp/infer", {"json": {"inputs": [{"name": "features", "shape": [3, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}}, 400, "needs 12 values"),
    ("post", "/v2/models/resnet/infer", {"json": {"inputs": []}}, 404, "unknown model 'resnet'"),
    ("get", "/v3/what", {}, 404, "no such endpoint"),
    ("get", "/predict", {}, 405, "use POST"),
    ("post", "/predict", {"data": b"[" + b"1.0," * 300000 + b"1.0]"}, 413, "exceeds the limit"),
]


def test_bad_requests_get_4xx_and_the_server_keeps_serving(mlp_image):
    with serve(mlp_image["tag"], env={"GPUX_MAX_BODY_BYTES": "1000000"}) as server:
        for method, path, kwargs, status, words in HTTP_ERRORS:
            r = getattr(server, method)(path, **kwargs)
            assert r.status_code == status, (path, r.text)
            assert words in r.json()["error"], (path, r.text)
            assert server.get("/health").status_code == 200
            ok = server.post("/predict", json={"features": [[1, 2, 3, 4]]})
            assert ok.status_code == 200
        logs = server.container.get_wrapped_container().logs().decode()
        assert "Traceback" not in logs


def test_failed_build_prints_the_step_and_keeps_the_previous_tag(tmp_path, docker_client, tags):
    broken_base = tags("broken-base:1")
    # a base without libstdc++: python3 needs none, the link check on the host fails
    docker_client.images.build(
        fileobj=io.BytesIO(f"FROM {BASE_IMAGE}\nRUN rm -f /usr/lib/x86_64-linux-gnu/libstdc++.so.6*\n".encode()),
        tag=broken_base, rm=True)
    project = copy_example("mlp", tmp_path)
    tag = tags("keep:1")
    good = build_image(project, tag)
    (project / "gpux.yml").write_text((project / "gpux.yml").read_text().replace("1.0.0", "1.0.1"))
    proc = run_cli("build", str(project), "--base-image", broken_base, "--tag", tag)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    # one line naming the library, before anything is built; then every problem found
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and error[0].startswith(
        "error: link check failed: CPUExecutionProvider cannot load: libstdc++.so.6 (needed by "), proc.stderr
    assert "is not in the image" in error[0] and "building" not in proc.stderr
    assert docker_client.images.get(tag).id == good["id"], "the earlier image keeps its tag"


def test_baked_warmup_commits_a_serving_image(tmp_path, docker_client, tags, mlp_image):
    baked = build_image(copy_example("mlp", tmp_path), tags("baked:1"), "--warmup", "always")
    assert baked["warmup"] == "baked"
    image = docker_client.images.get(baked["tag"])
    assert image.labels["io.gpux.warmup"] == "baked"
    config = image.attrs["Config"]
    assert config["Cmd"] == ["serve"] and config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["/usr/bin/python3", "-m", "gpux_runtime"]
    assert "GPUX_CACHE_DIR=/opt/gpux/cache" in config["Env"]
    with serve(baked["tag"], read_only=True, tmpfs={"/tmp": "rw"}) as server:
        assert server.get("/info").json()["warmup"]["mode"] == "baked"
        assert server.post("/predict", json={"features": [[1, 2, 3, 4]]}).status_code == 200
        # ONNX Runtime's telemetry client left nothing, neither in the committed warmup nor in /tmp
        code, out = server.container.get_wrapped_container().exec_run(
            ["find", "/", "(", "-path", "/proc", "-o", "-path", "/sys", ")", "-prune", "-o",
             "(", "-name", ".ses", "-o", "-name", "Microsoft", ")", "-print"], user="0")
        assert code == 0 and out.decode().split() == [], out


def _leftovers(client, name: str) -> tuple[set[str], set[str]]:
    """Containers the CLI created (by their role label), and untagged images of this model."""
    containers = {c.id for c in client.containers.list(all=True, filters={"label": "io.gpux.pack.role"})}
    images = {i.id for i in client.images.list(all=True, filters={"label": f"io.gpux.model.name={name}"}) if not i.tags}
    return containers, images


def test_failed_builds_leave_no_container_and_no_image(tmp_path, docker_client, tags):
    before, _ = _leftovers(docker_client, "never")
    # 1. a base image without python3: the probe container fails at start, and is removed
    no_python = tags("no-python:1")
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text("FROM scratch\nCOPY Dockerfile /etc/empty\n")
    docker_client.images.build(path=str(tmp_path / "ctx"), tag=no_python, rm=True)
    project = copy_example("mlp", tmp_path)
    proc = run_cli("build", str(project), "--base-image", no_python, "--tag", tags("leftover:a"))
    assert proc.returncode == 2 and "has no python3" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3 and "Traceback" not in proc.stderr  # progress + the error

    # 2. a baked warmup that fails (the model cannot run on generated inputs): no container, and
    #    the untagged image it would have committed is removed
    name = f"leftover-{tags('x').split('/')[0].split('-')[-1]}"
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n"])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.array([2, 2], np.int64), "shape")]), opset_imports=[onnx.helper.make_opsetid("", 17)])
    onnx.save(model, str(project / "model.onnx"))
    (project / "gpux.yml").write_text(f"name: {name}\nmodel:\n  source: model.onnx\n")
    tag = tags("leftover:b")
    proc = run_cli("build", str(project), "--base-image", BASE_IMAGE, "--tag", tag, "--warmup", "always")
    assert proc.returncode == 1 and "warmup failed" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    containers, images = _leftovers(docker_client, name)
    assert containers <= before and not images, (containers - before, images)
    with pytest.raises(Exception):
        docker_client.images.get(tag)


def test_the_engines_builder_makes_the_same_layers(tmp_path, docker_client, tags, request):
    """GPUX_PACK_ASSEMBLE=0 (what an engine that writes layer tars differently gets): the same
    Dockerfile through the classic builder, runtime base included, gives the same diff ids."""
    project = copy_example("mlp", tmp_path)
    assembled = build_image(project, tags("builder:assembled"), env=SAME_TIME)
    base = tags("builder-base:1")  # a base of its own name: a runtime base of its own, built now
    docker_client.images.get(BASE_IMAGE).tag(base)
    built = build_image(project, tags("builder:built"), "--base-image", base,
                        env={**SAME_TIME, "GPUX_PACK_ASSEMBLE": "0"})
    request.addfinalizer(lambda: docker_client.images.remove(built["runtime_base"], force=True))
    assert assembled["assembled"] and not built["assembled"] and built["runtime_base_built"]
    assert built["steps"] == 4  # FROM, EXPOSE, ADD app.tar (the small model and gpux.json), LABEL
    assert layers(docker_client, built["tag"]) == layers(docker_client, assembled["tag"])
    runtime = docker_client.images.get(built["runtime_base"]).history()
    assert all("#(nop)" in h["CreatedBy"] for h in runtime[: 9]), [h["CreatedBy"] for h in runtime[:9]]
    # a model image assembled on the builder's runtime base image: the parent's history, as the
    # engine reports it, still lines up with its layers (issue 18)
    mixed = build_image(project, tags("builder:mixed"), "--base-image", base, env=SAME_TIME)
    assert mixed["assembled"] and not mixed["runtime_base_built"] and mixed["runtime_base"] == built["runtime_base"]
    for ref in (built["runtime_base"], built["tag"], assembled["tag"], mixed["tag"]):
        assert_history_matches_layers(docker_client, ref)


def test_external_data_in_two_spellings_is_baked_once_and_served(tmp_path, tags):
    """`./w.bin` and `w.bin` name one file: the assembled image holds it once (two tar entries
    for one path were refused by the engine) and the container answers as onnxruntime does."""
    import onnxruntime as ort
    from onnx import TensorProto as T, helper

    folder = tmp_path / "ext"
    folder.mkdir()
    rng = np.random.default_rng(7)
    w, b = rng.normal(size=(64, 8)).astype(np.float32), rng.normal(size=(8,)).astype(np.float32)
    (folder / "w.bin").write_bytes(w.tobytes() + b.tobytes())
    inits = []
    for name, dims, location, offset, length in (("w", [64, 8], "./w.bin", 0, w.nbytes),
                                                 ("b", [8], "w.bin", w.nbytes, b.nbytes)):
        t = T(name=name, data_type=T.FLOAT, dims=dims)
        t.data_location = T.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        inits.append(t)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["n", 64])], [helper.make_tensor_value_info("y", T.FLOAT, ["n", 8])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    (folder / "gpux.yml").write_text("name: ext-data\nversion: 1.0.0\nmodel:\n  source: ./model.onnx\n")
    built = build_image(folder, tags("ext-data:cpu"))
    assert built["assembled"], "the assembled path is the one that refused duplicate paths"
    x = rng.normal(size=(3, 64)).astype(np.float32)
    [expected] = ort.InferenceSession(str(folder / "model.onnx")).run(None, {"x": x})
    with serve(built["tag"]) as server:
        r = server.post("/predict", json={"x": x.tolist()})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["y"], expected, rtol=1e-5, atol=1e-5)
        listing = server.container.exec("ls -A /opt/gpux/model").output.decode().split()
    assert listing == ["model.onnx", "w.bin"]


LABELS_YML = """
description: |
  First line of a description,
  second line.\t(tabbed)

  And a paragraph\u00a0with\u200ba zero-width space\u202e.
pack:
  labels:
    newline: "a\\nb"
    crlf: "a\\r\\nb"
    tab: "a\\tb"
    tab-only: "\\t"
    vt-ff: "a\\vb\\fc"
    nel: "a\\Nb"
    ls-ps: "a\\Lb\\Pc"
    rlo: "a\\u202eb"
    zwsp-bom: "a\\u200bb\\ufeffc"
    ends: "  a  "
    quoted: "say \\"hi\\" \\\\ $HOME $${X}"
"""


def test_label_values_are_one_rule_built_and_rendered(tmp_path, docker_client, tags, monkeypatch):
    """`build` (assembled on the host) and `render` + `docker build` give the same label bytes,
    the plan's, for values with every kind of separator, control and format character."""
    from gpux_pack.pipeline.build import load, plan_for
    from gpux_pack.plan import Options
    from tests.locks import with_lock
    from gpux_pack.ui import Reporter
    from gpux_pack.wheels import Lock, Pin

    project = copy_example("mlp", tmp_path)
    config = project / "gpux.yml"
    text = "".join(line for line in config.read_text().splitlines(True) if not line.startswith("description:"))
    config.write_text(text + LABELS_YML)
    built = build_image(project, tags("labels:cli"), env=SAME_TIME)
    assert built["assembled"]
    out = tmp_path / "context"
    proc = run_cli("render", str(project), "--provider", "cpu", "--base-image", BASE_IMAGE,
                   "--output", str(out), env=SAME_TIME)
    assert proc.returncode == 0, proc.stderr
    plain = tags("labels:plain")
    proc = subprocess.run(["docker", "build", "-q", "-t", plain, str(out)], capture_output=True, text=True,
                          env={**os.environ, "DOCKER_BUILDKIT": "0"}, timeout=600)
    assert proc.returncode == 0, proc.stderr
    ours, theirs = (docker_client.images.get(ref).attrs["Config"]["Labels"] for ref in (built["tag"], plain))
    assert ours == theirs
    monkeypatch.setenv("SOURCE_DATE_EPOCH", SAME_TIME["SOURCE_DATE_EPOCH"])
    plan = plan_for(load(project), "cpu", "test", Options(base_image=BASE_IMAGE), None, Reporter(quiet=True),
                    pull=False)
    pin = Pin(plan.provider.ort, ours["io.gpux.onnxruntime.version"], frozenset())
    expected = with_lock(plan, Lock(plan.target, plan.requirements, (pin,))).labels
    assert {k: ours[k] for k in expected} == expected
    assert expected["org.opencontainers.image.description"] == (
        "First line of a description, second line. (tabbed) And a paragraph with a zero-width space .")
    assert {k: expected[k] for k in ("newline", "crlf", "tab", "tab-only", "vt-ff", "nel", "ls-ps", "rlo",
                                     "zwsp-bom", "ends", "quoted")} == {
        "newline": "a b", "crlf": "a b", "tab": "a b", "tab-only": "", "vt-ff": "a b c", "nel": "a b",
        "ls-ps": "a b c", "rlo": "a b", "zwsp-bom": "a b c", "ends": "a", "quoted": 'say "hi" \\ $HOME ${X}'}


def test_source_date_epoch_and_emptied_caches_give_the_same_image_and_sbom(docker_client, tags, tmp_path):
    """Reproducible: two builds of examples/mlp with SOURCE_DATE_EPOCH set, each with an empty
    gpux-pack cache (lock, wheels, install, base export) and its runtime base image made afresh,
    give the same image id (its config digest: config and every layer) and the same SBOM bytes."""
    from pathlib import Path

    tag = tags("repro:1")
    base = tags("repro-base:1")  # the base under a name of its own: a runtime base image of its own to remove
    docker_client.images.get(BASE_IMAGE).tag(base)
    ids, sboms = [], []
    for i in range(2):
        env = {"SOURCE_DATE_EPOCH": "1700000000", "GPUX_PACK_CACHE_DIR": str(tmp_path / f"cache{i}")}
        plan = json.loads(run_cli("plan", str(EXAMPLES / "mlp"), "--provider", "cpu", "--base-image", base,
                                  "--json", env=env).stdout)["plans"][0]
        try:
            docker_client.images.remove(plan["runtime_base"]["tag"], force=True)  # made again below
        except docker.errors.ImageNotFound:
            pass
        proc = run_cli("build", str(EXAMPLES / "mlp"), "--provider", "cpu", "--base-image", base,
                       "--tag", tag, "--json", env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        image = json.loads(proc.stdout)["images"][0]
        assert image["runtime_base_built"] is True
        ids.append(image["id"])
        sboms.append(Path(image["sbom"]).read_bytes())
    docker_client.images.remove(plan["runtime_base"]["tag"], force=True)  # this test's own runtime base
    assert ids[0] == ids[1] and sboms[0] == sboms[1]


def test_a_signed_model_verifies_with_model_signing_and_a_changed_one_never_serves(docker_client, tags, tmp_path,
                                                                                  mlp_image):
    """build --sign-model: model-signing's own CLI verifies the bundle the image carries for the
    image's folder (gpux.json, the model, the assets); the image (pack.verify_model) checks it and
    serves; images derived from it with one model byte changed, or with its labels reversed in
    gpux.json, exit at start with one line and never serve; an unsigned image asked to verify says
    so in one line."""
    import shutil
    import sys
    from pathlib import Path

    from tests.conftest import key_pair

    key_pair(tmp_path, "key")
    project = copy_example("mlp", tmp_path)
    with open(project / "gpux.yml", "a") as f:
        f.write("\npack:\n  verify_model: true\n")
    image = build_image(project, tags("signed:1"), "--provider", "cpu", "--sign-model", str(tmp_path / "key.pem"))
    container = docker_client.containers.create(image["tag"])
    out = tmp_path / "from-image" / "gpux"
    try:
        for path in ("/opt/gpux/model", "/opt/gpux/assets", "/opt/gpux/gpux.json"):
            stream, _ = container.get_archive(path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                tar.extractall(out, filter="data")
    finally:
        container.remove(force=True)
    cli = Path(sys.executable).parent / "model_signing"
    verified = subprocess.run([str(cli), "verify", "key", str(out), "--signature",
                               str(out / "assets" / "model.sig"), "--public_key", str(tmp_path / "key.pub")],
                              capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and "Verification succeeded" in verified.stdout + verified.stderr, verified
    with serve(image["tag"], read_only=True, tmpfs={"/tmp": ""}) as server:
        assert server.post("/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]}).status_code == 200

    def refused(base: str, name: str, data: bytes, target: str, **env: str) -> str:
        """The one line a container of `base` with `target` replaced by `data` exits with."""
        context = tmp_path / name
        context.mkdir()
        if data:
            (context / "file").write_bytes(data)
        copy = f"COPY file {target}\n" if data else ""
        (context / "Dockerfile").write_text(f"FROM {base}\n{copy}")
        altered, _ = docker_client.images.build(path=str(context), tag=tags(f"signed:{name}"), rm=True)
        try:
            run = docker_client.containers.run(altered.id, detach=True, read_only=True, tmpfs={"/tmp": ""},
                                               labels={"io.gpux.pack.role": "test"}, environment=env)
            try:
                code = run.wait(timeout=120)["StatusCode"]
                logs = run.logs().decode(errors="replace")
            finally:
                run.remove(force=True)
        finally:
            shutil.rmtree(context, ignore_errors=True)
        failures = [line for line in logs.splitlines() if "model verification failed" in line or
                    "GPUX_VERIFY_MODEL=1" in line]
        assert code != 0 and len(failures) == 1 and "Traceback" not in logs, logs
        return failures[0]

    data = bytearray((out / "model" / "model.onnx").read_bytes())
    data[-1] ^= 1
    assert "model/model.onnx changed since it was signed" in refused(image["tag"], "weights", bytes(data),
                                                                     "/opt/gpux/model/model.onnx")
    spec = json.loads((out / "gpux.json").read_text())
    logits = next(o for o in spec["outputs"] if o.get("labels"))
    logits["labels"] = logits["labels"][::-1]
    assert "gpux.json changed since it was signed" in refused(image["tag"], "labels", json.dumps(spec).encode(),
                                                              "/opt/gpux/gpux.json")
    # an image built without --sign-model has no cryptography in its lock: still one line
    assert "this image carries no model signature" in refused(mlp_image["tag"], "unsigned", b"", "",
                                                              GPUX_VERIFY_MODEL="1")