"""`gpux-pack build`: the pipeline for each provider (and platform), the summary it prints, and the
record a weights-only rebuild replays. The summary is typed (`build --json`, what CI pipelines
read), so its JSON Schema (build-summary.schema.json, `gpux-pack schema --of build-summary`) is
generated, not written."""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field

from gpux_pack import engine
from gpux_pack.engine.interface import Engine
from gpux_pack.errors import PackError, UsageError
from gpux_pack.pipeline.build import Loaded, Made, build_each, check_tag, open_project
from gpux_pack.pipeline import rebuild
from gpux_pack.plan import Options
from gpux_pack.ui import Reporter, built_line, escape
from gpux_pack.wheels import ARCHES, lock_path


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageRow(_Model):
    tag: str = Field(description="The image's tag")
    id: str = Field(description="The image id (sha256:...)")
    size_bytes: int
    provider: str = Field(description="cpu, cuda, tensorrt, rocm, migraphx or openvino")
    reason: str = Field(description="Why this provider (auto says what it saw)")
    base_image: str
    runtime_base: Optional[str] = Field(description="The provider's runtime base image (content-addressed tag)")
    runtime_base_built: bool = Field(description="Whether this build made the runtime base image")
    context_bytes: int = Field(description="Bytes sent or assembled for the model image")
    platform: Optional[str]
    python: str
    onnxruntime: Optional[str] = Field(description="The onnxruntime version in the image")
    warmup: str = Field(description="none, at-start or baked")
    seconds: float
    steps: int
    cached_steps: int
    assembled: bool = Field(description="Made on the host and loaded (nothing ran), rather than built")
    digest: Optional[str] = Field(None, description="name@sha256:... when pushed (--push)")
    sbom: Optional[str] = Field(None, description="The CycloneDX SBOM this build recorded (a file under the cache; "
                                "--sbom DIR copies it there)")
    attestations: Optional[dict[str, str]] = Field(None, description="When pushed: the SBOM's and the provenance's "
                                                   "artifact manifests in the registry (name@sha256:...), both "
                                                   "referring to `digest`")
    notes: list[str] = Field(default_factory=list, description="Warnings about gpux.yml: what was left out or not "
                             "acted on, where the graph overrules a declaration (file:line: field: text)")
    optimize: Optional[Optimization] = Field(None, description="What pack.optimize did to the model, with the "
                                             "measured errors (absent when it was off)")


class OptimizeStep(_Model):
    mode: str = Field(description="graph, int8 or fp16")
    how: str = Field(description="graph: extended or basic; int8: dynamic, static, or static per tensor (where the "
                     "quantiser refuses per-channel weights); fp16: float16")
    errors: dict[str, float] = Field(description="Per output: the relative L2 error against the original model's "
                                     "answer (the difference's root mean square over the answer's; non-float outputs: "
                                     "the share of elements that differ), the largest over the checked inputs, after "
                                     "this step")
    tolerance: dict[str, float] = Field(description="Per output: the largest error allowed")


class ModelFile(_Model):
    sha256: str
    bytes: int


class Optimization(_Model):
    steps: list[OptimizeStep] = Field(description="Each step done, in order, checked against the original model")
    skipped: list[str] = Field(description="What could not be done for this image, and why (a line each)")
    samples: str = Field(description="The inputs the checks ran: gpux.yml's pack.optimize.samples, or generated")
    onnxruntime: str = Field(description="The ONNX Runtime that optimised and checked the model here")
    original: ModelFile = Field(description="The model as given")
    optimized: ModelFile = Field(description="The model in the image")


class IndexManifest(_Model):
    platform: str = Field(description="os/architecture, e.g. linux/arm64")
    digest: str = Field(description="name@sha256:... of that platform's image")


class PushedIndex(_Model):
    provider: str
    tag: str = Field(description="The tag the OCI image index was pushed under")
    digest: str = Field(description="name@sha256:... of the index")
    manifests: list[IndexManifest]


class Failure(_Model):
    provider: str
    error: str = Field(description="The one-line error")
    exit_code: int


