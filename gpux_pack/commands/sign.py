"""`gpux-pack sign IMAGE --key KEY`: sign a pushed image in cosign's key-based format."""

from __future__ import annotations

from pathlib import Path

from gpux_pack.engine.interface import Engine
from gpux_pack.registry import signatures
from gpux_pack.ui import Reporter


def sign(client: Engine | None, ref: str, key_path: Path, ui: Reporter) -> str:
    """The signed manifest (repo@sha256:...), its signature stored where `cosign verify` looks."""
    key = signatures.load_private_key(key_path)
    repository, digest = signatures.resolve(client, ref)
    ui.info(f"signing {repository}@{digest}")
    signatures.sign(client, repository, digest, key)
    return f"{repository}@{digest}"
