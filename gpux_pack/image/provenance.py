"""The image's build provenance: an in-toto Statement (v1) whose predicate is SLSA Provenance v1.

The build definition says what was built from what: the build type (gpux-pack's, documented in
docs/attestations.md), the external parameters a user chose (gpux.yml's digest, provider,
platform, tag, flags), and the resolved dependencies (the base image, the model, every wheel and
preprocessing file, by sha256). The run details say who built it (gpux-pack and its version) and
when. The subject (the pushed manifest's digest) is only known once the image is pushed, so the
build records the predicate and the push makes the statement. With SOURCE_DATE_EPOCH set, both
timestamps are that instant: the same inputs give the same bytes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gpux_pack import __version__, wheels
from gpux_pack.image.sbom import CompiledCache
from gpux_pack.plan import Plan

STATEMENT = "https://in-toto.io/Statement/v1"
PREDICATE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/gpux-pack/gpux-pack/blob/main/docs/attestations.md#build-type-v1"
BUILDER = "https://github.com/gpux-pack/gpux-pack"
MEDIA_TYPE = "application/vnd.in-toto+json"  # the artifactType of the statement in a registry


def predicate(plan: Plan, started: str, finished: str, flags: dict[str, Any]) -> dict[str, Any]:
    """The SLSA v1 predicate of one image. started/finished: RFC 3339 (SOURCE_DATE_EPOCH's when set)."""
    config_path = plan.project.config_path
    installed = wheels.wheel_hashes(plan.lock) if plan.lock else {}
    dependencies: list[dict[str, Any]] = []
    base = plan.base
    dependencies.append({"uri": f"docker-image:{base.image}", "name": "base image",
                         **({"digest": {"sha256": base.id.split(":", 1)[-1]}} if base.id else {})})
    dependencies.append({"uri": f"file:{plan.model.files[0]}", "name": "model",
                         "digest": {"sha256": plan.model.sha256}})
    for name, path in plan.assets:
        dependencies.append({"uri": f"file:{name}", "name": "preprocessing",
                             "digest": {"sha256": _sha256(path.read_bytes())}})
    for pin in plan.lock.pins if plan.lock else ():
        chosen = installed.get(pin.name)
        entry: dict[str, Any] = {"uri": f"pkg:pypi/{pin.name}@{pin.version}", "name": pin.name}
        if chosen:
            entry["digest"] = {"sha256": chosen}
        else:
            entry["annotations"] = {"lockHashes": sorted(pin.hashes)}
        dependencies.append(entry)
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "gpuxYml": {"name": config_path.name, "digest": {"sha256": _sha256(config_path.read_bytes())}},
                "provider": plan.provider.name,
                "platform": plan.platform,
                "tag": plan.tag,
                "flags": flags,
            },
            "internalParameters": {"onnxruntime": plan.ort_version, "python": base.python,
                                   "runtimeBase": plan.runtime_base.tag, "warmup": plan.warmup,
                                   "excludes": list(plan.excludes)},
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": BUILDER, "version": {"gpux-pack": __version__}},
            "metadata": {"startedOn": started, "finishedOn": finished},
        },
    }


def with_cache(predicate_: dict[str, Any], parent_id: str | None, cache: CompiledCache,
               finished: str) -> dict[str, Any]:
    """The predicate of the image a baked warmup derived: the image it started from (when it was
    an image of its own, `gpux-pack warmup IMAGE`) is one more resolved dependency, and the compiled
    cache (its layer's digest, key and provider) a byproduct of the run."""
    out = json.loads(json.dumps(predicate_))
    definition, run = out["buildDefinition"], out["runDetails"]
    definition["internalParameters"]["warmup"] = "baked"
    if parent_id:
        definition["resolvedDependencies"].append({"uri": f"docker-image:{parent_id}", "name": "image before warmup",
                                                   "digest": {"sha256": parent_id.split(":", 1)[-1]}})
    run.setdefault("byproducts", []).append({
        "uri": f"file:{cache.path}", "name": "compiled cache", "digest": {"sha256": cache.layer.split(":", 1)[-1]},
        "annotations": {k: v for k, v in (("key", cache.key), ("provider", cache.provider), ("device", cache.device),
                                          ("onnxruntime", cache.onnxruntime)) if v}})
    run["metadata"]["finishedOn"] = finished
    return out


def statement(subjects: list[tuple[str, str]], predicate_: dict[str, Any]) -> bytes:
    """The in-toto Statement: subjects (name, sha256:... digest) and the predicate, as bytes."""
    doc = {"_type": STATEMENT,
           "subject": [{"name": name, "digest": {"sha256": digest.split(":", 1)[-1]}} for name, digest in subjects],
           "predicateType": PREDICATE, "predicate": predicate_}
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
