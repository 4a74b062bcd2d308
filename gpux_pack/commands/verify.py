"""`gpux-pack verify IMAGE --key PUB`: the image's signature, and its SBOM and provenance read and
checked against the image (registry/signatures.py says what each check is)."""

from __future__ import annotations

from pathlib import Path

from gpux_pack.engine.interface import Engine
from gpux_pack.registry import signatures


def verify(client: Engine | None, ref: str, key_path: Path) -> signatures.Verified:
    key = signatures.load_public_key(key_path)
    repository, digest = signatures.resolve(client, ref)
    return signatures.verify(client, repository, digest, key)


def lines(done: signatures.Verified) -> list[str]:
    """What was checked, document by document: a verify that says only "ok" vouches for nothing
    the reader can see."""
    count = f"{done.signatures} signature{'s' if done.signatures != 1 else ''} with this key"
    index = any(image.get("signed_by") for image in done.images)
    head = f"verified {done.subject}: signed ({count})"
    out = [head + (f"; an index of {len(done.images)} image{'s' if len(done.images) != 1 else ''}, each "
                   "one's SBOM and provenance checked" if index else "; its SBOM and provenance checked")]
    for image in done.images:
        pad = "    " if index else "  "
        if index:
            out.append(f"  {image['platform'] or 'image'}  {image['manifest']}")
        model = f"model sha256:{image['model_sha256']}"
        out += [f"{pad}sbom        {d}  CycloneDX, names image {image['image_id']} and {model}"
                for d in image["sbom"]]
        out += [f"{pad}provenance  {d}  SLSA v1 of gpux-pack's build type, subject this digest, {model}"
                for d in image["provenance"]]
    return out
