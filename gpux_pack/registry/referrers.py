"""Documents attached to an image in its registry as OCI 1.1 artifacts (image-spec 1.1,
distribution-spec 1.1): each an image manifest whose `artifactType` says what it is, whose one
layer is the document, whose config is the empty descriptor and whose `subject` is the image's
manifest. Clients find them through the referrers API (GET /v2/<name>/referrers/<digest>), or,
on a registry without it (Distribution 2.8), through the referrers tag schema: an image index
tagged `sha256-<hex>` of the subject, listing them; gpux-pack keeps that index current."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from gpux_pack.engine.interface import Engine
from gpux_pack.errors import DockerError
from gpux_pack.registry.index import INDEX, MANIFESTS, MAX_MANIFEST, Registry

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY = b"{}"  # the OCI empty descriptor's content
EMPTY_MEDIA = "application/vnd.oci.empty.v1+json"
MAX_DOCUMENT = 64 << 20  # an attached document larger than this is refused unread (a gpux SBOM is about 1 MiB)
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class Unreadable(DockerError):
    """An attached artifact that is not one bounded, digest-checked document; the message is the
    predicate ("is not a JSON manifest"), the caller names the artifact."""


@dataclass(frozen=True)
class Artifact:
    """One document to attach: its artifactType (the layer's media type too) and bytes."""

    artifact_type: str
    data: bytes
    annotations: dict[str, str] = field(default_factory=dict)


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def tag_of(digest: str) -> str:
    """The referrers tag schema's tag of a subject digest: sha256-<hex>."""
    algorithm, _, hex_ = digest.partition(":")
    return f"{algorithm}-{hex_}"


def attach(client: Engine | None, repository: str, subject: str, artifacts: list[Artifact]) -> list[str]:
    """Push each artifact as a manifest whose subject is `subject` (a manifest digest of
    `repository`), and list them under the subject's referrers tag; the artifact manifests'
    digests, in order."""
    registry = Registry(client, repository)
    descriptor = _subject(registry, subject)
    upload(registry, EMPTY)
    added = []
    for artifact in artifacts:
        layer = upload(registry, artifact.data)
        manifest = {
            "schemaVersion": 2, "mediaType": MANIFEST, "artifactType": artifact.artifact_type,
            "config": {"mediaType": EMPTY_MEDIA, "digest": _digest(EMPTY), "size": len(EMPTY)},
            "layers": [{"mediaType": artifact.artifact_type, "digest": layer, "size": len(artifact.data)}],
            "subject": descriptor,
            **({"annotations": dict(sorted(artifact.annotations.items()))} if artifact.annotations else {}),
        }
        body = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
        digest = _digest(body)
        response = registry.request("PUT", f"manifests/{digest}", data=body, headers={"Content-Type": MANIFEST})
        registry.check(response, f"{artifact.artifact_type} for {repository}@{subject}")
        added.append({"mediaType": MANIFEST, "digest": digest, "size": len(body),
                      "artifactType": artifact.artifact_type,
                      **({"annotations": manifest["annotations"]} if artifact.annotations else {})})
    if not _has_referrers_api(registry, subject):
        _update_tag_index(registry, subject, added)
    return [a["digest"] for a in added]


def referrers(client: Engine | None, repository: str, subject: str) -> list[dict[str, Any]]:
    """The descriptors of the artifacts that refer to `subject`: the referrers API where the
    registry has it, else the tag schema's index (empty when there is none)."""
    registry = Registry(client, repository, actions="pull")
    response = registry.request("GET", f"referrers/{subject}", headers={"Accept": INDEX})
    if response.status_code == 200 and response.headers.get("Content-Type", "").startswith(INDEX):
        try:
            body = response.json()
        except ValueError:
            body = None
    else:
        try:
            body = registry.manifest(tag_of(subject)).body
        except KeyError:
            body = None
    listed = body.get("manifests") if isinstance(body, dict) else None
    return [d for d in listed if isinstance(d, dict)] if isinstance(listed, list) else []


def fetch(client: Engine | None, repository: str, descriptor: dict[str, Any],
          limit: int | None = None) -> tuple[dict[str, Any], bytes]:
    """An artifact's manifest and its one layer's bytes, each checked against its digest. Bounded:
    whatever a registry serves, a manifest over 4 MiB or a document over `limit` (MAX_DOCUMENT) is
    refused, by its declared size before the download and by the bytes read (no more than declared).
    Unreadable says what is wrong."""
    limit = MAX_DOCUMENT if limit is None else limit
    registry = Registry(client, repository, actions="pull")
    digest, size = descriptor.get("digest"), descriptor.get("size")
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise Unreadable("has no sha256 digest in the referrers list")
    if _count(size) and size > MAX_MANIFEST:
        raise Unreadable(f"has a manifest of {size} bytes (more than {size_text(MAX_MANIFEST)}): refused unread")
    body = read(registry, f"manifests/{digest}", MAX_MANIFEST, f"artifact {repository}@{digest}",
                {"Accept": MANIFEST})
    if _digest(body) != digest:
        raise Unreadable(f"was served by registry {registry.name} as other bytes (sha256 {_digest(body)})")
    try:
        manifest = json.loads(body)
    except (ValueError, RecursionError):
        manifest = None
    if not isinstance(manifest, dict):
        raise Unreadable("has a manifest that is not a JSON object")
    layers = manifest.get("layers")
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], dict):
        count = len(layers) if isinstance(layers, list) else 0
        raise Unreadable(f"has {count} layer descriptors; an attached document is one")
    layer, size = layers[0].get("digest"), layers[0].get("size")
    if not isinstance(layer, str) or not DIGEST.fullmatch(layer) or not _count(size):
        raise Unreadable("has a layer without a sha256 digest and a size")
    if size > limit:
        raise Unreadable(f"is a document of {size} bytes (more than {size_text(limit)}): refused unread")
    data = read(registry, f"blobs/{layer}", size, f"blob {repository}@{layer}")
    if len(data) != size or _digest(data) != layer:
        raise Unreadable(f"was served by registry {registry.name} as other bytes than its layer {layer}")
    return manifest, data


