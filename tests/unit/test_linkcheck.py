"""The link check on real ELF files: libraries compiled here, and onnxruntime's own."""

import os
import shutil
import struct
import subprocess

from pathlib import Path

import onnxruntime
import pytest

from gpux_pack import linkcheck
from gpux_pack.linkcheck import ElfInfo, Resolver


@pytest.fixture
def libs(tmp_path):
    """liba.so, and libb.so needing liba.so through RPATH $ORIGIN."""
    if not shutil.which("gcc"):
        pytest.fail("gcc is needed to compile the test libraries")
    (tmp_path / "a.c").write_text("int a(void) { return 1; }\n")
    (tmp_path / "b.c").write_text("int a(void); int b(void) { return a() + 1; }\n")
    run = lambda *args: subprocess.run(args, cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    run("gcc", "-shared", "-fPIC", "-o", "liba.so", "a.c")
    run("gcc", "-shared", "-fPIC", "-o", "libb.so", "b.c", "-L.", "-la", "-Wl,--disable-new-dtags,-rpath,$ORIGIN")
    return tmp_path


def test_reads_needed_and_rpath(libs):
    info = ElfInfo(libs / "libb.so")
    assert info.needed == ["liba.so"]
    assert info.rpath == [str(libs)]


def test_resolves_through_origin_and_reports_what_is_missing(libs):
    ok = Resolver([], set())
    ok.walk(libs / "libb.so")
    assert ok.missing == [] and ok.seen["liba.so"] == libs / "liba.so"
    (libs / "liba.so").unlink()
    broken = Resolver([], set())
    broken.walk(libs / "libb.so")
    assert broken.missing == [("liba.so", "libb.so")]
    driver = Resolver([], {"liba.so"})  # a library the host's driver brings
    driver.walk(libs / "libb.so")
    assert driver.missing == [] and driver.skipped == {"liba.so"}


def test_onnxruntime_on_this_host_resolves(capsys):
    assert linkcheck.check(["libonnxruntime_providers_shared.so"], [], [], [], "CPUExecutionProvider") == []
    assert "libraries resolve" in capsys.readouterr().out


def test_provider_missing_from_the_build_is_named():
    problems = linkcheck.check(["libonnxruntime_providers_cuda.so"], [], [], [], "CUDAExecutionProvider")
    assert problems == [f"libonnxruntime_providers_cuda.so is not in onnxruntime {onnxruntime.__version__}: "
                        "this build has no CUDAExecutionProvider"]


def test_dlopened_libraries_must_resolve():
    problems = linkcheck.check(["libonnxruntime_providers_shared.so"], ["libcudnn.so.9"], [], [], "CUDAExecutionProvider")
    assert problems == ["libcudnn.so.9 (needed by CUDAExecutionProvider at run time) is not in the image"]


def test_command_line(capsys):
    assert linkcheck.main(["--provider", "X", "--lib", "libonnxruntime_providers_shared.so", "--dlopen", "libnope.so.1"]) == 1
    err = capsys.readouterr().err
    assert "link check failed: X cannot load: libnope.so.1 (needed by X at run time) is not in the image; use a base" in err


# ---------------------------------------------------------------------------------------------
# on the build host: an image's root filesystem, with host folders standing in for image paths


def test_origin_is_the_folder_the_image_sees(libs, tmp_path):
    """$ORIGIN of a library found through an overlay is its image folder, resolved in the tree."""
    root = tmp_path / "root"
    root.mkdir()
    tree = linkcheck.Tree(root, {"/opt/x/lib": libs})
    resolver = Resolver([], {"libc.so.6"}, tree, env=[], arch="x86_64")
    resolver.walk(Path("/opt/x/lib/libb.so"))
    assert resolver.missing == [] and resolver.seen["liba.so"] == Path("/opt/x/lib/liba.so")
    assert tree.file("/opt/x/lib/liba.so") == libs / "liba.so"
    assert tree.is_dir("/opt") and tree.is_dir("/opt/x") and tree.glob("/opt/*/lib") == ["/opt/x/lib"]
    (root / "usr/lib").mkdir(parents=True)
    os.symlink("/opt/x/lib/liba.so", root / "usr/lib/liba.so")  # absolute: into the overlay, not the host
    assert tree.file("/usr/lib/liba.so") == libs / "liba.so"


def test_check_with_a_root(libs, tmp_path, capsys):
    site = tmp_path / "site"
    (site / "onnxruntime/capi").mkdir(parents=True)
    (site / "onnxruntime/__init__.py").write_text('__version__ = "1.31.1"\n')
    shutil.copy(libs / "libb.so", site / "onnxruntime/capi/libb.so")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    kw = dict(root=root, overlays={"/opt/site": site, "/opt/a": libs}, site="/opt/site", arch=os.uname().machine)
    assert linkcheck.check(["libb.so"], [], [], ["libc.so.6"], "X", quiet=True, **kw) == [
        "liba.so (needed by libb.so) is not in the image"
    ]  # its RPATH $ORIGIN is /opt/site/onnxruntime/capi in the image: liba.so is not there
    (root / "etc/ld.so.conf").write_text("/opt/a\n")
    assert linkcheck.check(["libb.so"], ["liba.so"], [], ["libc.so.6"], "X", **kw) == []
    assert capsys.readouterr().out == "link check: X: 1 libraries resolve\n"
    assert linkcheck.check(["libnope.so"], [], [], [], "X", **kw) == [
        "libnope.so is not in onnxruntime 1.31.1: this build has no X"
    ]
    with pytest.raises(ValueError):
        linkcheck.check(["libb.so"], [], [], [], "X", root=root)
    assert linkcheck.check_tree("X", ["libb.so"], [], [], [], root, {}, "/opt/site", "x86_64") == [
        "onnxruntime is not installed in /opt/site"
    ]


def test_failure_line():
    assert linkcheck.failure("P", ["a (needed by b) is not in the image"], "do x") == (
        "link check failed: P cannot load: a (needed by b) is not in the image; do x"
    )
    assert linkcheck.failure("P", ["one", "two", "three"], "do x") == "link check failed: P cannot load: one (and 2 more); do x"


def test_elf_files_that_are_not_libraries(tmp_path):
    header = bytearray(b"\x7fELF\x02\x01" + b"\0" * 58)
    struct.pack_into("<Q", header, 32, 4096)  # program headers past the end: a truncated file
    struct.pack_into("<HH", header, 54, 56, 1)
    for data in (b"", b"#!/bin/sh\n" * 20, bytes(header)):
        (tmp_path / "f").write_bytes(data)
        with pytest.raises(ValueError):
            ElfInfo(tmp_path / "f")
