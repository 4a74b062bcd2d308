"""The warmup step for images built where the accelerator is absent: `gpux-pack warmup` bakes a
verified, keyed cache into a derived image or exports it for a volume; containers use a cache
only when its key and sha256 hold, share one named volume, and report partition and accuracy.
OpenVINO (CPU device, Intel's plugin EP) is the provider that compiles here: through ONNX Runtime's
compile API into an EP context model. Its plugin offers no device on other vendors' CPUs, so on
such a host the images run under qemu-x86_64 with an Intel CPU model (tests.conftest.on_intel_cpu)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from gpux_pack.image import sbom
from gpux_pack.image import attestation_store
from gpux_pack.runtime import caches
from tests.conftest import (assert_history_matches_layers, build_image, copy_example, on_intel_cpu, run_cli,
                            serve, wait_ready)

pytestmark = pytest.mark.e2e

X = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.1, 4.4, 1.4]]


@pytest.fixture(scope="module")
def ov_never(docker_client, tags, tmp_path_factory):
    """openvino, built with --warmup never, as a CI host without the accelerator would."""
    image = build_image(copy_example("mlp", tmp_path_factory.mktemp("never")), tags("warm:never"),
                        "--provider", "openvino", "--warmup", "never")
    runs = on_intel_cpu(docker_client, image["tag"], tags("warm:never-intel"))
    if runs != image["tag"]:  # the test-only image stands for the built one: so do its attestations
        shutil.copytree(attestation_store.folder_of(docker_client.images.get(image["tag"]).id),
                        attestation_store.folder_of(docker_client.images.get(runs).id), dirs_exist_ok=True)
    return {**image, "tag": runs}


@pytest.fixture(scope="module")
def exported(ov_never, tmp_path_factory):
    """One `warmup --export` of ov_never, shared: (its --json summary, the exported key folder).
    Tests read it; one that alters a cache copies it first."""
    root = tmp_path_factory.mktemp("exported") / "cache"
    proc = run_cli("warmup", ov_never["tag"], "--export", str(root), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    return summary, Path(summary["exported"])


@pytest.fixture(scope="module")
def cpu_answers(mlp_image):
    with serve(mlp_image["tag"]) as server:
        return server.post("/predict", json={"features": X}).json()


def _logs(server) -> str:
    return server.container.get_wrapped_container().logs().decode(errors="replace")


def _answers_match(server, cpu_answers) -> None:
    got = server.post("/predict", json={"features": X})
    assert got.status_code == 200, got.text
    for name in ("logits", "probs"):
        np.testing.assert_allclose(got.json()[name], cpu_answers[name], atol=1e-4, rtol=0)


def test_warmup_bakes_one_layer_with_the_same_config(ov_never, docker_client, tags, cpu_answers):
    tag = tags("warm:baked")
    proc = run_cli("warmup", ov_never["tag"], "--tag", tag, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["cache"] == "compiled" and summary["assembled"] is True and summary["tag"] == tag
    parent, derived = docker_client.images.get(ov_never["tag"]), docker_client.images.get(tag)
    assert derived.attrs["RootFS"]["Layers"][:-1] == parent.attrs["RootFS"]["Layers"]  # +1 layer, nothing else
    assert_history_matches_layers(docker_client, tag)  # `docker history` sizes line up (issue 18)
    before, after = parent.attrs["Config"], derived.attrs["Config"]
    for field in ("Entrypoint", "Cmd", "Env", "User", "WorkingDir", "Healthcheck", "ExposedPorts"):
        assert after[field] == before[field], field
    labels = after["Labels"]
    assert labels["io.gpux.warmup"] == "baked" and labels["io.gpux.warmup.key"] == summary["key"]
    assert labels["io.gpux.warmup.key.provider"] == "OpenVINOExecutionProvider"
    assert labels["io.gpux.warmup.key.device"].startswith("cpu: ")
    assert {k: v for k, v in labels.items() if not k.startswith("io.gpux.warmup")} == \
        {k: v for k, v in before["Labels"].items() if not k.startswith("io.gpux.warmup")}
    # the derived image's SBOM and provenance: its parent's, with the compiled cache (issue 34)
    doc = json.loads(Path(summary["sbom"]).read_text())
    assert sbom.validate(doc) is None
    (cache,) = [c for c in doc["components"] if c["type"] == "data"]
    props = {p["name"]: p["value"] for p in cache["properties"]}
    assert props["gpux:key"] == summary["key"] and props["gpux:provider"] == "OpenVINOExecutionProvider"
    assert props["gpux:layer"] == derived.attrs["RootFS"]["Layers"][-1]  # the layer that holds it
    assert cache["hashes"][0]["content"] == derived.attrs["RootFS"]["Layers"][-1].split(":")[1]
    recorded = attestation_store.recorded(derived.id)
    assert recorded is not None and recorded[0] == Path(summary["sbom"]).read_bytes()
    predicate = recorded[1]
    assert predicate["runDetails"]["byproducts"][0]["annotations"]["key"] == summary["key"]
    assert predicate["buildDefinition"]["resolvedDependencies"][-1]["uri"] == f"docker-image:{parent.id}"
    empty = docker_client.volumes.create(labels={"io.gpux.pack.role": "test"})
    try:
        with serve(tag, read_only=True, tmpfs={"/tmp": "rw"}, volumes=[(empty.name, "/opt/gpux/cache", "rw")]) as server:
            info = server.get("/info").json()["warmup"]
            logs = _logs(server)
            assert info["key"] == summary["key"] and info["mode"] == "baked" and info["cache"] == "baked", info
            assert "not using the baked cache" not in logs and "compiled model.onnx" not in logs, logs[-2000:]
            _answers_match(server, cpu_answers)
            code, out = server.container.get_wrapped_container().exec_run(["ls", "-A", "/opt/gpux/cache"])
            assert code == 0 and out.decode().split() == [], out  # compiled nothing
            code, out = server.container.get_wrapped_container().exec_run(["find", "/opt/gpux/warm", "-type", "f"])
            files = sorted(out.decode().split())
            record = json.loads(server.container.get_wrapped_container().exec_run(
                ["cat", f"/opt/gpux/warm/{summary['key']}/warmup.json"]).output)
            assert files == sorted([f"/opt/gpux/warm/{summary['key']}/warmup.json",
                                    *(f"/opt/gpux/warm/{summary['key']}/{f['path']}" for f in record["files"])])
            assert {f["path"] for f in record["files"]} == {"model_ctx.onnx", "model_ctx_OpenVINOExecutionProvider.bin"}
    finally:
        empty.remove(force=True)


def test_the_engines_builder_adds_the_same_layer(ov_never, exported, docker_client, tags, monkeypatch):
    """One exported cache, made into an image both ways: assembled, and by `docker build`."""
    from gpux_pack.pipeline.bake import warm_labels, warm_members
    from gpux_pack.image.maker import choose
    from gpux_pack.ui import Reporter

    key, folder = exported[0]["key"], exported[1]
    record = caches.read_record(folder)
    image = docker_client.images.get(ov_never["tag"])
    ids = {}
    for assemble, tag in (("1", tags("warm:assembled")), ("0", tags("warm:builder"))):
        monkeypatch.setenv("GPUX_PACK_ASSEMBLE", assemble)
        made = choose(docker_client, Reporter(quiet=True)).derive(
            image.id, tag, warm_members(folder, key), warm_labels(key, record), f"warmup cache {key}")
        ids[assemble] = (made.id, made.assembled)
    assert ids["1"][1] is True and ids["0"][1] is False
    a, b = (docker_client.images.get(ids[k][0]) for k in ("1", "0"))
    assert a.attrs["RootFS"]["Layers"] == b.attrs["RootFS"]["Layers"]
    assert a.attrs["Config"]["Labels"] == b.attrs["Config"]["Labels"]
    for made in (a, b):
        assert_history_matches_layers(docker_client, made.id)


def test_default_tag_and_export(ov_never, exported, docker_client):
    summary, folder = exported
    assert folder.parent.name == "cache" and folder.name == summary["key"] and summary["tag"] is None
    record = caches.read_record(folder)
    assert record["parts"]["provider"] == "OpenVINOExecutionProvider" and record["shapes"] == [{"features": [1, 4]}]
    assert record["files"] and all(caches.sha256(folder / f["path"]) == f["sha256"] for f in record["files"])
    proc = run_cli("warmup", ov_never["tag"], "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tag = json.loads(proc.stdout)["tag"]
    try:
        assert tag == f"{ov_never['tag']}-warm-{summary['short']}"
    finally:
        docker_client.images.remove(tag, force=True)
    assert run_cli("warmup", "no-such/image:1").returncode == 2
    bad = run_cli("warmup", ov_never["tag"], "--gpus", "many")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("expected all or a number of GPUs")


def _shared(path: Path) -> None:
    """Let the image's user write a folder made here (a bind mount keeps host owners)."""
    for folder, dirs, files in os.walk(path):
        os.chmod(folder, 0o777)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o666)


