
import pytest

from gpux_pack import providers
from gpux_pack.project.load import load_project
from gpux_pack.engine import host_from
from gpux_pack.errors import UsageError
from gpux_pack.plan import execution_providers
from gpux_pack.providers import HostInfo, decide, parse_provider_list


def session_providers(provider, cfg):
    """The session options with the config's own TensorRT profiles (a plan derives them otherwise)."""
    profiles = {n: {"min": p.min, "opt": p.opt, "max": p.max} for n, p in cfg.pack.tensorrt.profiles.items()}
    return execution_providers(provider, cfg, profiles)

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


def test_table_is_complete():
    """A provider is a row of the table; every provider's Dockerfile is the one template's."""
    from gpux_pack.image.dockerfile import templates_dir

    assert set(providers.PROVIDERS) == {"cpu", "cuda", "tensorrt", "rocm", "migraphx", "openvino"}
    assert (templates_dir() / "base.Dockerfile.j2").is_file()
    for p in providers.PROVIDERS.values():
        assert p.execution_providers[-1] == "CPUExecutionProvider"
        assert "==" in p.pip_requirement  # pinned: the lock is reproducible only then
        assert p.libraries, f"{p.name} names no library to link-check"


def test_cuda_flavours_and_vendor_bases():
    cuda13, cuda12 = providers.get("cuda"), providers.get("cuda", cuda="12")
    assert cuda13.pip_requirement == "onnxruntime-gpu[cuda,cudnn]==1.31.1" and cuda13.cuda == "13"
    assert cuda12.pip_requirement == "onnxruntime-gpu[cuda,cudnn]==1.26.0" and cuda12.cuda == "12"
    assert providers.get("tensorrt", cuda="12").base_image == "nvcr.io/nvidia/tensorrt:25.03-py3"
    assert providers.get("cpu", cuda="12") == providers.get("cpu")  # the flavour only touches NVIDIA rows
    vendor = providers.base_for(cuda13, "vendor")
    assert vendor.image.startswith("nvidia/cuda:13.") and vendor.nvidia_libs == "base"
    assert vendor.apt_packages() == ("python3",)
    assert cuda13.requirement(vendor.nvidia_libs) == "onnxruntime-gpu==1.31.1"  # CUDA comes with the base
    assert providers.base_for(cuda12, "vendor").image.startswith("nvidia/cuda:12.")
    with pytest.raises(UsageError, match="cpu has no vendor base image"):
        providers.base_for(providers.get("cpu"), "vendor")
    custom = providers.base_for(cuda13, "registry.local/py:3.11")
    assert custom.image == "registry.local/py:3.11" and custom.has_python


def test_execution_providers_from_config(tmp_path):
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


def test_device_and_extra_provider_options(tmp_path):
    (tmp_path / "gpux.yml").write_text(
        "name: m\nmodel: {source: m.onnx}\npack:\n  device_id: 1\n  provider_options:\n"
        "    cuda: {cudnn_conv_algo_search: HEURISTIC, enable_cuda_graph: true}\n"
        "    OpenVINOExecutionProvider: {enable_qdq_optimizer: true}\n  openvino: {device: GPU, precision: f16}\n"
    )
    cfg = load_project(tmp_path).config
    cuda = dict(session_providers(providers.get("cuda"), cfg))["CUDAExecutionProvider"]
    assert cuda["device_id"] == "1" and cuda["cudnn_conv_algo_search"] == "HEURISTIC"
    assert cuda["enable_cuda_graph"] == "true" and cuda["arena_extend_strategy"] == "kNextPowerOfTwo"
    ov = dict(session_providers(providers.get("openvino"), cfg))["OpenVINOExecutionProvider"]
    # the plugin reads its settings from load_config only (device_type, num_of_threads: ignored, warned)
    assert ov == {"load_config": '{"GPU": {"INFERENCE_PRECISION_HINT": "f16"}}', "enable_qdq_optimizer": "true"}
    migraphx = dict(session_providers(providers.get("migraphx"), cfg))["MIGraphXExecutionProvider"]
    assert migraphx["device_id"] == "1" and migraphx["migraphx_model_cache_dir"] == "${GPUX_CACHE_DIR}/migraphx"
    (tmp_path / "gpux.yml").write_text("name: m\nmodel: {source: m.onnx}\npack:\n  provider_options: {cdua: {}}\n")
    with pytest.raises(Exception, match="unknown provider 'cdua' \\(did you mean 'cuda'"):
        load_project(tmp_path)