def read(registry: Registry, path: str, limit: int, what: str, headers: dict[str, str] | None = None) -> bytes:
    """GET /v2/<name>/<path>, at most `limit` bytes of it (streamed: a registry that sends more is
    cut off there, Unreadable)."""
    import requests

    response = registry.request("GET", path, headers=headers, stream=True)
    try:
        registry.check(response, what)
        chunks, total = [], 0
        for chunk in response.iter_content(1 << 16):
            total += len(chunk)
            if total > limit:
                raise Unreadable(f"is more than {size_text(limit)} as served: refused")
            chunks.append(chunk)
        return b"".join(chunks)
    except requests.RequestException as e:
        raise DockerError(f"{what} on {registry.name}: the download broke off ({type(e).__name__})") from None
    finally:
        response.close()


def size_text(n: int) -> str:
    """A cap in words: 64 MiB, or its bytes where it is not whole MiB."""
    return f"{n >> 20} MiB" if n and not n % (1 << 20) else f"{n} bytes"


def _count(value: Any) -> bool:
    """A JSON size: a non-negative integer (not a bool, a float or a string)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _subject(registry: Registry, digest: str) -> dict[str, Any]:
    response = registry.request("GET", f"manifests/{digest}", headers={"Accept": ", ".join(MANIFESTS + (INDEX,))})
    registry.check(response, f"manifest {registry.repository}@{digest}")
    if _digest(response.content) != digest:
        raise DockerError(f"registry {registry.name} returned other bytes for {registry.repository}@{digest}")
    media = json.loads(response.content).get("mediaType") or response.headers.get("Content-Type", "").split(";")[0]
    return {"mediaType": media, "digest": digest, "size": len(response.content)}


def upload(registry: Registry, data: bytes) -> str:
    """A blob, pushed unless the registry has it (one monolithic upload): its digest."""
    digest = _digest(data)
    if registry.request("HEAD", f"blobs/{digest}").status_code == 200:
        return digest
    started = registry.request("POST", "blobs/uploads/")
    registry.check(started, f"blob upload to {registry.repository}")
    location = started.headers.get("Location", "")
    if not location:
        raise DockerError(f"registry {registry.name} started an upload without a Location")
    if location.startswith("/v2/"):
        location = location[len(f"/v2/{registry.path}/"):]
    elif "://" in location:
        location = location.split(f"/v2/{registry.path}/", 1)[-1]
    joiner = "&" if "?" in location else "?"
    done = registry.request("PUT", f"{location}{joiner}digest={digest}", data=data,
                            headers={"Content-Type": "application/octet-stream"})
    registry.check(done, f"blob {digest} to {registry.repository}")
    return digest


def _has_referrers_api(registry: Registry, subject: str) -> bool:
    response = registry.request("GET", f"referrers/{subject}", headers={"Accept": INDEX})
    return response.status_code == 200 and response.headers.get("Content-Type", "").startswith(INDEX)


def _update_tag_index(registry: Registry, subject: str, added: list[dict[str, Any]]) -> None:
    """The referrers tag schema: the subject's sha256-<hex> index, with the new artifacts (one
    entry per digest; an older entry of the same artifactType and gpux kind is replaced)."""
    tag = tag_of(subject)
    try:
        current = list(registry.manifest(tag).body.get("manifests") or [])
    except KeyError:
        current = []

    def kind(d: dict[str, Any]) -> tuple[Any, Any]:
        return d.get("artifactType"), (d.get("annotations") or {}).get("dev.gpux.kind")

    replaced = {kind(a) for a in added if kind(a)[1]}
    kept = [d for d in current if kind(d) not in replaced and d["digest"] not in {a["digest"] for a in added}]
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": kept + added}
    body = json.dumps(index, separators=(",", ":"), sort_keys=True).encode()
    response = registry.request("PUT", f"manifests/{tag}", data=body, headers={"Content-Type": INDEX})
    registry.check(response, f"referrers index {registry.repository}:{tag}")
