"""Fixtures of the end-to-end tests that talk to a registry: a real one (Debian's
docker-registry, Distribution 2.8) started on 127.0.0.1 with htpasswd auth, and one with
Bearer-token auth as Docker Hub and GHCR have it."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import build_image, copy_example, free_port

USER, PASSWORD = "gpux", "s3cret-pass"


def _start_registry(root: Path, auth: str) -> tuple[subprocess.Popen, str]:
    """Distribution 2.8 on a free 127.0.0.1 port with the given `auth:` section; returns once it
    answers /v2/ with 401 (up, and asking for credentials)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("the push tests need Debian's docker-registry package (`bash scripts/dev test` installs it)")
    port = free_port()
    (root / "config.yml").write_text(
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
        f"auth: {auth}\n"
    )
    proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=open(root / "registry.log", "wb"))
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)
        except urllib.error.HTTPError as e:
            if e.code == 401:
                return proc, f"127.0.0.1:{port}"
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the registry did not start: {(root / 'registry.log').read_text()[-2000:]}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """host:port of a registry that wants USER/PASSWORD (Basic); stopped (and its storage removed) after."""
    import bcrypt

    root = tmp_path_factory.mktemp("registry")
    (root / "htpasswd").write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=5)).decode()}\n")
    proc, address = _start_registry(root, f"{{htpasswd: {{realm: test, path: {root / 'htpasswd'}}}}}")
    yield address
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory):
    """host:port of a registry with Bearer-token auth as Docker Hub and GHCR have it: a token
    service here (RS256 JWTs with an x5c chain the registry trusts) grants pull,push to
    USER/PASSWORD and nothing to anyone else."""
    import datetime
    import http.server
    import threading
    import urllib.parse

    import jwt
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    root = tmp_path_factory.mktemp("token-registry")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpux-test-token-issuer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (root / "issuer.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    chain = [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()]
    issued = []

    class Tokens(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            given = self.headers.get("Authorization", "")
            good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            if given != good:
                self.send_response(401)
                self.end_headers()
                return
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            access = []
            for scope in query.get("scope", []):
                kind, repo, actions = scope.split(":")
                access.append({"type": kind, "name": repo, "actions": actions.split(",")})
            stamp = int(time.time())
            claims = {"iss": "gpux-test", "sub": USER, "aud": query.get("service", [""])[0], "iat": stamp,
                      "nbf": stamp - 60, "exp": stamp + 600, "jti": str(stamp) + str(len(issued)), "access": access}
            token = jwt.encode(claims, key, algorithm="RS256", headers={"x5c": chain})
            issued.append(access)
            body = json.dumps({"token": token, "access_token": token, "expires_in": 600}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Tokens)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    realm = f"http://127.0.0.1:{server.server_address[1]}/token"
    proc, address = _start_registry(
        root, f"{{token: {{realm: '{realm}', service: gpux-test-registry, issuer: gpux-test, "
              f"rootcertbundle: {root / 'issuer.pem'}}}}}")
    yield address, issued
    proc.terminate()
    proc.wait(timeout=10)
    server.shutdown()


def _with_grpc(example: str, tmp_path: Path) -> Path:
    project = copy_example(example, tmp_path)
    text = (project / "gpux.yml").read_text()
    if "\nserving:\n" in text:
        text = text.replace("\nserving:\n", "\nserving:\n  grpc_port: 8001\n")
    else:
        text += "\nserving:\n  grpc_port: 8001\n"
    (project / "gpux.yml").write_text(text)
    return project


@pytest.fixture(scope="session")
def grpc_images(docker_client, tags, tmp_path_factory) -> dict:
    """The examples with serving.grpc_port 8001, built once for every module that serves gRPC."""
    return {example: build_image(_with_grpc(example, tmp_path_factory.mktemp(example)), tags(f"grpc-{example}:cpu"))
            for example in ("mlp", "text-classifier", "strings")}
