"""Built images serve the model: answers equal in-process onnxruntime, on a real engine."""

import hashlib
import json
import os
import time

import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import BASE_IMAGE, EXAMPLES, intel_cpu, run_cli, serve

pytestmark = pytest.mark.e2e


def reference(example: str, feeds: dict) -> dict:
    session = ort.InferenceSession(str(EXAMPLES / example / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def v2_infer(server, name: str, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    datatypes = {np.float32: "FP32", np.int64: "INT64"}
    body = {"inputs": [
        {"name": k, "shape": list(v.shape), "datatype": datatypes[v.dtype.type], "data": v.ravel().tolist()}
        for k, v in tensors.items()]}
    r = server.post(f"/v2/models/{name}/infer", json=body)
    assert r.status_code == 200, r.text
    return {o["name"]: np.reshape(o["data"], o["shape"]) for o in r.json()["outputs"]}


@pytest.mark.parametrize("batch", [1, 8])
def test_mlp_answers_equal_onnxruntime(mlp_image, batch):
    x = np.random.default_rng(batch).normal(size=(batch, 4)).astype(np.float32)
    expected = reference("mlp", {"features": x})
    with serve(mlp_image["tag"], read_only=True, tmpfs={"/tmp": "rw,size=64m"}) as server:
        assert server.get("/health").json() == {"status": "healthy", "model": "iris-mlp", "ready": True}
        predicted = server.post("/predict", json={"features": x.tolist()})
        assert predicted.status_code == 200, predicted.text
        v2 = v2_infer(server, "iris-mlp", {"features": x})
        for name in ("logits", "probs"):
            np.testing.assert_allclose(predicted.json()[name], expected[name], atol=1e-5, rtol=0)
            np.testing.assert_allclose(v2[name], expected[name], atol=1e-5, rtol=0)
            assert np.shape(predicted.json()[name]) == (batch, 3)


def test_info_and_metadata(mlp_image):
    with serve(mlp_image["tag"]) as server:
        info = server.get("/info").json()
        assert info["name"] == "iris-mlp" and info["version"] == "1.0.0"
        assert info["execution_providers"]["active"] == ["CPUExecutionProvider"]
        assert info["onnxruntime"] == mlp_image["onnxruntime"] == "1.32.0"
        assert info["warmup"]["mode"] == "at-start" and info["warmup"]["state"] == "done"
        cpus, threads = len(os.sched_getaffinity(0)), info["threads"]  # the container has the host's CPUs
        if cpus > 1:  # warmup's rule: a run of this MLP is far too cheap for threads to pay, on every start
            assert threads["chosen"] == "rule" and threads["intra_op"] == 1 and threads["run_ms"] < 0.25, threads
            assert threads["why"].startswith(f"a run takes {threads['run_ms']:g} ms on {cpus} threads (< 0.25 ms)")
        assert [i["name"] for i in info["inputs"]] == ["features"]
        assert server.get("/v2").json()["name"] == "gpux"
        assert server.get("/v2/health/live").status_code == 200
        meta = server.get("/v2/models/iris-mlp").json()
        assert meta["platform"] == "onnxruntime_onnx"
        assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]


def test_text_classifier_int64_inputs(text_image):
    ids = np.array([[5, 17, 256, 0, 0], [9, 8, 7, 6, 5]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=np.int64)
    expected = reference("text-classifier", {"input_ids": ids, "attention_mask": mask})
    with serve(text_image["tag"], port=9000) as server:  # serving.port: 9000 in its gpux.yml
        r = server.post("/predict", json={"input_ids": ids.tolist(), "attention_mask": mask.tolist()})
        np.testing.assert_allclose(r.json()["logits"], expected["logits"], atol=1e-5, rtol=0)
        v2 = v2_infer(server, "text-classifier", {"input_ids": ids, "attention_mask": mask})
        np.testing.assert_allclose(v2["logits"], expected["logits"], atol=1e-5, rtol=0)


def test_port_from_environment(mlp_image):
    with serve(mlp_image["tag"], port=9123, env={"GPUX_PORT": "9123"}) as server:
        assert server.get("/health").status_code == 200


def test_labels_through_inspect(mlp_image):
    proc = run_cli("inspect", mlp_image["tag"], "--json")
    assert proc.returncode == 0, proc.stderr
    labels = json.loads(proc.stdout)["labels"]
    model_sha = hashlib.sha256((EXAMPLES / "mlp" / "model.onnx").read_bytes()).hexdigest()
    assert labels["io.gpux.model.sha256"] == model_sha
    assert labels["io.gpux.model.name"] == "iris-mlp" and labels["io.gpux.model.version"] == "1.0.0"
    assert labels["io.gpux.provider"] == "cpu" and labels["io.gpux.warmup"] == "at-start"
    assert labels["io.gpux.onnxruntime.version"] == "1.32.0"
    assert labels["org.opencontainers.image.title"] == "iris-mlp"
    assert labels["org.opencontainers.image.base.name"] == BASE_IMAGE
    for key in ("org.opencontainers.image.created", "org.opencontainers.image.version",
                "org.opencontainers.image.description", "io.gpux.pack.version"):
        assert labels[key]
    missing = run_cli("inspect", "gpux-test/does-not-exist:1")
    assert missing.returncode == 2 and "no such image" in missing.stderr


@pytest.mark.parametrize("command", [["run"], ["inspect"], ["deploy", "--target", "compose"], ["warmup"]])
def test_a_reference_that_is_no_reference_is_one_usage_line(command, tmp_path):
    """`REL4/MLP`, `$(id)` or a line break reached the engine, whose raw "400 Client Error" text
    ended the command with exit 1."""
    for ref in ("REL4/MLP", "$(id)", "iris\nmlp"):
        extra = ["--output", str(tmp_path)] if command[0] == "deploy" else []
        proc = run_cli(command[0], ref, *command[1:], *extra)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (command, ref, proc.stderr)
        assert "is not a valid image reference" in lines[0] and "400" not in lines[0], lines


def test_sigterm_drains_and_exits_zero(mlp_image, docker_client):
    with serve(mlp_image["tag"]) as server:
        container = server.container.get_wrapped_container()
        container.stop(timeout=20)  # SIGTERM; SIGKILL would give 137
        container.reload()
        assert container.attrs["State"]["ExitCode"] == 0
        assert "Finished server process" in container.logs().decode()


def test_entrypoint_commands(mlp_image, docker_client):
    out = docker_client.containers.run(
        mlp_image["tag"], ["predict", "--input", '{"features": [[5.1, 3.5, 1.4, 0.2]]}'], remove=True)
    x = np.array([[5.1, 3.5, 1.4, 0.2]], dtype=np.float32)
    np.testing.assert_allclose(json.loads(out)["probs"], reference("mlp", {"features": x})["probs"], atol=1e-5)
    info = json.loads(docker_client.containers.run(mlp_image["tag"], ["info"], remove=True))
    assert info["execution_providers"]["active"] == ["CPUExecutionProvider"]
    warm = json.loads(docker_client.containers.run(mlp_image["tag"], ["warmup"], remove=True).decode().splitlines()[-1])
    assert warm["warmup"]["state"] == "done"


def test_providers_command_reads_this_host(docker_client):
    proc = run_cli("providers", "--json")
    assert proc.returncode == 0, proc.stderr
    table = {p["name"]: p for p in json.loads(proc.stdout)["providers"]}
    assert set(table) == {"cpu", "cuda", "tensorrt", "rocm", "migraphx", "openvino"}
    assert table["cuda"]["package"] == "onnxruntime-gpu[cuda,cudnn]==1.31.1"
    assert table["cuda"]["cuda12"] == "onnxruntime-gpu[cuda,cudnn]==1.26.0"
    assert table["cuda"]["vendor_base_image"].startswith("nvidia/cuda:13.") and table["cuda"]["docker_run"] == "--gpus all"
    assert table["cpu"]["host_can_run"] is True and table["cpu"]["package"].startswith("onnxruntime==")
    assert table["openvino"]["host_can_run"] is intel_cpu()  # the plugin offers devices on Intel CPUs only
    assert table["openvino"]["package"] == "onnxruntime==1.32.0 + onnxruntime-ep-openvino==1.8.1"
    gpu = any(r["host_can_run"] for n, r in table.items() if n in ("cuda", "tensorrt"))
    assert gpu == ("nvidia" in (docker_client.info().get("Runtimes") or {}))


def _wait_exit(container, timeout: float) -> int:
    """The container's exit code, failing with its logs if it is still running at the deadline."""
    import requests

    try:
        return container.wait(timeout=timeout)["StatusCode"]
    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
        logs = container.logs().decode(errors="replace")
        pytest.fail(f"still running {timeout}s after SIGTERM:\n{logs[-3000:]}")


def test_sigterm_during_start_exits_at_once(mlp_image, docker_client):
    """PID 1 ignores SIGTERM without a handler: one is there before the slow imports. Early on
    it exits 0; mid-load 143 with one line."""
    for _ in range(3):
        container = docker_client.containers.run(mlp_image["tag"], detach=True)
        try:
            time.sleep(0.2)  # deliberate: the acceptance is a SIGTERM 0.2 s after start
            container.kill(signal="SIGTERM")
            code = _wait_exit(container, 2)
            stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
            assert code in (0, 143), stderr
            if code == 143:
                assert stderr.splitlines() == ["gpux: stopped by SIGTERM while loading the model"]
            assert "Traceback" not in stderr
        finally:
            container.remove(force=True)


def test_sigterm_when_ready_drains_and_exits_zero(mlp_image):
    with serve(mlp_image["tag"]) as server:
        assert server.post("/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]}).status_code == 200
        container = server.container.get_wrapped_container()
        container.kill(signal="SIGTERM")
        assert _wait_exit(container, 15) == 0
        logs = container.logs().decode(errors="replace")
        assert "Finished server process" in logs and "stopped by" not in logs and "Traceback" not in logs


def test_bad_variable_exits_2_with_one_line(mlp_image, docker_client):
    container = docker_client.containers.run(mlp_image["tag"], detach=True, environment={"GPUX_TIMEOUT": "abc"})
    try:
        assert _wait_exit(container, 30) == 2
        assert container.logs(stdout=True, stderr=False) == b""
        stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
        assert stderr.splitlines() == [
            "gpux: GPUX_TIMEOUT=abc: expected a number of seconds, more than 0 and at most 86400"]
        assert "Traceback" not in stderr
    finally:
        container.remove(force=True)


def test_deep_json_is_400_and_serving_goes_on(mlp_image):
    with serve(mlp_image["tag"]) as server:
        r = server.post("/predict", data=b"[" * 100_000 + b"]" * 100_000, headers={"content-type": "application/json"})
        text = "the JSON body is nested deeper than 1024 levels"
        assert r.status_code == 400 and r.json() == {"error": text, "detail": text}
        r = server.post("/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]})
        assert r.status_code == 200 and set(r.json()) == {"logits", "probs", "labels", "predicted"}
