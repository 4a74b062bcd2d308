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
import re
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from gpux_pack.engine.interface import Engine
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


def sign(client: Engine | None, repository: str, digest: str, key: Any) -> str:
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


SBOM_MEDIA = "application/vnd.cyclonedx+json"  # image/sbom.py's MEDIA_TYPE (registry may not import image)
PROVENANCE_MEDIA = "application/vnd.in-toto+json"  # image/provenance.py's MEDIA_TYPE, and the three below
STATEMENT = "https://in-toto.io/Statement/v1"
PREDICATE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/gpux-pack/gpux-pack/blob/main/docs/attestations.md#build-type-v1"
MODEL_LABEL = "io.gpux.model.sha256"  # plan.labels: the model's sha256, in the image's config
DOCUMENTS = {SBOM_MEDIA: "SBOM", PROVENANCE_MEDIA: "provenance"}
HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Verified:
    subject: str  # repo@sha256:... as verified: an image manifest, or an index
    signatures: int  # how many of the stored signatures this key verifies
    images: list[dict[str, Any]]  # each image manifest whose documents were checked (an index: every platform's)


def verify(client: Engine | None, repository: str, digest: str, key: Any) -> Verified:
    """That `digest` is signed with `key` (cosign's format), and that every SBOM and provenance
    attached to it (to each platform's image, for an index) is one gpux-pack wrote for this image:
    the documents are read and checked, not only their subject. VerifyError (one line) otherwise."""
    registry = Registry(client, repository, actions="pull")
    subject = f"{repository}@{digest}"
    good = _signed(registry, subject, digest, key)
    try:
        top = registry.manifest(digest)
    except KeyError:
        raise VerifyError(f"{subject}: not in its registry") from None
    if not top.is_list:
        return Verified(subject, good, [_attested(client, registry, digest, top.body, subject)])
    images = []
    for member in _list(top.body.get("manifests")):
        if not isinstance(member, dict) or _get(member, "platform", "os") == "unknown":
            continue  # not an image: buildx lists its attestations as unknown/unknown
        named = member.get("digest")
        if not isinstance(named, str) or not referrers.DIGEST.fullmatch(named):
            raise VerifyError(f"{subject}: the index lists a manifest without a sha256 digest")
        try:
            manifest = registry.manifest(named)
        except KeyError:
            raise VerifyError(f"{subject}: the index lists {named}, which is not in the registry") from None
        if manifest.is_list:
            raise VerifyError(f"{subject}: the index lists an index, {named} (nested indexes are not verified)")
        images.append(_attested(client, registry, named, manifest.body, subject))
    if not images:
        raise VerifyError(f"{subject}: the index lists no image manifest")
    return Verified(subject, good, images)


def _signed(registry: Registry, subject: str, digest: str, key: Any) -> int:
    """How many signatures under the digest's .sig tag verify with `key` and name `digest`."""
    tag = f"{tag_of(digest)}.sig"
    try:
        signed = registry.manifest(tag).body
    except KeyError:
        raise VerifyError(f"{subject}: no signature ({registry.repository}:{tag} does not exist)") from None
    good, problems = 0, []
    for entry in _list(signed.get("layers")):
        if not isinstance(entry, dict) or entry.get("mediaType") != PAYLOAD_MEDIA:
            continue
        try:
            signature = _get(entry, "annotations", SIGNATURE_ANNOTATION)
            if not isinstance(entry.get("digest"), str) or not referrers.DIGEST.fullmatch(entry["digest"]):
                raise ValueError("no digest")
            data = referrers.read(registry, f"blobs/{entry['digest']}", referrers.MAX_MANIFEST,
                                  f"signed payload {registry.repository}@{entry['digest']}")
            if _digest(data) != entry["digest"]:
                raise referrers.Unreadable(f"was served by registry {registry.name} as other bytes")
            key.verify(base64.b64decode(signature, validate=True), data, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError, TypeError):
            problems.append("a signature does not verify with this key")
            continue
        except referrers.Unreadable as e:
            problems.append(f"a signed payload {e}")
            continue
        except DockerError as e:
            problems.append(str(e))
            continue
        try:
            critical = json.loads(data)["critical"]
            named = critical["image"]["docker-manifest-digest"]
            kind = critical["type"]
        except (ValueError, KeyError, TypeError, RecursionError):
            problems.append("a signed payload is not a simple-signing document")
            continue
        if kind != SIGNATURE_TYPE or named != digest:
            shown = named if isinstance(named, str) and referrers.DIGEST.fullmatch(named) else _shown(named, 80)
            problems.append(f"a signature is of {shown}, not of {digest}")
            continue
        good += 1
    if not good:
        why = "; ".join(sorted(set(problems))) or "no signature layers"
        raise VerifyError(f"{subject}: not signed with this key ({why})")
    return good


