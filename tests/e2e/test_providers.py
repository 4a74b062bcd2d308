"""The provider matrix on a real engine: OpenVINO serving, one command for several providers,
the link check failing a CUDA build, a CUDA image without a GPU, runtime base images."""

import json

import docker
import numpy as np
import onnxruntime as ort
import pytest

from gpux_pack.runtime.contract import cpu_vendor
from tests.conftest import BASE_IMAGE, EXAMPLES, copy_example, free_port, intel_cpu, on_intel_cpu, run_cli, serve

pytestmark = pytest.mark.e2e

X = np.random.default_rng(3).normal(size=(8, 4)).astype(np.float32)


@pytest.fixture(scope="module")
def cpu_and_openvino(docker_client, tags, tmp_path_factory):
    """`--provider cpu,openvino`: two images from one command, one summary."""
    project = copy_example("mlp", tmp_path_factory.mktemp("multi"))
    made = {provider: tags(f"multi:{provider}") for provider in ("cpu", "openvino")}  # removed at the end
    tag = made["cpu"].rsplit(":", 1)[0] + ":{provider}"
    proc = run_cli("build", str(project), "--provider", "cpu,openvino", "--base-image", BASE_IMAGE,
                   "--tag", tag, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    images = {i["provider"]: i for i in json.loads(proc.stdout)["images"]}
    assert {p: i["tag"] for p, i in images.items()} == made
    return images


def test_one_command_builds_one_image_per_provider(cpu_and_openvino, docker_client):
    assert set(cpu_and_openvino) == {"cpu", "openvino"}
    cpu, ov = (docker_client.images.get(cpu_and_openvino[p]["tag"]) for p in ("cpu", "openvino"))
    assert cpu.labels["io.gpux.provider"] == "cpu" and ov.labels["io.gpux.provider"] == "openvino"
    assert ov.labels["io.gpux.onnxruntime.version"] == "1.32.0"  # the plain wheel, with Intel's plugin EP
    assert cpu.labels["io.gpux.model.sha256"] == ov.labels["io.gpux.model.sha256"]
    assert cpu_and_openvino["cpu"]["tag"].endswith(":cpu") and cpu_and_openvino["openvino"]["tag"].endswith(":openvino")


def test_openvino_serves_like_cpu_and_caches_its_compiled_model(cpu_and_openvino, docker_client, tags):
    answers = {}
    for provider in ("cpu", "openvino"):
        tag = cpu_and_openvino[provider]["tag"]
        if provider == "openvino":
            tag = on_intel_cpu(docker_client, tag, tags("multi:openvino-intel"))
        with serve(tag) as server:
            info = server.get("/info").json()
            answers[provider] = server.post("/predict", json={"features": X.tolist()}).json()
            if provider == "openvino":
                assert info["execution_providers"]["active"][0] == "OpenVINOExecutionProvider"
                code, out = server.container.get_wrapped_container().exec_run(
                    ["find", "/opt/gpux/cache", "-name", "model_ctx*"])
                assert code == 0 and sorted(p.rsplit("/", 1)[-1] for p in out.decode().split()) == \
                    ["model_ctx.onnx", "model_ctx_OpenVINOExecutionProvider.bin"], out
    for name in ("logits", "probs"):
        np.testing.assert_allclose(answers["openvino"][name], answers["cpu"][name], atol=1e-4, rtol=0)


def test_one_failing_provider_does_not_stop_the_others(tmp_path, tags):
    project = copy_example("mlp", tmp_path)
    tag = tags("partial:cpu").rsplit(":", 1)[0] + ":{provider}"
    proc = run_cli("build", str(project), "--provider", "rocm,cpu", "--base-image", BASE_IMAGE, "--tag", tag, "--json")
    assert proc.returncode == 1  # rocm builds on Debian, but ROCm's libraries are not there
    summary = json.loads(proc.stdout)
    assert [i["provider"] for i in summary["images"]] == ["cpu"]
    [failed] = summary["failed"]
    assert failed["provider"] == "rocm" and failed["exit_code"] == 1
    assert "link check failed: ROCMExecutionProvider cannot load: libhipblas.so.3" in failed["error"]
    assert "use a ROCm 7.2 base image" in failed["error"]
    assert "error: rocm: link check failed: " in proc.stderr


def cuda_project(tmp_path, pack: str):
    project = copy_example("mlp", tmp_path)
    (project / "gpux.yml").write_text((project / "gpux.yml").read_text() + "pack:\n" + pack)
    return project


def test_link_check_fails_a_cuda_build_missing_its_libraries(tmp_path, tags, docker_client):
    """cuda on a plain Debian base without NVIDIA's wheels: the build fails, naming the library."""
    project = cuda_project(tmp_path, "  nvidia_libs: base\n")
    tag = tags("linkcheck:fail")
    proc = run_cli("build", str(project), "--provider", "cuda", "--base-image", BASE_IMAGE, "--tag", tag)
    assert proc.returncode == 1
    first = proc.stderr.strip().splitlines()
    line = next(x for x in first if x.startswith("error: "))
    assert line.startswith("error: link check failed: CUDAExecutionProvider cannot load: libcublasLt.so.13"), line
    assert "libcudnn.so.9 (needed by CUDAExecutionProvider at run time) is not in the image" in proc.stderr
    assert "Traceback" not in proc.stderr
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)


