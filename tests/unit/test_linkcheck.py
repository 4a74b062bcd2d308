"""The link check on real ELF files: libraries compiled here, and onnxruntime's own."""

import shutil
import subprocess

import onnxruntime
import pytest

from gpux_pack.runtime import linkcheck
from gpux_pack.runtime.linkcheck import ElfInfo, Resolver


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