def _attested(client: Engine | None, registry: Registry, digest: str, manifest: dict[str, Any], signed: str) -> dict[str, Any]:
    """One image manifest's attached SBOMs and provenances, each read and checked against the
    image (its config's digest and its model's sha256 label): at least one of each, and every one
    valid. `signed`: what the signature covers (the index, for a platform's image)."""
    repository = registry.repository
    subject = f"{repository}@{digest}"
    config = manifest.get("config")
    config_digest = config.get("digest") if isinstance(config, dict) else None
    if not isinstance(config_digest, str) or not referrers.DIGEST.fullmatch(config_digest):
        raise VerifyError(f"{subject}: its manifest names no config blob (not an image)")
    try:
        data = referrers.read(registry, f"blobs/{config_digest}", referrers.MAX_DOCUMENT,
                              f"config {repository}@{config_digest}")
    except referrers.Unreadable as e:
        raise VerifyError(f"{subject}: its config blob {e}") from None
    if _digest(data) != config_digest:
        raise VerifyError(f"{subject}: registry {registry.name} served other bytes for its config {config_digest}")
    try:
        blob = json.loads(data)
    except (ValueError, RecursionError):
        blob = None
    model = _get(blob, "config", "Labels", MODEL_LABEL)
    if not isinstance(model, str) or not HEX.fullmatch(model):
        raise VerifyError(f"{subject}: its config has no {MODEL_LABEL} label (not an image gpux-pack built), so "
                          "there is no model to check its SBOM and provenance against")
    platform = "/".join(str(_get(blob, k)) for k in ("os", "architecture") if isinstance(_get(blob, k), str))
    found: dict[str, list[str]] = {SBOM_MEDIA: [], PROVENANCE_MEDIA: []}
    for descriptor in referrers.referrers(client, repository, digest):
        kind = descriptor.get("artifactType")
        if not isinstance(kind, str) or kind not in DOCUMENTS:
            continue
        what = DOCUMENTS[kind]
        artifact = descriptor.get("digest")
        named = f"{what} {artifact}" if isinstance(artifact, str) and referrers.DIGEST.fullmatch(artifact) else what
        try:
            artifact_manifest, document = referrers.fetch(client, repository, descriptor)
        except referrers.Unreadable as e:
            raise VerifyError(f"{subject}: the attached {named} {e}") from None
        about = _get(artifact_manifest, "subject", "digest")
        if about != digest:
            raise VerifyError(f"{subject}: the attached {named} names {_shown(about, 80)} as its subject, "
                              "not this digest")
        stated = artifact_manifest.get("artifactType")
        if stated is not None and stated != kind:
            raise VerifyError(f"{subject}: the attached {named} is listed as {kind} but its manifest says "
                              f"{_shown(stated, 80)}")
        check = check_sbom if kind == SBOM_MEDIA else check_provenance
        try:
            check(document, config_digest, model, digest)
        except VerifyError as e:
            raise VerifyError(f"{subject}: the attached {named} {e}") from None
        found[kind].append(artifact)
    for kind, what in DOCUMENTS.items():
        if not found[kind]:
            raise VerifyError(f"{subject}: no {what} attached (no {kind} referrer)")
    return {"manifest": subject, "platform": platform, "image_id": config_digest, "model_sha256": model,
            "sbom": found[SBOM_MEDIA], "provenance": found[PROVENANCE_MEDIA],
            **({"signed_by": signed} if signed != subject else {})}


def check_sbom(data: bytes, image_id: str, model_sha256: str, digest: str) -> None:
    """That `data` is the CycloneDX SBOM of this image: its metadata.component carries the image's
    id (gpux:image_id, what a build and a warmup write) and it lists exactly one machine-learning
    model, whose SHA-256 is the image's model's. Another image's SBOM, an empty or a foreign
    document would otherwise be vouched for. `digest` (the manifest) is not named in an SBOM: the
    image id is. VerifyError (what is wrong, a predicate: "is not JSON") otherwise."""
    doc = _parse(data)
    if doc.get("bomFormat") != "CycloneDX":
        raise VerifyError(f"is not a CycloneDX SBOM (bomFormat {_shown(doc.get('bomFormat'))})")
    if not isinstance(doc.get("specVersion"), str) or not re.fullmatch(r"1\.\d+", doc["specVersion"]):
        raise VerifyError(f"has no CycloneDX specVersion (found {_shown(doc.get('specVersion'))})")
    component = _get(doc, "metadata", "component")
    if not isinstance(component, dict):
        raise VerifyError("has no metadata.component (the image it describes)")
    properties = component.get("properties")
    ids = [p.get("value") for p in properties if isinstance(p, dict) and p.get("name") == "gpux:image_id"] \
        if isinstance(properties, list) else []
    if not ids:
        raise VerifyError("names no image (metadata.component has no gpux:image_id property)")
    if ids != [image_id]:
        raise VerifyError(f"names image {_shown(ids[0] if len(ids) == 1 else ids)}, not this image {image_id}")
    components = doc.get("components")
    models = [c for c in components if isinstance(c, dict) and c.get("type") == "machine-learning-model"] \
        if isinstance(components, list) else []
    if len(models) != 1:
        raise VerifyError(f"lists {len(models)} machine-learning-model components; the image holds one model")
    hashes = models[0].get("hashes")
    sha = [h.get("content") for h in hashes if isinstance(h, dict) and h.get("alg") == "SHA-256"] \
        if isinstance(hashes, list) else []
    if not sha:
        raise VerifyError("lists its model without a SHA-256")
    if [s.lower() if isinstance(s, str) else s for s in sha] != [model_sha256]:
        raise VerifyError(f"lists model sha256 {_shown(sha[0] if len(sha) == 1 else sha)}, not this image's "
                          f"model sha256:{model_sha256}")


