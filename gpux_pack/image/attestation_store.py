"""The SBOM and provenance predicate every build records of its image, under the cache by image
id (`attestations/<id>/`), so that a later `push` attaches them; and the same documents for an
image that differs from a recorded one only in its model's bytes (a weights-only rebuild): the
model's sha256, the image id and the times put in, the serial number made anew. Standard library
only: the rebuild that uses it imports nothing heavy."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from gpux_pack import staging

SBOM_FILE = "sbom.cdx.json"
PREDICATE_FILE = "provenance-predicate.json"
GPUX_NAMESPACE = uuid.UUID("6c4c4ad2-0d1e-4d3b-9a43-1f1d3b7e2a51")  # the SBOM serial number's uuid5 namespace


def folder_of(image_id: str) -> Path:
    return staging.cache_dir() / "attestations" / image_id.replace(":", "-")


def write(image_id: str, document: bytes, predicate: dict[str, Any]) -> Path:
    """Record an image's SBOM and predicate; the SBOM's path."""
    folder = folder_of(image_id)
    folder.mkdir(parents=True, exist_ok=True)
    staging.write_bytes(folder / SBOM_FILE, document)
    staging.write_text(folder / PREDICATE_FILE, json.dumps(predicate, sort_keys=True, indent=1) + "\n")
    return folder / SBOM_FILE


def recorded(image_id: str) -> tuple[bytes, dict[str, Any]] | None:
    """The SBOM and provenance predicate a build recorded for this image, if any."""
    folder = folder_of(image_id)
    try:
        found = (folder / SBOM_FILE).read_bytes(), json.loads((folder / PREDICATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    staging.touch(folder)  # used: `cache prune` keeps it
    return found


def sbom_bytes(doc: dict[str, Any]) -> bytes:
    """The SBOM as gpux-pack writes it: its serial number derived from everything else in it (the
    same content, the same serial; other content, another), keys sorted."""
    rest = {k: v for k, v in doc.items() if k != "serialNumber"}
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    out = {**rest, "serialNumber": f"urn:uuid:{uuid.uuid5(GPUX_NAMESPACE, digest)}"}
    return (json.dumps(out, sort_keys=True, indent=1) + "\n").encode()


def sbom_timestamp(created: str) -> str:
    """An RFC 3339 time (Z) as the SBOM's metadata holds it (+00:00)."""
    return datetime.fromisoformat(created.replace("Z", "+00:00")).isoformat()


def with_new_model(old_id: str, new_id: str, old_sha: str, new_sha: str, created: str, started: str,
                   finished: str) -> Path | None:
    """Record the documents of image `new_id`, made from `old_id`'s by a weights-only rebuild:
    what a full build of it records (the model's sha256, the image id and the times are the only
    inputs that changed). None when `old_id` has none recorded."""
    found = recorded(old_id)
    if found is None:
        return None
    document, predicate = found
    doc = json.loads(document.decode().replace(old_sha, new_sha).replace(old_id, new_id))
    doc["metadata"]["timestamp"] = sbom_timestamp(created)
    predicate = json.loads(json.dumps(predicate).replace(old_sha, new_sha))
    predicate["runDetails"]["metadata"].update(startedOn=started, finishedOn=finished)
    return write(new_id, sbom_bytes(doc), predicate)
