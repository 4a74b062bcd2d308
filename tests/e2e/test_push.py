"""Push to a real registry (Debian's docker-registry, Distribution 2.8) started here on
127.0.0.1 with htpasswd auth: digests, pull by digest, one-line refusals."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import BASE_IMAGE, EXAMPLES, run_cli, serve

pytestmark = pytest.mark.e2e

USER, PASSWORD = "gpux", "s3cret-pass"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """host:port of a registry that wants USER/PASSWORD; stopped (and its storage removed) after."""
    import bcrypt

    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("the push tests need Debian's docker-registry package (`bash scripts/dev test` installs it)")
    root = tmp_path_factory.mktemp("registry")
    (root / "htpasswd").write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=5)).decode()}\n")
    port = _free_port()
    (root / "config.yml").write_text(
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
        f"auth: {{htpasswd: {{realm: test, path: {root / 'htpasswd'}}}}}\n"
    )
    proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=open(root / "registry.log", "wb"))  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)
        except urllib.error.HTTPError as e:
            if e.code == 401:
                break  # up, and asking for credentials
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the registry did not start: {(root / 'registry.log').read_text()[-2000:]}")
        time.sleep(0.05)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


def _docker_config(tmp_path: Path, registry: str, password: str) -> dict[str, str]:
    """A DOCKER_CONFIG as `docker login` writes it."""
    folder = tmp_path / f"docker-{password}"
    folder.mkdir()
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {registry: {"auth": auth}}}))
    return {"DOCKER_CONFIG": str(folder)}


def test_build_push_digest_pull_by_digest_and_serve(registry, tmp_path, docker_client):
    tag = f"{registry}/team/iris-mlp:1.0.0-cpu"
    env = _docker_config(tmp_path, registry, PASSWORD)
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--base-image", BASE_IMAGE, "--tag", tag, "--push", "--json",
                   env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    digest = json.loads(proc.stdout)["images"][0]["digest"]
    assert digest.startswith(f"{registry}/team/iris-mlp@sha256:") and len(digest.split("@sha256:")[1]) == 64
    docker_client.images.remove(tag, force=True)
    auth = {"username": USER, "password": PASSWORD}
    pulled = docker_client.images.pull(digest, auth_config=auth)  # by digest: these bytes or nothing
    assert digest in pulled.attrs["RepoDigests"]
    with serve(pulled.id) as server:
        assert server.post("/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]}).status_code == 200
    again = run_cli("push", tag, "--json", env=env)
    assert again.returncode == 2 and "no such image" in again.stderr  # removed above: one line, usage
    docker_client.images.remove(pulled.id, force=True)


def test_a_wrong_password_or_no_registry_is_one_line_exit_1(registry, tmp_path, docker_client, tags):
    tag = f"{registry}/team/iris-mlp:wrong"
    local = docker_client.images.get(BASE_IMAGE)
    local.tag(tag)
    try:
        proc = run_cli("push", tag, env=_docker_config(tmp_path, registry, "wrong"))
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len([line for line in lines if line.startswith("error:")]) == 1, lines
        assert lines[-1].startswith(f"error: push of {tag} to {registry} failed: authentication failed"), lines
        closed = f"127.0.0.1:{_free_port()}"
        other = f"{closed}/team/iris-mlp:nowhere"
        local.tag(other)
        proc = run_cli("push", other, env=_docker_config(tmp_path, closed, PASSWORD))
        assert proc.returncode == 1 and "registry unreachable" in proc.stderr.strip().splitlines()[-1], proc.stderr
    finally:
        for t in (tag, f"{closed}/team/iris-mlp:nowhere"):
            try:
                docker_client.images.remove(t)
            except Exception:
                pass