def check_provenance(data: bytes, image_id: str, model_sha256: str, digest: str) -> None:
    """That `data` is gpux-pack's provenance of this manifest: an in-toto Statement v1 of SLSA
    Provenance v1 with gpux-pack's build type, `digest` among its subjects and the image's model
    as its resolved dependency "model". A statement of another build, or any other predicate,
    would otherwise be vouched for. `image_id` is not named in a provenance: the digest is.
    VerifyError (what is wrong, a predicate) otherwise."""
    doc = _parse(data)
    if doc.get("_type") != STATEMENT:
        raise VerifyError(f"is not an in-toto Statement v1 (_type {_shown(doc.get('_type'))})")
    if doc.get("predicateType") != PREDICATE:
        raise VerifyError(f"has predicateType {_shown(doc.get('predicateType'))}, not SLSA Provenance v1 "
                          f"({PREDICATE})")
    subjects = doc.get("subject")
    named = [_get(s, "digest", "sha256") for s in subjects] if isinstance(subjects, list) else []
    if digest.split(":", 1)[-1] not in named:
        raise VerifyError(f"has subject digests {_shown(named)}, not this digest")
    build_type = _get(doc, "predicate", "buildDefinition", "buildType")
    if build_type != BUILD_TYPE:
        raise VerifyError(f"has buildType {_shown(build_type)}, not gpux-pack's ({BUILD_TYPE})")
    resolved = _get(doc, "predicate", "buildDefinition", "resolvedDependencies")
    models = [d for d in resolved if isinstance(d, dict) and d.get("name") == "model"] \
        if isinstance(resolved, list) else []
    if len(models) != 1:
        raise VerifyError(f"lists {len(models)} resolved dependencies named \"model\"; the image holds one model")
    sha = _get(models[0], "digest", "sha256")
    if not isinstance(sha, str) or sha.lower() != model_sha256:
        raise VerifyError(f"lists model sha256 {_shown(sha)}, not this image's model sha256:{model_sha256}")


def _parse(data: bytes) -> dict[str, Any]:
    """A document's JSON object; VerifyError for anything else (bytes, a list, a string, too big
    or too deep to read)."""
    if len(data) > referrers.MAX_DOCUMENT:
        raise VerifyError(f"is {len(data)} bytes, more than {referrers.size_text(referrers.MAX_DOCUMENT)}: refused")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise VerifyError("is JSON nested too deep to read") from None
    except ValueError:  # UnicodeDecodeError too
        raise VerifyError("is not JSON") from None
    if not isinstance(doc, dict):
        raise VerifyError(f"is not a JSON object (a {_JSON.get(type(doc), type(doc).__name__)})")
    return doc


_JSON = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _get(doc: Any, *path: str) -> Any:
    """doc[a][b]..., None where a step is not an object or lacks the key (documents are anyone's JSON)."""
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def _list(value: Any) -> list[Any]:
    """A JSON array, or nothing where a document has something else."""
    return value if isinstance(value, list) else []


def _shown(value: Any, limit: int = 120) -> str:
    """A value from a document as JSON on one line (control characters escaped), cut to `limit`."""
    try:
        text = json.dumps(value, ensure_ascii=True, default=str)
    except (ValueError, RecursionError):
        text = repr(type(value))
    return text if len(text) <= limit else text[:limit] + "..."


def resolve(client: Engine | None, ref: str) -> tuple[str, str]:
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


def attachments(client: Engine | None, repository: str, digest: str) -> dict[str, Any]:
    """What the registry holds for this manifest: the SBOM's and provenance's artifact digests
    (None when absent) and how many cosign signatures (unverified: `verify` checks them)."""
    found: dict[str, Any] = {"sbom": None, "provenance": None, "signatures": 0}
    for descriptor in referrers.referrers(client, repository, digest):
        artifact_type = descriptor.get("artifactType")
        kind = {SBOM_MEDIA: "sbom", PROVENANCE_MEDIA: "provenance"}.get(artifact_type) \
            if isinstance(artifact_type, str) else None
        if kind:
            found[kind] = descriptor.get("digest")
    try:
        layers = Registry(client, repository, actions="pull").manifest(f"{tag_of(digest)}.sig").body.get("layers")
        found["signatures"] = sum(1 for entry in _list(layers) if _get(entry, "mediaType") == PAYLOAD_MEDIA)
    except KeyError:
        pass
    return found
