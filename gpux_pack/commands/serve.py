"""`gpux-pack serve PATH`: the image's runtime on this machine, without Docker or an image.

The folder an image holds is staged from the same plan a build makes (gpux.json, with the
model read in place), then the image's own entrypoint (`python -m gpux_pack.runtime serve`)
runs it with this machine's onnxruntime: same endpoints, same settings and GPUX_* variables,
same readiness after warmup. A change to gpux.yml or the model's files is validated first and
then restarts the server; a change that does not validate leaves the running one serving.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from gpux_pack.errors import PackError, UsageError
from gpux_pack.pipeline.local import Staged, stage
from gpux_pack.ui import Reporter

POLL_SECONDS = 0.5  # how often the watched files are looked at
STOP_SECONDS = 15.0  # the server's drain (8 s by default) plus its shutdown


def snapshot(paths: tuple[Path, ...]) -> tuple[Any, ...]:
    """What tells a file changed: an editor's atomic replace changes the inode, a write the
    size or mtime."""
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


class Server:
    """The runtime in a child process: a reload is a clean restart (ONNX Runtime's native state
    goes with the process), and Ctrl-C reaches it as it reaches an image's."""

    def __init__(self, staged: Staged, host: str, port: int | None):
        self.staged = staged
        env = {**os.environ, **staged.env(GPUX_HOST=host)}
        if port is not None:
            env["GPUX_PORT"] = str(port)
        self.port = port or staged.spec.serving.port
        self.process = subprocess.Popen([sys.executable, "-m", "gpux_pack.runtime", "serve"], env=env)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # drain in-flight requests, as `docker stop` does
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def serve(path: Path, flag: str | None, host: str | None, port: int | None, ui: Reporter) -> int:
    """Serve until Ctrl-C (or SIGTERM): 0 when stopped so, else the server's exit code. host:
    --host, else gpux.yml's serving.host, else 127.0.0.1."""
    try:
        if host is not None:
            ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"--host {host!r}: expected an IP address such as 127.0.0.1 or 0.0.0.0") from None
    with tempfile.TemporaryDirectory(prefix="gpux-serve-") as tmp:
        staged = stage(path, flag, Path(tmp) / "0", ui)
        host = host or staged.host
        server: Server | None = None
        seen, pending = snapshot(staged.watched), None
        idle = threading.Event()  # never set: a wait that a signal interrupts
        generation = 0
        try:  # from the child's start: a signal at any point after it stops it
            server = Server(staged, host, port)
            ui.info(f"serving {staged.spec.name} with {staged.provider} ({staged.reason}) on "
                    f"http://{host if ':' not in host else f'[{host}]'}:{server.port}; reloads when "
                    f"{', '.join(p.name for p in staged.watched)} change; Ctrl-C stops")
            while True:
                if server is None:
                    idle.wait(POLL_SECONDS)
                else:
                    try:
                        code = server.process.wait(POLL_SECONDS)
                    except subprocess.TimeoutExpired:
                        code = None
                    if code is not None:  # it stopped by itself (a port in use, a model ORT refused): its line is above
                        if generation == 0:
                            return code
                        ui.warn(f"the server stopped (exit {code}); waiting for the next change")
                        server = None
                now = snapshot(staged.watched)
                if now == seen or now != pending:  # unchanged, or changed since the last look: still being written
                    pending = None if now == seen else now
                    continue
                changed = [p.name for p, a, b in zip(staged.watched, seen, now) if a != b]
                seen, pending = now, None
                generation += 1
                try:
                    fresh = stage(path, flag, Path(tmp) / str(generation), ui)
                except PackError as e:
                    ui.warn(f"not reloaded, still serving the last good version: {' '.join(str(e).splitlines())}")
                    continue
                ui.info(f"reloading: {', '.join(changed)} changed")
                if server is not None:
                    server.stop()
                if fresh.watched != staged.watched:  # else `now`, read before staging: a write since is news
                    seen = snapshot(fresh.watched)
                staged, server = fresh, Server(fresh, host, port)
        except KeyboardInterrupt:
            ui.info("stopping (in-flight requests drain)")
            if server is not None:
                server.stop()
            return 0
