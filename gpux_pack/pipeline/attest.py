"""What a build records of each image for a security team, and what a push attaches to it.

Every build writes the image's SBOM (image/sbom.py) and its provenance predicate
(image/provenance.py) under the cache, by image id (`attestations/<id>/`), so that a later
`gpux-pack push` of the same image attaches them too. A push attaches both to the pushed
manifest in its registry as OCI artifacts (registry/referrers.py): the SBOM as it is, the
provenance as an in-toto Statement whose subject is that manifest's digest. A baked warmup's
image gets its parent's documents with the compiled cache added."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpux_pack.engine.interface import Engine
from gpux_pack.image import attestation_store, provenance, sbom
from gpux_pack.image.builder import BuiltImage
from gpux_pack.plan import Plan
from gpux_pack.registry import referrers
from gpux_pack.registry.push import Pushed
from gpux_pack.timestamps import created_now
from gpux_pack.ui import Reporter



@dataclass(frozen=True)
class Attached:
    """What a push attached to one manifest: the artifacts' manifest digests."""

    subject: str  # repo@sha256:...
    sbom: str
    provenance: str


def now() -> str:
    """RFC 3339 UTC; SOURCE_DATE_EPOCH's instant when it is set (reproducible documents)."""
    return created_now()


def record(plan: Plan, built: BuiltImage, started: str, flags: dict[str, Any],
           cache: sbom.CompiledCache | None = None) -> Path:
    """Write the image's SBOM and provenance predicate under the cache; the SBOM's path. cache:
    the compiled cache a baked warmup (`--warmup always`) added to the image."""
    document = sbom.document(plan, built.id)
    predicate = provenance.predicate(plan, started, now(), flags)
    if cache is not None:
        document = sbom.with_cache(document, built.id, cache)
        predicate = provenance.with_cache(predicate, None, cache, now())
    return attestation_store.write(built.id, document, predicate)


def record_warmed(parent_id: str, image_id: str, cache: sbom.CompiledCache) -> Path | None:
    """`gpux-pack warmup IMAGE`: the derived image's SBOM and provenance, made from its parent's
    (None when no build here recorded the parent's: the push then says so)."""
    found = attestation_store.recorded(parent_id)
    if found is None:
        return None
    document, predicate = found
    return attestation_store.write(image_id, sbom.with_cache(document, image_id, cache),
                  provenance.with_cache(predicate, parent_id, cache, now()))


def attach(client: Engine, pushed: Pushed, image_id: str, ui: Reporter) -> Attached | None:
    """Attach the recorded SBOM and provenance to the pushed manifest; None (and a warning) when
    this machine's builds recorded none for the image."""
    found = attestation_store.recorded(image_id)
    if found is None:
        ui.warn(f"{pushed.tag}: no SBOM or provenance recorded for image {image_id[:19]} (built by another "
                "machine, or by gpux-pack before 0.33): pushed without them")
        return None
    document, predicate = found
    repository, digest = pushed.digest.split("@", 1)
    statement = provenance.statement([(repository, digest)], predicate)
    created = predicate["runDetails"]["metadata"]["finishedOn"]
    ui.info(f"attaching the SBOM and provenance to {pushed.digest}")
    sbom_digest, provenance_digest = referrers.attach(client, repository, digest, [
        referrers.Artifact(sbom.MEDIA_TYPE, document, {"dev.gpux.kind": "sbom",
                                                       "org.opencontainers.image.created": created}),
        referrers.Artifact(provenance.MEDIA_TYPE, statement, {"dev.gpux.kind": "provenance",
                                                              "org.opencontainers.image.created": created,
                                                              "in-toto.io/predicate-type": provenance.PREDICATE}),
    ])
    return Attached(pushed.digest, f"{repository}@{sbom_digest}", f"{repository}@{provenance_digest}")
