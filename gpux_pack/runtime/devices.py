"""What the device a model runs on is: the CPU (vendor, model, the ISA features compiled code may
use) and NVIDIA's GPU (through the driver API). Read by the runtime (a compiled cache's key, the
reason a plugin EP offers no device) and by the packager on the build host (plan, providers):
standard library only."""

from __future__ import annotations

import os
from pathlib import Path

# CPU features compiled code may depend on (x86 flags, aarch64 Features); the rest of
# /proc/cpuinfo (bugs, power management) does not change what a compiler emits.
ISA = {
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "asimddp", "asimdhp", "fphp", "sve", "sve2", "bf16", "i8mm", "sme",
}

def device_of(provider: str) -> str:
    """The device a provider compiles for: the GPU (name and compute capability) for NVIDIA's
    providers, else the CPU (model name and the ISA features compiled code may use)."""
    if provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        return nvidia_device()
    return cpu_device()


def cpu_device() -> str:
    _, model, flags = _cpuinfo()
    return f"cpu: {model} [{' '.join(sorted(flags))}]"


def cpu_vendor() -> tuple[str, str]:
    """('AuthenticAMD', 'AMD EPYC 7763 64-Core Processor'): which plugin EPs offer a device
    depends on it (OpenVINO's matches Intel's vendor id only)."""
    vendor, model, _ = _cpuinfo()
    return vendor or "unknown vendor", model


def _cpuinfo() -> tuple[str, str, set[str]]:
    """The first CPU's vendor id, model name and ISA flags from /proc/cpuinfo."""
    vendor, model, flags = "", os.uname().machine, set()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "vendor_id" and not vendor:
            vendor = value.strip()
        elif name in ("model name", "cpu model") and model == os.uname().machine:
            model = " ".join(value.split())
        elif name in ("flags", "features") and not flags:
            flags = set(value.split()) & ISA
    return vendor, model, flags


def no_device(ep: str, device: str, offered: list[str], vendor: str, model: str) -> str:
    """The one line said when a plugin EP offers no device of the kind asked for: by the
    runtime at start, and by `plan` and `providers` before a build."""
    if device == "CPU" and vendor != "GenuineIntel":
        why = f"this CPU is {vendor}, {model}; the plugin offers devices on Intel's (vendor id 0x8086) only"
    else:
        why = f"it offers {', '.join(sorted(set(offered))) or 'none'}" + (
            "; start the container with --device /dev/dri" if device in ("GPU", "NPU") else "")
    return f"the {ep} plugin offers no {device} device here: {why}"


def nvidia_device(index: int = 0) -> str:
    """'gpu: NVIDIA H200 sm90 (driver 13000)' through the driver API (libcuda.so.1, mounted by
    the NVIDIA container toolkit); 'gpu: none (...)' without one."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "gpu: none (libcuda.so.1 not found)"
    device, major, minor, version = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    name = ctypes.create_string_buffer(256)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), index) != 0:
        return "gpu: none (no CUDA device)"
    cuda.cuDeviceGetName(name, 256, device)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)
    cuda.cuDriverGetVersion(ctypes.byref(version))
    return f"gpu: {name.value.decode(errors='replace')} sm{major.value}{minor.value} (driver {version.value})"