@pytest.fixture(scope="module")
def cuda_image(docker_client, tags, tmp_path_factory):
    """The real onnxruntime-gpu wheel on the offline Debian base, NVIDIA libraries left out and
    the link check off (as on hosts that mount CUDA at run time): a CUDA image with no GPU."""
    project = cuda_project(tmp_path_factory.mktemp("cuda"), "  nvidia_libs: base\n  link_check: false\n")
    tag = tags("cuda:nogpu")
    proc = run_cli("build", str(project), "--provider", "cuda", "--base-image", BASE_IMAGE, "--tag", tag, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)["images"][0]


def test_cuda_image_without_gpu_falls_back_to_cpu_loudly(cuda_image):
    assert cuda_image["onnxruntime"] == "1.31.1"
    with serve(cuda_image["tag"]) as server:
        info = server.get("/info").json()
        assert info["execution_providers"] == {
            "requested": ["CUDAExecutionProvider", "CPUExecutionProvider"], "active": ["CPUExecutionProvider"]}
        logs = server.container.get_wrapped_container().logs().decode()
        assert "FALLBACK: CUDAExecutionProvider is not active (libcublasLt.so.13" in logs
        r = server.post("/predict", json={"features": X.tolist()})
        assert r.status_code == 200
        session = ort.InferenceSession(str(EXAMPLES / "mlp" / "model.onnx"), providers=["CPUExecutionProvider"])
        logits, probs = session.run(["logits", "probs"], {"features": X})
        np.testing.assert_allclose(r.json()["logits"], logits, atol=1e-5, rtol=0)
        np.testing.assert_allclose(r.json()["probs"], probs, atol=1e-5, rtol=0)


def test_cuda_image_refuses_to_start_when_the_provider_is_required(cuda_image, docker_client):
    container = docker_client.containers.run(
        cuda_image["tag"], environment={"GPUX_REQUIRE_PROVIDER": "1"}, detach=True)
    try:
        assert container.wait(timeout=60)["StatusCode"] == 1
        err = container.logs(stdout=False, stderr=True).decode().strip().splitlines()
    finally:
        container.remove(force=True)
    assert len(err) == 1, err
    assert err[0].startswith("gpux: GPUX_REQUIRE_PROVIDER=1: CUDAExecutionProvider is not active (libcublasLt.so.13")


