"""Image signatures in cosign's key-based format (sigstore/cosign specs/SIGNATURE_SPEC.md), so
`cosign verify --key` and other verifiers accept them, and their verification.

A signature is an ECDSA P-256 signature (SHA-256, DER, base64) of a simple-signing payload
naming the image's manifest digest; the payload is a layer (media type
application/vnd.dev.cosign.simplesigning.v1+json) of an OCI image manifest tagged
`sha256-<hex>.sig` in the image's repository, the signature its annotation
`dev.cosignproject.cosign/signature`. Several signatures of one image are several layers.

Keys are PEM: a PKCS#8 or SEC1 EC private key on P-256 (unencrypted, or encrypted with the
password in GPUX_SIGN_PASSWORD or COSIGN_PASSWORD) and a PKIX public key, as `openssl` writes them.
cosign's own encrypted key format (scrypt and NaCl secretbox) is not read: cosign verifies with a
PEM public key either way."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from gpux_pack.errors import DockerError, PackError, UsageError
from gpux_pack.keys import load_private_key, load_public_key  # noqa: F401 (sign and verify read keys here)
from gpux_pack.registry import referrers
from gpux_pack.registry.index import Registry
from gpux_pack.registry.referrers import MANIFEST, tag_of, upload

PAYLOAD_MEDIA = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIGNATURE_TYPE = "cosign container image signature"
CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"


class VerifyError(PackError):
    """What failed, in one line (verify exits 1)."""


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def payload(repository: str, digest: str) -> bytes:
    """The simple-signing payload of an image manifest digest."""
    doc = {"critical": {"identity": {"docker-reference": repository}, "image": {"docker-manifest-digest": digest},
                        "type": SIGNATURE_TYPE}, "optional": None}
    return json.dumps(doc, separators=(",", ":")).encode()


def sign(client: Any, repository: str, digest: str, key: Any) -> str:
    """Sign the manifest `digest` of `repository` and store the signature where cosign looks
    (added to the signatures already there); the signature manifest's digest."""
    registry = Registry(client, repository)
    data = payload(repository, digest)
    signature = base64.b64encode(key.sign(data, ec.ECDSA(hashes.SHA256()))).decode()
    layer = {"mediaType": PAYLOAD_MEDIA, "digest": _digest(data), "size": len(data),
             "annotations": {SIGNATURE_ANNOTATION: signature}}
    tag = f"{tag_of(digest)}.sig"
    try:
        layers = [entry for entry in registry.manifest(tag).body.get("layers") or []
                  if entry.get("digest") != layer["digest"] or
                  (entry.get("annotations") or {}).get(SIGNATURE_ANNOTATION) != signature]
    except KeyError:
        layers = []
    layers.append(layer)
    config = json.dumps({"architecture": "", "os": "", "config": {}, "created": "0001-01-01T00:00:00Z",
                         "rootfs": {"type": "layers", "diff_ids": [entry["digest"] for entry in layers]}},
                        separators=(",", ":"), sort_keys=True).encode()
    upload(registry, data)
    upload(registry, config)
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                "config": {"mediaType": CONFIG_MEDIA, "digest": _digest(config), "size": len(config)},
                "layers": layers}
    body = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    response = registry.request("PUT", f"manifests/{tag}", data=body, headers={"Content-Type": MANIFEST})
    registry.check(response, f"signature {repository}:{tag}")
    return _digest(body)


@dataclass(frozen=True)
class Verified:
    subject: str  # repo@sha256:...
    signatures: int  # how many of the stored signatures this key verifies
    sbom: str  # the SBOM artifact's digest
    provenance: str


