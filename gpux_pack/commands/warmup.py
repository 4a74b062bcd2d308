"""`gpux-pack warmup IMAGE`: bake the image's compiled provider caches into a derived image, or
export them for a volume, on the machine that has its accelerator (pipeline/bake.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpux_pack import engine, providers
from gpux_pack.engine import image_labels
from gpux_pack.engine.interface import Engine
from gpux_pack.errors import UsageError
from gpux_pack.pipeline import attest
from gpux_pack.pipeline.bake import bake_image, cache_of
from gpux_pack.reference import parse_reference
from gpux_pack.ui import Reporter


def warmup(client: Engine, image: str, pull: str, tag: str | None, gpus: str | None, device: tuple[str, ...],
           export: Path | None, timeout: int, ui: Reporter) -> dict[str, Any]:
    """Bake (or export) and say what was made: `warmup --json`'s document."""
    if tag is not None:
        try:
            parse_reference(tag.replace("{short}", "x"))
        except ValueError as e:
            raise UsageError(f"--tag: {e}") from None
        if export is not None:
            raise UsageError("--export: --tag makes an image, --export a folder: choose one")
    engine.ensure_image(client, image, pull, ui.info)
    row = providers.PROVIDERS.get(image_labels.read(client, image).provider)
    devices = providers.devices_for(row, gpus, device)
    parent = client.images.get(image).id
    baked = bake_image(client, image, ui, tag=tag, devices=devices, export=export, timeout=timeout)
    cache = cache_of(client, baked)
    sbom = attest.record_warmed(parent, baked.id, cache) if cache and baked.id else None
    state = baked.state
    return {
        "image": image, "tag": baked.tag, "id": baked.id, "exported": str(baked.exported) if baked.exported else None,
        "key": baked.key, "short": baked.short, "cache": state.get("cache"), "assembled": baked.assembled,
        "device": (baked.record.get("parts") or {}).get("device"), "warmup_seconds": state.get("seconds"),
        "partition": state.get("partition"), "accuracy": state.get("accuracy"), "seconds": round(baked.seconds, 2),
        "sbom": str(sbom) if sbom else None,
    }


def line(summary: dict[str, Any]) -> str:
    if summary["exported"]:
        return f"exported {summary['exported']}  key {summary['key']}  ({summary['device']})"
    return (f"warmed {summary['tag']}  {(summary['id'] or '')[7:19]}  key {summary['key']}  "
            f"({summary['device'] or 'already warm'})")
