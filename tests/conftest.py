"""Shared fixtures. End-to-end tests need a Docker engine and the offline base image
(`bash scripts/dev test` provides both); without them they fail, they never skip."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BASE_IMAGE = os.environ.get("GPUX_TEST_BASE_IMAGE", "gpux-pack/debian-python:bookworm")
RUN_ID = uuid.uuid4().hex[:8]

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")
os.environ.setdefault("TC_HOST", "127.0.0.1")
# the tests' own onnxruntime (reference answers) and every CLI they run: no telemetry files under
# the developer's ~/.cache/Microsoft (test_startup.py checks the runtime and the CLI without it)
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
# A suite started in the background of a non-interactive shell (`bash .ci/run &`) inherits SIGINT
# ignored, and so would every CLI it starts: the Ctrl-C tests would then test nothing. The
# children get the default back when this process handles it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 900):
    """gpux-pack as users run it: a separate process, its exit code, stdout and stderr."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gpux_pack", *args],
        capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout,
    )


def key_pair(folder: Path, name: str) -> tuple[Path, Path, object]:
    """A P-256 key pair as openssl writes it: NAME.pem (PKCS#8), NAME.pub (PKIX); and the public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public, key.public_key()


def run_cli_measured(*args: str, env: dict[str, str] | None = None, timeout: int = 300):
    """run_cli, and the peak resident memory (bytes) of the gpux-pack process: measured by a
    parent of its own, whose only child it is."""
    import json

    probe = ("import json, resource, subprocess, sys\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "print(json.dumps([p.returncode, p.stdout, p.stderr, "
             "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024]))\n")
    out = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "gpux_pack", *args], capture_output=True,
                         text=True, env={**os.environ, **(env or {})}, timeout=timeout, check=True)
    code, stdout, stderr, peak = json.loads(out.stdout)
    return subprocess.CompletedProcess(args, code, stdout, stderr), peak


@pytest.fixture(scope="session")
def docker_client():
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as e:  # a missing engine is a failure, not a skip
        pytest.fail(f"end-to-end tests need a Docker engine ({e}); run `bash scripts/dev test`")
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"base image {BASE_IMAGE} is missing; run `bash base-images/debian-offline.sh`")
    return client


@pytest.fixture(scope="session")
def tags(docker_client):
    """Unique image tags for this run; removed at the end."""
    made: list[str] = []

    def make(name: str) -> str:
        tag = f"gpux-test-{RUN_ID}/{name}"
        made.append(tag)
        return tag

    yield make
    # every image named under this run's prefix, whatever tag a test gave it (name:1, name:arm64)
    prefix = f"gpux-test-{RUN_ID}/"
    ours = {t for image in docker_client.images.list() for t in image.tags if t.startswith(prefix)}
    for tag in sorted(ours | {t if ":" in t.rsplit("/", 1)[-1] else f"{t}:latest" for t in made}):
        try:
            docker_client.images.remove(tag, force=True)
        except Exception:
            pass


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1 (for a registry or a published port)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_image(path: Path, tag: str, *extra: str, env: dict[str, str] | None = None) -> dict:
    """`gpux-pack build --json` on the offline base; returns the summary of the one image."""
    proc = run_cli("build", str(path), "--base-image", BASE_IMAGE, "--tag", tag, "--json", *extra, env=env)
    assert proc.returncode == 0, f"build failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    summary = json.loads(proc.stdout)
    assert len(summary["images"]) == 1
    return summary["images"][0]


@pytest.fixture(scope="session")
def mlp_image(docker_client, tags) -> dict:
    return build_image(EXAMPLES / "mlp", tags("iris-mlp:cpu"))


@pytest.fixture(scope="session")
def text_image(docker_client, tags) -> dict:
    return build_image(EXAMPLES / "text-classifier", tags("text-classifier:cpu"))


class Served:
    """A running container reached through a port published on 127.0.0.1."""

    def __init__(self, container, url: str):
        self.container, self.url = container, url

    def get(self, path: str, **kw):
        import requests

        return requests.get(self.url + path, timeout=30, **kw)

    def post(self, path: str, **kw):
        import requests

        return requests.post(self.url + path, timeout=30, **kw)


@contextmanager
def serve(image: str, port: int = 8080, ready: bool = True, extra_ports: tuple[int, ...] = (), **kwargs):
    """Start the image with testcontainers; wait until /v2/health/ready answers 200."""
    from testcontainers.core.container import DockerContainer

    tmpfs = kwargs.pop("tmpfs", {})
    container = DockerContainer(image, **kwargs)
    container.tmpfs.update(tmpfs)
    for published in (port, *extra_ports):
        container.ports[f"{published}/tcp"] = ("127.0.0.1", None)  # published on loopback only
    container.start()
    try:
        host = container.get_container_host_ip()
        url = f"http://{host}:{container.get_exposed_port(port)}"
        served = Served(container, url)
        if ready:
            wait_ready(served)
        yield served
    finally:
        container.stop()


def wait_ready(served: Served, timeout: float = 60) -> None:
    """Poll readiness (the container's own signal), failing with its logs if it never comes."""
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        served.container.get_wrapped_container().reload()
        if served.container.get_wrapped_container().status == "exited":
            break
        try:
            if requests.get(served.url + "/v2/health/ready", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    logs = served.container.get_wrapped_container().logs().decode(errors="replace")
    pytest.fail(f"container never became ready:\n{logs[-3000:]}")


def copy_example(name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(EXAMPLES / name, target)
    return target


QEMU = Path("/usr/bin/qemu-x86_64-static")  # Debian's qemu-user-static (scripts/dev installs it)
INTEL_CPU_MODEL = "Haswell-noTSX"


def intel_cpu() -> bool:
    from gpux_pack.runtime.contract import cpu_vendor

    return cpu_vendor()[0] == "GenuineIntel"


def on_intel_cpu(client, tag: str, derived: str) -> str:
    """The image as an Intel CPU runs it: the image itself on an Intel host; elsewhere a test-only
    image whose entrypoint runs under qemu-x86_64 with an Intel CPU model, because OpenVINO's plugin
    offers no device on other vendors' CPUs. The product never needs this."""
    if intel_cpu():
        return tag
    if not QEMU.is_file():
        pytest.fail(f"{QEMU} is missing: OpenVINO's tests need it on a non-Intel host (run `bash scripts/dev test`)")
    import tempfile

    config = client.images.get(tag).attrs["Config"]
    program, *args = config.get("Entrypoint") or []
    if "/" not in program:  # qemu opens a path; it does not search PATH
        found = client.containers.run(tag, entrypoint=["/bin/sh", "-c", 'command -v "$0"', program], remove=True)
        program = found.decode().strip()
    entrypoint = [f"/usr/local/bin/{QEMU.name}", "-cpu", INTEL_CPU_MODEL, program, *args]
    with tempfile.TemporaryDirectory() as context:
        shutil.copy(QEMU, Path(context) / QEMU.name)
        os.chmod(Path(context) / QEMU.name, 0o755)
        (Path(context) / "Dockerfile").write_text(
            f"FROM {tag}\nCOPY {QEMU.name} /usr/local/bin/{QEMU.name}\n"
            f"ENTRYPOINT {json.dumps(entrypoint)}\nCMD {json.dumps(config.get('Cmd') or [])}\n")
        client.images.build(path=context, tag=derived, rm=True, forcerm=True)
    return derived


class _Chunks(io.RawIOBase):
    """A file over a stream of byte chunks (the engine's `docker save`)."""

    def __init__(self, chunks):
        self.chunks, self.rest = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.rest:
            self.rest = next(self.chunks, None)
            if self.rest is None:
                self.rest = b""
                return 0
        n = min(len(buffer), len(self.rest))
        buffer[:n], self.rest = self.rest[:n], self.rest[n:]
        return n


def _files_size(fileobj) -> int:
    """A layer's size as `docker history` shows it (the engine's directory size of the layer):
    its regular files and its symlinks' targets, each hard-linked file once, folders 0."""
    total = 0
    with tarfile.open(fileobj=fileobj, mode="r|") as layer:
        for member in layer:
            if member.isreg():
                total += member.size
            elif member.issym():
                total += len(member.linkname.encode())
    return total


def saved_layers(client, ref: str) -> tuple[dict, list[int]]:
    """`docker save` of an image, read as it streams: its config and its layers' sizes in order."""
    sizes, small = {}, {}
    with tarfile.open(fileobj=io.BufferedReader(_Chunks(client.api.get_image(ref)), 1 << 20), mode="r|") as saved:
        for member in saved:
            if not member.isfile():
                continue
            data = saved.extractfile(member)
            if member.size < 1 << 20:
                small[member.name] = data.read()
                data = io.BytesIO(small[member.name])
            try:
                sizes[member.name] = _files_size(data)
            except tarfile.TarError:
                pass
    (manifest,) = json.loads(small["manifest.json"])
    return json.loads(small[manifest["Config"]]), [sizes[path] for path in manifest["Layers"]]


def assert_history_matches_layers(client, ref: str) -> None:
    """The OCI rule, and what `docker history` shows for it: one non-empty history entry per
    layer, in order, and each such line carries its own layer's size (issue 18: every size one
    line off)."""
    config, sizes = saved_layers(client, ref)
    written = config["history"]
    assert sum(not h.get("empty_layer") for h in written) == len(config["rootfs"]["diff_ids"]) == len(sizes), \
        [(h.get("created_by", "")[-60:], bool(h.get("empty_layer"))) for h in written]
    shown = list(reversed(client.api.history(ref)))  # `docker history`, oldest first
    assert [h["CreatedBy"] for h in shown] == [h.get("created_by", "") for h in written]
    lines = [(h["CreatedBy"][-60:], h["Size"]) for h, w in zip(shown, written) if not w.get("empty_layer")]
    assert [size for _, size in lines] == sizes, list(zip(lines, sizes))
    assert all(h["Size"] == 0 for h, w in zip(shown, written) if w.get("empty_layer"))


# -- where the suite's time goes -------------------------------------------------------------
# Each test file's wall time (setup, call and teardown of its tests; a session fixture's image
# build is charged to the first test that asks for it), printed after the run: what a change to
# the CI time is measured by.

_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("-", f"seconds per test file ({total:.0f} s in all), the slowest 15")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
