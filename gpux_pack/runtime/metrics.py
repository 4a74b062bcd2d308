"""/metrics in Prometheus text (written by prometheus-client) and one-line JSON logs (GPUX_LOG_FORMAT=json).

Endpoints are labelled by route, never by the raw path: a client probing random URLs must not
grow the label set without bound.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from typing import Any

import orjson

LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
ROUTES = ("/predict", "/info", "/health", "/metrics", "/v2", "/v2/health/live", "/v2/health/ready", "/openapi.json",
          "/docs", "/redoc")


class Metrics:
    """The counts, kept here under one lock; prometheus-client only writes them out, imported at
    the first /metrics: its import (http.server, email, wsgiref with it) is 20 to 40 ms that
    every start would pay before its first answer, and no request but /metrics needs it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str], int] = {}  # (endpoint, code) -> answered
        self.latency: dict[str, _Histogram] = {}  # endpoint -> request seconds
        self.inference = _Histogram(LATENCY)
        self.batch = _Histogram(ROWS)
        self.batched = _Gauge(self.lock)  # requests answered by a shared run (a counter)
        self.queue = _Gauge(self.lock)
        self.in_flight = _Gauge(self.lock)
        self.room = _Gauge(self.lock)  # what requests may hold now (budget.Budget.room)
        self.floor = _Gauge(self.lock)  # the process's resident anonymous memory with nothing in flight (0: not read)
        self.refused = _Labelled(self.lock)
        self._registry: Any = None

    def observe_run(self, rows: int, seconds: float) -> None:
        with self.lock:
            self.batch.observe(rows)
            self.inference.observe(seconds)

    def observe_request(self, endpoint: str, code: int, seconds: float) -> None:
        key = (endpoint, str(code))
        with self.lock:
            self.requests[key] = self.requests.get(key, 0) + 1
            histogram = self.latency.get(endpoint)
            if histogram is None:
                histogram = self.latency[endpoint] = _Histogram(LATENCY)
            histogram.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if self._registry is None:
            from prometheus_client import CollectorRegistry

            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(_Collector(self))
        return generate_latest(self._registry), CONTENT_TYPE_LATEST

    def families(self) -> list[Any]:
        """The metrics as prometheus-client families, in the order /metrics has always listed them."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        with self.lock:  # one consistent copy, series in the order first seen; written outside the lock
            requests = list(self.requests.items())
            latency = [(k, h.copy()) for k, h in self.latency.items()]
            inference, batch = self.inference.copy(), self.batch.copy()
            batched, queue, in_flight = self.batched.value, self.queue.value, self.in_flight.value
            room, floor = self.room.value, self.floor.value
            refused = list(self.refused.values.items())
        counter = CounterMetricFamily("gpux_requests", "HTTP requests answered", labels=["endpoint", "code"])
        for (endpoint, code), n in requests:
            counter.add_metric([endpoint, code], n)
        seconds = HistogramMetricFamily("gpux_request_seconds", "Time from request to response", labels=["endpoint"])
        for endpoint, histogram in latency:
            seconds.add_metric([endpoint], histogram.buckets(), histogram.sum)
        runs = HistogramMetricFamily("gpux_inference_seconds", "session.run time per batch")
        runs.add_metric([], inference.buckets(), inference.sum)
        rows = HistogramMetricFamily("gpux_batch_rows", "Rows per session.run (batches merge requests)")
        rows.add_metric([], batch.buckets(), batch.sum)
        shared = CounterMetricFamily("gpux_batched_requests", "Requests answered by a run shared with others",
                                     value=batched)
        depth = GaugeMetricFamily("gpux_queue_depth", "Requests waiting for an inference worker", value=queue)
        held = GaugeMetricFamily("gpux_in_flight_bytes", "Request bytes held by requests in flight", value=in_flight)
        refusals = CounterMetricFamily("gpux_refused", "Requests refused for lack of room", labels=["reason"])
        for reason, n in refused:
            refusals.add_metric([reason], n)
        room_ = GaugeMetricFamily("gpux_request_room_bytes", "Bytes all requests in flight may hold now: half the "
                                  "memory, less what the process kept since warmup", value=room)
        floor_ = GaugeMetricFamily("gpux_resident_floor_bytes", "The server's resident anonymous memory when last read with no "
                                   "request in flight (0: not read: no container memory limit)", value=floor)
        return [counter, seconds, runs, rows, shared, depth, held, refusals, room_, floor_]


class _Histogram:
    """Counts per bucket (a value on a bound counts in that bucket, as Prometheus's `le` says) and the sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: over every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def copy(self) -> "_Histogram":
        out = _Histogram(self.bounds)
        out.counts, out.sum = list(self.counts), self.sum
        return out

    def buckets(self) -> list[tuple[str, float]]:
        from prometheus_client.utils import floatToGoString

        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((floatToGoString(bound), total))
        return out


class _Gauge:
    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def inc(self, amount: float = 1) -> None:
        with self.lock:
            self.value += amount


class _Labelled:
    """A counter by one label: `refused.labels("memory").inc()`, as prometheus-client spells it."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.values: dict[str, int] = {}

    def labels(self, value: str) -> "_Count":
        return _Count(self, value)


class _Count:
    def __init__(self, counter: _Labelled, value: str) -> None:
        self.counter, self.value = counter, value

    def inc(self, amount: int = 1) -> None:
        with self.counter.lock:
            self.counter.values[self.value] = self.counter.values.get(self.value, 0) + amount


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> list[Any]:
        return self.metrics.families()


def route(path: str, model_name: str) -> str:
    if path in ROUTES:
        return path
    if path.startswith("/v2/models/"):
        tail = path.rsplit("/", 1)[-1]
        return "/v2/models/{name}/" + tail if tail in ("infer", "ready") else "/v2/models/{name}"
    return "other"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's extra fields."""

    FIELDS = ("method", "path", "status", "seconds", "bytes", "id", "client")

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in self.FIELDS:
            if hasattr(record, name):
                doc[name] = getattr(record, name)
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return orjson.dumps(doc, default=str).decode()
