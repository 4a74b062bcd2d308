"""TensorRT, correct by construction: the exact session options and warmup key parts the image
hands ONNX Runtime, and the link check refusing a TensorRT older than the one the provider
library was built with (real ELF files in a fake root filesystem; nothing runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gpux_pack import providers
from gpux_pack.errors import BuildError
from gpux_pack.image.dockerfile import link_check_command
from gpux_pack.install import check_links
from gpux_pack.plan import RuntimeBase, execution_providers
from gpux_pack.runtime.contract import SITE
from gpux_pack.project.load import load_project
from gpux_pack.providers import BaseImage
from gpux_pack import linkcheck
from gpux_pack.runtime import caches
from gpux_pack.wheels import Installed

ROOT = Path(__file__).resolve().parents[2]
H100 = "gpu: NVIDIA H100 80GB HBM3 sm90 (driver 13000)"
ARCH = os.uname().machine
LIBDIR = f"/usr/lib/{linkcheck.TRIPLETS.get(ARCH, ARCH)}"
PROVIDER_LIB = "libonnxruntime_providers_tensorrt.so"


def test_the_rows_record_the_tensorrt_their_provider_library_was_built_with():
    trt, trt12 = providers.get("tensorrt"), providers.get("tensorrt", cuda="12")
    assert (trt.version, trt.tensorrt, trt.base_image) == ("1.31.1", "10.14.1", "nvcr.io/nvidia/tensorrt:25.11-py3")
    assert (trt12.version, trt12.tensorrt, trt12.base_image) == ("1.22.0", "10.9.0",
                                                                  "nvcr.io/nvidia/tensorrt:25.03-py3")
    assert trt.base_image in trt.link_hint and trt12.base_image in trt12.link_hint
    assert all(not p.tensorrt for name, p in providers.PROVIDERS.items() if name != "tensorrt")
    assert "--tensorrt 10.14.1" in link_check_command(trt)  # the check in an image gets it too


# ---------------------------------------------------------------------------------------------
# session options and warmup key


def trt_options(tmp_path: Path, pack: str) -> dict[str, str]:
    (tmp_path / "gpux.yml").write_text("name: m\nmodel: {source: m.onnx}\npack:\n" + pack)
    cfg = load_project(tmp_path).config
    profiles = {n: {"min": p.min, "opt": p.opt, "max": p.max} for n, p in cfg.pack.tensorrt.profiles.items()}
    eps = execution_providers(providers.get("tensorrt"), cfg, profiles)
    assert [name for name, _ in eps] == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    return dict(eps)["TensorrtExecutionProvider"]


def test_every_tensorrt_option_exactly(tmp_path):
    opts = trt_options(tmp_path, "  device_id: 1\n  tensorrt:\n    fp16: true\n    int8: true\n    workspace: 2GB\n"
                                 "    ep_context: true\n    profiles:\n"
                                 "      x: {min: [1, 3], opt: [8, 3], max: [64, 3]}\n"
                                 "      mask: {min: [1], opt: [8], max: [64]}\n")
    assert opts == {
        "device_id": "1",
        "trt_fp16_enable": "true",
        "trt_int8_enable": "true",
        "trt_max_workspace_size": str(2 * 1024**3),
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": "${GPUX_CACHE_DIR}/tensorrt",
        "trt_timing_cache_enable": "true",
        "trt_timing_cache_path": "${GPUX_CACHE_DIR}/tensorrt",
        "trt_profile_min_shapes": "x:1x3,mask:1",
        "trt_profile_opt_shapes": "x:8x3,mask:8",
        "trt_profile_max_shapes": "x:64x3,mask:64",
        "trt_dump_ep_context_model": "true",
        "trt_ep_context_file_path": "${GPUX_CACHE_DIR}/model_ctx.onnx",
        "trt_ep_context_embed_mode": "1",
    }


def test_the_defaults_set_no_workspace_profiles_or_ep_context(tmp_path):
    assert trt_options(tmp_path, "  tensorrt: {}\n") == {
        "device_id": "0",
        "trt_fp16_enable": "false",
        "trt_int8_enable": "false",
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": "${GPUX_CACHE_DIR}/tensorrt",
        "trt_timing_cache_enable": "true",
        "trt_timing_cache_path": "${GPUX_CACHE_DIR}/tensorrt",
    }


def test_the_warmup_key_has_the_options_without_cache_paths_and_the_device(tmp_path):
    opts = trt_options(tmp_path, "  tensorrt:\n    fp16: true\n    workspace: 1GB\n    ep_context: true\n"
                                 "    profiles: {x: {min: [1, 3], opt: [8, 3], max: [64, 3]}}\n")
    sha256 = "ab" * 32
    libs = {"onnxruntime-gpu": "1.31.1"}
    parts = caches.key_parts(sha256, "TensorrtExecutionProvider", opts, [{"x": [1, 3]}], "1.31.1", device=H100,
                           libraries=libs)
    assert parts["device"] == H100 and parts["libraries"] == libs and parts["provider"] == "TensorrtExecutionProvider"
    assert parts["options"] == {  # sorted; where a cache lives is not what it holds
        "device_id": "0",
        "trt_dump_ep_context_model": "true",
        "trt_engine_cache_enable": "true",
        "trt_ep_context_embed_mode": "1",
        "trt_fp16_enable": "true",
        "trt_int8_enable": "false",
        "trt_max_workspace_size": str(1024**3),
        "trt_profile_max_shapes": "x:64x3",
        "trt_profile_min_shapes": "x:1x3",
        "trt_profile_opt_shapes": "x:8x3",
        "trt_timing_cache_enable": "true",
    }
    assert list(parts["options"]) == sorted(parts["options"])
    moved = caches.key_parts(sha256, "TensorrtExecutionProvider", {**opts, "trt_engine_cache_path": "${GPUX_CACHE_DIR}/x"},
                           [{"x": [1, 3]}], "1.31.1", device=H100, libraries=libs)
    assert caches.digest(moved) == caches.digest(parts)
    other_gpu = caches.key_parts(sha256, "TensorrtExecutionProvider", opts, [{"x": [1, 3]}], "1.31.1",
                               device=H100.replace("H100 80GB HBM3 sm90", "A100-SXM4-80GB sm80"), libraries=libs)
    assert caches.digest(other_gpu) != caches.digest(parts) and caches.short(parts).startswith("sm90-")


# ---------------------------------------------------------------------------------------------
# the link check compares TensorRT versions


@pytest.fixture
def elf(tmp_path):
    """A fake libnvinfer (soname libnvinfer.so.10) and a provider library needing it."""
    if not shutil.which("gcc"):
        pytest.fail("gcc is needed to compile the test libraries")
    out = tmp_path / "elf"
    out.mkdir()
    (out / "nvinfer.c").write_text("int createInferBuilder_INTERNAL(void) { return 0; }\n")
    (out / "provider.c").write_text("int createInferBuilder_INTERNAL(void);\n"
                                    "int p(void) { return createInferBuilder_INTERNAL(); }\n")
    run = lambda *args: subprocess.run(args, cwd=out, check=True, capture_output=True)  # noqa: E731
    run("gcc", "-shared", "-fPIC", "-o", "libnvinfer.so.10", "nvinfer.c", "-Wl,-soname,libnvinfer.so.10")
    run("gcc", "-shared", "-fPIC", "-o", PROVIDER_LIB, "provider.c", "-L.", "-l:libnvinfer.so.10")
    return out


def image(tmp_path: Path, elf: Path, nvinfer: str | None) -> tuple[Path, Path]:
    """A root filesystem with libnvinfer.so.10 -> <nvinfer> (as NVIDIA's .deb installs it; None:
    no TensorRT in the base), and a site-packages with onnxruntime 1.31.1's provider library."""
    root, site = tmp_path / "root", tmp_path / "site"
    (root / "etc").mkdir(parents=True)
    (site / "onnxruntime/capi").mkdir(parents=True)
    (site / "onnxruntime/__init__.py").write_text('__version__ = "1.31.1"\n')
    shutil.copy(elf / PROVIDER_LIB, site / "onnxruntime/capi" / PROVIDER_LIB)
    if nvinfer:
        lib = root / LIBDIR.lstrip("/")
        lib.mkdir(parents=True)
        shutil.copy(elf / "libnvinfer.so.10", lib / nvinfer)
        if nvinfer != "libnvinfer.so.10":
            os.symlink(nvinfer, lib / "libnvinfer.so.10")
    return root, site


