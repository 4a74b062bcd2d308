"""An image read from its registry without pulling it: its manifest (or index), config blob
and labels, through the registry's HTTP API with the user's Docker credentials (index.Registry).
deploy and inspect take an image that is only in a registry this way; run and warmup need the
image on the engine and say so.

Local first: the engine's image is what `run` would start, and a build's labels are the same
either way. A reference missing here is read from its registry when it names one
(image_labels.names_registry). The result pins the digest of the manifest the reference names:
for a multi-platform tag that is the index, so each node pulls its own platform.
"""

from __future__ import annotations

import json
import platform
from typing import Any

from gpux_pack import engine
from gpux_pack.engine import image_labels
from gpux_pack.engine.image_labels import GpuxImage
from gpux_pack.engine.interface import Engine
from gpux_pack.errors import DockerError, UsageError
from gpux_pack.reference import parse_reference
from gpux_pack.registry.index import MANIFESTS, Manifest, Registry

ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def read(client: Engine | None, ref: str, built_by_us: bool = True) -> GpuxImage:
    """The image on this engine, else in the registry the reference names (client None: no
    engine, the registry only)."""
    if client is not None:
        found = image_labels.local(client, ref, built_by_us)
        if found is not None:
            return found
    if not image_labels.names_registry(ref):
        if client is None:
            engine.connect()  # a bare name can only be local: the engine's own one-line refusal
        raise UsageError(f"{ref}: no such image on this Docker engine (to read it from a registry, name the "
                         "registry: host[:port]/repository:tag)")
    return fetch(client, ref, built_by_us)


def fetch(client: Engine | None, ref: str, built_by_us: bool = True) -> GpuxImage:
    """The image as its registry has it: labels from the config blob, id = the config digest,
    size = its layers summed, pinned = repo@<digest of the manifest or index ref names>."""
    try:
        reference = parse_reference(ref)
    except ValueError as e:
        raise UsageError(f"{ref}: {e}") from None
    repo, wanted = reference.repository_tag
    registry = Registry(client, repo, actions="pull")
    top = _manifest(registry, ref, wanted)
    image = top
    if top.is_list:
        member = pick(top.body.get("manifests") or [], host_arch())
        if member is None:
            raise UsageError(f"{ref}: its index lists no image manifest for any platform")
        image = _manifest(registry, ref, member["digest"])
        if image.is_list:
            raise UsageError(f"{ref}: an index inside an index is not read")
    config = image.body.get("config") or {}
    if not isinstance(config, dict) or not str(config.get("digest", "")).startswith("sha256:"):
        raise DockerError(f"{ref}: its manifest names no config blob")
    try:
        blob = json.loads(registry.blob(config["digest"]))
    except ValueError:
        raise DockerError(f"{ref}: its config blob is not JSON") from None
    if not isinstance(blob, dict):
        raise DockerError(f"{ref}: its config blob is malformed")
    size = sum(int(layer.get("size") or 0) for layer in image.body.get("layers") or [] if isinstance(layer, dict))
    return image_labels.from_config(ref, blob, config["digest"], size, f"{repo}@{top.digest}", built_by_us)


def _manifest(registry: Registry, ref: str, wanted: str) -> Manifest:
    try:
        return registry.manifest(wanted)
    except KeyError as e:
        why = str(e.args[0]) if e.args else "HTTP 404"
        raise UsageError(f"{ref}: no such image in registry {registry.name} ({why})") from None


def host_arch() -> str:
    machine = platform.machine().lower()
    return ARCHES.get(machine, machine)


def pick(manifests: list[Any], host: str) -> dict[str, Any] | None:
    """The index member whose config stands for the image: linux/amd64 (what most clusters run),
    else linux/<this host's architecture>, else the first image listed; the only image of a
    one-member index is that. Every member of a gpux-pack index carries the same labels (one
    plan, one label set), so the choice only decides which config is read. Entries that are not
    image manifests (buildx's attestations, platform unknown/unknown; nested indexes) are skipped."""
    images = [m for m in manifests if isinstance(m, dict) and str(m.get("digest", "")).startswith("sha256:")
              and m.get("mediaType", MANIFESTS[0]) in MANIFESTS
              and (m.get("platform") or {}).get("os") != "unknown"]

    def on(arch: str) -> dict[str, Any] | None:
        return next((m for m in images if (m.get("platform") or {}).get("os", "linux") == "linux"
                     and (m.get("platform") or {}).get("architecture") == arch), None)

    return on("amd64") or on(host) or (images[0] if images else None)
