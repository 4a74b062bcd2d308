"""The execution-provider table, and the choice of a provider for a build.

A provider is data: one `Provider` row plus a small template in templates/. Versions live here,
not in templates, so a new ONNX Runtime release is a one-line change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpux_pack.errors import UsageError

# What the image's runtime imports besides onnxruntime (kept tiny: the runtime is slim).
RUNTIME_REQUIREMENTS: tuple[str, ...] = ("numpy>=1.26", "uvicorn>=0.30,<1")


@dataclass(frozen=True)
class Provider:
    name: str
    title: str
    package: str  # the ORT requirement, pinned: the lock is reproducible only if this is
    ort_dist: str  # distribution name to read the locked ORT version from
    base_image: str  # default base; --base-image / pack.base_image replace it
    python: str  # Python of the default base image (wheels are resolved for it)
    min_glibc: tuple[int, int]  # the ORT wheel's manylinux floor
    platforms: tuple[str, ...]
    execution_providers: tuple[str, ...]  # ORT EP names, in preference order, CPU last
    device: str | None = None  # accelerator the container needs at run time: nvidia | amd | intel
    extra_requirements: tuple[str, ...] = ()
    template: str = ""
    notes: str = ""
    libraries: tuple[str, ...] = field(default=())  # shared libraries the EP must resolve

    @property
    def requirements(self) -> tuple[str, ...]:
        return (self.package, *self.extra_requirements, *RUNTIME_REQUIREMENTS)

    @property
    def template_name(self) -> str:
        return self.template or f"{self.name}.Dockerfile.j2"


PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        Provider(
            name="cpu",
            title="CPU",
            package="onnxruntime==1.31.1",
            ort_dist="onnxruntime",
            base_image="python:3.11-slim",
            python="3.11",
            min_glibc=(2, 28),
            platforms=("linux/amd64", "linux/arm64"),
            execution_providers=("CPUExecutionProvider",),
        ),
        Provider(
            name="cuda",
            title="NVIDIA CUDA 13",
            package="onnxruntime-gpu[cuda,cudnn]==1.31.1",
            ort_dist="onnxruntime-gpu",
            base_image="python:3.11-slim",
            python="3.11",
            min_glibc=(2, 28),
            platforms=("linux/amd64",),
            execution_providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
            device="nvidia",
            notes="CUDA/cuDNN come from NVIDIA's PyPI wheels; the driver (libcuda.so.1) from the host",
        ),
        Provider(
            name="tensorrt",
            title="NVIDIA TensorRT 10",
            package="onnxruntime-gpu==1.31.1",
            ort_dist="onnxruntime-gpu",
            base_image="nvcr.io/nvidia/tensorrt:25.10-py3",
            python="3.12",
            min_glibc=(2, 28),
            platforms=("linux/amd64",),
            execution_providers=(
                "TensorrtExecutionProvider",
                "CUDAExecutionProvider",
                "CPUExecutionProvider",
            ),
            device="nvidia",
            notes="TensorRT, CUDA and cuDNN come from NVIDIA's TensorRT base image",
        ),
        Provider(
            name="rocm",
            title="AMD ROCm 7.2",
            package="onnxruntime-rocm==1.22.2.post3",
            ort_dist="onnxruntime-rocm",
            # onnxruntime-rocm declares no dependencies: its imports are listed here.
            extra_requirements=("protobuf", "flatbuffers", "packaging"),
            base_image="rocm/dev-ubuntu-24.04:7.2",
            python="3.12",
            min_glibc=(2, 34),
            platforms=("linux/amd64",),
            execution_providers=("ROCMExecutionProvider", "CPUExecutionProvider"),
            device="amd",
        ),
        Provider(
            name="openvino",
            title="Intel OpenVINO 2025.4",
            package="onnxruntime-openvino==1.24.1",
            ort_dist="onnxruntime-openvino",
            base_image="python:3.11-slim",
            python="3.11",
            min_glibc=(2, 28),
            platforms=("linux/amd64",),
            execution_providers=("OpenVINOExecutionProvider", "CPUExecutionProvider"),
        ),
    )
}

# GPUX backends that name no Linux execution provider: rejected with a reason.
NOT_FOR_LINUX: dict[str, str] = {
    "coreml": "CoreML is Apple-only",
    "metal": "Metal is Apple-only",
    "directml": "DirectML is Windows-only",
    "dx12": "DirectX 12 is Windows-only",
    "vulkan": "ONNX Runtime has no Vulkan execution provider",
}


def get(name: str) -> Provider:
    return PROVIDERS[name]


# ---------------------------------------------------------------------------------------------
# Choosing providers for a build


@dataclass(frozen=True)
class HostInfo:
    """What the Docker host can give a container (read from `docker info` and /dev)."""

    nvidia: bool = False  # NVIDIA runtime or CDI devices
    amd: bool = False  # /dev/kfd
    intel_gpu: bool = False  # /dev/dri with an Intel card
    details: str = ""

    def can_run(self, provider: Provider) -> tuple[bool, str]:
        if provider.device is None:
            return True, "needs no accelerator"
        has = {"nvidia": self.nvidia, "amd": self.amd, "intel": self.intel_gpu}[provider.device]
        need = {
            "nvidia": "an NVIDIA GPU exposed to Docker (nvidia runtime or CDI)",
            "amd": "/dev/kfd and /dev/dri on the Docker host",
            "intel": "an Intel GPU at /dev/dri",
        }[provider.device]
        return (True, f"host has {need}") if has else (False, f"needs {need}; not found")


@dataclass(frozen=True)
class Decision:
    providers: tuple[str, ...]
    reason: str


def parse_provider_list(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """'cpu,openvino' or ['cpu', 'openvino'] -> ['cpu', 'openvino'] (order kept, no repeats);
    an unknown name is a usage error."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in (i.strip().lower() for i in items):
        if item and item != "auto" and item not in PROVIDERS:
            hint = f"; {NOT_FOR_LINUX[item]}" if item in NOT_FOR_LINUX else ""
            raise UsageError(f"--provider: unknown provider '{item}' (choose from auto, {', '.join(PROVIDERS)}){hint}")
        if item and item not in out:
            out.append(item)
    return out


