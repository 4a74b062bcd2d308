"""The execution-provider table, and the choice of a provider for a build.

A provider is data: one `Provider` row; every provider's Dockerfile is the one template's.
Versions, base images, libraries and the accelerator a container needs (the `Device` rows:
Docker flags, Compose entries, Kubernetes resources) live here, not in templates or commands,
so a new ONNX Runtime release is a one-line change and a new provider one row. Facts are from the wheels' METADATA and `readelf -d` of their provider libraries
(Nov 2026); none of the GPU rows has run on a GPU in this project's CI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from gpux_pack.errors import UsageError
from gpux_pack.runtime.contract import CACHE_PLACEHOLDER, no_device

# What the image's runtime imports besides onnxruntime (kept tiny: the runtime is slim).
# The image's runtime: uvicorn with httptools (its C HTTP parser; uvloop is left out: 14 MB
# installed for 1.07x the requests a second once bodies are read by simdjson), orjson (JSON with
# numpy arrays, no tolist), pysimdjson (a body's number arrays straight into NumPy, no Python
# object per number: runtime/number_arrays.py), prometheus-client (/metrics).
RUNTIME_REQUIREMENTS: tuple[str, ...] = ("numpy>=1.26", "uvicorn>=0.30,<1", "httptools>=0.6", "orjson>=3.10",
                                         "pysimdjson>=6", "prometheus-client>=0.20")

NVIDIA_DRIVER = ("libcuda.so.1", "libnvidia-ml.so.1", "libnvcuvid.so.1", "libnvidia-ptxjitcompiler.so.1")
NVIDIA_ENV = (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"))
NVIDIA_WHEEL_LIBS = ("nvidia/*/lib", "tensorrt_libs")  # nvidia/cu13/lib, nvidia/cudnn/lib, ...


@dataclass(frozen=True)
class Device:
    """An accelerator, and how each runtime hands it to a container."""

    name: str  # nvidia | amd | intel
    need: str  # "needs ..." / "has ..." in what `providers` and `run` say
    host_field: str  # the HostInfo flag that says the Docker host has it
    auto: str  # the provider `auto` picks on a host that has it
    found: str  # why `auto` picked it ({details}: the host's details)
    gpus: str | None = None  # docker run --gpus (the NVIDIA runtime or CDI)
    devices: tuple[str, ...] = ()  # docker run --device
    groups: tuple[str, ...] = ()  # docker run --group-add
    kubernetes: str = ""  # the resource name its Kubernetes device plugin offers

    @property
    def run_flags(self) -> str:
        return " ".join([*([f"--gpus {self.gpus}"] if self.gpus else []), *(f"--device {d}" for d in self.devices),
                         *(f"--group-add {g}" for g in self.groups)])


DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("nvidia", "an NVIDIA GPU (nvidia runtime or CDI)", "nvidia", "cuda",
               "exposes an NVIDIA GPU ({details}); cuda, not tensorrt (which GPUX ranks first): TensorRT compiles "
               "an engine for each GPU and input shape before it serves, minutes on a first start, and adds about "
               "1 GB of libraries; --provider tensorrt asks for it", gpus="all", kubernetes="nvidia.com/gpu"),
        Device("amd", "an AMD GPU (/dev/kfd)", "amd", "rocm", "has an AMD GPU (/dev/kfd)",
               devices=("/dev/kfd", "/dev/dri"), groups=("video",), kubernetes="amd.com/gpu"),
        Device("intel", "an Intel GPU (/dev/dri)", "intel_gpu", "openvino", "has an Intel GPU (/dev/dri)",
               devices=("/dev/dri",), kubernetes="gpu.intel.com/i915"),
    )
}


@dataclass(frozen=True)
class Devices:
    """What one container gets: --gpus, --device and --group-add."""

    gpus: str | None = None  # "all" or a count
    devices: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class BaseImage:
    """A base image a provider can build on: what the table knows of it, then (probed=True)
    what the image's own files say of its Python, glibc and architecture (read on the host
    from its exported root filesystem, never by running it)."""

    image: str
    python: str  # its Python, for locking wheels when the image cannot be inspected
    glibc: tuple[int, int]
    has_python: bool = True  # else python3 is installed with apt (vendor CUDA images)
    nvidia_libs: str = "wheels"  # "base": CUDA/cuDNN ship with the image, not as wheels
    system_packages: tuple[str, ...] = ()  # apt packages the provider needs on this base
    arch: str = "x86_64"  # x86_64 | aarch64
    probed: bool = False
    id: str = ""  # the image id, once inspected
    rootfs: str = ""  # its exported root filesystem on the host (what the link check reads)
    ld_library_path: tuple[str, ...] = ()  # its LD_LIBRARY_PATH, from the image config
    interpreter: str = ""  # its python3's absolute path, found by the probe ("": not probed, or none)
    workdir: str = ""  # its config's WorkingDir, once inspected ("": none, so /)

    def apt_packages(self) -> tuple[str, ...]:
        """apt packages the image needs on this base: python3 where the base lacks it."""
        return (*(() if self.has_python else ("python3",)), *self.system_packages)


@dataclass(frozen=True)
class Provider:
    name: str
    title: str
    ort: str  # the ONNX Runtime distribution
    version: str  # pinned: the lock is reproducible only if this is
    python: tuple[str, str]  # Python versions the wheel exists for (inclusive)
    min_glibc: tuple[int, int]  # the wheel's manylinux floor
    platforms: tuple[str, ...]
    execution_providers: tuple[str, ...]  # preference order, CPU last
    bases: dict[str, BaseImage]  # "default" and, for GPUs, the vendor's own image ("vendor")
    options: dict[str, dict[str, str]] = field(default_factory=dict)  # EP -> option defaults
    extras: tuple[str, ...] = ()  # ORT extras that bring NVIDIA's runtime wheels
    extra_requirements: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()  # provider libraries (in onnxruntime/capi) to link-check
    dlopen: tuple[str, ...] = ()  # loaded at run time by name: must resolve too
    library_dirs: tuple[str, ...] = ()  # site-packages globs the runtime preloads from
    driver_libs: tuple[str, ...] = ()  # come from the host's driver at `docker run`
    device: str | None = None  # a DEVICES key: the accelerator its containers need
    run_note: str = ""  # what `docker run` needs, for a provider whose device is optional
    warmup_bakes: bool = False  # warmup auto bakes its caches at build time on a host with the device
    cuda: str | None = None  # CUDA major version of this flavour
    # The TensorRT its TensorRT provider library was built with: the link check fails on an older
    # libnvinfer. Measured: the version the library passes to createInferBuilder_INTERNAL (objdump -d).
    tensorrt: str = ""
    link_hint: str = ""  # what to do when the link check fails
    plugin: str = ""  # Python module of a plugin EP library (get_library_path()), chosen by device
    ep_context: bool = False  # compiled with ONNX Runtime's compile API into an EP context model
    env: tuple[tuple[str, str], ...] = ()  # the image's environment for this provider
    # Newest model IR version and ai.onnx / ai.onnx.ml opsets this onnxruntime release loads (it
    # refuses newer ones: "Unsupported model IR version", "Opset N is under development"). Measured
    # by bench/ort_limits.py: models of IR 3-15, opset 7-30 and ml opset 1-8 loaded with the release
    # (onnxruntime, onnxruntime-openvino) or the CPU onnxruntime wheel of its number (the GPU
    # wheels; rocm 1.22.2 with 1.22.1, migraphx 1.27.1 with 1.27.0: no CPU wheel of that number).
    onnx_ir: int = field(kw_only=True)
    onnx_opset: int = field(kw_only=True)
    onnx_ml_opset: int = field(kw_only=True)

    @property
    def ep(self) -> str:
        """Its ONNX Runtime execution provider (the first; CPU comes last)."""
        return self.execution_providers[0]

    @property
    def run_flags(self) -> str:
        """What `docker run` needs for the device."""
        return DEVICES[self.device].run_flags if self.device else self.run_note

    def requirement(self, nvidia_libs: str = "wheels") -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras and nvidia_libs == "wheels" else ""
        return f"{self.ort}{extras}=={self.version}"

    def requirements(self, nvidia_libs: str = "wheels") -> tuple[str, ...]:
        return (self.requirement(nvidia_libs), *self.extra_requirements, *RUNTIME_REQUIREMENTS)

    @property
    def pip_requirement(self) -> str:
        """Its onnxruntime distribution, pinned, as pip names it."""
        return self.requirement()

    @property
    def base_image(self) -> str:
        return self.bases["default"].image


_CUDA_OPTIONS = {"device_id": "0", "arena_extend_strategy": "kNextPowerOfTwo", "cudnn_conv_algo_search": "EXHAUSTIVE"}
_TRT_OPTIONS = {
    "device_id": "0",
    "trt_fp16_enable": "false",
    "trt_int8_enable": "false",
    "trt_engine_cache_enable": "true",
    "trt_engine_cache_path": f"{CACHE_PLACEHOLDER}/tensorrt",
    "trt_timing_cache_enable": "true",
    "trt_timing_cache_path": f"{CACHE_PLACEHOLDER}/tensorrt",
}
_UBUNTU_2404 = (2, 39)
# What every NVIDIA row shares: the wheels' library folders, the driver's libraries, the device
# and its environment, CUDA 13 (pack.cuda: "12" swaps in the CUDA12 rows below).
_NVIDIA = dict(library_dirs=NVIDIA_WHEEL_LIBS, driver_libs=NVIDIA_DRIVER, device="nvidia", env=NVIDIA_ENV, cuda="13")
_TRT_BASE, _TRT_BASE_CUDA12 = "nvcr.io/nvidia/tensorrt:25.11-py3", "nvcr.io/nvidia/tensorrt:25.03-py3"

PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        Provider(
            name="cpu",
            title="CPU",
            ort="onnxruntime",
            version="1.32.0",  # the first release that loads IR 14 (onnx 1.23's make_model default)
            onnx_ir=14, onnx_opset=28, onnx_ml_opset=5,
            python=("3.11", "3.14"),
            min_glibc=(2, 28),
            platforms=("linux/amd64", "linux/arm64"),
            execution_providers=("CPUExecutionProvider",),
            bases={"default": BaseImage("python:3.11-slim", "3.11", (2, 36))},
            libraries=("libonnxruntime_providers_shared.so",),
        ),
        Provider(
            name="cuda",
            title="NVIDIA CUDA 13",
            ort="onnxruntime-gpu",
            version="1.31.1",  # the newest onnxruntime-gpu: no IR 14
            onnx_ir=13, onnx_opset=26, onnx_ml_opset=5,
            extras=("cuda", "cudnn"),
            python=("3.11", "3.14"),
            min_glibc=(2, 28),
            platforms=("linux/amd64", "linux/arm64"),  # aarch64: manylinux_2_34 wheels (GH200, Jetson Thor)
            execution_providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
            options={"CUDAExecutionProvider": _CUDA_OPTIONS},
            bases={
                "default": BaseImage("python:3.11-slim", "3.11", (2, 36)),
                "vendor": BaseImage("nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04", "3.12", _UBUNTU_2404,
                               has_python=False, nvidia_libs="base"),
            },
            libraries=("libonnxruntime_providers_cuda.so",),
            dlopen=("libcudnn.so.9",),
            **_NVIDIA,
            link_hint="take CUDA and cuDNN from NVIDIA's wheels (pack.nvidia_libs: wheels) or use --base-image vendor",
        ),
        Provider(
            name="tensorrt",
            title="NVIDIA TensorRT 10 (CUDA 13)",
            ort="onnxruntime-gpu",
            version="1.31.1",  # the newest onnxruntime-gpu: no IR 14
            onnx_ir=13, onnx_opset=26, onnx_ml_opset=5,
            python=("3.11", "3.14"),
            min_glibc=(2, 28),
            platforms=("linux/amd64",),
            execution_providers=("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
            options={"TensorrtExecutionProvider": _TRT_OPTIONS, "CUDAExecutionProvider": _CUDA_OPTIONS},
            # 0x18c19 = NV_TENSORRT_VERSION 101401 in libonnxruntime_providers_tensorrt.so of 1.31.1
            tensorrt="10.14.1",
            # 25.11: TensorRT 10.14.1, CUDA 13.0, cuDNN 9, Python 3.12, Ubuntu 24.04, the first release
            # with the TensorRT that ORT 1.31.1 was built with (25.10 has TensorRT 10.13; 25.12 and
            # later move to CUDA 13.1). Projects that pull 25.11 (and 25.12) report TensorRT 10.14.1;
            # NVIDIA's release notes page for 25.11 was not reachable from here.
            bases={"default": BaseImage(_TRT_BASE, "3.12", _UBUNTU_2404, nvidia_libs="base")},
            libraries=("libonnxruntime_providers_tensorrt.so", "libonnxruntime_providers_cuda.so"),
            dlopen=("libcudnn.so.9", "libnvinfer_plugin.so.10"),
            **_NVIDIA,
            link_hint=f"use NVIDIA's TensorRT container {_TRT_BASE} or newer as the base image",
            warmup_bakes=True,  # its engines take minutes to build
        ),
        Provider(
            name="rocm",
            title="AMD ROCm 7.2",
            ort="onnxruntime-rocm",
            version="1.22.2.post3",
            onnx_ir=10, onnx_opset=22, onnx_ml_opset=5,
            # no Requires-Dist in the wheel: its imports are listed here
            extra_requirements=("numpy", "protobuf", "flatbuffers", "packaging"),
            python=("3.10", "3.14"),
            min_glibc=(2, 34),
            platforms=("linux/amd64",),
            execution_providers=("ROCMExecutionProvider", "CPUExecutionProvider"),
            options={"ROCMExecutionProvider": {"device_id": "0", "arena_extend_strategy": "kNextPowerOfTwo",
                                               "tunable_op_enable": "0"}},
            bases={"default": BaseImage("rocm/dev-ubuntu-24.04:7.2", "3.12", _UBUNTU_2404)},
            libraries=("libonnxruntime_providers_rocm.so",),
            link_hint="use a ROCm 7.2 base image such as rocm/dev-ubuntu-24.04:7.2",
            device="amd",
        ),
        Provider(
            name="migraphx",
            title="AMD MIGraphX (ROCm 7.2)",
            ort="onnxruntime-migraphx",
            version="1.27.1",
            onnx_ir=13, onnx_opset=26, onnx_ml_opset=5,
            python=("3.11", "3.14"),
            min_glibc=(2, 34),
            platforms=("linux/amd64",),
            execution_providers=("MIGraphXExecutionProvider", "CPUExecutionProvider"),
            options={"MIGraphXExecutionProvider": {"device_id": "0", "migraphx_fp16_enable": "0",
                                                   "migraphx_model_cache_dir": f"{CACHE_PLACEHOLDER}/migraphx"}},
            bases={"default": BaseImage("rocm/dev-ubuntu-24.04:7.2", "3.12", _UBUNTU_2404, system_packages=("migraphx",))},
            libraries=("libonnxruntime_providers_migraphx.so",),
            link_hint="use a ROCm 7.2 base image with the migraphx package",
            device="amd",
        ),
        Provider(
            name="openvino",
            title="Intel OpenVINO 2026.4 (plugin EP)",
            # Intel's plugin execution provider (ONNX Runtime's EP ABI) on the plain onnxruntime
            # wheel: it ships OpenVINO's IR reader, so compiled models import again (the old
            # onnxruntime-openvino 1.24.1 could not read the blobs it wrote, and loads no IR 14).
            ort="onnxruntime",
            version="1.32.0",
            onnx_ir=14, onnx_opset=28, onnx_ml_opset=5,  # what onnxruntime loads; unsupported nodes run on CPU
            extra_requirements=("onnxruntime-ep-openvino==1.8.1",),
            plugin="onnxruntime_ep_openvino",
            ep_context=True,
            python=("3.11", "3.14"),
            min_glibc=(2, 28),
            platforms=("linux/amd64",),
            execution_providers=("OpenVINOExecutionProvider", "CPUExecutionProvider"),
            bases={"default": BaseImage("python:3.11-slim", "3.11", (2, 36))},
            libraries=("onnxruntime_ep_openvino/libonnxruntime_providers_openvino_plugin.so",
                       "onnxruntime_ep_openvino/libopenvino_intel_cpu_plugin.so"),
            run_note="(Intel GPU: --device /dev/dri)",
        ),
    )
}

# pack.cuda: "12" -> these rows replace the CUDA 13 ones (ORT <= 1.26 is built for CUDA 12).
CUDA12: dict[str, dict[str, Any]] = {
    "cuda": {
        "title": "NVIDIA CUDA 12",
        "version": "1.26.0",
        "onnx_ir": 13, "onnx_opset": 26, "onnx_ml_opset": 5,
        "cuda": "12",
        "platforms": ("linux/amd64",),  # 1.26.0 has no aarch64 wheel
        "bases": {
            "default": BaseImage("python:3.11-slim", "3.11", (2, 36)),
            "vendor": BaseImage("nvidia/cuda:12.9.1-cudnn-runtime-ubuntu24.04", "3.12", _UBUNTU_2404,
                           has_python=False, nvidia_libs="base"),
        },
    },
    "tensorrt": {
        # ORT 1.22 is documented with TensorRT 10.9 and CUDA 12.0-12.8: the 25.03 container
        # (TensorRT 10.9.0, CUDA 12.8.1, Python 3.12, Ubuntu 24.04)
        "title": "NVIDIA TensorRT 10 (CUDA 12)",
        "version": "1.22.0",
        "onnx_ir": 10, "onnx_opset": 22, "onnx_ml_opset": 5,
        "cuda": "12",
        "tensorrt": "10.9.0",  # its provider library passes 0x18a24 = NV_TENSORRT_VERSION 100900
        "bases": {"default": BaseImage(_TRT_BASE_CUDA12, "3.12", _UBUNTU_2404, nvidia_libs="base")},
        "link_hint": f"use NVIDIA's TensorRT container {_TRT_BASE_CUDA12} or newer (CUDA 12) as the base image",
    },
}

# Short provider names (gpux.yml, --provider, GPUX_PROVIDERS) -> ONNX Runtime execution providers.
# The image's runtime gets this table in gpux.json (plan.gpux_json): one table for both sides.
EP_NAMES: dict[str, str] = {name: row.ep for name, row in PROVIDERS.items()}
# EPs that run on the CPU's cores: the runtime gives them one worker and every core.
CPU_EPS: tuple[str, ...] = tuple(row.ep for row in PROVIDERS.values() if row.device is None)
# What AMD's and NVIDIA's providers call a memory limit (runtime.gpu.memory).
MEMORY_OPTION: dict[str, str] = {"CUDAExecutionProvider": "gpu_mem_limit", "ROCMExecutionProvider": "gpu_mem_limit",
                                 "MIGraphXExecutionProvider": "migraphx_mem_limit"}


def names_help(several: bool = True) -> str:
    """The --provider help: every row's name, from the table."""
    return f"auto, {', '.join(PROVIDERS)}" + ("; several: cpu,openvino." if several else ".")

