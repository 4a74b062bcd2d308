"""Context -> image, through the Docker SDK (classic builder), with visible progress.

A failed build raises BuildError with the failing step and the end of its output. Tags move
only when everything succeeded, so earlier images under the same tag stay intact.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from gpux_pack import assemble
from gpux_pack import context as contexts
from gpux_pack import plan as planning
from gpux_pack.engine import ROLE_LABEL, remove_container
from gpux_pack.errors import BuildError, DockerError, PackError
from gpux_pack.layers import Unsupported
from gpux_pack.plan import Plan
from gpux_pack.reference import parse_reference
from gpux_pack.ui import Reporter

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # the classic builder colours a step's stderr
TAIL = 25


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    id: str
    size_bytes: int
    seconds: float
    steps: int
    cached_steps: int
    assembled: bool = False  # made on the host and loaded (no builder); steps are then 0


ASSEMBLED = "gpux-pack (assembled, nothing ran): "  # how an assembled image's history lines begin

# ---------------------------------------------------------------------------------------------
# assembled images: nothing runs (see assemble.py); the builder where the Dockerfile has a RUN,
# or where this engine writes layer tars differently


def make_runtime(client: Any, runtime: Any, ui: Reporter, no_cache: bool = False,
                 platform: str | None = None, reuse: bool = False) -> BuiltImage:
    """A provider's runtime base image (runtime: pipeline.PreparedRuntime). Builds making the
    same tag at once take turns (a lock per tag under the cache); with reuse (the tag is
    content-addressed), the later one finds the image made and uses it."""
    import hashlib

    from gpux_pack import staging
    from gpux_pack.engine import image_exists
    from gpux_pack.wheels import cache_dir

    name = hashlib.sha256(runtime.tag.encode()).hexdigest()[:24]
    with staging.lock_file(cache_dir() / ".locks" / f"image-{name}.lock"):
        if reuse and not no_cache and image_exists(client, runtime.tag):
            ui.info(f"runtime base image {runtime.tag} was made by another build meanwhile: using it")
            started = time.perf_counter()
            return _built(client, runtime.tag, client.images.get(runtime.tag).id, started)
        return _make_runtime(client, runtime, ui, no_cache, platform)


def _make_runtime(client: Any, runtime: Any, ui: Reporter, no_cache: bool, platform: str | None) -> BuiltImage:
    title = f"building the runtime base image {runtime.tag} ({runtime.context.size_bytes / 1e6:.0f} MB context)"
    uname = assemble.engine_uname(client) if runtime.assemblable else None
    if uname is not None:
        try:
            return _assemble_runtime(client, runtime, ui, uname)
        except Unsupported as e:
            ui.info(f"building with the engine's builder: {e}")
    return build_context(client, runtime.context, runtime.tag, ui, no_cache, platform, title=title)


def _assemble_runtime(client: Any, runtime: Any, ui: Reporter, uname: bytes) -> BuiltImage:
    from gpux_pack.render import runtime_labels

    started = time.perf_counter()
    ctx = runtime.context
    new = [assemble.layer(ctx, "packages", "COPY packages/ /", uname),
           assemble.layer(ctx, "runtime", "COPY runtime/ /", uname),
           assemble.of_members("cache", contexts.cache_members(), "ADD cache.tar /", uname)]  # fmt: skip
    parent, history = _parent(client, runtime.base.image)
    config = planning.image_config(runtime.provider)
    image = assemble.Image(
        tag=runtime.tag, parent=parent, parent_history=history, layers=new,
        config=assemble.runtime_config(parent, config, runtime_labels(runtime.provider, runtime.base)),
        history=_runtime_history(config, new), created=planning.created_now(),
    )  # fmt: skip
    ui.info(f"assembling the runtime base image {runtime.tag} ({sum(x.size for x in new) / 1e6:.0f} MB of layers; "
            "nothing runs)")
    image_id = assemble.load(client, [image])
    return _built(client, runtime.tag, image_id, started)


def _runtime_history(config: planning.ImageConfig, new: list[assemble.Layer]) -> list[tuple[str, bool]]:
    """The image's history: the Dockerfile's instructions, marked as assembled (nothing ran)."""
    lines = [
        ("ENV " + " ".join(f"{k}={v}" for k, v in config.env), True),
        *((layer.created_by, False) for layer in new),
        (f"USER {config.user}", True), (f"WORKDIR {config.workdir}", True),
        (f"HEALTHCHECK CMD {json.dumps(list(config.healthcheck))}", True),
        (f"ENTRYPOINT {json.dumps(list(config.entrypoint))}", True), (f"CMD {json.dumps(list(config.cmd))}", True),
        ("LABEL (the runtime base image's labels)", True),
    ]  # fmt: skip
    return [(f"{ASSEMBLED}{text}", empty) for text, empty in lines]


def make_model(client: Any, prepared: Any, ui: Reporter, no_cache: bool = False, tag: bool = True) -> BuiltImage:
    """A model image on its runtime base image (prepared: pipeline.Prepared); untagged when a
    baked warmup will commit and tag it."""
    plan: Plan = prepared.plan
    uname = assemble.engine_uname(client)
    if uname is not None:
        try:
            return _assemble_model(client, prepared, ui, uname, tag)
        except Unsupported as e:
            ui.info(f"building with the engine's builder: {e}")
    return build_image(client, prepared.context, plan, ui, no_cache=no_cache, tag=tag)


def _assemble_model(client: Any, prepared: Any, ui: Reporter, uname: bytes, tag: bool) -> BuiltImage:
    started = time.perf_counter()
    plan: Plan = prepared.plan
    ctx = prepared.context
    new = [assemble.layer(ctx, "model", "COPY model/ /", uname),
           assemble.layer(ctx, "config", "COPY config/ /", uname)]  # fmt: skip
    parent, history = _parent(client, plan.runtime_base)
    ort = (plan.lock.version_of(plan.provider.ort) if plan.lock else None) or "unknown"
    image = assemble.Image(
        tag=plan.tag if tag else None, parent=parent, parent_history=history, layers=new,
        config=assemble.model_config(parent, plan.ports, planning.labels(plan, ort)),
        history=[(f"{ASSEMBLED}{text}", empty) for text, empty in
                 [("EXPOSE " + " ".join(map(str, plan.ports)), True), *((layer.created_by, False) for layer in new),
                  ("LABEL (the model image's labels)", True)]],
        created=plan.created,
    )  # fmt: skip
    ui.info(f"assembling {plan.tag} ({plan.provider.name}, {sum(x.size for x in new) / 1e6:.1f} MB of layers; "
            "nothing runs)")
    image_id = assemble.load(client, [image])
    return _built(client, plan.tag, image_id, started)


def _parent(client: Any, ref: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        return client.api.inspect_image(ref), client.api.history(ref)
    except Exception as e:
        raise DockerError(f"cannot inspect {ref}: {str(e).splitlines()[0][:300]}") from None


def _built(client: Any, tag: str, image_id: str, started: float) -> BuiltImage:
    size = client.images.get(image_id).attrs.get("Size", 0)
    return BuiltImage(tag=tag, id=image_id, size_bytes=size, seconds=time.perf_counter() - started, steps=0,
                      cached_steps=0, assembled=True)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# the engine's builder


def build_image(
    client: Any,
    ctx: contexts.Context,
    plan: Plan,
    ui: Reporter,
    no_cache: bool = False,
    tag: bool = True,
) -> BuiltImage:
    """A model image; untagged when a baked warmup will commit and tag it."""
    built = build_context(client, ctx, plan.tag if tag else None, ui, no_cache, plan.platform,
                          title=f"building {plan.tag} ({plan.provider.name}, {ctx.size_bytes / 1e6:.0f} MB context)")
    return built if tag else replace(built, tag=plan.tag)


def build_context(
    client: Any,
    ctx: contexts.Context,
    tag: str | None,
    ui: Reporter,
    no_cache: bool = False,
    platform: str | None = None,
    title: str | None = None,
) -> BuiltImage:
    started = time.perf_counter()
    ui.start(title or f"building {tag} ({ctx.size_bytes / 1e6:.0f} MB context)")
    tail: deque[str] = deque(maxlen=TAIL)
    step, total, cached, image_id = 0, 0, 0, None
    instruction = ""
    context = contexts.Stream(ctx)
    try:
        stream = client.api.build(
            fileobj=iter(context),
            custom_context=True,
            encoding=None,
            tag=tag,
            rm=True,
            forcerm=True,
            pull=False,
            nocache=no_cache,
            decode=True,
            platform=platform,
        )
        for event in stream:
            if "error" in event or "errorDetail" in event:
                message = (event.get("errorDetail") or {}).get("message") or event.get("error", "")
                raise _failure(message, step, total, instruction, list(tail))
            if "aux" in event and isinstance(event["aux"], dict) and "ID" in event["aux"]:
                image_id = event["aux"]["ID"]
            text = _ANSI.sub("", event.get("stream") or event.get("status") or "")
            for line in text.splitlines():
                line = line.rstrip()
                m = _STEP.match(line)
                if m:
                    step, total, instruction = int(m[1]), int(m[2]), m[3]
                    tail.clear()
                    ui.step(step, total, instruction)
                elif line.strip() == "---> Using cache":
                    cached += 1
                elif line.strip() and not line.startswith((" ---> ", "Removing intermediate")):
                    tail.append(line)
                    ui.output(line)
                m = re.match(r"^Successfully built ([0-9a-f]+)$", line)
                if m and image_id is None:
                    image_id = m[1]
    except (BuildError, DockerError):
        raise
    except Exception as e:  # the engine broke mid-stream (connection lost, daemon restarted)
        raise BuildError(f"the Docker engine failed during the build: {str(e).splitlines()[0][:300]}", instruction, list(tail)) from None
    finally:
        context.close()
        ui.stop()
    if context.error is not None:
        raise BuildError(f"cannot send the build context: {context.error}", instruction, list(tail))
    if image_id is None:
        raise BuildError("the build ended without an image", instruction, list(tail))
    image = client.images.get(image_id)
    return BuiltImage(
        tag=tag or "",
        id=image.id,
        size_bytes=image.attrs.get("Size", 0),
        seconds=time.perf_counter() - started,
        steps=total,
        cached_steps=cached,
    )


def _failure(message: str, step: int, total: int, instruction: str, tail: list[str]) -> BuildError:
    """First line: which step, its exit code, and the step's own last words (the link check's
    verdict, pip's error) rather than Docker's echo of the whole command."""
    code = re.search(r"returned a non-zero code: (\d+)", message)
    reason = tail[-1].strip() if tail and code else message.strip()
    where = f"step {step}/{total}" if step else "the build"
    exit_code = f" (exit {code[1]})" if code else ""
    short = " ".join(instruction.split())
    short = short if len(short) <= 100 else short[:99] + "…"
    return BuildError(f"{where} failed{exit_code}: {reason}\n  in: {short}", instruction, tail)


def bake_warmup(client: Any, built: BuiltImage, plan: Plan, ui: Reporter, gpus: bool) -> BuiltImage:
    """`--warmup always`: what `gpux-pack warmup` does, on the image just built (untagged), to
    give the tag an image with its cache baked in. On any failure (Ctrl-C included) the
    untagged built image is removed; the warmup container always is."""
    from gpux_pack import warmup

    started = time.perf_counter()
    try:
        warmed = warmup.warm_image(client, built.id, ui, tag=plan.tag,
                                   devices=warmup.Devices("all") if gpus else warmup.Devices())  # fmt: skip
    except BaseException:
        _remove_untagged(client, built.id)
        raise
    image = client.images.get(warmed.id)
    return replace(built, tag=plan.tag, id=image.id, size_bytes=image.attrs.get("Size", 0),
                   seconds=built.seconds + time.perf_counter() - started)


def _remove_untagged(client: Any, image_id: str) -> None:
    """A built image that never got its tag is garbage; one that is tagged elsewhere is kept."""
    try:
        if not client.images.get(image_id).tags:
            client.images.remove(image_id, noprune=False)
    except Exception:
        pass
