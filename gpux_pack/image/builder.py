"""Context -> image through the engine's builder (the Docker SDK's classic builder), with
visible progress: for Dockerfiles that RUN something (an apt step, the link check in the
image), and for engines that do not write layer tars the way the assembler does.

A failed build raises BuildError with the failing step and the end of its output. Tags move
only when everything succeeded, so earlier images under the same tag stay intact.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass

from gpux_pack.engine.interface import Engine
from gpux_pack.errors import BuildError, DockerError
from gpux_pack.image.archive import Loadable
from gpux_pack.image.context import Context, Stream
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
    loaded: Loadable | None = None  # what was loaded, when assembled (a model-only rebuild replays it)


def engine_build(
    client: Engine,
    ctx: Context,
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
    context = Stream(ctx)
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