# GPUX backends that name no Linux execution provider: rejected with a reason.
NOT_FOR_LINUX: dict[str, str] = {
    "coreml": "CoreML is Apple-only",
    "metal": "Metal is Apple-only",
    "directml": "DirectML is Windows-only",
    "dx12": "DirectX 12 is Windows-only",
    "vulkan": "ONNX Runtime has no Vulkan execution provider",
}


def get(name: str, cuda: str = "13") -> Provider:
    """A provider row, in the CUDA flavour asked for (the flavour only changes NVIDIA rows)."""
    row = PROVIDERS[name]
    if cuda == "12" and name in CUDA12:
        row = replace(row, **CUDA12[name])
    return row


def base_for(provider: Provider, choice: str | None) -> BaseImage:
    """`None`/"default" -> the provider's default base; "vendor" -> the vendor's image;
    anything else is an image reference, assumed to carry Python like the default."""
    if choice in (None, "default", "vendor"):
        key = choice or "default"
        if key not in provider.bases:
            raise UsageError(f"{provider.name} has no vendor base image; give an image reference instead")
        return provider.bases[key]
    default = provider.bases["default"]
    return BaseImage(choice, default.python, provider.min_glibc, True, default.nvidia_libs, default.system_packages)


# ---------------------------------------------------------------------------------------------
# Choosing providers for a build


