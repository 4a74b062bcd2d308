"""The runtime's settings: GPUX_* variables and gpux.json, each mistake one line naming it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpux_pack.runtime.settings import ConfigurationError, Settings, StartupError

from tests.in_process import ROOT, settings, tiny_dir


BAD_ENV = [
    ("GPUX_PORT", "http", "expected a port number from 1 to 65535"),
    ("GPUX_PORT", "0", "expected a port number from 1 to 65535"),
    ("GPUX_PORT", "65536", "expected a port number from 1 to 65535"),
    ("GPUX_PORT", "80.5", "expected a port number"),
    ("GPUX_HOST", "my-host", "expected an IP address"),
    ("GPUX_HOST", "300.1.1.1", "expected an IP address"),
    ("GPUX_HOST", "[::]", "expected an IP address"),
    ("GPUX_LOG_LEVEL", "verbose", "expected one of critical, error, warning, info, debug"),
    ("GPUX_PROVIDERS", "tpu", "unknown provider 'tpu' (use cpu, cuda, tensorrt, rocm, migraphx, openvino)"),
    ("GPUX_PROVIDERS", "cuda,CUDAExecutionProvider", "'CUDAExecutionProvider' is named twice"),
    ("GPUX_PROVIDERS", ",", "names no provider"),
    ("GPUX_REQUIRE_PROVIDER", "maybe", "expected 1 or 0 (true/false, yes/no)"),
    ("GPUX_CACHE_DIR", "cache", "expected an absolute path"),
    ("GPUX_CACHE_DIR", "/tmp/a\0b", "contains a NUL byte"),
    ("GPUX_MAX_BODY_BYTES", "0", "expected a positive whole number of bytes"),
    ("GPUX_MAX_BODY_BYTES", "64MiB", "expected a positive whole number of bytes"),
    ("GPUX_MAX_WORKERS", "0", "expected a whole number from 1 to 256"),
    ("GPUX_MAX_WORKERS", "257", "expected a whole number from 1 to 256"),
    ("GPUX_MAX_WORKERS", "9" * 5000, "expected a whole number from 1 to 256"),
    ("GPUX_TIMEOUT", "abc", "expected a number of seconds, more than 0 and at most 86400"),
    ("GPUX_TIMEOUT", "0", "expected a number of seconds"),
    ("GPUX_TIMEOUT", "-1", "expected a number of seconds"),
    ("GPUX_TIMEOUT", "inf", "expected a number of seconds"),
    ("GPUX_TIMEOUT", "nan", "expected a number of seconds"),
    ("GPUX_TIMEOUT", "86401", "expected a number of seconds"),
    ("GPUX_CONFIG", "/does/not/exist.json", "No such file or directory"),
]


@pytest.mark.parametrize("key, value, words", BAD_ENV, ids=[f"{k}={v[:12]!r}" for k, v, _ in BAD_ENV])
def test_bad_variable_is_one_line_naming_it(tmp_path, key, value, words):
    with pytest.raises(ConfigurationError) as caught:
        settings(tiny_dir(tmp_path), **{key: value})
    message = str(caught.value)
    assert message.startswith(f"{key}=") and words in message and "\n" not in message
    assert caught.value.exit_code == 2 and isinstance(caught.value, StartupError)


def test_good_variables_are_taken(tmp_path):
    folder = tiny_dir(tmp_path)
    s = settings(folder, GPUX_PORT=" 9000", GPUX_HOST="::", GPUX_LOG_LEVEL="DEBUG", GPUX_REQUIRE_PROVIDER="yes",
                 GPUX_PROVIDERS="OpenVINOExecutionProvider, cpu", GPUX_MAX_BODY_BYTES="100",
                 GPUX_MAX_WORKERS="256", GPUX_TIMEOUT="0.5")
    assert (s.port, s.host, s.log_level, s.require_provider) == (9000, "::", "debug", True)
    assert [n for n, _ in s.providers] == ["OpenVINOExecutionProvider", "CPUExecutionProvider"]
    assert (s.max_body_bytes, s.max_workers, s.timeout) == (100, 256, 0.5)
    for host in ("127.0.0.1", "localhost", "fe80::1"):
        assert settings(folder, GPUX_HOST=host).host == host
    for flag, value in (("", False), ("0", False), ("No", False), ("TRUE", True), ("1", True)):
        assert settings(folder, GPUX_REQUIRE_PROVIDER=flag).require_provider is value
    # empty means unset: the config's values, then the runtime's defaults
    s = settings(folder, GPUX_PORT="", GPUX_TIMEOUT="", GPUX_MAX_WORKERS="", GPUX_HOST="", GPUX_PROVIDERS="")
    assert (s.port, s.timeout, s.max_workers, s.host) == (8080, 30.0, 1, "0.0.0.0")  # cpu: one worker


def test_an_unknown_gpux_variable_is_a_warning_naming_it(tmp_path):
    """GPUX_MAX_BODY_BYTE (a letter short) would otherwise be dropped without a word."""
    s = settings(tiny_dir(tmp_path), GPUX_MAX_BODY_BYTE="100", GPUX_NOTHING_LIKE_IT="1", GPUX_PACK_REBUILD="0",
                 GPUX_TEST_BASE_IMAGE="x", GPUX_SIGN_PASSWORD="y")  # gpux-pack's own: no warning
    assert s.unknown == ("GPUX_MAX_BODY_BYTE: not a variable this image reads; ignored (did you mean "
                         "GPUX_MAX_BODY_BYTES?)", "GPUX_NOTHING_LIKE_IT: not a variable this image reads; ignored")


def test_the_variables_the_image_reads_are_the_ones_the_docs_name():
    """settings.VARIABLES is what settings.py reads, and docs/runtime.md names each; no doc names
    a GPUX_* variable that nothing reads (gpux-pack's own, GPUX_PACK_* and the tests', aside)."""
    from gpux_pack.runtime import settings as module

    source = Path(module.__file__).read_text()
    read = {v for v in re.findall(r"\"(GPUX_[A-Z0-9_]+)\"", source.split("VARIABLES = (", 1)[1].split(")", 1)[1])
            if not v.startswith(module.PACKAGER_VARIABLES)}
    assert read == set(module.VARIABLES)
    runtime_doc = (ROOT / "docs" / "runtime.md").read_text()
    assert [v for v in module.VARIABLES if v not in runtime_doc] == []
    docs = " ".join(p.read_text() for p in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "CONTRIBUTING.md"])
    packager = ("GPUX_PACK_", "GPUX_TEST_")  # gpux-pack's and the tests' own
    examples = {"GPUX_X", "GPUX_MAX_BODY_BYTE", "GPUX_UPDATE_GOLDEN", "GPUX_SIGN_PASSWORD"}  # a placeholder, a misspelling
    named = {v for v in re.findall(r"GPUX_[A-Z0-9_]+", docs) if not v.startswith(packager)} - examples
    assert named - set(module.VARIABLES) == set(), "documented, read by nothing"


def test_bad_config_file(tmp_path, monkeypatch):
    import gpux_pack.runtime.settings as settings_module

    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"name": "x"}')
    cases = [(tmp_path, "not a regular file"), (tmp_path / "broken.json", "not valid JSON"),
             (tmp_path / "other.json", "not this runtime's gpux.json: format None is not this runtime's (2)")]
    for path, words in cases:
        with pytest.raises(ConfigurationError, match=re.escape(f"GPUX_CONFIG={path}: {words}")):
            Settings.load({"GPUX_CONFIG": str(path)})
    # the image's own gpux.json missing is the image's fault, not a variable's: exit 1
    monkeypatch.setattr(settings_module, "DEFAULT_CONFIG", str(tmp_path / "gone.json"))
    with pytest.raises(StartupError, match="cannot read the model config") as caught:
        Settings.load({})
    assert caught.value.exit_code == 1