def check(root: Path, site: Path, tensorrt: str, log=None, dirs=()) -> list[str]:
    return linkcheck.check_tree("TensorrtExecutionProvider", [PROVIDER_LIB], [], list(dirs), ["libc.so.6"], root,
                                {SITE: site}, SITE, ARCH, [], log, tensorrt)


def test_a_base_with_an_older_tensorrt_fails(elf, tmp_path):
    root, site = image(tmp_path, elf, "libnvinfer.so.10.13.3")
    assert check(root, site, "10.14.1") == [
        f"TensorRT 10.13.3 in the image ({LIBDIR}/libnvinfer.so.10.13.3) is older than 10.14.1, which "
        "onnxruntime 1.31.1's TensorRT provider was built for"
    ]
    assert check(root, site, "") == []  # no version to require: resolving is enough


@pytest.mark.parametrize("nvinfer, required", [
    ("libnvinfer.so.10.14.1", "10.14.1"),
    ("libnvinfer.so.10.16.0", "10.14.1"),
    ("libnvinfer.so.10.13.3", "10.9.0"),  # numbers, not text: 10.13 is newer than 10.9
])
def test_the_same_or_a_newer_tensorrt_passes(elf, tmp_path, nvinfer, required):
    root, site = image(tmp_path, elf, nvinfer)
    lines: list[str] = []
    assert check(root, site, required, lines.append) == []
    have = nvinfer.removeprefix("libnvinfer.so.")
    assert lines == [f"link check: TensorrtExecutionProvider: 1 libraries resolve; TensorRT {have} "
                     f"(built for {required})"]


