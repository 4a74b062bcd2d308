"""What this container may use: CPUs and memory from its cgroup (not the host's), and the
limits derived from them: ONNX Runtime's intra-op threads, the inference workers, the request
queue, the body limit and the tensor bytes one request may hold.

A container started with `--cpus 2` on a 64-core host that sized its thread pools from
os.cpu_count() would run 64 threads per inference on 2 CPUs' worth of quota; one started with
`--memory 256m` that accepted a 64 MiB JSON body would be OOM-killed parsing it (a JSON number
becomes a 32-byte Python float before numpy sees it).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
MiB = 1024 * 1024
REQUEST_OVERHEAD = 2 * MiB  # what a request holds besides its body, tensors and answer, from arrival to
                            # answer: asyncio's 256 KiB reads, the piece of the answer being written,
                            # uvicorn's or grpc's buffers, and the allocators' steps (Python takes memory
                            # 1 MiB at a time); measured 1-2 MB more in a container than in process
INLINE_BYTES = 64 * 1024  # bodies and answers up to this are handled on the event loop: a thread hop costs more
INLINE_DECODE = 256 * 1024  # a JSON body up to this is decoded on the event loop (about a millisecond at most):
                            # decoding holds the GIL, so a codec thread only adds the hand-offs (a 95 KiB body:
                            # 0.96 ms p50 at 1 client with them, 0.70 ms without)


@dataclass(frozen=True)
class Limits:
    cpus: int  # CPUs this container may keep busy
    memory: int  # bytes it may use (cgroup limit, else the machine's)
    memory_from: str  # "cgroup", "host", or "given" (a caller's figure: the budget measures nothing against it)


def cpus(root: Path = CGROUP) -> int:
    """min(the CPUs it may run on (cpuset), its CPU quota rounded up (cpu.max or cfs quota))."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = _quota(root)
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def _quota(root: Path) -> float | None:
    try:  # cgroup v2: "max 100000" or "200000 100000"
        text = (root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:  # cgroup v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def memory(root: Path = CGROUP) -> tuple[int, str]:
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):  # v1 writes a huge number for "no limit"
            return int(text), "cgroup"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024, "host"
    except (OSError, ValueError, IndexError):
        pass
    return 4 * 1024 * MiB, "host"


def limits(root: Path = CGROUP) -> Limits:
    mem, source = memory(root)
    return Limits(cpus(root), mem, source)


def default_body_bytes(lim: Limits) -> int:
    """64 MiB, or a sixteenth of the memory when that is less: JSON expands about tenfold as
    Python objects, and the server must stay alive to refuse the next one."""
    return max(MiB, min(64 * MiB, lim.memory // 16))


def default_request_bytes(lim: Limits) -> int:
    """Tensor bytes (inputs and the outputs they imply) one request may hold: an eighth of the
    memory, at most 4 GiB."""
    return max(4 * MiB, min(4096 * MiB, lim.memory // 8))


def default_in_flight_bytes(lim: Limits) -> int:
    """Tensor bytes all requests together may hold: half the memory; past it, 503."""
    return max(8 * MiB, lim.memory // 2)
