"""Inference off the event loop: a bounded queue in front of a few worker threads, with dynamic
batching for models whose first dimension is a dynamic batch.

Requests beyond the queue's bound are refused at once (503 with Retry-After) rather than
queued without limit. A request that times out before its turn is dropped; one that times out
while it runs is terminated (ONNX Runtime's RunOptions.terminate) when no other request shares
its batch. With batching, a worker that takes a request also takes the compatible ones already
waiting (same output names, same non-batch shapes and dtypes), up to max_batch_size rows,
waiting at most max_delay_ms for more while others are on their way; one session.run answers
them all and each gets its own rows back.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

Run = Callable[[dict[str, Any], "list[str] | None", Any], dict[str, Any]]


class Overloaded(Exception):
    """The queue is full: 503 with Retry-After."""


@dataclass(frozen=True)
class Batching:
    max_batch_size: int
    max_delay_ms: float


@dataclass(eq=False)
class Job:
    feeds: dict[str, np.ndarray]
    names: list[str] | None
    rows: int
    key: tuple | None  # None: runs alone
    future: Future = field(default_factory=Future)
    options: Any = None  # the RunOptions of the run it is in
    batch: list["Job"] = field(default_factory=list)
    abandoned: bool = False

    def abandon(self) -> None:
        """Its caller stopped waiting: drop it before it runs, stop its run when it runs alone."""
        self.abandoned = True
        if self.future.cancel():
            return
        if self.options is not None and all(j.abandoned for j in self.batch):
            self.options.terminate = True


class Scheduler:
    def __init__(self, run: Run, make_options: Callable[[], Any], workers: int, queue_limit: int,
                 batching: Batching | None, observe: Callable[[int, float], None] | None = None):
        self._run, self._make_options = run, make_options
        self.batching = batching
        self.queue_limit = queue_limit
        self._observe = observe or (lambda rows, seconds: None)
        self._jobs: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self.arriving = 0  # requests being decoded: worth waiting for when batching
        self._threads = [threading.Thread(target=self._work, name=f"infer-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    @property
    def depth(self) -> int:
        return len(self._jobs)

    @property
    def closed(self) -> bool:
        """Shutting down: no new run is taken."""
        return self._closed

    def arrive(self, delta: int) -> None:
        """delta requests began (1) or finished (-1) decoding: a batch waits for them. Without
        batching nothing reads the count, and the notification would wake every idle worker."""
        if self.batching is None:
            return
        with self._cv:
            self.arriving += delta
            if delta < 0:
                self._cv.notify_all()

    def submit(self, feeds: dict[str, np.ndarray], names: list[str] | None, batchable: bool) -> Job:
        rows, key = 1, None
        if self.batching and batchable and feeds:
            first = next(iter(feeds.values()))
            rows = int(first.shape[0]) if first.ndim else 1
            if all(a.ndim and a.shape[0] == rows for a in feeds.values()):
                key = (tuple(names) if names else None,
                       tuple((k, a.dtype.str, a.shape[1:]) for k, a in sorted(feeds.items())))
        job = Job(feeds, names, rows, key)
        with self._cv:
            if self._closed:
                raise Overloaded("the server is shutting down")
            if len(self._jobs) >= self.queue_limit:
                raise Overloaded(f"{len(self._jobs)} requests are queued (the limit); retry shortly")
            self._jobs.append(job)
            self._cv.notify()
        return job

    def close(self) -> None:
        """Stop taking jobs; workers finish what is queued, then exit."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # -- workers -------------------------------------------------------------------------------

    def _take(self) -> list[Job] | None:
        with self._cv:
            while True:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if not self._jobs:
                    return None
                job = self._jobs.popleft()
                if job.future.set_running_or_notify_cancel():
                    break
            batch, rows = [job], job.rows
            if job.key is None or self.batching is None:
                return batch
            limit = self.batching.max_batch_size
            deadline = time.monotonic() + self.batching.max_delay_ms / 1000
            while rows < limit:
                for other in list(self._jobs):
                    if other.key == job.key and rows + other.rows <= limit:
                        self._jobs.remove(other)
                        if other.future.set_running_or_notify_cancel():
                            batch.append(other)
                            rows += other.rows
                remaining = deadline - time.monotonic()
                if rows >= limit or remaining <= 0 or not (self.arriving or self._jobs):
                    break
                self._cv.wait(remaining)
            return batch

    def _work(self) -> None:
        while (batch := self._take()) is not None:
            self._serve(batch)
            batch = None  # type: ignore[assignment]  # not kept alive while this worker waits for the next

    def _serve(self, batch: list[Job]) -> None:
        """One run for the batch; each job's future gets its rows of the answer, or the error."""
        options = self._make_options()
        for job in batch:
            job.options, job.batch = options, batch
        started = time.perf_counter()
        try:
            if len(batch) == 1:
                results = [self._run(batch[0].feeds, batch[0].names, options)]
            else:
                results = self._run_batch(batch, options)
        except BaseException as e:  # each waiting request gets the error
            for job in batch:
                job.future.set_exception(e)
            return
        finally:
            self._observe(sum(j.rows for j in batch), time.perf_counter() - started)
            for job in batch:  # the run is over: the batch list holds each job, and that cycle kept
                job.batch, job.options = [], None  # every request's inputs and answer alive until a full collection
        for job, result in zip(batch, results):
            job.future.set_result(result)

    def _run_batch(self, batch: list[Job], options: Any) -> list[dict[str, Any]]:
        merged = {name: np.concatenate([j.feeds[name] for j in batch]) for name in batch[0].feeds}
        total = sum(j.rows for j in batch)
        out = self._run(merged, batch[0].names, options)
        if not all(isinstance(v, np.ndarray) and v.ndim and v.shape[0] == total for v in out.values()):
            return [self._run(j.feeds, j.names, options) for j in batch]  # outputs not per row: one by one
        bounds = np.cumsum([j.rows for j in batch])[:-1]
        parts = {name: np.split(value, bounds) for name, value in out.items()}
        return [{name: parts[name][i] for name in out} for i in range(len(batch))]
