"""`render --output` built by other builders: BuildKit (Debian's docker.io 20.10 CLI with
DOCKER_BUILDKIT=1), `podman build` and `buildah bud --layers` against `gpux-pack build`'s image
on the same base (issue 19). Where a builder writes its layer tars its own way, the test says
exactly what differs and checks that everything else is byte for byte the same."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from gpux_pack.image import layer_tar
from gpux_pack.image.context import MTIME
from gpux_pack.image.layout import LAYERS, MODEL, RUNTIME_BASE
from tests.conftest import BASE_IMAGE, RUN_ID, build_image, copy_example, run_cli

pytestmark = pytest.mark.e2e

DOCKER = "/usr/bin/docker"  # Debian's docker.io CLI: BuildKit with DOCKER_BUILDKIT=1 (the 28.x one lacks buildx)
SAME_TIME = {"SOURCE_DATE_EPOCH": "1767225600"}  # one creation label for the render and the build
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"  # a tar of no entries


@dataclass(frozen=True)
class Rendered:
    context: Path  # what `render --output` wrote
    tag: str  # gpux-pack build's image of the same project, on the same base
    base: list[str]  # the base image's diff ids
    ours: list[str]  # the diff ids gpux-pack build added: packages, runtime, cache, model, gpux.json


def _run(cmd: list[str], **env: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def folder_layers(context: Path, uname: bytes) -> list[str]:
    """The diff ids of the layers the rendered Dockerfile adds, as a tar writer that reads the
    folder writes them with this owner name: each COPY folder's tree with its entries' own
    modes and mtimes, and the ADDed tar's members."""
    out = []
    for layer in (LAYERS[name] for name in (*RUNTIME_BASE, *MODEL)):
        if layer.tar:
            members = layer_tar.read_members((context / layer.source).read_bytes())
        else:
            root = context / layer.name
            members = [layer_tar.Member(p.relative_to(root).as_posix(), p.stat().st_mode & 0o7777,
                                        int(p.stat().st_mtime), source=None if p.is_dir() else p)
                       for p in root.rglob("*")]  # fmt: skip
        out.append(layer_tar.digest(layer_tar.walk_order(members), uname))
    return out


def digest_with_folder_mtimes(layer: IO[bytes], mtime: int) -> str:
    """The diff id a layer tar would have if every folder entry in it carried this mtime (its
    files keep theirs)."""
    h = hashlib.sha256()
    while len(block := layer.read(512)) == 512:
        h.update(_with_mtime(block, mtime) if block[156:157] == b"5" else block)
        size = int(block[124:136].rstrip(b"\0 ") or b"0", 8) if block.strip(b"\0") else 0
        left = -(-size // 512) * 512
        while left:
            piece = layer.read(min(left, 1 << 20))
            h.update(piece)
            left -= len(piece)
    h.update(block)
    return "sha256:" + h.hexdigest()


def _with_mtime(header: bytes, mtime: int) -> bytes:
    h = bytearray(header)
    h[136:148] = format(mtime, "o").rjust(11, "0").encode() + b"\0"
    h[148:156] = b" " * 8
    h[148:156] = format(sum(h), "o").rjust(6, "0").encode() + b"\0 "
    return bytes(h)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, docker_client, tags) -> Rendered:
    """One render and one gpux-pack build for every builder."""
    tmp = tmp_path_factory.mktemp("builders")
    project = copy_example("mlp", tmp)
    built = build_image(project, tags("builders:gpux-pack"), env=SAME_TIME)
    context = tmp / "context"
    proc = run_cli("render", str(project), "--provider", "cpu", "--base-image", BASE_IMAGE, "--output", str(context),
                   env=SAME_TIME)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    base = docker_client.images.get(BASE_IMAGE).attrs["RootFS"]["Layers"]
    layers = docker_client.images.get(built["tag"]).attrs["RootFS"]["Layers"]
    assert layers[: len(base)] == base
    ours = layers[len(base) :]
    # the folder read as a tar writer reads it gives gpux-pack build's layers, with the owner
    # name this engine writes ("root" up to Docker 20.10, "" later)
    assert ours in (folder_layers(context, b"root"), folder_layers(context, b"")), ours
    return Rendered(context, built["tag"], base, ours)