class BuildSummary(_Model):
    images: list[ImageRow]
    indexes: list[PushedIndex] = Field(
        default_factory=list, description="--platform a,b --push: one OCI image index per provider"
    )
    failed: list[Failure]
    seconds: float


def json_schema() -> dict[str, Any]:
    out = BuildSummary.model_json_schema()
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "gpux-pack build --json"
    return out


def platforms(platform: str | None, bases: list[str] | None, push: bool) -> tuple[list, dict]:
    """--platform a,b and --base-image [PLATFORM=]IMAGE...: the platforms (or [None]) and each
    one's base (None: every platform's; the last given for a platform wins)."""
    chosen_platforms = [p.strip() for p in platform.split(",")] if platform else [None]
    if len(chosen_platforms) > 1:
        if len(set(chosen_platforms)) != len(chosen_platforms) or \
                len({ARCHES.get(p) for p in chosen_platforms}) != len(chosen_platforms):
            raise UsageError(f"--platform '{platform}' names a platform twice")
        if not push:
            raise UsageError(f"--platform '{platform}': several platforms need --push: their index lives in a "
                             "registry, not in the engine")
    chosen: dict[str | None, str] = {}
    for item in bases or []:
        where, _, image = item.rpartition("=")  # a reference never holds '='
        key = where or None
        if key is not None and key not in chosen_platforms:
            raise UsageError(f"--base-image '{item}': {where} is not a platform being built ({platform or 'none given'})")
        chosen[key] = image  # a later one for the same platform wins, as with any option given twice
    return chosen_platforms, chosen


@dataclass(frozen=True)
class Outcome:
    made: list[Made]
    failures: list[tuple[str, PackError]]
    indexes: list[tuple[str, Any]]  # (provider, index.Index) per provider built for several platforms
    seconds: float
    loaded: Loaded
    client: Engine


def build(path: Path, provider: str | None, tag: str | None, options: Options, platforms: list[str | None],
          bases: dict[str | None, str], ui: Reporter, failed: Callable[[str, PackError], None], *,
          no_cache: bool = False, refresh: bool = False, push: bool = False, contained: bool = False,
          strict: bool = False, sign_key: Path | None = None) -> Outcome:
    """One image per provider and platform (bases: each platform's --base-image, None for all);
    sign_key (with push): each pushed manifest signed in cosign's format."""
    started = time.perf_counter()
    key = _signing_key(sign_key)  # a bad key is refused before anything runs
    loaded, decision, client = open_project(path, provider, tag, engine.connect, ui, contained, strict)
    check_tag(tag, decision.providers)
    if (options.warmup or loaded.project.config.pack.warmup) != "never":  # a baked warmup wants the host's device
        options = replace(options, host=engine.host_info(client))
    per_platform = [replace(options, platform=p, base_image=bases.get(p, bases.get(None)), multi_platform=True)
                    for p in platforms] if len(platforms) > 1 else [options]
    made, failures, indexes = build_each(loaded, decision, per_platform, client, ui, failed, no_cache,
                                                  refresh, push)
    for subject in [m.pushed.digest for m in made if m.pushed] + [i.digest for _, i in indexes] if key else ():
        from gpux_pack.registry import signatures

        ui.info(f"signing {subject}")
        signatures.sign(client, *subject.split("@", 1), key)
    return Outcome(made, failures, indexes, time.perf_counter() - started, loaded, client)


def _signing_key(path: Path | None) -> Any:
    """--sign-key's key, read first; cryptography (10 ms of import) only for the builds that sign."""
    if path is None:
        return None
    from gpux_pack.registry import signatures

    return signatures.load_private_key(path)


