"""`render --output` built by other builders: BuildKit (Debian's docker.io 20.10 CLI with
DOCKER_BUILDKIT=1), `podman build` and `buildah bud --layers` against `gpux-pack build`'s image
on the same base (issue 19). Every layer is a tar ADDed at /, which every builder unpacks with
the times and owners its headers give, so each commits gpux-pack's bytes; the one thing a
builder writes its own way, the owner name of root's files, is checked exactly."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpux_pack.image import layer_tar
from gpux_pack.image.layout import LAYERS, RUNTIME_BASE, model_layers
from tests.conftest import BASE_IMAGE, RUN_ID, build_image, copy_example, run_cli

pytestmark = pytest.mark.e2e

DOCKER = "/usr/bin/docker"  # Debian's docker.io CLI: BuildKit with DOCKER_BUILDKIT=1 (the 28.x one lacks buildx)
SAME_TIME = {"SOURCE_DATE_EPOCH": "1767225600"}  # one creation label for the render and the build
MODEL_LAYERS = model_layers(assets=False, one_layer=True)  # examples/mlp: a small model shares gpux.json's layer


@dataclass(frozen=True)
class Rendered:
    project: Path  # a copy of examples/mlp
    context: Path  # what `render --output` wrote
    tag: str  # gpux-pack build's image of the same project, on the same base
    base: list[str]  # the base image's diff ids
    ours: list[str]  # the diff ids gpux-pack build added: packages, runtime, cache, the small model with gpux.json
    uname: bytes  # the owner name this engine writes for root ("root" up to Docker 20.10, "" later)


def _run(cmd: list[str], **env: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def context_layers(context: Path, uname: bytes) -> list[str]:
    """The diff ids of the layers the rendered Dockerfile ADDs, as gpux-pack's tar writer writes
    each context tar's members with this owner name for root."""
    out = []
    for layer in (LAYERS[name] for name in (*RUNTIME_BASE, *MODEL_LAYERS)):
        members = []
        with tarfile.open(context / layer.source) as archive:
            for info in archive:
                data = None if info.isdir() else (archive.extractfile(info) or b"").read()  # type: ignore[union-attr]
                members.append(layer_tar.Member(info.name.rstrip("/"), info.mode & 0o7777, int(info.mtime), data=data,
                                                uid=info.uid, gid=info.gid))
        out.append(layer_tar.digest(layer_tar.walk_order(members), uname))
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, docker_client, tags) -> Rendered:
    """One render and one gpux-pack build for every builder."""
    tmp = tmp_path_factory.mktemp("builders")
    project = copy_example("mlp", tmp)
    built = build_image(project, tags("builders:gpux-pack"), env=SAME_TIME)
    context = tmp / "context"
    proc = run_cli("render", str(project), "--provider", "cpu", "--base-image", BASE_IMAGE, "--output", str(context),
                   env=SAME_TIME)
    assert proc.returncode == 0, proc.stderr
    base = docker_client.images.get(BASE_IMAGE).attrs["RootFS"]["Layers"]
    layers = docker_client.images.get(built["tag"]).attrs["RootFS"]["Layers"]
    assert layers[: len(base)] == base
    ours = layers[len(base) :]
    # the context's tars are gpux-pack's layers, written with an empty owner name: each tar's
    # sha256 is the diff id of the layer gpux-pack writes for an engine that writes them so
    files = ["sha256:" + hashlib.sha256((context / LAYERS[n].source).read_bytes()).hexdigest() for n in (*RUNTIME_BASE, *MODEL_LAYERS)]
    assert files == context_layers(context, b"")
    uname = next(u for u in (b"root", b"") if context_layers(context, u) == ours)  # this engine's
    return Rendered(project, context, built["tag"], base, ours, uname)


def test_buildkit_gives_the_same_layers(rendered, docker_client, tags):
    """BuildKit unpacks each tar as it is (it stamps the folders a COPY makes with its own
    time, which is why there is no COPY) and commits no layer for a WORKDIR the Dockerfile does
    not have: every diff id is gpux-pack build's."""
    if not os.access(DOCKER, os.X_OK):
        pytest.fail(f"the BuildKit test needs Debian's docker.io CLI at {DOCKER} (apt-get install docker.io)")
    tag = tags("builders:buildkit")
    _run([DOCKER, "build", "-q", "-t", tag, str(rendered.context)], DOCKER_BUILDKIT="1")
    image = docker_client.images.get(tag).attrs
    assert image["RootFS"]["Layers"] == [*rendered.base, *rendered.ours]
    ours = docker_client.images.get(rendered.tag).attrs["Config"]
    for key in ("Entrypoint", "Cmd", "User", "WorkingDir", "Env", "Healthcheck", "ExposedPorts", "Labels"):
        assert image["Config"].get(key) == ours.get(key), key