def test_runtime_base_image_makes_model_builds_small(tmp_path, docker_client, tags):
    # link_check off on both sides: a runtime base no other test's build would pick up
    proc = run_cli("base", "build", "--provider", "cpu", "--base-image", BASE_IMAGE, "--no-link-check", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    runtime = json.loads(proc.stdout)["tag"]
    assert runtime.startswith("gpux-pack/runtime-cpu:1.32.0-")
    try:
        project = cuda_project(tmp_path, "  link_check: false\n")
        proc = run_cli("build", str(project), "--base-image", BASE_IMAGE, "--tag", tags("on-runtime:1"), "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        image = json.loads(proc.stdout)["images"][0]
        assert image["runtime_base"] == runtime and not image["runtime_base_built"] and image["assembled"]
        assert f"runtime base image {runtime} is present: only the model is sent" in proc.stderr
        base_layers = docker_client.images.get(runtime).attrs["RootFS"]["Layers"]
        layers = docker_client.images.get(image["tag"]).attrs["RootFS"]["Layers"]
        assert layers[: len(base_layers)] == base_layers and len(layers) == len(base_layers) + 1  # the small model's
        with serve(image["tag"]) as server:
            assert server.post("/predict", json={"features": X.tolist()}).status_code == 200
            assert server.get("/info").json()["name"] == "iris-mlp"
    finally:
        docker_client.images.remove(runtime, force=True)


@pytest.mark.slow
def test_cuda_with_nvidia_wheels_passes_the_link_check(tmp_path, tags):
    """Opt-in (`pytest -m slow`): about 1.7 GB of NVIDIA wheels and a 2.8 GB image."""
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--provider", "cuda", "--base-image", BASE_IMAGE,
                   "--tag", tags("cuda:wheels"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "link check: CUDAExecutionProvider:" in proc.stderr and "left to the host's driver: libcuda.so.1" in proc.stderr


@pytest.fixture
def run_volume(docker_client):
    """`run` makes a named cache volume per model: removed after the test."""
    yield "gpux-cache-iris-mlp"
    try:
        docker_client.volumes.get("gpux-cache-iris-mlp").remove(force=True)
    except docker.errors.NotFound:
        pass


def test_run_serves_on_the_chosen_port_locked_down(mlp_image, docker_client, run_volume):
    port = free_port()
    proc = run_cli("run", mlp_image["tag"], "--port", str(port), "--detach")
    assert proc.returncode == 0, proc.stderr[-2000:]
    url_line, container_id = proc.stdout.strip().splitlines()
    container = docker_client.containers.get(container_id)
    try:
        assert url_line.startswith(f"http://127.0.0.1:{port}  cpu  cache volume gpux-cache-iris-mlp")
        import requests

        r = requests.post(f"http://127.0.0.1:{port}/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]}, timeout=10)
        assert r.status_code == 200
        host = container.attrs["HostConfig"]
        assert host["ReadonlyRootfs"] is True and "/tmp" in host["Tmpfs"]
        assert [m["Destination"] for m in container.attrs["Mounts"] if m["Type"] == "volume"] == ["/opt/gpux/cache"]
    finally:
        container.remove(force=True)


def test_run_a_cuda_image_without_a_gpu_is_one_line_unless_cpu_fallback(cuda_image, docker_client, run_volume):
    proc = run_cli("run", cuda_image["tag"], "--detach")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: {cuda_image['tag']} needs an NVIDIA GPU (nvidia runtime or CDI); this Docker host has none (run "
        "with --cpu-fallback to serve on CPU)"]
    assert not docker_client.containers.list(all=True, filters={"label": "io.gpux.pack.role=run"})
    proc = run_cli("run", cuda_image["tag"], "--detach", "--cpu-fallback")
    assert proc.returncode == 0, proc.stderr[-2000:]
    url, container_id = proc.stdout.strip().splitlines()
    container = docker_client.containers.get(container_id)
    try:
        import requests

        base = url.split()[0]
        info = requests.get(base + "/info", timeout=10).json()
        assert info["execution_providers"]["active"] == ["CPUExecutionProvider"] and "on CPU" in url
        assert "FALLBACK" not in container.logs().decode()  # asked for CPU: no warning
        assert requests.post(base + "/predict", json={"features": [[1, 2, 3, 4]]}, timeout=10).status_code == 200
    finally:
        container.remove(force=True)


def test_run_in_the_foreground_stops_and_removes_on_ctrl_c(mlp_image, docker_client, run_volume):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "gpux_pack", "run", mlp_image["tag"]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once ready
        assert line.startswith("http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
        assert len(docker_client.containers.list(filters={"label": "io.gpux.pack.role=run"})) == 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:  # a failure above: nothing left behind for the tests after this one
            proc.kill()
            proc.wait()
            for container in docker_client.containers.list(all=True, filters={"label": "io.gpux.pack.role=run"}):
                container.remove(force=True)
    assert not docker_client.containers.list(all=True, filters={"label": "io.gpux.pack.role=run"})


def test_bench_compares_cpu_and_openvino(tags, tmp_path):
    """On Intel CPUs both providers; elsewhere OpenVINO's plugin has no device, and bench (which
    starts images as `run` does) refuses it in one line, then compares what can run."""
    tag = tags("bench:cpu").rsplit(":", 1)[0] + ":{provider}"
    tags("bench:openvino")
    wanted = "cpu,openvino" if intel_cpu() else "cpu"
    if not intel_cpu():
        proc = run_cli("bench", str(copy_example("mlp", tmp_path / "ov")), "--provider", "openvino", "--base-image",
                       BASE_IMAGE, "--tag", tag, "--runs", "50")
        assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].endswith(
            "the OpenVINOExecutionProvider plugin offers no CPU device here: this CPU is "
            f"{cpu_vendor()[0]}, {cpu_vendor()[1]}; the plugin offers devices on Intel's (vendor id 0x8086) "
            "only; this Docker host has none (run with --cpu-fallback to serve on CPU)"), proc.stderr[-2000:]
    proc = run_cli("bench", str(copy_example("mlp", tmp_path)), "--provider", wanted, "--base-image",
                   BASE_IMAGE, "--tag", tag, "--runs", "50", "--concurrency", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["provider"]: r for r in json.loads(proc.stdout)["results"]}
    assert set(results) == set(wanted.split(","))
    if "openvino" in results:
        assert results["openvino"]["active"][0] == "OpenVINOExecutionProvider"
    for r in results.values():
        assert 0 < r["model_p50_ms"] <= r["model_p99_ms"] and 0 < r["http_p50_ms"] <= r["http_p99_ms"]
        assert r["throughput_rps"] > 0 and r["runs"] == 50 and r["concurrency"] == 2
        assert r["model_p50_ms"] < r["http_p50_ms"]  # HTTP adds to the model's own time
