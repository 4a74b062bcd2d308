"""The dev loop against the image it stands for: `serve` answers as the built image answers,
`predict IMAGE` asks a running container or a fresh one (removed after), and what `init`
writes builds and serves as is. Reload, Ctrl-C and `predict PATH` without Docker are in
tests/unit/test_dev_loop.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time

import numpy as np
import pytest

from tests.conftest import EXAMPLES, ROOT, build_image, copy_example, run_cli, serve
from tests.unit.test_dev_loop import assert_outputs, one_error_line, reference, serving  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

MLP = EXAMPLES / "mlp" / "model.onnx"


def v2_json(server, name: str, x: np.ndarray) -> dict:
    body = {"inputs": [{"name": "features", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    r = server.post(f"/v2/models/{name}/infer", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_serve_answers_as_the_image_does(mlp_image, tmp_path, serving):  # noqa: F811 (the fixture imported above)
    local = serving(copy_example("mlp", tmp_path))
    with serve(mlp_image["tag"]) as image:
        local.wait_ready()
        for path in ("/v2/models/iris-mlp", "/v2/models/iris-mlp/ready", "/v2", "/health", "/v2/health/live"):
            a, b = local.get(path), image.get(path)
            assert (a.status_code, a.json()) == (b.status_code, b.json()), path
        mine, theirs = local.get("/info").json(), image.get("/info").json()
        for key in ("name", "version", "description", "model", "inputs", "outputs", "onnxruntime"):
            assert mine[key] == theirs[key], key

        for batch in (1, 5):
            x = np.random.default_rng(batch).normal(size=(batch, 4)).astype(np.float32)
            expected = reference(MLP, {"features": x})
            body = {"features": x.tolist()}
            a, b = local.post("/predict", json=body), image.post("/predict", json=body)
            assert a.status_code == b.status_code == 200, (a.text, b.text)
            assert_outputs(a.json(), {k: np.asarray(v) for k, v in b.json().items()})
            assert_outputs(a.json(), expected)
            va, vb = v2_json(local, "iris-mlp", x), v2_json(image, "iris-mlp", x)
            assert [(o["name"], o["datatype"], o["shape"]) for o in va["outputs"]] == \
                   [(o["name"], o["datatype"], o["shape"]) for o in vb["outputs"]]
            assert (va["model_name"], va.get("model_version")) == (vb["model_name"], vb.get("model_version"))
            for oa, ob in zip(va["outputs"], vb["outputs"]):
                np.testing.assert_allclose(oa["data"], ob["data"], atol=1e-5, rtol=0)

        # a refusal is the same refusal
        bad = {"features": [[1.0, 2.0, 3.0]]}
        a, b = local.post("/predict", json=bad), image.post("/predict", json=bad)
        assert a.status_code == b.status_code == 400 and a.json() == b.json(), (a.text, b.text)


def containers_of(client, tag: str) -> list:
    """Containers `predict`/`run` started from the image (their io.gpux.image label), any state."""
    return client.containers.list(all=True, filters={"label": f"io.gpux.image={tag}"})


def created(client, tag: str, since: float) -> int:
    """How many containers of the image were created since `since` (the engine's events)."""
    events = client.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                           filters={"type": "container", "event": "create", "label": f"io.gpux.image={tag}"})
    return sum(1 for _ in events)


