"""The wheel locks of the GPU providers: the right ONNX Runtime package and runtime wheels for
linux/amd64 and the base image's Python. Resolution only (uv, against the package index): no
gigabytes of NVIDIA wheels are downloaded."""

import shutil
from pathlib import Path

import pytest

from gpux_pack import wheels
from gpux_pack.pipeline.build import load, plan_for
from gpux_pack.plan import Options
from gpux_pack.ui import Reporter

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.network  # uv resolves against the package index


def lock(tmp_path: Path, provider: str, pack: str = "", **options) -> tuple[wheels.Lock, dict[str, str]]:
    shutil.copytree(ROOT / "examples" / "mlp", tmp_path / "mlp")
    config = tmp_path / "mlp" / "gpux.yml"
    config.write_text(config.read_text() + ("pack:\n" + pack if pack else ""))
    loaded = load(tmp_path / "mlp")
    plan = plan_for(loaded, provider, "test", Options(**options), None, Reporter(quiet=True), pull=False)
    result = wheels.resolve(plan.requirements, plan.target)
    assert result.target.arch == "x86_64"
    return result, {p.name: p.version for p in result.pins}


def nvidia(pins: dict[str, str]) -> set[str]:
    return {name for name in pins if name.startswith("nvidia-")}


def test_cuda13(tmp_path):
    result, pins = lock(tmp_path, "cuda")
    assert result.target.python == "3.11"
    assert pins["onnxruntime-gpu"] == "1.31.1" and "onnxruntime" not in pins
    assert {"nvidia-cudnn-cu13", "nvidia-cublas", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc", "nvidia-cufft",
            "nvidia-curand"} <= nvidia(pins)
    assert pins["nvidia-cudnn-cu13"].startswith("9.")
    assert not any(name.endswith("-cu12") for name in pins)


def test_cuda12(tmp_path):
    _, pins = lock(tmp_path, "cuda", "  cuda: '12'\n")
    assert pins["onnxruntime-gpu"] == "1.26.0"
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-nvrtc-cu12",
            "nvidia-cufft-cu12", "nvidia-curand-cu12"} <= nvidia(pins)
    assert pins["nvidia-cuda-runtime-cu12"].startswith("12.")
    assert not any(name.endswith("-cu13") for name in pins) and "nvidia-cuda-runtime" not in pins


def test_cuda_vendor_base_takes_no_nvidia_wheels(tmp_path):
    result, pins = lock(tmp_path, "cuda", base_image="vendor")
    assert result.target.python == "3.12" and pins["onnxruntime-gpu"] == "1.31.1"
    assert nvidia(pins) == set()


@pytest.mark.parametrize("flavour, version", [("13", "1.31.1"), ("12", "1.22.0")])
def test_tensorrt(tmp_path, flavour, version):
    result, pins = lock(tmp_path, "tensorrt", f"  cuda: '{flavour}'\n")
    assert result.target.python == "3.12"  # the TensorRT container's Python
    assert pins["onnxruntime-gpu"] == version
    assert nvidia(pins) == set()  # CUDA, cuDNN and TensorRT come with the TensorRT base image


def test_rocm(tmp_path):
    result, pins = lock(tmp_path, "rocm")
    assert result.target.python == "3.12" and result.target.glibc >= (2, 34)
    assert pins["onnxruntime-rocm"] == "1.22.2.post3"
    assert {"numpy", "protobuf", "flatbuffers", "packaging"} <= set(pins)  # the wheel declares none
    assert nvidia(pins) == set() and "onnxruntime" not in pins


def test_migraphx(tmp_path):
    _, pins = lock(tmp_path, "migraphx")
    assert pins["onnxruntime-migraphx"] == "1.27.1"
    assert nvidia(pins) == set() and "onnxruntime-rocm" not in pins


def test_openvino(tmp_path):
    _, pins = lock(tmp_path, "openvino")
    assert pins["onnxruntime"] == "1.32.0" and pins["onnxruntime-ep-openvino"] == "1.8.1"
    assert "onnxruntime-openvino" not in pins  # the plugin EP runs on the plain wheel