def test_a_mismatched_or_corrupt_cache_is_never_loaded(ov_never, exported, tmp_path, cpu_answers):
    cache = tmp_path / "cache"
    folder = cache / exported[1].name
    shutil.copytree(exported[1], folder)  # this test alters its copy
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)
    record = json.loads((folder / "warmup.json").read_text())
    record["parts"]["device"] = "cpu: Some Other CPU [avx2]"  # as if warmed on another machine
    (folder / "warmup.json").write_text(json.dumps(record))
    _shared(cache)
    volume = [(str(cache), "/opt/gpux/cache", "rw")]
    with serve(ov_never["tag"], volumes=volume, read_only=True, tmpfs={"/tmp": "rw"}) as server:
        warnings = [line for line in _logs(server).splitlines() if "not using the" in line]
        assert len(warnings) == 1, warnings
        assert "key mismatch: device (recorded 'cpu: Some Other CPU [avx2]', this container 'cpu: " in warnings[0]
        assert server.get("/info").json()["warmup"]["cache"] == "compiled"
        _answers_match(server, cpu_answers)
    caches.check(folder, caches.read_record(pristine)["parts"])  # replaced by a valid folder
    blob = folder / "model_ctx_OpenVINOExecutionProvider.bin"  # the compiled model
    blob.write_bytes(b"\0" + blob.read_bytes()[1:])
    with serve(ov_never["tag"], volumes=volume, read_only=True, tmpfs={"/tmp": "rw"}) as server:
        warnings = [line for line in _logs(server).splitlines() if "not using the" in line]
        assert len(warnings) == 1 and "is corrupt (sha256 differs from the record)" in warnings[0], warnings
        assert server.get("/info").json()["warmup"]["cache"] == "compiled"
        _answers_match(server, cpu_answers)