def decide(
    cli: list[str], pack_providers: list[str], backend: str, host: HostInfo | None
) -> Decision:
    """Pick the build's providers: --provider, then pack.providers, then runtime.gpu.backend,
    then what the Docker host has. `auto` anywhere defers to the next source."""
    for source, names in (("--provider", cli), ("pack.providers", pack_providers)):
        concrete = [n for n in names if n != "auto"]
        if concrete:
            return Decision(tuple(concrete), f"{source} asks for {', '.join(concrete)}")
    if backend and backend != "auto":
        return Decision((backend,), f"runtime.gpu.backend is {backend}")
    if host is None:
        return Decision(("cpu",), "auto: the Docker host could not be inspected, so cpu")
    if host.nvidia:
        return Decision(("cuda",), "auto: the Docker host exposes an NVIDIA GPU")
    if host.amd:
        return Decision(("rocm",), "auto: the Docker host has an AMD GPU (/dev/kfd)")
    if host.intel_gpu:
        return Decision(("openvino",), "auto: the Docker host has an Intel GPU (/dev/dri)")
    return Decision(("cpu",), "auto: the Docker host has no GPU that containers can use, so cpu")


# ---------------------------------------------------------------------------------------------
# Session options the image's runtime passes to ONNX Runtime

CACHE = "${GPUX_CACHE_DIR}"  # expanded by the runtime: the container's own cache dir


def session_providers(provider: Provider, config) -> list[list]:
    """[[EP name, options], ...] for gpux.json, from runtime.gpu and pack.tensorrt.

    Values are strings, as ONNX Runtime parses them; booleans as "true"/"false"."""
    gpu, trt = config.runtime.gpu, config.pack.tensorrt
    cuda: dict[str, str] = {
        "device_id": "0",
        "arena_extend_strategy": "kNextPowerOfTwo",
        "cudnn_conv_algo_search": "EXHAUSTIVE",
    }
    if gpu.memory:
        cuda["gpu_mem_limit"] = str(gpu.memory)
    tensorrt: dict[str, str] = {
        "device_id": "0",
        "trt_fp16_enable": _flag(trt.fp16),
        "trt_int8_enable": _flag(trt.int8),
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": f"{CACHE}/tensorrt",
        "trt_timing_cache_enable": "true",
        "trt_timing_cache_path": f"{CACHE}/tensorrt",
    }
    if trt.workspace:
        tensorrt["trt_max_workspace_size"] = str(trt.workspace)
    if trt.profiles:
        for point in ("min", "opt", "max"):
            tensorrt[f"trt_profile_{point}_shapes"] = ",".join(
                f"{name}:{'x'.join(str(d) for d in getattr(p, point))}" for name, p in trt.profiles.items()
            )
    rocm: dict[str, str] = {"device_id": "0", "arena_extend_strategy": "kNextPowerOfTwo"}
    if gpu.memory:
        rocm["gpu_mem_limit"] = str(gpu.memory)
    options = {
        "CPUExecutionProvider": {},
        "CUDAExecutionProvider": cuda,
        "TensorrtExecutionProvider": tensorrt,
        "ROCMExecutionProvider": rocm,
        "OpenVINOExecutionProvider": {"device_type": "CPU", "cache_dir": f"{CACHE}/openvino"},
    }
    return [[ep, options[ep]] for ep in provider.execution_providers]


def _flag(value: bool) -> str:
    return "true" if value else "false"
