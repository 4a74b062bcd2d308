"""The memory a server may hold for requests: every request's bytes are charged here as they
arrive (its body, its tensors, the graph's intermediate tensors and outputs they imply, its
answer, what decoding an image holds) and released when it is answered; past the in-flight
budget (half the memory) a request waits for none of it (503), past GPUX_MAX_REQUEST_BYTES one
request is refused (413). HTTP and gRPC charge the same budget. Memory freed by large requests
goes back to the system once idle (malloc_trim).

What the process keeps between requests counts too: its resident anonymous memory once idle (measured
after warmup, and again after each trim) is its floor, and the in-flight budget shrinks by what
that floor grew since warmup (heap fragmentation, the image libraries' pools, threads' arenas),
and never reaches past the container's memory less the floor and a reserve. Without it, a
container that had served large requests was OOM-killed by requests inside every limit."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Executor
from typing import Any, Self

import numpy as np

from .resources import REQUEST_OVERHEAD
from .tensors import RequestError, ServedTensor
from .v2 import V2Request

Feeds = Any  # one request's {input: array}, or GPUX's batch form: a list of them


class Budget:
    def __init__(self, model: Any, codec: Executor):
        self.model, self.settings, self.codec = model, model.settings, codec
        # the graph's intermediate tensors at their peak: bytes x the request's (input, axis) sizes
        self.working = [(term.dims, term.bytes) for term in model.spec.model.working_memory]
        # a request charged this much may leave freed memory in malloc's free lists: trimmed once
        # idle; sooner in a small container, where what the heap keeps is a large share
        memory = self.settings.limits.memory if self.settings.limits else 1 << 34
        self.trim_after = min(TRIM_AFTER, memory // 32)
        self._lock = threading.Lock()
        self.in_flight_bytes = 0
        self._large = False  # a large request finished since memory was last trimmed
        self.memory = memory
        self.floor = self.started = None  # what the process holds with no request in flight: now, at the start
        self.room = self.settings.max_in_flight_bytes  # what requests may hold now (see measure)
        self.measure(start=True)

    def measure(self, start: bool = False) -> None:
        """The process's floor, read while nothing is in flight, and the room it leaves requests:
        the in-flight budget less what the floor grew since the start (start: warmup is done, the
        floor from here on is the model's), and at most the memory less the floor and a reserve
        (where the floor fits the memory at all). Only under a container's limit (the cgroup's)."""
        limits = self.settings.limits
        now = resident() if limits is not None and limits.memory_from == "cgroup" else None
        if now is None:  # no container limit to keep under (the host's memory, a test's figure)
            return
        with self._lock:
            if self.in_flight_bytes:  # a request arrived meanwhile: its memory is not the floor's
                return
            if start or self.started is None:
                self.started = now
            self.floor = now
            room = self.settings.max_in_flight_bytes - max(0, now - self.started)
            if self.started < self.memory:
                room = min(room, self.memory - now - max(RESERVE, self.memory // 16))
            self.room = max(0, room)

    def hold(self, n: int) -> int:
        """Count n request bytes against what all requests in flight may hold; 503 past it. With
        nothing in flight, the floor is read again before a refusal: memory a request was still
        freeing when the floor was last read would otherwise refuse every request after it."""
        for again in (True, False):
            with self._lock:
                fits = not n or self.in_flight_bytes + n <= self.room
                if fits:
                    self.in_flight_bytes += n
                    return n
                idle = self.in_flight_bytes == 0
            if not (again and idle and self.room < self.settings.max_in_flight_bytes):
                break
            self.measure()
        raise RequestError("too many request bytes in flight; retry shortly", 503, refused="memory")

    def held(self, n: int) -> Hold:
        """n bytes charged (503 past the budget), as a Hold: `with budget.held(n) as hold:`."""
        return Hold(self, self.hold(n))

    def hold_decode(self, cost: int, size: int) -> int:
        """Count what decoding a body will hold; a body that could never fit is 413, not an OOM."""
        limit = self.settings.max_in_flight_bytes
        if cost > limit:
            raise RequestError(f"decoding this {size}-byte body would hold about {cost} bytes, more than this server "
                               f"may hold for requests ({limit}, half its memory); send the tensors as binary data "
                               "(KServe v2 binary extension) or .npy", 413, refused="memory")
        return self.hold(cost)

    def release(self, n: int) -> None:
        with self._lock:
            self.in_flight_bytes -= n
            self._large = self._large or n >= self.trim_after
            idle = self.in_flight_bytes == 0
            trim = self._large and idle
            if trim:
                self._large = False
        if trim:  # malloc_trim walks every arena (tens of ms after a large request): never on the event loop
            try:
                self.codec.submit(self._trim)
            except RuntimeError:  # shutting down
                pass
        elif idle and self.room < self.settings.max_in_flight_bytes:  # the floor read last may have come
            self.measure()  # down since (memory freed after that read): a read of /proc is microseconds

    def _trim(self) -> None:
        trim()
        self.measure()

    def request_bytes(self, feeds: Feeds, request: V2Request, v2: bool) -> int:
        """What a decoded request holds until its answer is sent: its tensors, the graph's
        intermediate tensors and the outputs they imply, the answer (JSON text, or the binary
        outputs' bytes once more) and REQUEST_OVERHEAD; a 413 past GPUX_MAX_REQUEST_BYTES. An
        array of requests (GPUX's batch form) holds them all."""
        model, budget = self.model, self.settings.max_request_bytes
        needed, outputs, answer = REQUEST_OVERHEAD, 0, 0
        for one in feeds if isinstance(feeds, list) else [feeds]:
            out, text = output_size(model.inputs, model.outputs, one, request, v2)
            outputs, answer = outputs + out, answer + text
            needed += sum(a.nbytes for a in one.values()) + out + text + working(self.working, one)
        if needed > budget:
            hint = "ask for binary outputs or send fewer rows" if answer > outputs else "send fewer rows"
            raise RequestError(f"this request needs about {needed} bytes (its tensors, the model's intermediate "
                               f"tensors and outputs they imply, and the answer), more than this server's budget of "
                               f"{budget} bytes per request (GPUX_MAX_REQUEST_BYTES); {hint}", 413)
        return needed


class Hold:
    """Bytes a request holds against the in-flight budget, given back exactly once: when the
    `with` block that holds them ends (an answer, a refusal, an error alike), or, when that
    block handed them to an answer sent after it (transfer), once that answer is sent (release,
    or a `with` block of its sender's). Releasing twice gives back nothing the second time."""

    __slots__ = ("budget", "bytes", "kept")

    def __init__(self, budget: Budget, n: int = 0):
        self.budget, self.bytes = budget, n  # n: already charged to the budget
        self.kept = False  # transferred: the end of the block it was transferred in leaves it held

    def __enter__(self) -> Self:
        self.kept = False
        return self

    def __exit__(self, error: type[BaseException] | None, *exc: object) -> None:
        if self.kept and error is None:
            return
        n, self.bytes = self.bytes, 0
        if n:
            self.budget.release(n)

    def grow(self, n: int) -> None:
        """n bytes more; 503 past the in-flight budget (what is held stays held until released)."""
        self.bytes += self.budget.hold(n)

    def swap(self, n: int) -> None:
        """Hold n bytes in place of what is held now: the new charge first, then the old given
        back, so no other request takes the room in between (503 leaves the old held)."""
        self.budget.hold(n)
        old, self.bytes = self.bytes, n
        self.budget.release(old)

    def transfer(self) -> Hold:
        """This Hold, for an answer sent after its block ends: the block's end (unless an error
        ends it) leaves it held, and whoever sends the answer releases it. The block's last step."""
        self.kept = True
        return self

    def release(self) -> None:
        n, self.bytes = self.bytes, 0
        if n:
            self.budget.release(n)


class Charge(Hold):
    """What decoding a body and preprocessing it hold while they work (JSON's objects, an image's
    decoded pixels), given back once the request is decoded. decode(cost): what parsing the body
    holds at its peak, a 413 where it could never fit; charge(n), each preprocessing step's: past
    the per-request budget a 413 (what the earlier steps, the request's other images, hold counts),
    past the in-flight one a 503."""

    __slots__ = ("body_bytes", "steps")

    def __init__(self, budget: Budget, body_bytes: int):
        self.budget, self.bytes, self.kept, self.body_bytes, self.steps = budget, 0, False, body_bytes, 0

    def decode(self, cost: int) -> None:
        self.bytes += self.budget.hold_decode(cost, self.body_bytes)

    def __call__(self, n: int) -> None:
        limit = self.budget.settings.max_request_bytes
        if self.steps + n > limit:
            raise RequestError(f"preprocessing this request would hold about {self.steps + n} bytes, more than this "
                               f"server's budget of {limit} bytes per request (GPUX_MAX_REQUEST_BYTES)", 413)
        self.bytes += self.budget.hold_decode(n, self.body_bytes)
        self.steps += n


ANSWER_TEXT = 20  # bytes a JSON answer holds per output element while orjson writes it (measured:
                 # 11 in the final text, 18 at the peak of its buffer's growth, float32 outputs)


def output_size(inputs: list[ServedTensor], outputs: list[ServedTensor], feeds: dict[str, np.ndarray],
                request: V2Request, v2: bool) -> tuple[int, int]:
    """(bytes, answer bytes) of the outputs the request asks for, from their declared shapes,
    named dimensions bound by the inputs' (an unknown dimension counts as 1). The answer: a
    binary output's bytes once more (the body that carries them), a JSON one's text (ANSWER_TEXT
    bytes an element at its peak)."""
    dims: dict[str, int] = {}
    for spec in inputs:
        arr = feeds.get(spec.name)
        if arr is not None and spec.shape and len(spec.shape) == arr.ndim:
            dims.update({d: n for d, n in zip(spec.shape, arr.shape) if isinstance(d, str)})
    total = answer = 0
    for spec in outputs:
        if request.outputs is not None and spec.name not in request.outputs or not spec.shape:
            continue
        count = 1
        for d in spec.shape:
            count *= d if isinstance(d, int) and d >= 0 else dims.get(d, 1) if isinstance(d, str) else 1
        total += count * spec.itemsize
        answer += count * spec.itemsize if v2 and request.wants_binary(spec.name) else count * ANSWER_TEXT
    return total, answer


def working(terms: list[tuple[tuple[tuple[str, int], ...], int]], feeds: dict[str, np.ndarray]) -> int:
    """The graph's intermediate tensors for these inputs (gpux.json's model.working_memory)."""
    total = 0
    for dims, n in terms:
        for name, axis in dims:
            arr = feeds.get(name)
            n *= int(arr.shape[axis]) if arr is not None and axis < arr.ndim else 1
        total += n
    return total


def body_over_limit(limit: int) -> RequestError:
    """A request's body (an HTTP body, a gRPC message) past GPUX_MAX_BODY_BYTES."""
    return RequestError(f"request body exceeds the limit of {limit} bytes (GPUX_MAX_BODY_BYTES)", 413)


TRIM_AFTER = 16 << 20  # a request charged this much may leave freed memory in malloc's free lists (the most)
RESERVE = 8 << 20  # at least this much of the memory is never offered to requests (what no charge counts)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident() -> int | None:
    """This process's resident anonymous memory in bytes (Linux's /proc/self/statm: resident less
    shared, the file-backed pages), None where there is none. The pages of the libraries it maps
    (35 MB of a small image's 70) are the kernel's to drop and read again under pressure: they
    never OOM-kill a container; what the process allocated does."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, ValueError, IndexError):
        return None
MMAP_THRESHOLD = 1 << 20  # blocks this large come from mmap and go back to the system when freed
TRIM_THRESHOLD = 4 << 20  # free memory at the top of a heap past this goes back at once


def _libc() -> Any:
    """glibc, or False (musl has no malloc_trim or mallopt)."""
    global _LIBC
    if _LIBC is None:
        import ctypes

        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim, _LIBC.mallopt  # noqa: B018
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC


def trim() -> None:
    """Give memory freed by large requests back to the system (glibc keeps it otherwise, and a
    container's memory would only grow under a burst of large requests)."""
    if _libc():
        _LIBC.malloc_trim(0)


def tune_malloc() -> None:
    """Blocks of 1 MiB and more (bodies, arrays, answers) from mmap, unmapped when freed, and
    at most 4 MiB of free memory kept at a heap's top: glibc otherwise raises both thresholds
    after the first large free and keeps serving large blocks from the heap, where a burst of
    large requests fragments it for good. Not lower: every block from mmap, or returned to the
    system at once, is page-faulted in afresh on its next use (at 128 KiB, a 255 KB JSON body
    cost 350 page faults to decode and encode, 2x the time without them, on a VM)."""
    if _libc():
        _LIBC.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (fixing it also stops the raising)
        _LIBC.mallopt(-1, TRIM_THRESHOLD)  # M_TRIM_THRESHOLD


_LIBC: Any = None