def test_predict_image_starts_a_fresh_container_and_removes_it(mlp_image, docker_client, tmp_path):
    tag = mlp_image["tag"]
    x = np.random.default_rng(11).normal(size=(4, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "in.json").write_text(json.dumps({"features": x.tolist()}))
    expected = reference(MLP, {"features": x})
    assert docker_client.containers.list(filters={"ancestor": tag, "status": "running"}) == []
    since = time.time()

    proc = run_cli("predict", tag, "--input", f"features={tmp_path / 'x.npy'}", cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "starting" in proc.stderr
    assert_outputs(json.loads(proc.stdout), expected)
    assert containers_of(docker_client, tag) == []
    assert docker_client.containers.list(all=True, filters={"ancestor": tag}) == []

    out = tmp_path / "out"
    proc = run_cli("predict", tag, "--input", str(tmp_path / "in.json"), "--output", str(out), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert_outputs({p.stem: np.load(p) for p in out.glob("*.npy")}, expected)

    # inputs the model refuses: exit 2, one line naming the --input, the container gone too
    np.save(tmp_path / "wide.npy", np.zeros((2, 5), np.float32))
    one_error_line(run_cli("predict", tag, "--input", f"features={tmp_path / 'wide.npy'}", cwd=ROOT, timeout=300),
                   f"--input features={tmp_path / 'wide.npy'}", "must be 4", after=("starting ",))
    one_error_line(run_cli("predict", tag, "--input", f"features={tmp_path / 'nope.npy'}", cwd=ROOT, timeout=300),
                   "nope.npy")  # (no file: refused before any container)
    assert containers_of(docker_client, tag) == []
    assert docker_client.containers.list(all=True, filters={"ancestor": tag}) == []
    assert created(docker_client, tag, since) == 3


def infer_count(server) -> float:
    text = server.get("/metrics").text
    found = re.findall(r'^gpux_requests_total\{code="200",endpoint="/v2/models/\{name\}/infer"\} (\S+)$', text, re.M)
    return float(found[0]) if found else 0.0


def test_predict_image_uses_a_running_container(mlp_image, docker_client, tmp_path):
    tag = mlp_image["tag"]
    x = np.random.default_rng(12).normal(size=(2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    with serve(tag) as running:  # published on 127.0.0.1, as `docker run -p 127.0.0.1::8080` does
        before = infer_count(running)
        since = time.time()
        proc = run_cli("predict", tag, "--input", f"features={tmp_path / 'x.npy'}", cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "starting" not in proc.stderr
        assert_outputs(json.loads(proc.stdout), reference(MLP, {"features": x}))
        assert infer_count(running) == before + 1  # it was this container that answered
        assert created(docker_client, tag, since) == 0
        assert containers_of(docker_client, tag) == []


def test_init_output_builds_and_serves(tmp_path, tags):
    folder = tmp_path / "iris"
    folder.mkdir()
    model = folder / "model.onnx"
    model.write_bytes(MLP.read_bytes())
    proc = run_cli("init", str(model), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    summary = build_image(folder, tags("init-iris:cpu"))
    x = np.random.default_rng(13).normal(size=(3, 4)).astype(np.float32)
    with serve(summary["tag"]) as server:
        r = server.post("/predict", json={"features": x.tolist()})
        assert r.status_code == 200, r.text
        assert_outputs({k: np.asarray(v) for k, v in r.json().items()}, reference(model, {"features": x}))
        meta = server.get("/v2/models/iris").json()
        assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]
        assert [o["name"] for o in meta["outputs"]] == ["logits", "probs"]


REPLAYED = "only the model's weights changed"


@pytest.fixture
def earlier_images_removed(docker_client):
    """The images a test's later builds of the same tag left untagged (its SOURCE_DATE_EPOCH's
    creation time, made while it ran): removed after it, as the tags fixture removes the tagged."""
    before = {image.id for image in docker_client.images.list(all=True)}
    yield
    for image in docker_client.images.list(filters={"dangling": True}):
        if image.id not in before and image.labels.get("org.opencontainers.image.created") == "2023-11-14T22:13:20Z":
            try:
                docker_client.images.remove(image.id, force=True)
            except Exception:
                pass


@pytest.mark.usefixtures("earlier_images_removed")
def test_a_weights_only_rebuild_replays_the_last_build_and_equals_a_full_one(tmp_path, tags, docker_client):
    """The same `build` after new weights: replayed (pipeline/rebuild.py), and the very image the
    full build makes; a renamed input, broken bytes or an edited gpux.yml meet the full build."""
    import onnx
    from onnx import numpy_helper

    from tests.conftest import BASE_IMAGE

    project = copy_example("mlp", tmp_path)
    tag, full = tags("rebuild"), tags("rebuild-full")
    env = {"SOURCE_DATE_EPOCH": "1700000000"}
    args = ("build", str(project), "--base-image", BASE_IMAGE, "--tag", tag)
    first = run_cli(*args, env=env)
    assert first.returncode == 0 and REPLAYED not in first.stderr, first.stderr[-2000:]

    def edit(change):
        model = onnx.load(str(project / "model.onnx"))
        change(model)
        onnx.save(model, str(project / "model.onnx"))

    def bump(model):
        init = model.graph.initializer[-1]
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(0.5), init.name))

    edit(bump)
    second = run_cli(*args, env=env)
    assert second.returncode == 0 and REPLAYED in second.stderr and "provider:" not in second.stderr, second.stderr
    assert re.match(rf"built {re.escape(tag)}  [0-9a-f]{{12}}  \d+ MB  cpu  ", second.stdout), second.stdout
    from gpux_pack.image import attestation_store

    replayed = attestation_store.recorded(docker_client.images.get(tag).id)  # its SBOM and provenance: a push attaches them
    assert replayed is not None
    reference_build = run_cli(*args[:-1], full, "-q", env={**env, "GPUX_PACK_REBUILD": "0"})
    assert reference_build.returncode == 0, reference_build.stderr[-2000:]
    assert docker_client.images.get(tag).id == docker_client.images.get(full).id
    # what the full build records, but for its tag (and the serial number, derived from the content)
    recorded = attestation_store.recorded(docker_client.images.get(full).id)
    for (sbom_a, predicate_a), (sbom_b, predicate_b) in [(recorded, replayed)]:
        sbom_a = {k: v for k, v in json.loads(sbom_a.decode().replace(full, tag)).items() if k != "serialNumber"}
        assert sbom_a == {k: v for k, v in json.loads(sbom_b).items() if k != "serialNumber"}
        assert json.loads(json.dumps(predicate_a).replace(full, tag)) == predicate_b
    labels = docker_client.images.get(tag).labels
    assert labels["io.gpux.model.sha256"] == hashlib.sha256((project / "model.onnx").read_bytes()).hexdigest()

    edit(bump)  # again: the record follows the last replay
    assert REPLAYED in run_cli(*args, env=env).stderr

    edit(lambda m: setattr(m.graph.input[0], "name", "renamed"))  # gpux.yml names "features"
    renamed = run_cli(*args, env=env)
    assert renamed.returncode == 2 and REPLAYED not in renamed.stderr and "features" in renamed.stderr, renamed.stderr

    good = (project / "model.onnx").read_bytes()
    (project / "model.onnx").write_bytes(good[: len(good) // 2])
    broken = run_cli(*args, env=env)
    assert broken.returncode == 2 and REPLAYED not in broken.stderr and "model" in broken.stderr, broken.stderr

    shutil.copy(EXAMPLES / "mlp" / "model.onnx", project / "model.onnx")
    assert run_cli(*args, env=env).returncode == 0  # a full build records again
    config = project / "gpux.yml"
    config.write_text(config.read_text().replace("Three-class MLP", "A three-class MLP"))
    edit(bump)
    edited = run_cli(*args, env=env)
    assert edited.returncode == 0 and REPLAYED not in edited.stderr and "provider:" in edited.stderr, edited.stderr
    # a checkout or a sync tool writes gpux.yml again with the same bytes (a new mtime): still replayed
    edit(bump)
    text = config.read_bytes()
    config.unlink()
    config.write_bytes(text)
    os.utime(config, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    rewritten = run_cli(*args, env=env)
    assert rewritten.returncode == 0 and REPLAYED in rewritten.stderr, rewritten.stderr
    # build --json, as CI pipelines call it: replayed too, with the summary a full build prints
    from gpux_pack.commands.build import BuildSummary

    assert run_cli(*args, "--json", env=env).returncode == 0  # the first --json build records
    edit(bump)
    as_json = run_cli(*args, "--json", env=env)
    assert as_json.returncode == 0 and REPLAYED in as_json.stderr, as_json.stderr
    [row] = BuildSummary.model_validate_json(as_json.stdout).images
    assert row.tag == tag and row.id == docker_client.images.get(tag).id and row.assembled
