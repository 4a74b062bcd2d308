
import pytest

from gpux_pack import providers
from gpux_pack.config import load_project
from gpux_pack.engine import host_from
from gpux_pack.errors import UsageError
from gpux_pack.providers import HostInfo, decide, parse_provider_list, session_providers

NONE = HostInfo()


@pytest.mark.parametrize(
    "cli, pack, backend, host, chosen, words",
    [
        (["openvino"], ["cpu"], "cuda", NONE, ("openvino",), "--provider"),
        (["auto"], ["cpu", "openvino"], "cuda", NONE, ("cpu", "openvino"), "pack.providers"),
        ([], [], "rocm", NONE, ("rocm",), "runtime.gpu.backend"),
        ([], [], "auto", HostInfo(nvidia=True), ("cuda",), "NVIDIA"),
        ([], [], "auto", HostInfo(amd=True), ("rocm",), "/dev/kfd"),
        ([], [], "auto", HostInfo(intel_gpu=True), ("openvino",), "Intel GPU"),
        ([], [], "auto", NONE, ("cpu",), "no GPU"),
        ([], [], "auto", None, ("cpu",), "could not be inspected"),
        (["auto"], ["auto"], "auto", HostInfo(nvidia=True, amd=True), ("cuda",), "NVIDIA"),
    ],
)
def test_decide(cli, pack, backend, host, chosen, words):
    d = decide(cli, pack, backend, host)
    assert d.providers == chosen and words in d.reason


@pytest.mark.parametrize(
    "info, dev, expect",
    [
        ({"Runtimes": {"runc": {}, "nvidia": {}}}, None, (True, False, False)),
        ({"DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=all"}]}, None, (True, False, False)),
        ({"Runtimes": {"runc": {}}}, None, (False, False, False)),
    ],
)
def test_host_from_docker_info(info, dev, expect):
    h = host_from(info, dev, None)
    assert (h.nvidia, h.amd, h.intel_gpu) == expect


def test_host_devices(tmp_path):
    dev, drm = tmp_path / "dev", tmp_path / "drm"
    (dev / "dri").mkdir(parents=True)
    (dev / "kfd").touch()
    (drm / "card0" / "device").mkdir(parents=True)
    (drm / "card0" / "device" / "vendor").write_text("0x8086\n")
    h = host_from({"Runtimes": {"runc": {}}}, dev, drm)
    assert h.amd and h.intel_gpu and not h.nvidia


def test_parse_provider_list():
    assert parse_provider_list("CPU, openvino,cpu") == ["cpu", "openvino"]
    with pytest.raises(UsageError, match="unknown provider 'coreml'.*Apple-only"):
        parse_provider_list("coreml")


def test_table_is_complete_and_templates_exist():
    from gpux_pack.render import templates_dir

    assert set(providers.PROVIDERS) == {"cpu", "cuda", "tensorrt", "rocm", "openvino"}
    for p in providers.PROVIDERS.values():
        assert (templates_dir() / p.template_name).is_file()
        assert p.execution_providers[-1] == "CPUExecutionProvider"
        assert "==" in p.package  # pinned: the lock is reproducible only then


def test_session_options_from_config(tmp_path):
    (tmp_path / "gpux.yml").write_text(
        "name: m\nmodel: {source: m.onnx}\nruntime:\n  gpu: {memory: 2GB}\n"
        "pack:\n  tensorrt:\n    fp16: true\n    workspace: 1GB\n"
        "    profiles:\n      x: {min: [1, 3], opt: [8, 3], max: [32, 3]}\n"
    )
    cfg = load_project(tmp_path).config
    cuda = dict(session_providers(providers.get("cuda"), cfg))
    assert cuda["CUDAExecutionProvider"]["gpu_mem_limit"] == str(2 * 1024**3)
    trt = dict(session_providers(providers.get("tensorrt"), cfg))["TensorrtExecutionProvider"]
    assert trt["trt_fp16_enable"] == "true" and trt["trt_max_workspace_size"] == str(1024**3)
    assert trt["trt_profile_opt_shapes"] == "x:8x3" and trt["trt_engine_cache_path"] == "${GPUX_CACHE_DIR}/tensorrt"
    assert list(dict(session_providers(providers.get("tensorrt"), cfg))) == [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
