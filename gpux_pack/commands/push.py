"""`gpux-pack push`: push images as built, and attach the SBOM and provenance their builds recorded."""

from __future__ import annotations

from typing import Any

from gpux_pack.engine.interface import Engine
from gpux_pack.pipeline import attest
from gpux_pack.registry.push import Pushed, push
from gpux_pack.ui import Reporter


def push_all(client: Engine, refs: list[str], ui: Reporter) -> list[tuple[Pushed, attest.Attached | None]]:
    """Each image pushed, then its recorded SBOM and provenance attached to the pushed manifest."""
    out = []
    for ref in refs:
        pushed = push(client, ref, ui)
        out.append((pushed, attest.attach(client, pushed, client.images.get(pushed.tag).id, ui)))
    return out


def summary(done: list[tuple[Pushed, attest.Attached | None]]) -> dict[str, Any]:
    """push --json's document."""
    return {"images": [{"tag": p.tag, "digest": p.digest, "size_bytes": p.size, "seconds": round(p.seconds, 2),
                        "attestations": {"sbom": a.sbom, "provenance": a.provenance} if a else None}
                       for p, a in done]}


def lines(done: list[tuple[Pushed, attest.Attached | None]]) -> list[str]:
    return [f"pushed {p.digest}" + (" (with its SBOM and provenance)" if a else "") for p, a in done]