def verify(client: Any, repository: str, digest: str, key: Any) -> Verified:
    """That `digest` is signed with `key` (cosign's format), and that an SBOM and an in-toto
    provenance statement are attached to it and name it as their subject. VerifyError otherwise."""
    registry = Registry(client, repository, actions="pull")
    tag = f"{tag_of(digest)}.sig"
    try:
        signed = registry.manifest(tag).body
    except KeyError:
        raise VerifyError(f"{repository}@{digest}: no signature ({repository}:{tag} does not exist)") from None
    good, problems = 0, []
    for entry in signed.get("layers") or []:
        if entry.get("mediaType") != PAYLOAD_MEDIA:
            continue
        signature = (entry.get("annotations") or {}).get(SIGNATURE_ANNOTATION, "")
        try:
            data = registry.blob(entry["digest"])
            key.verify(base64.b64decode(signature, validate=True), data, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError, TypeError):
            problems.append("a signature does not verify with this key")
            continue
        except DockerError as e:
            problems.append(str(e))
            continue
        try:
            critical = json.loads(data)["critical"]
            named = critical["image"]["docker-manifest-digest"]
            kind = critical["type"]
        except (ValueError, KeyError, TypeError):
            problems.append("a signed payload is not a simple-signing document")
            continue
        if kind != SIGNATURE_TYPE or named != digest:
            problems.append(f"a signature is of {named}, not of {digest}")
            continue
        good += 1
    if not good:
        why = "; ".join(sorted(set(problems))) or "no signature layers"
        raise VerifyError(f"{repository}@{digest}: not signed with this key ({why})")
    found = {}
    for descriptor in referrers.referrers(client, repository, digest):
        kind = descriptor.get("artifactType")
        if kind not in ("application/vnd.cyclonedx+json", "application/vnd.in-toto+json"):
            continue
        manifest, document = referrers.fetch(client, repository, descriptor)
        if (manifest.get("subject") or {}).get("digest") != digest:
            raise VerifyError(f"{repository}@{digest}: the attached {kind} names "
                              f"{(manifest.get('subject') or {}).get('digest')} as its subject")
        if kind == "application/vnd.in-toto+json":
            subjects = [s.get("digest", {}).get("sha256") for s in json.loads(document).get("subject") or []]
            if digest.split(":", 1)[1] not in subjects:
                raise VerifyError(f"{repository}@{digest}: the provenance's subject is {subjects}, not this digest")
        found[kind] = descriptor["digest"]
    for kind, what in (("application/vnd.cyclonedx+json", "SBOM"), ("application/vnd.in-toto+json", "provenance")):
        if kind not in found:
            raise VerifyError(f"{repository}@{digest}: no {what} attached (no {kind} referrer)")
    return Verified(f"{repository}@{digest}", good, found["application/vnd.cyclonedx+json"],
                    found["application/vnd.in-toto+json"])


def resolve(client: Any, ref: str) -> tuple[str, str]:
    """(repository, manifest digest) of an image reference: its @digest, else what its tag names
    in the registry now."""
    from gpux_pack.reference import parse_reference

    try:
        reference = parse_reference(ref)
    except ValueError as e:
        raise UsageError(f"{ref}: {e}") from None
    if "@" in ref:
        repository, digest = ref.rsplit("@", 1)
        return repository, digest
    repository, tag = reference.repository_tag
    try:
        return repository, Registry(client, repository, actions="pull").manifest(tag).digest
    except KeyError:
        raise UsageError(f"{ref}: not in its registry (push it first)") from None


def attachments(client: Any, repository: str, digest: str) -> dict[str, Any]:
    """What the registry holds for this manifest: the SBOM's and provenance's artifact digests
    (None when absent) and how many cosign signatures (unverified: `verify` checks them)."""
    found: dict[str, Any] = {"sbom": None, "provenance": None, "signatures": 0}
    for descriptor in referrers.referrers(client, repository, digest):
        kind = {"application/vnd.cyclonedx+json": "sbom", "application/vnd.in-toto+json": "provenance"}.get(
            descriptor.get("artifactType"))
        if kind:
            found[kind] = descriptor["digest"]
    try:
        layers = Registry(client, repository, actions="pull").manifest(f"{tag_of(digest)}.sig").body.get("layers")
        found["signatures"] = sum(1 for entry in layers or [] if entry.get("mediaType") == PAYLOAD_MEDIA)
    except KeyError:
        pass
    return found