def write_sboms(outcome: Outcome, folder: Path) -> list[Path]:
    """`build --sbom DIR`: each image's SBOM as DIR/<tag, made a file name>.cdx.json."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--sbom {folder}: cannot make the folder ({e.strerror or e})") from None
    written = []
    for made in outcome.made:
        if made.sbom is None:
            continue
        target = folder / (re.sub(r"[^A-Za-z0-9._-]+", "_", made.built.tag or made.built.id) + ".cdx.json")
        try:
            shutil.copyfile(made.sbom, target)
        except OSError as e:
            raise UsageError(f"--sbom {folder}: cannot write {target.name} ({e.strerror or e})") from None
        written.append(target)
    return written


def row(made: Made) -> dict[str, Any]:
    """One image's row of the build summary."""
    plan, prepared, built, pushed = made.plan, made.prepared, made.built, made.pushed
    return {
        "tag": built.tag,
        "id": built.id,
        "size_bytes": built.size_bytes,
        "provider": plan.provider.name,
        "reason": plan.reason,
        "base_image": plan.base.image,
        "runtime_base": plan.runtime_base.tag,
        "runtime_base_built": prepared.runtime_base_context is not None,
        "context_bytes": prepared.context.size_bytes,
        "platform": plan.platform,
        "python": plan.base.python,
        "onnxruntime": plan.lock.version_of(plan.provider.ort),
        "warmup": plan.warmup,
        "seconds": round(built.seconds, 2),
        "steps": built.steps,
        "cached_steps": built.cached_steps,
        "assembled": built.assembled,
        "digest": pushed.digest if pushed else None,
        "sbom": str(made.sbom) if made.sbom else None,
        "attestations": {"sbom": made.attached.sbom, "provenance": made.attached.provenance}
        if made.attached else None,
        "notes": list(plan.notes),
        "optimize": plan.optimized.to_json() if plan.optimized else None,
    }


def summary(outcome: Outcome) -> BuildSummary:
    return BuildSummary.model_validate({
        "images": [row(m) for m in outcome.made],
        "indexes": [{"provider": name, "tag": i.tag, "digest": i.digest,
                     "manifests": [{"platform": p, "digest": d} for p, d in i.members]} for name, i in outcome.indexes],
        "failed": [{"provider": name, "error": str(e), "exit_code": e.exit_code} for name, e in outcome.failures],
        "seconds": round(outcome.seconds, 2),
    })


def summary_report(doc: BuildSummary) -> tuple[list[str], Any, list[str]]:
    """What `build` prints without --json: lines, a table (several images or a failure, else None),
    lines after it."""
    rows, failed = doc.images, doc.failed
    pushed = [f"pushed {r.digest}" + (" (with its SBOM and provenance)" if r.attestations else "")
              for r in rows if r.digest]
    pushed += [f"pushed index {i.digest}  ({', '.join(m.platform for m in i.manifests)})" for i in doc.indexes]
    if len(rows) + len(failed) == 1 and rows:
        r = rows[0]
        how = "assembled, nothing ran" if r.assembled else f"{r.cached_steps}/{r.steps} steps cached"
        return [built_line(r.tag, r.id, r.size_bytes, r.provider, r.seconds, how)], None, pushed
    from rich.table import Table

    table = Table(title=f"{len(rows)} built, {len(failed)} failed, {doc.seconds:.1f}s")
    for col in ("provider", "platform", "tag", "image", "size", "onnxruntime", "seconds", "result"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(escape(c) for c in (r.provider, r.platform or "", r.tag, r.id[7:19],
                                             f"{r.size_bytes / 1e6:.0f} MB", r.onnxruntime or "",
                                             f"{r.seconds:.1f}", "ok")))
    for f in failed:
        table.add_row(escape(f.provider), "", "", "", "", "", "", escape(f"failed: {f.error[:100]}"))
    return [], table, pushed


def record(request: rebuild.Request, outcome: Outcome) -> None:
    """What the next identical `build` needs to replay this one when only the weights change."""
    if len(outcome.made) != 1 or outcome.failures:
        return
    made = outcome.made[0]
    plan, built = made.plan, made.built
    if built.loaded is None or plan.warmup == "baked" or plan.optimized is not None:
        return  # an optimised model is made again from the new one, checked again: no replay
    try:
        images = {ref: outcome.client.images.get(ref).id for ref in (plan.base.image, plan.runtime_base.tag)}
    except Exception:  # a base that is not an image here: nothing to replay from
        return
    rebuild.record(request, outcome.loaded.project.root, plan.model.path, plan.model.sha256, plan.model.size_bytes,
                   plan.provider.name, images, lock_path(plan.requirements, plan.target, excludes=plan.excludes), built.loaded,
                   plan.project.variables, row(made))