@pytest.fixture(scope="module")
def podman_base():
    """The base image in podman's storage (podman and buildah share it), from Docker's."""
    present = subprocess.run(["podman", "image", "exists", BASE_IMAGE], capture_output=True).returncode == 0
    if not present:
        _run(["podman", "pull", "-q", f"docker-daemon:{BASE_IMAGE}"])
    yield
    if not present:
        subprocess.run(["podman", "rmi", BASE_IMAGE], capture_output=True)


def _podman_inspect(tag: str) -> tuple[list[str], dict]:
    image = json.loads(_run(["podman", "image", "inspect", tag]))[0]
    return image["RootFS"]["Layers"], {**image["Config"], "Healthcheck": image.get("Healthcheck")}  # kept apart


def _buildah_inspect(tag: str) -> tuple[list[str], dict]:
    image = json.loads(_run(["buildah", "inspect", "--type", "image", tag]))["Docker"]
    return image["rootfs"]["diff_ids"], image["config"]


@pytest.fixture(scope="module")
def podman_built(rendered, podman_base, tmp_path_factory) -> list[str]:
    """`gpux-pack build` of the same project on podman's engine (its Docker API, as users of
    podman point DOCKER_HOST at it): the diff ids it added to the base."""
    import docker

    sock = tmp_path_factory.mktemp("podman") / "podman.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tag = f"localhost/gpux-test-{RUN_ID}/builders-gpux-pack:1"
    made: list[str] = [tag]
    try:
        deadline = time.monotonic() + 60
        while True:  # the socket answers once the service is up
            try:
                docker.DockerClient(base_url=f"unix://{sock}").ping()
                break
            except Exception:
                assert service.poll() is None and time.monotonic() < deadline, service.stderr.read().decode()  # type: ignore[union-attr]
                time.sleep(0.05)
        built = build_image(rendered.project, tag, env={**SAME_TIME, "DOCKER_HOST": f"unix://{sock}"})
        assert not built["assembled"]  # podman's load cannot skip the parent's layers: its builder builds
        made.append(built["runtime_base"])
        layers, _ = _podman_inspect(tag)
        assert layers[: len(rendered.base)] == rendered.base
        return layers[len(rendered.base) :]
    finally:
        for image in made:
            subprocess.run(["podman", "rmi", image], capture_output=True)
        service.terminate()
        service.wait(timeout=30)


# Without --layers, buildah bud commits the whole Dockerfile as one layer (podman build's
# default is --layers). --format docker: the OCI format drops HEALTHCHECK. --no-cache: podman
# and buildah share one build cache, and each must build its own layers.
BUILDERS = {"podman": (["podman", "build"], _podman_inspect),
            "buildah": (["buildah", "bud", "--layers"], _buildah_inspect)}


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_podman_and_buildah_give_the_same_layers(builder, rendered, podman_built, docker_client):
    """podman build and buildah bud give the diff ids gpux-pack build gives on podman's
    engine: byte for byte gpux-pack's tar writer with an empty owner name for root, as Docker
    23 and later write too. Docker 20.10 names root "root", so there gpux-pack build (which
    writes what its engine writes, found by building one tiny image both ways) differs from
    podman's layers in that name only. The base keeps its diff id across `podman pull
    docker-daemon:`."""
    command, inspect = BUILDERS[builder]
    tag = f"localhost/gpux-test-{RUN_ID}/builders-{builder}:1"
    try:
        _run([*command, "--format", "docker", "--pull=never", "--no-cache", "-q", "-t", tag, str(rendered.context)])
        layers, config = inspect(tag)
    finally:
        subprocess.run(["podman", "rmi", tag], capture_output=True)  # and its intermediate images
    n = len(rendered.base)
    assert layers[:n] == rendered.base
    assert layers[n:] == podman_built == context_layers(rendered.context, b"")
    if rendered.uname == b"":
        assert layers[n:] == rendered.ours
    else:
        assert rendered.ours == context_layers(rendered.context, rendered.uname)
    ours = docker_client.images.get(rendered.tag).attrs["Config"]
    for key in ("Entrypoint", "Cmd", "User", "WorkingDir"):  # no WorkingDir: podman leaves the key out
        assert (config.get(key) or None) == (ours.get(key) or None), key
    labels = dict(config["Labels"])
    assert labels.pop("io.buildah.version")  # both add their version; nothing else differs
    assert labels == ours["Labels"]
    assert config["Healthcheck"]["Test"] == ours["Healthcheck"]["Test"]