@dataclass(frozen=True)
class HostInfo:
    """What the Docker host can give a container (read from `docker info` and /dev)."""

    nvidia: bool = False  # NVIDIA runtime or CDI devices
    amd: bool = False  # /dev/kfd
    intel_gpu: bool = False  # /dev/dri with an Intel card
    details: str = ""
    cpu: tuple[str, str] = ("", "")  # (vendor id, model) of a local engine's CPU; unknown: ("", "")

    def can_run(self, provider: Provider) -> tuple[bool, str]:
        refusal = self.plugin_refusal(provider)
        if refusal:
            return False, refusal
        if provider.device is None:
            return True, "needs no accelerator"
        device = DEVICES[provider.device]
        return (True, f"has {device.need}") if self.has(device.name) else (False, f"needs {device.need}")

    def has(self, device: str | None) -> bool:
        """Whether containers here can get this accelerator (a DEVICES key)."""
        return device is not None and bool(getattr(self, DEVICES[device].host_field))

    def plugin_refusal(self, provider: Provider, device: str = "CPU") -> str:
        """The runtime's own line when the provider's plugin would offer no device here (it
        would serve on the CPU provider instead); "" when it would, or when the CPU is unknown."""
        vendor, model = self.cpu
        if not provider.plugin or not vendor or vendor == "GenuineIntel" or device != "CPU":
            return ""
        return no_device(provider.ep, device, [], vendor, model)