def test_buildkit_gives_the_same_files_but_its_own_folder_times_and_a_workdir_layer(rendered, docker_client, tags,
                                                                                     tmp_path):  # fmt: skip
    """Docker 20.10's BuildKit differs in two ways the context cannot change: each folder
    a COPY writes carries the time of BuildKit's own copy, not the context's mtime (its files
    keep theirs), and WORKDIR commits an empty layer (its mkdir of an existing /tmp). Set the
    folders' mtimes back and drop that layer: every byte of every layer is gpux-pack's. ADD of
    the cache tar keeps the tar's times, so that layer is the same as it is."""
    if not os.access(DOCKER, os.X_OK):
        pytest.fail(f"the BuildKit test needs Debian's docker.io CLI at {DOCKER} (apt-get install docker.io)")
    tag = tags("builders:buildkit")
    _run([DOCKER, "build", "-q", "-t", tag, str(rendered.context)], DOCKER_BUILDKIT="1")
    layers = docker_client.images.get(tag).attrs["RootFS"]["Layers"]
    n = len(rendered.base)
    assert layers[:n] == rendered.base
    added = layers[n:]
    assert added[3] == EMPTY_LAYER and EMPTY_LAYER not in rendered.ours  # packages, runtime, cache, WORKDIR
    del added[3]
    assert added[2] == rendered.ours[2]  # ADD cache.tar: byte for byte
    saved = tmp_path / "saved.tar"
    with open(saved, "wb") as out:
        for chunk in docker_client.api.get_image(tag):
            out.write(chunk)
    with tarfile.open(saved) as archive:
        (manifest,) = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
        paths = manifest["Layers"][n:]
        del paths[3]
        assert len(paths) == len(rendered.ours)
        same_times = [digest_with_folder_mtimes(archive.extractfile(p), MTIME) for p in paths]  # type: ignore[arg-type]
    assert same_times == rendered.ours


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


# Without --layers, buildah bud commits the whole Dockerfile as one layer (podman build's
# default is --layers). --format docker: the OCI format drops HEALTHCHECK. --no-cache: podman
# and buildah share one build cache, and each must build its own layers.
BUILDERS = {"podman": (["podman", "build"], _podman_inspect),
            "buildah": (["buildah", "bud", "--layers"], _buildah_inspect)}


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_podman_and_buildah_give_the_same_layers_with_empty_owner_names(builder, rendered, podman_base,
                                                                        docker_client):  # fmt: skip
    """containers/storage writes layer tars as Docker 20.10 does but leaves the owner names
    (uname, gname) empty where the engine writes "root": the same bytes as gpux-pack's layers
    written with an empty owner name, which is what it assembles on an engine that writes them
    so. The base image keeps its diff id across `podman pull docker-daemon:`."""
    command, inspect = BUILDERS[builder]
    tag = f"localhost/gpux-test-{RUN_ID}/builders-{builder}:1"
    try:
        _run([*command, "--format", "docker", "--pull=never", "--no-cache", "-q", "-t", tag, str(rendered.context)])
        layers, config = inspect(tag)
    finally:
        subprocess.run(["podman", "rmi", tag], capture_output=True)  # and its intermediate images
    n = len(rendered.base)
    assert layers[:n] == rendered.base
    assert layers[n:] == folder_layers(rendered.context, b"")
    ours = docker_client.images.get(rendered.tag).attrs["Config"]
    for key in ("Entrypoint", "Cmd", "User", "WorkingDir"):
        assert config[key] == ours[key], key
    labels = dict(config["Labels"])
    assert labels.pop("io.buildah.version")  # both add their version; nothing else differs
    assert labels == ours["Labels"]
    assert config["Healthcheck"]["Test"] == ours["Healthcheck"]["Test"]
