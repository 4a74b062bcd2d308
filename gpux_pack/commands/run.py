"""`gpux-pack run IMAGE`: start an image with its provider's device flags, a read-only root, a
tmpfs /tmp and a cache volume, and follow its logs until Ctrl-C (drained, removed)."""

from __future__ import annotations

import sys
import time

from gpux_pack import engine
from gpux_pack.engine.containers import Started, start_container
from gpux_pack.engine.interface import Engine
from gpux_pack.ui import Reporter


def run(client: Engine, image: str, ui: Reporter, pull: str, port: int | None, bind: str, cpu_fallback: bool,
        timeout: int) -> Started:
    """The image started and ready (pulled first as `--pull` says)."""
    engine.ensure_image(client, image, pull, ui.info)
    return start_container(client, image, ui, port=port, bind=bind, cpu_fallback=cpu_fallback, timeout=timeout)


def started_line(started: Started) -> str:
    note = " (on CPU: --cpu-fallback)" if started.on_cpu else ""
    return f"{started.url}  {started.provider}{note}  cache volume {started.volume}"


def follow(started: Started) -> None:
    """Its logs on stderr until Ctrl-C; then it is stopped (in-flight requests drain) and removed."""
    try:
        for chunk in started.container.logs(stream=True, follow=True, since=int(time.time())):
            sys.stderr.write(chunk.decode(errors="replace"))
    except KeyboardInterrupt:
        print("stopping (in-flight requests drain)", file=sys.stderr)
    finally:
        try:
            started.container.stop(timeout=15)
        finally:
            engine.remove_container(started.container)