@dataclass(frozen=True)
class Decision:
    providers: tuple[str, ...]
    reason: str
    from_host: bool = False  # `auto` all the way: the Docker host decided (or would have)


# GPUX's other spellings: its short name for TensorRT and ONNX Runtime's own EP names, any case
PROVIDER_ALIASES: dict[str, str] = {
    "trt": "tensorrt",
    **{ep.lower(): name for name, ep in EP_NAMES.items()},
    "coremlexecutionprovider": "coreml",
    "dmlexecutionprovider": "directml",
}


def provider_alias(raw: object) -> object:
    """'CUDA', 'trt', 'CUDAExecutionProvider' -> the table's name; anything else as it was."""
    if not isinstance(raw, str):
        return raw
    item = raw.strip().lower()
    return PROVIDER_ALIASES.get(item, item)


def provider_name(raw: str) -> str:
    """'OpenVINO ' -> 'openvino', 'trt' -> 'tensorrt'. The one check of a provider name, for
    pack.providers and --provider alike (the runtime reads the same EP_NAMES table, from gpux.json,
    for GPUX_PROVIDERS)."""
    if not isinstance(raw, str):
        raise ValueError(f"{raw!r} is not a provider name")
    item = str(provider_alias(raw))
    if item and item != "auto" and item not in PROVIDERS:
        shown = ascii(raw) if not raw.isprintable() else f"'{raw}'"
        hint = f"; {NOT_FOR_LINUX[item]}" if item in NOT_FOR_LINUX else ""
        raise ValueError(f"unknown provider {shown} (choose from auto, {', '.join(PROVIDERS)}){hint}")
    return item


