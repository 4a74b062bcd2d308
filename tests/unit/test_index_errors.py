"""A package index that refuses the credentials, or cannot be reached, is said to be so, naming
the index without its password, for both the lock (`uv pip compile`) and the download (`pip
download`). Real servers on 127.0.0.1: one answering 401 to everything, and a port nothing
listens on. The index is given as a user gives it (PIP_INDEX_URL / UV_INDEX_URL)."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpux_pack import providers, wheels
from gpux_pack.errors import WheelError
from tests.conftest import EXAMPLES, free_port

SECRET = "s3cret-pw"
TARGET = "cp311 x86_64-manylinux_2_36"  # the cpu row's python:3.11-slim, assumed without an engine
HINT_AUTH = "check the index's user name and password (in PIP_INDEX_URL/UV_INDEX_URL, .netrc or the keyring)"
HINT_DOWN = "check the index URL, the network and the proxy"


class _Refuse(http.server.BaseHTTPRequestHandler):
    status = 401

    def do_GET(self):  # noqa: N802
        self.send_response(self.status)
        self.send_header("WWW-Authenticate", 'Basic realm="index"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


class _Unavailable(_Refuse):
    status = 503


@pytest.fixture
def refusing_index():
    """127.0.0.1:PORT answering 401 to every request (a wrong password)."""
    yield from _serve(_Refuse)


@pytest.fixture
def unavailable_index():
    """127.0.0.1:PORT answering 503 to every request (an index that is down behind its proxy)."""
    yield from _serve(_Unavailable)


def _serve(handler):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A private cache (the shared one is untouched), no engine, no retries (a refused connection
    is not retried for seconds), and no index settings of the machine running the tests."""
    for name in list(os.environ):
        if name.startswith(("PIP_INDEX", "PIP_EXTRA_INDEX", "UV_INDEX", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX")):
            monkeypatch.delenv(name)
    values = {"GPUX_PACK_CACHE_DIR": str(tmp_path / "cache"), "DOCKER_HOST": "unix:///nonexistent.sock",
              "UV_HTTP_RETRIES": "0", "PIP_RETRIES": "0"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def render(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    project = tmp_path / "mlp"
    if not project.exists():
        shutil.copytree(EXAMPLES / "mlp", project)
    return subprocess.run([sys.executable, "-m", "gpux_pack", "render", str(project), "-p", "cpu",
                           "--output", str(tmp_path / "out"), "--quiet", *extra],
                          capture_output=True, text=True, timeout=300)


def one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and SECRET not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("variable", ["PIP_INDEX_URL", "UV_INDEX_URL"])
def test_lock_with_a_wrong_password_says_authentication_failed(tmp_path, env, monkeypatch, refusing_index, variable):
    monkeypatch.setenv(variable, f"http://user:{SECRET}@{refusing_index}/simple")
    line = one_line(render(tmp_path, "--refresh"))
    assert line == (f"error: cannot resolve the image's wheels for {TARGET}: package index authentication failed: "
                    f"http://{refusing_index}/simple (401 Unauthorized); {HINT_AUTH}")


def test_lock_with_an_index_that_is_down_says_unreachable(tmp_path, env, monkeypatch):
    port = free_port()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://user:{SECRET}@127.0.0.1:{port}/simple")
    line = one_line(render(tmp_path, "--refresh"))
    assert line == (f"error: cannot resolve the image's wheels for {TARGET}: package index unreachable: "
                    f"http://127.0.0.1:{port}/simple (Connection refused); {HINT_DOWN}")


def _cached_lock() -> None:
    """A lock already in the (private) cache, as an earlier build leaves it: the build goes
    straight to downloading its wheels."""
    cpu = providers.get("cpu")
    target = wheels.Target("3.11", "x86_64", (2, 36))
    path = wheels.lock_path(cpu.requirements(), target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"click==8.5.1 --hash=sha256:{'0' * 64}\nonnxruntime=={cpu.version} --hash=sha256:{'1' * 64}\n")


def test_download_with_a_wrong_password_says_authentication_failed(tmp_path, env, monkeypatch, refusing_index):
    _cached_lock()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://user:{SECRET}@{refusing_index}/simple")
    line = one_line(render(tmp_path))
    assert line == (f"error: downloading wheels failed: package index authentication failed: "
                    f"http://{refusing_index}/simple (401 Unauthorized); {HINT_AUTH}")


def test_download_with_an_index_that_is_down_says_unreachable(tmp_path, env, monkeypatch):
    _cached_lock()
    port = free_port()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://user:{SECRET}@127.0.0.1:{port}/simple")
    line = one_line(render(tmp_path))
    assert line == (f"error: downloading wheels failed: package index unreachable: http://127.0.0.1:{port}/simple "
                    f"(Connection refused); {HINT_DOWN}")


def test_fetch_without_credentials_at_an_index_that_wants_them(tmp_path, env, monkeypatch, refusing_index):
    """pip prints nothing about a 401 when the URL has no credentials; its log does."""
    monkeypatch.setenv("PIP_INDEX_URL", f"http://{refusing_index}/simple")
    pin = wheels.Pin("click", "8.5.1", frozenset({"0" * 64}))
    lock = wheels.Lock(wheels.Target("3.11", "x86_64", (2, 36)), ("click==8.5.1",), (pin,))
    with pytest.raises(WheelError) as failed:
        wheels.fetch(lock)
    assert str(failed.value).startswith(f"downloading wheels failed: package index authentication failed: "
                                        f"http://{refusing_index}/simple (401 Unauthorized)")
    assert failed.value.exit_code == 1


def test_an_index_answering_503_is_unreachable_for_the_lock_and_the_download(tmp_path, env, monkeypatch,
                                                                             unavailable_index):
    monkeypatch.setenv("PIP_INDEX_URL", f"http://user:{SECRET}@{unavailable_index}/simple")
    line = one_line(render(tmp_path, "--refresh"))
    assert line == (f"error: cannot resolve the image's wheels for {TARGET}: package index unreachable: "
                    f"http://{unavailable_index}/simple (503 Service Unavailable); {HINT_DOWN}")
    _cached_lock()
    line = one_line(render(tmp_path))
    assert line == (f"error: downloading wheels failed: package index unreachable: http://{unavailable_index}/simple "
                    f"(too many 503 error responses); {HINT_DOWN}")


def test_redact_takes_every_credential_out():
    assert wheels.redact("http://u:pw@h/simple and https://tok@h2:8/x, http://u:****@h3/s") == \
        "http://h/simple and https://h2:8/x, http://h3/s"