@pytest.fixture
def volume(docker_client):
    made = []

    def make():
        v = docker_client.volumes.create(labels={"io.gpux.pack.role": "test"})
        made.append(v)
        return v.name

    yield make
    for v in made:
        v.remove(force=True)


def _warmup_in(image: str, volume_name: str, docker_client) -> dict:
    out = docker_client.containers.run(image, command=["warmup"], volumes={volume_name: {"bind": "/opt/gpux/cache"}},
                                       read_only=True, tmpfs={"/tmp": "rw"}, remove=True, stderr=False)
    return json.loads(out.decode().strip().splitlines()[-1])["warmup"]


def test_a_named_volume_is_writable_and_shared(ov_never, docker_client, volume, cpu_answers):
    name = volume()
    first = _warmup_in(ov_never["tag"], name, docker_client)
    second = _warmup_in(ov_never["tag"], name, docker_client)
    assert (first["cache"], second["cache"]) == ("compiled", "volume") and first["key"] == second["key"]
    # two containers warming one fresh volume at once: both ready, one valid folder, no leftovers
    shared = volume()
    opts = {"volumes": [(shared, "/opt/gpux/cache", "rw")], "read_only": True, "tmpfs": {"/tmp": "rw"}}
    with serve(ov_never["tag"], ready=False, **opts) as a, serve(ov_never["tag"], ready=False, **opts) as b:
        threads = [threading.Thread(target=wait_ready, args=(s,)) for s in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in (a, b):
            _answers_match(s, cpu_answers)
        code, out = a.container.get_wrapped_container().exec_run(["ls", "-A", "/opt/gpux/cache"])
        assert out.decode().split() == [first["key"]], out
    third = _warmup_in(ov_never["tag"], shared, docker_client)
    assert third["cache"] == "volume"  # the published folder verifies


def test_partition_and_accuracy_are_reported(docker_client, tags, tmp_path):
    image = build_image(copy_example("mlp", tmp_path), tags("warm:at-start"), "--provider", "openvino")
    with serve(on_intel_cpu(docker_client, image["tag"], tags("warm:at-start-intel"))) as server:
        info = server.get("/info").json()["warmup"]
    assert info["state"] == "done" and info["mode"] == "at-start" and info["cache"] == "compiled"
    assert info["partition"] == {"OpenVINOExecutionProvider": 4}  # Gemm, Relu, Gemm, Softmax
    assert set(info["accuracy"]) == {"logits", "probs"}
    assert all(0 <= e["max_abs"] < 1e-4 and 0 <= e["max_rel"] < 1e-3 for e in info["accuracy"].values())


def test_an_accuracy_limit_that_cannot_hold_fails_the_warmup(docker_client, tags, tmp_path):
    project = copy_example("mlp", tmp_path)
    with open(project / "gpux.yml", "a") as f:
        f.write("\npack:\n  accuracy: {atol: 0, rtol: 0}\n")
    image = build_image(project, tags("warm-strict:1"), "--provider", "openvino", "--warmup", "never")
    intel = on_intel_cpu(docker_client, image["tag"], tags("warm-strict:intel"))
    tag = tags("warm-strict:warm")
    proc = run_cli("warmup", intel, "--tag", tag)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "last lines" not in proc.stderr, proc.stderr[-2000:]
    assert errors[0].startswith("error: warmup failed: output 'probs' differs from the CPU provider beyond "
                                "pack.accuracy (atol 0.0, rtol 0.0): max abs error "), proc.stderr[-2000:]
    assert not docker_client.images.list(name=tag)
    assert not docker_client.containers.list(all=True, filters={"label": "io.gpux.pack.role=warmup"})


def _deep_project(folder: Path) -> Path:
    """The benchmark's 600-node model (300 MatMul + Relu): compiling it costs something."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("warmup_bench", Path(__file__).parents[2] / "bench" / "warmup_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.deep_project(folder)


def test_a_baked_or_volume_cache_skips_the_compile(docker_client, tags, tmp_path, volume):
    """Session load (where the provider compiles or imports) of a baked and of a volume cache,
    against a cold start's, in one run: at most 0.6x; the baked one writes nothing."""
    image = build_image(_deep_project(tmp_path / "deep"), tags("deep:never"), "--provider", "openvino",
                        "--warmup", "never")
    plain = on_intel_cpu(docker_client, image["tag"], tags("deep:never-intel"))
    proc = run_cli("warmup", plain, "--tag", tags("deep:baked"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    shared, empty = volume(), volume()
    opts = {"read_only": True, "tmpfs": {"/tmp": "rw"}}
    seconds = {}
    for name, image_tag, mount in (("cold", plain, shared), ("volume", plain, shared), ("baked", tags("deep:baked"), empty)):
        with serve(image_tag, volumes=[(mount, "/opt/gpux/cache", "rw")], **opts) as server:
            info = server.get("/info").json()
            assert info["warmup"]["cache"] == {"cold": "compiled"}.get(name, name), info["warmup"]
            assert info["execution_providers"]["active"][0] == "OpenVINOExecutionProvider"
            seconds[name] = info["load_seconds"]
    listing = docker_client.containers.run(plain, entrypoint=["ls", "-A", "/c"], volumes={empty: {"bind": "/c"}},
                                           remove=True)
    assert listing.decode().split() == []  # the baked start compiled nothing into its volume
    assert seconds["baked"] <= 0.6 * seconds["cold"] and seconds["volume"] <= 0.6 * seconds["cold"], seconds


def test_a_volume_key_folder_the_server_cannot_read_is_one_warning_and_a_fresh_compile(mlp_image, docker_client,
                                                                                      tmp_path):
    """A volume whose key folder is root's and 0700: the server (uid 10001) exited 1 with a
    PermissionError traceback; now the image's own runtime warns once and compiles afresh."""
    parts = {"model_sha256": "ab" * 32, "provider": "OpenVINOExecutionProvider", "device": "cpu: test"}
    key = caches.digest(parts)
    volume = tmp_path / "volume"
    (volume / key).mkdir(parents=True)
    (volume / key / caches.RECORD).write_text("{}")
    (volume / key).chmod(0o700)  # root's, as the tests run: uid 10001 cannot look inside
    volume.chmod(0o777)
    script = ("import json, pathlib\nfrom gpux_runtime import caches\n"
              f"c = caches.choose(json.loads({json.dumps(json.dumps(parts))}), pathlib.Path('/cache'), pathlib.Path('/no'))\n"
              "print(json.dumps([c.source, c.warnings, c.folder.parent.as_posix()]))\n")
    out = docker_client.containers.run(mlp_image["tag"], ["-c", script], entrypoint=["python3"], remove=True,
                                       volumes={str(volume): {"bind": "/cache", "mode": "rw"}}, read_only=True,
                                       labels={"io.gpux.pack.role": "test"})
    source, warnings, where = json.loads(out.decode().strip().splitlines()[-1])
    assert (source, where) == ("compiled", "/cache") and len(warnings) == 1, warnings
    assert warnings[0].startswith(f"not using the volume cache /cache/{key}: ") and "Permission denied" in warnings[0]
