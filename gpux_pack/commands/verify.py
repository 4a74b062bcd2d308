"""`gpux-pack verify IMAGE --key PUB`: the image's signature, SBOM and provenance, checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpux_pack.registry import signatures


def verify(client: Any, ref: str, key_path: Path) -> signatures.Verified:
    key = signatures.load_public_key(key_path)
    repository, digest = signatures.resolve(client, ref)
    return signatures.verify(client, repository, digest, key)


def lines(done: signatures.Verified) -> list[str]:
    return [f"verified {done.subject}: signed ({done.signatures} signature{'s' if done.signatures != 1 else ''} "
            "with this key), SBOM and provenance attached and naming it",
            f"  sbom        {done.sbom}", f"  provenance  {done.provenance}"]
