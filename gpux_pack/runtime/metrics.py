"""/metrics in Prometheus text (prometheus-client) and one-line JSON logs (GPUX_LOG_FORMAT=json).

Endpoints are labelled by route, never by the raw path: a client probing random URLs must not
grow the label set without bound.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

disable_created_metrics()  # no *_created series: half the lines, nothing a dashboard uses

LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
ROUTES = ("/predict", "/info", "/health", "/metrics", "/v2", "/v2/health/live", "/v2/health/ready")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("gpux_requests", "HTTP requests answered", ["endpoint", "code"], registry=r)
        self.latency = Histogram("gpux_request_seconds", "Time from request to response", ["endpoint"],
                                 buckets=LATENCY, registry=r)  # fmt: skip
        self.inference = Histogram("gpux_inference_seconds", "session.run time per batch", buckets=LATENCY,
                                   registry=r)  # fmt: skip
        self.batch = Histogram("gpux_batch_rows", "Rows per session.run (batches merge requests)", buckets=ROWS,
                               registry=r)  # fmt: skip
        self.batched = Counter("gpux_batched_requests", "Requests answered by a run shared with others", registry=r)
        self.queue = Gauge("gpux_queue_depth", "Requests waiting for an inference worker", registry=r)
        self.in_flight = Gauge("gpux_in_flight_bytes", "Request bytes held by requests in flight", registry=r)
        self.refused = Counter("gpux_refused", "Requests refused for lack of room", ["reason"], registry=r)

    def observe_run(self, rows: int, seconds: float) -> None:
        self.batch.observe(rows)
        self.inference.observe(seconds)

    def observe_request(self, endpoint: str, code: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(code)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


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
