"""The archive `docker load` reads (the docker-save layout), written as a stream: each new
layer's tar, the image config, and manifest.json. Layers the engine already holds (the
parent's) are named in the manifest but not sent: the engine skips every layer whose chain it
has. Imports nothing heavy, so a model-only rebuild (pipeline/rebuild.py) writes it too."""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass
from typing import Iterator

from gpux_pack.image import layer_tar
from gpux_pack.reference import parse_reference

@dataclass(frozen=True)
class LayerTar:
    """A layer written on the host: its members, and the diff id the engine will compute."""

    name: str  # the layout's layer ("packages", "model", ...)
    members: list[layer_tar.Member]
    diff_id: str
    size: int
    created_by: str  # its history line
    uname: bytes  # the owner name this engine writes in layer tars


@dataclass(frozen=True)
class Loadable:
    """One image in the archive: its config's bytes, its parent's diff ids (not sent) and its
    own layers (sent)."""

    tag: str | None  # None: untagged
    config: bytes
    parent_diff_ids: list[str]
    layers: list[LayerTar]
    own_history: int = 0  # how many of the config's history entries are this image's (the last ones)


def config_bytes(doc: dict) -> bytes:
    """An image config as the archive holds it (its sha256 is the image id): one spelling, so a
    replayed image and a built one with the same content have the same id."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def chunks(images: list[Loadable]) -> Iterator[bytes]:
    manifest = []
    for image in images:
        config_name = hashlib.sha256(image.config).hexdigest() + ".json"
        paths = [f"{d.split(':', 1)[1]}/layer.tar" for d in image.parent_diff_ids]
        for lay in image.layers:
            path = f"{lay.diff_id.split(':', 1)[1]}/layer.tar"
            paths.append(path)
            yield _member_header(path, lay.size)
            yield from layer_tar.chunks(lay.members, lay.uname)
            yield _padding(lay.size)
        yield _member_header(config_name, len(image.config)) + image.config + _padding(len(image.config))
        manifest.append({"Config": config_name, "RepoTags": [repo_tag(image.tag)] if image.tag else None,
                         "Layers": paths})
    data = json.dumps(manifest).encode()
    yield _member_header("manifest.json", len(data)) + data + _padding(len(data))
    yield b"\0" * 1024


def _member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, layer_tar.MTIME
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _padding(size: int) -> bytes:
    return b"\0" * (-size % 512)


def repo_tag(tag: str) -> str:
    """The RepoTags form of a reference (docker.io/library/x:1 -> x:1)."""
    repo, name = parse_reference(tag).repository_tag
    return f"{repo}:{name}"