# Each pinned release's newest loadable IR version, ai.onnx and ai.onnx.ml opset, as
# bench/ort_limits.py measured them. A new pin without a new measurement fails here.
MEASURED = {
    "onnxruntime==1.32.0": (14, 28, 5),
    "onnxruntime-gpu==1.31.1": (13, 26, 5),
    "onnxruntime-gpu==1.26.0": (13, 26, 5),
    "onnxruntime-gpu==1.22.0": (10, 22, 5),
    "onnxruntime-rocm==1.22.2.post3": (10, 22, 5),
    "onnxruntime-migraphx==1.27.1": (13, 26, 5),
    "onnxruntime-openvino==1.24.1": (13, 25, 5),
}
ROWS = [(name, cuda) for name in providers.PROVIDERS for cuda in ("13", "12") if cuda == "13" or name in providers.CUDA12]


def _model_of_ir(folder, ir: int):
    from onnx import TensorProto, helper, save

    from gpux_pack.project.model import inspect_model

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g", [x], [y])
    path = folder / f"ir{ir}.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=ir), str(path))
    return inspect_model(path)


def test_every_pinned_release_has_measured_limits():
    for name, cuda in ROWS:
        row = providers.get(name, cuda)
        pin = f"{row.ort}=={row.version}"
        assert pin in MEASURED, f"{pin} ({name}, CUDA {cuda}) was not measured: run bench/ort_limits.py"
        assert (row.onnx_ir, row.onnx_opset, row.onnx_ml_opset) == MEASURED[pin], (name, cuda)


@pytest.mark.parametrize("name, cuda", ROWS)
def test_ir_version_newer_than_the_images_onnxruntime_loads_is_refused(tmp_path, name, cuda):
    from dataclasses import replace

    import onnx

    from gpux_pack.errors import ModelError
    from gpux_pack.plan import check_model_for

    row = providers.get(name, cuda)
    check_model_for(_model_of_ir(tmp_path, row.onnx_ir), row)  # its newest loads
    if row.onnx_ir < onnx.IR_VERSION:
        newer = _model_of_ir(tmp_path, row.onnx_ir + 1)
    else:  # the host's onnx cannot save it yet (its checker refuses it): the same model, stamped newer
        newer = replace(_model_of_ir(tmp_path, row.onnx_ir), ir_version=row.onnx_ir + 1,
                        path=tmp_path / f"ir{row.onnx_ir + 1}.onnx")
    with pytest.raises(ModelError) as refused:
        check_model_for(newer, row)
    assert refused.value.exit_code == 2
    assert str(refused.value) == (
        f"ir{row.onnx_ir + 1}.onnx: IR version {row.onnx_ir + 1}; {row.ort} {row.version} loads IR versions up to "
        f"{row.onnx_ir} (save it with an older IR version, e.g. onnx.helper.make_model(..., ir_version={row.onnx_ir}))"
    )


def test_gpux_provider_spellings_are_accepted_on_the_command_line():
    """GPUX matches `trt`, `TensorrtExecutionProvider` and `CUDAExecutionProvider` (any case)."""
    assert providers.parse_provider_list("trt,CUDAExecutionProvider") == ["tensorrt", "cuda"]
    assert providers.parse_provider_list("TensorrtExecutionProvider,OpenVINOExecutionProvider") == ["tensorrt", "openvino"]
    assert providers.parse_provider_list(" CUDA ") == ["cuda"]


def test_auto_says_why_cuda_and_not_tensorrt_on_an_nvidia_host():
    decision = providers.decide([], [], "auto", providers.HostInfo(nvidia=True, details="1 GPU"))
    assert decision.providers == ("cuda",) and "not tensorrt" in decision.reason and "--provider tensorrt" in decision.reason