def test_a_version_the_file_name_does_not_carry_is_not_compared(elf, tmp_path):
    root, site = image(tmp_path, elf, "libnvinfer.so.10")  # a file, no symlink to a versioned name
    lines: list[str] = []
    assert check(root, site, "10.14.1", lines.append) == []
    assert lines[0].endswith(f"; TensorRT of {LIBDIR}/libnvinfer.so.10 unknown: not compared")


def test_tensorrt_from_the_wheels_is_versioned_by_its_distribution(elf, tmp_path):
    root, site = image(tmp_path, elf, None)
    (site / "tensorrt_libs").mkdir()
    shutil.copy(elf / "libnvinfer.so.10", site / "tensorrt_libs/libnvinfer.so.10")
    (site / "tensorrt_cu13_libs-10.13.3.9.dist-info").mkdir()
    assert check(root, site, "10.14.1") == ["libnvinfer.so.10 (needed by libonnxruntime_providers_tensorrt.so) "
                                            "is not in the image"]  # not preloaded: not found
    assert check(root, site, "10.14.1", dirs=providers.NVIDIA_WHEEL_LIBS) == [
        f"TensorRT 10.13.3 in the image ({SITE}/tensorrt_libs/libnvinfer.so.10) is older than 10.14.1, which "
        "onnxruntime 1.31.1's TensorRT provider was built for"
    ]
    (site / "tensorrt_cu13_libs-10.13.3.9.dist-info").rename(site / "tensorrt_cu13_libs-10.14.1.48.dist-info")
    assert check(root, site, "10.14.1", dirs=providers.NVIDIA_WHEEL_LIBS) == []


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)


def test_the_build_fails_with_the_rows_version_and_base(elf, tmp_path):
    """install.check_links hands the check the row's TensorRT; the one-line error says what to use."""
    root, site = image(tmp_path, elf, "libnvinfer.so.10.13.3")
    row = replace(providers.get("tensorrt"), libraries=(PROVIDER_LIB,), dlopen=(), driver_libs=("libc.so.6",))
    base = BaseImage("nvcr.io/nvidia/tensorrt:25.10-py3", "3.12", (2, 39), nvidia_libs="base", probed=True,
                     rootfs=str(root), arch=ARCH)
    installed = Installed(None, site, False, ())  # type: ignore[arg-type]
    with pytest.raises(BuildError) as e:
        check_links(RuntimeBase(row, base, "linux/amd64", "host", "base"), installed, Lines())
    assert str(e.value) == (
        "link check failed: TensorrtExecutionProvider cannot load: TensorRT 10.13.3 in the image "
        f"({LIBDIR}/libnvinfer.so.10.13.3) is older than 10.14.1, which onnxruntime 1.31.1's TensorRT provider "
        "was built for; use NVIDIA's TensorRT container nvcr.io/nvidia/tensorrt:25.11-py3 or newer as the base image"
    )
    ok = Lines()
    check_links(RuntimeBase(replace(row, tensorrt="10.9.0"), base, "linux/amd64", "host", "base"), installed,
                ok)  # the CUDA 12 row's
    assert ok.lines[-1].endswith("; TensorRT 10.13.3 (built for 10.9.0)")


def test_command_line(elf, tmp_path, capsys):
    root, site = image(tmp_path, elf, "libnvinfer.so.10.13.3")
    args = ["--provider", "TensorrtExecutionProvider", "--lib", PROVIDER_LIB, "--driver", "libc.so.6", "--root",
            str(root), "--overlay", f"{SITE}={site}", "--site", SITE, "--arch", ARCH]
    assert linkcheck.main([*args, "--tensorrt", "10.14.1", "--hint", "use 25.11"]) == 1
    assert capsys.readouterr().err.splitlines()[-1].endswith("is older than 10.14.1, which onnxruntime 1.31.1's "
                                                             "TensorRT provider was built for; use 25.11")
    assert linkcheck.main([*args, "--tensorrt", "10.13.3"]) == 0