def provider_names(items: list[str]) -> list[str]:
    """Checked names, order kept, no repeats or blanks."""
    return list(dict.fromkeys(n for n in map(provider_name, items) if n))


def parse_provider_list(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """--provider 'cpu,openvino' -> ['cpu', 'openvino']; an unknown name is a usage error."""
    if value is None:
        return []
    try:
        return provider_names(value.split(",") if isinstance(value, str) else list(value))
    except ValueError as e:
        raise UsageError(f"--provider: {e}") from None


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
        return Decision(("cpu",), "auto: the Docker host could not be inspected, so cpu", True)
    for device in DEVICES.values():  # in the table's order: NVIDIA, AMD, Intel
        if host.has(device.name):
            return Decision((device.auto,), "auto: the Docker host " + device.found.format(details=host.details), True)
    return Decision(("cpu",), "auto: the Docker host has no GPU that containers can use, so cpu", True)


def devices_for(provider: Provider | None, gpus: str | None = None, device: tuple[str, ...] = ()) -> Devices:
    """The command line's --gpus / --device, else what the provider's accelerator needs."""
    if gpus is not None and gpus != "all" and not (gpus.isdigit() and 0 < int(gpus) < 1000):
        raise UsageError(f"--gpus {gpus!r}: expected all or a number of GPUs")
    for d in device:
        if not re.fullmatch(r"/dev/[A-Za-z0-9._/-]{1,200}", d) or ".." in d.split("/"):
            raise UsageError(f"--device {d!r}: expected a device path such as /dev/dri")
    if gpus or device:
        return Devices(gpus, tuple(device))
    if provider is None or provider.device is None:
        return Devices()
    row = DEVICES[provider.device]
    return Devices(row.gpus, row.devices, row.groups)
