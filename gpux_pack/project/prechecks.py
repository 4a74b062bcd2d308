"""A build's model checks, ready ahead in a second process.

ONNX's checker and shape inference need `onnx`, whose import (with NumPy) took 75 ms of a 0.41 s
rebuild after a new graph, on the one core the build's process keeps busy. `gpux-pack build`
starts a worker once the weights-only replay has declined (a replay checks nothing), on a machine
with a second CPU: it imports onnx and graph.py, at a lower priority, while this process imports
the build's modules and reads gpux.yml. Where the model's checks are not in the cache,
inspect_model hands the worker the model's path and reads back what graph.inspect_graph found (or
the problem it refused the model for), for the bytes this process read (their fingerprint must
match); the worker is killed as soon as the checks turn out to be cached, and at exit. Whatever it
cannot answer this process checks itself, as it would without one: the same answers, the same
words.

Only the standard library here: the build imports it before anything else.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = "gpux_pack.project.precheck_worker"
_running: list[subprocess.Popen[bytes]] = []  # the worker started and not yet asked or stopped


def start() -> None:
    """Start the worker, where it can help: two CPUs or more, the check cache on. It imports
    what is installed, never a module from the working directory (-P), and keeps NumPy's BLAS to
    one thread (it multiplies nothing; spare threads would only take the engine's CPU). Measured
    (the tiny CNN): a rebuild after a new graph 0.89x; one whose checks are cached 1.00x."""
    if _running or os.environ.get("GPUX_PACK_CHECK_CACHE") == "0" or _cpus() < 2:
        return
    try:
        worker = subprocess.Popen([sys.executable, "-P", "-m", WORKER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    except OSError:  # no process to spare: the checks run here
        return
    _running.append(worker)
    atexit.register(cancel)


def _cpus() -> int:
    """The CPUs this process may run on (its affinity on Linux; the machine's where the OS has
    no affinity call, as macOS)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cancel() -> None:
    """No model to check, or the command is over: the worker stops now."""
    while _running:
        worker = _running.pop()
        worker.kill()
        worker.wait()


def answer(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The worker's answer for the model at path: {"doc": ...} (graph.inspect_graph's) or
    {"problem": ...} (a ModelError's); None where no worker runs, or it read other bytes than
    `fingerprint` says this process did, or it failed. One model per worker."""
    if not _running:
        return None
    worker = _running.pop()
    try:
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(os.fsencode(path))
        worker.stdin.close()  # the path ends where the input does: any byte but NUL may be in it
        said = json.loads(worker.stdout.read() or b"null")
    except (OSError, ValueError):  # it died, or said something else: checked here
        said = None
    finally:
        worker.kill()
        worker.wait()
    if not isinstance(said, dict) or said.get("fingerprint") != fingerprint:
        return None
    return said
