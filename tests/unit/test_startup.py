"""What the runtime leaves out of its start (issue 18): prometheus-client until the first
/metrics, numpy.random, argparse for a bare `serve`; and that what replaces them answers as
before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from gpux_pack.runtime import metrics
from gpux_pack.runtime.warmup import _sample, _Spread
from tests.conftest import ROOT, copy_example
from tests.in_process import tiny_dir

RUNTIME = Path(__file__).resolve().parents[2] / "gpux_pack" / "runtime"

EVENTS = [("/predict", 200, 0.0005), ("/predict", 200, 0.003), ("/health", 503, 31.0),
          ("/v2/models/{name}/infer", 200, 1.0), ("/predict", 400, 0.001)]
RUNS = [(1, 0.0001), (3, 0.002), (512, 0.5), (1000, 100.0), (2, 0.25)]  # on a bound, past the last


def _prometheus_objects() -> tuple[bytes, bytes]:
    """The same events through prometheus-client's own Counter/Histogram/Gauge, as metrics.py
    counted them before: the text /metrics must keep."""
    disable_created_metrics()
    r = CollectorRegistry()
    requests = Counter("gpux_requests", "HTTP requests answered", ["endpoint", "code"], registry=r)
    latency = Histogram("gpux_request_seconds", "Time from request to response", ["endpoint"],
                        buckets=metrics.LATENCY, registry=r)
    inference = Histogram("gpux_inference_seconds", "session.run time per batch", buckets=metrics.LATENCY, registry=r)
    batch = Histogram("gpux_batch_rows", "Rows per session.run (batches merge requests)", buckets=metrics.ROWS,
                      registry=r)
    Counter("gpux_batched_requests", "Requests answered by a run shared with others", registry=r)
    queue = Gauge("gpux_queue_depth", "Requests waiting for an inference worker", registry=r)
    in_flight = Gauge("gpux_in_flight_bytes", "Request bytes held by requests in flight", registry=r)
    refused = Counter("gpux_refused", "Requests refused for lack of room", ["reason"], registry=r)
    room = Gauge("gpux_request_room_bytes", "Bytes all requests in flight may hold now: half the memory, less what "
                 "the process kept since warmup", registry=r)
    floor = Gauge("gpux_resident_floor_bytes", "The server's resident anonymous memory when last read with no request in "
                  "flight (0: not read: no container memory limit)", registry=r)
    empty = generate_latest(r)
    for endpoint, code, seconds in EVENTS:
        requests.labels(endpoint, str(code)).inc()
        latency.labels(endpoint).observe(seconds)
    for rows, seconds in RUNS:
        batch.observe(rows)
        inference.observe(seconds)
    for reason in ("memory", "busy", "memory"):
        refused.labels(reason).inc()
    queue.set(3)
    in_flight.set(1234)
    room.set(5678)
    floor.set(91011)
    return empty, generate_latest(r)


def test_metrics_text_is_what_prometheus_client_objects_write():
    m = metrics.Metrics()
    empty = m.render()[0]
    for endpoint, code, seconds in EVENTS:
        m.observe_request(endpoint, code, seconds)
    for rows, seconds in RUNS:
        m.observe_run(rows, seconds)
    for reason in ("memory", "busy", "memory"):
        m.refused.labels(reason).inc()
    m.queue.set(3)
    m.in_flight.set(1234)
    m.room.set(5678)
    m.floor.set(91011)
    body, content_type = m.render()
    assert (empty, body) == _prometheus_objects()
    assert content_type.startswith("text/plain")
    assert 'gpux_refused_total{reason="memory"} 2.0' in body.decode()
    assert m.render()[0] == body  # rendering counts nothing


def test_warmup_values_spread_over_0_1_the_same_on_every_start():
    first, again = _Spread(), _Spread()
    a = _sample("float32", [64, 4], first)
    assert np.array_equal(a, _sample("float32", [64, 4], again))
    assert a.dtype == np.float32 and a.min() >= 0 and a.max() < 1
    assert len(np.unique(a)) == a.size  # varied, not a constant the accuracy check would pass blindly
    assert not np.array_equal(_sample("float32", [64, 4], first), a)  # the next tensor goes on
    half = _sample("float16", [4096], _Spread())
    assert half.max() < 1 and half.min() >= 0
    assert _sample("bfloat16", [3], _Spread()).dtype == np.uint16
    assert _sample("int64", [2, 2], _Spread()).tolist() == [[0, 0], [0, 0]]
    assert _sample("float32", [0, 4], _Spread()).shape == (0, 4)


def _in_image_layout(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    """Run code with the runtime importable as `gpux_runtime`, as in an image, in a fresh interpreter."""
    (tmp_path / "gpux_runtime").symlink_to(RUNTIME)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_start_imports_neither_prometheus_nor_numpy_random_nor_argparse(tmp_path):
    proc = _in_image_layout(tmp_path, """
import sys
from gpux_runtime import protocol, server
server.App.__init__  # the module is whole
for name in ("prometheus_client", "numpy.random", "argparse"):
    assert name not in sys.modules, name
""")
    assert proc.returncode == 0, proc.stderr


def _telemetry_files(home: Path) -> list[str]:
    """What ONNX Runtime's telemetry client leaves: a device id and an event database under
    $HOME/.cache/Microsoft, a session file in $TMPDIR."""
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if "Microsoft" in p.parts or p.name == ".ses")


def test_onnxruntime_telemetry_is_off_in_the_runtime_and_the_cli(tmp_path):
    (tmp_path / "tiny").mkdir()
    folder = tiny_dir(tmp_path / "tiny")
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    quiet = {k: v for k, v in os.environ.items()  # where ONNX Runtime sees a CI, it stays quiet by itself
             if k not in ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "TF_BUILD", "ORT_DISABLE_TELEMETRY")}

    def home(name: str, argv: list[str], **env: str) -> Path:
        folder_ = tmp_path / name
        folder_.mkdir()
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env={**quiet, "HOME": str(folder_), "TMPDIR": str(folder_), **env})
        assert proc.returncode == 0, proc.stderr
        return folder_

    runtime = [sys.executable, "-m", "gpux_pack.runtime", "info"]
    config = {"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(tmp_path / "cache")}
    assert _telemetry_files(home("runtime", runtime, **config)) == []
    project = copy_example("mlp", tmp_path)
    cli = [sys.executable, "-m", "gpux_pack", "predict", str(project), "--input", f"features={tmp_path / 'x.npy'}"]
    assert _telemetry_files(home("cli", cli)) == []
    # the same run with telemetry asked for writes them: what the two above would have left
    opted_in = _telemetry_files(home("opted-in", runtime, ORT_DISABLE_TELEMETRY="0", **config))
    assert ".ses" in opted_in and any(p.endswith("deviceid") for p in opted_in), opted_in
