"""JSON and binary bodies by size against one image (issue 28): what the server spends per
request, p50 at concurrency 1, throughput at 8, and the container's peak memory against what
the server charged for the request, beside orjson's in-process parse of the same body.

    python bench/json_matrix.py [--base-image IMG] [--rounds 3] [--memory 1g] [--seconds 2]

examples/mlp (input features [batch, 4] float32, outputs logits and probs [batch, 3]) is built
once and served from one container (`--memory`, published on 127.0.0.1 only). For each body
size (1 KB, 64 KB, 255 KB, 1 MB, 4 MB, 16 MiB of /predict JSON, as a Python client's
`json.dumps` of random float32 rows writes it) the same rows go three ways:

  /predict JSON   {"features": [[...], ...]}, answered {"logits": ..., "probs": ...}
  v2 JSON         KServe v2 infer, JSON data in and out
  v2 binary       KServe v2 infer, binary data in and out (the binary tensor extension)

Per case, rounds interleaved (every case once per round; best p50 and throughput kept, the
highest peak kept):
  server ms       what the server spent per request: the change in gpux_request_seconds' sum
                  over its count on /metrics across the concurrency-1 requests
  p50 c=1         an http.client keep-alive connection, requests for about --seconds
  req/s c=8       wrk (when installed; else the Python client) for --seconds, 8 connections
  peak MB c=1     the most one request took of the container's memory above its level just
                  before it (cgroup v1 memory.max_usage_in_bytes, reset before each request;
                  cgroup v2 memory.peak, reset the same way where the kernel allows)
  peak MB c=8     the same high-water mark over the whole concurrency-8 load, above the level
                  before it
  charge MB       what the server counts against its in-flight budget for one such request at
                  its peak (from the runtime's own cost functions: the body and its decode, or
                  the tensors, the graph's intermediate tensors and the answer; and the
                  request's fixed overhead); peak c=1 must not exceed it (the cgroup charges memory 256 KiB at
                  a time: smaller peaks read as 0.25)
  floor ms        orjson.loads of the body and np.asarray(..., float32) of its tensor, in
                  this process (binary: the header's orjson.loads and np.frombuffer)
  stdlib ms       json.loads of the body and json.dumps of the answer: the JSON a stdlib
                  server does for the same exchange

The headline (issue 28's acceptance): at 255 KB, /predict JSON p50 minus in-process
session.run of the same rows, over the stdlib exchange: target <= 0.5x.

Writes bench/results-json-matrix.json and prints a Markdown table. Removes the container and
the image it made. A measurement, never a timed test; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import docker
import numpy as np
import onnxruntime as ort
import orjson

import serve_bench  # bench/: its container start and load generator
from gpux_pack.project.model import inspect_model
from gpux_pack.runtime import tensors
from gpux_pack.runtime.resources import REQUEST_OVERHEAD
from gpux_pack.runtime.budget import ANSWER_TEXT

ROOT = Path(__file__).resolve().parent.parent
TAG = "gpux-bench/json-matrix:mlp"
MiB = 1024 * 1024
SIZES = [("1 KB", 1000), ("64 KB", 64_000), ("255 KB", 255_000), ("1 MB", 1_000_000), ("4 MB", 4_000_000),
         ("16 MiB", 16 * MiB)]
WORKING = inspect_model(ROOT / "examples/mlp/model.onnx").working_memory  # (((features, 0),), 128)


def rows_for(size: int, rng: np.random.Generator) -> np.ndarray:
    """Random float32 rows whose /predict body, as stdlib json writes it, is about `size` bytes."""
    sample = rng.random((256, 4), dtype=np.float32)
    per_row = len(json.dumps(sample.tolist())) / 256
    return rng.random((max(1, int((size - 16) / per_row)), 4), dtype=np.float32)


def cases_for(x: np.ndarray) -> dict[str, tuple[str, bytes, dict[str, str]]]:
    return serve_bench.bodies(x, "features", "iris-mlp")


def charge(name: str, body: bytes, rows: int) -> int:
    """What the server holds against its in-flight budget for this request at its peak: the
    body and what decoding it holds, then the tensors, the outputs, the graph's intermediate
    tensors (model.working_memory) and the answer (a JSON answer's text, a binary one's bytes).
    The same functions and constants the server uses."""
    outputs = rows * 6  # logits and probs, [rows, 3] each
    working = sum(n * rows ** len(dims) for dims, n in WORKING)
    tensors_bytes = rows * 4 * 4 + outputs * 4 + working
    if name == "v2 binary":
        decode = (len(body) - rows * 16) * tensors.JSON_FACTOR  # the JSON header as objects
        answer = outputs * 4
    else:  # parsed whole up to WHOLE_PARSE (the server's rule, with --memory 1g's per-request budget)
        whole = len(body) <= tensors.WHOLE_PARSE and len(body) * tensors.JSON_FACTOR <= (1024 * MiB // 8) // 2
        numeric = None if whole else tensors.numeric_body(body)
        decode = numeric.decode_cost(4) if numeric is not None else len(body) * tensors.JSON_FACTOR
        answer = outputs * ANSWER_TEXT
    return max(len(body) + decode, tensors_bytes + answer) + REQUEST_OVERHEAD


def floor_ms(name: str, body: bytes, headers: dict[str, str], runs: int) -> float:
    def once() -> None:
        if name == "v2 binary":
            n = int(headers["Inference-Header-Content-Length"])
            orjson.loads(body[:n])
            np.frombuffer(body, np.float32, offset=n)
        elif name == "v2 JSON":
            np.asarray(orjson.loads(body)["inputs"][0]["data"], np.float32)
        else:
            np.asarray(orjson.loads(body)["features"], np.float32)

    return _median(once, runs)


def stdlib_ms(body: bytes, answer: dict, runs: int) -> float:
    return _median(lambda: (json.loads(body), json.dumps(answer)), runs)


def _median(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


class Memory:
    """The container's cgroup memory high-water mark, reset before each case."""

    def __init__(self, container) -> None:
        cid = container.id
        v1 = Path(f"/sys/fs/cgroup/memory/docker/{cid}")
        v2 = next((p for p in (Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope"), Path(f"/sys/fs/cgroup/docker/{cid}"))
                   if p.exists()), None)
        if v1.exists():
            self.usage, self.peak_file = v1 / "memory.usage_in_bytes", v1 / "memory.max_usage_in_bytes"
            self.fd = None
        elif v2 is not None and (v2 / "memory.peak").exists():
            self.usage, self.peak_file = v2 / "memory.current", v2 / "memory.peak"
            self.fd = os.open(self.peak_file, os.O_RDWR)
        else:
            sys.exit("cannot find the container's memory cgroup (run as root, cgroupfs or systemd driver)")

    def reset(self) -> int:
        if self.fd is None:
            self.peak_file.write_text("0")
        else:
            os.pwrite(self.fd, b"reset", 0)
        return int(self.usage.read_text())

    def peak(self) -> int:
        if self.fd is None:
            return int(self.peak_file.read_text())
        return int(os.pread(self.fd, 64, 0))


def metrics(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return text


def server_seconds(port: int, endpoint: str) -> tuple[float, int]:
    total = count = 0.0
    for line in metrics(port).splitlines():
        if f'endpoint="{endpoint}"' not in line:
            continue
        if line.startswith("gpux_request_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("gpux_request_seconds_count"):
            count = float(line.rsplit(" ", 1)[1])
    return total, int(count)


def settle(port: int) -> None:
    """Wait until no request is in flight: wrk stops at its deadline with requests still being
    served, and they would count towards the next case's time and memory."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "gpux_in_flight_bytes 0.0" in metrics(port):
            return
        time.sleep(0.05)
    sys.exit("requests still in flight after 120 s")


def one_connection(port: int, path: str, body: bytes, headers: dict[str, str], seconds: float,
                   memory: "Memory | None" = None, most: int = 400) -> tuple[list[float], bytes, int]:
    """Requests one after another for about `seconds` (at least 5): sorted latencies (ms), the
    last answer, and the most memory one request took above the level before it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    answer, peaks = b"", [0]
    while len(latencies) < 5 or time.monotonic() < deadline and len(latencies) < most:
        before = memory.reset() if memory else 0
        started = time.perf_counter()
        conn.request("POST", path, body, headers)
        r = conn.getresponse()
        answer = r.read()
        latencies.append(1000 * (time.perf_counter() - started))
        if memory:
            peaks.append(memory.peak() - before)
        if r.status != 200:
            sys.exit(f"{path}: HTTP {r.status}: {answer[:300]!r}")
    conn.close()
    return sorted(latencies), answer, sorted(peaks)


def throughput(port: int, path: str, body: bytes, headers: dict[str, str], seconds: float) -> float:
    """Requests per second over 8 keep-alive connections for about `seconds` (serve_bench's load:
    wrk when installed, else its Python client)."""
    client = "wrk" if shutil.which("wrk") else "python"
    return serve_bench.load(port, path, body, headers, 8, max(80, int(400 * seconds)), client)["rps"]


def start(client, memory: str):
    container, port = serve_bench.start(client, TAG, mem_limit=memory, read_only=True, tmpfs={"/tmp": ""})
    return container, port


def session_run_ms(x: np.ndarray, runs: int = 50) -> float:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(ROOT / "examples/mlp/model.onnx"), opts, providers=["CPUExecutionProvider"])
    session.run(None, {"features": x})
    return _median(lambda: session.run(None, {"features": x}), runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-image", default="gpux-pack/debian-python:bookworm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory", default="1g", help="the container's memory limit (the body limit is a sixteenth)")
    ap.add_argument("--seconds", type=float, default=2.0, help="how long each load lasts")
    ap.add_argument("--sizes", default=",".join(label for label, _ in SIZES),
                    help="which body sizes, by label (the headline needs 255 KB)")
    ap.add_argument("--output", default=str(ROOT / "bench/results-json-matrix.json"))
    args = ap.parse_args()
    build = subprocess.run([sys.executable, "-m", "gpux_pack", "build", str(ROOT / "examples/mlp"), "--base-image",
                            args.base_image, "--tag", TAG, "--quiet"], capture_output=True, text=True)
    if build.returncode:
        sys.exit(f"build failed:\n{build.stderr[-2000:]}")
    client = docker.from_env()
    rng = np.random.default_rng(0)
    wanted = set(args.sizes.split(","))
    sizes = [(label, rows_for(size, rng)) for label, size in SIZES if label in wanted]
    best: dict[tuple[str, str], dict] = {}
    container, port = start(client, args.memory)
    try:
        memory = Memory(container)
        for round_ in range(args.rounds):
            for label, x in sizes:
                for name, (path, body, headers) in cases_for(x).items():
                    endpoint = "/predict" if path == "/predict" else "/v2/models/{name}/infer"
                    one_connection(port, path, body, headers, 0)  # the connection path warm
                    settle(port)
                    s0, n0 = server_seconds(port, endpoint)
                    latencies, answer, peaks = one_connection(port, path, body, headers, args.seconds, memory)
                    peak1, typical1 = peaks[-1], peaks[len(peaks) // 2]
                    s1, n1 = server_seconds(port, endpoint)
                    before = memory.reset()
                    rps = throughput(port, path, body, headers, max(args.seconds, 8 * latencies[0] / 1000))
                    settle(port)
                    peak8 = memory.peak() - before
                    row = {"size": label, "body_bytes": len(body), "rows": len(x), "endpoint": name,
                           "server_ms": 1000 * (s1 - s0) / max(1, n1 - n0), "p50_ms": latencies[len(latencies) // 2],
                           "rps_c8": rps, "peak_mb_c1": peak1 / MiB, "median_peak_mb_c1": typical1 / MiB,
                           "peak_mb_c8": peak8 / MiB,
                           "charge_mb": charge(name, body, len(x)) / MiB}
                    if round_ == 0:
                        runs = max(3, min(50, int(20_000_000 / len(body))))
                        row["floor_ms"] = floor_ms(name, body, headers, runs)
                        row["stdlib_ms"] = stdlib_ms(body, orjson.loads(answer), runs) if name == "/predict JSON" else None
                        row["session_run_ms"] = session_run_ms(x, runs)
                    key = (label, name)
                    if key in best:
                        old = best[key]
                        row = {**old, "server_ms": min(old["server_ms"], row["server_ms"]),
                               "p50_ms": min(old["p50_ms"], row["p50_ms"]), "rps_c8": max(old["rps_c8"], row["rps_c8"]),
                               "peak_mb_c1": max(old["peak_mb_c1"], row["peak_mb_c1"]),
                               "median_peak_mb_c1": max(old["median_peak_mb_c1"], row["median_peak_mb_c1"]),
                               "peak_mb_c8": max(old["peak_mb_c8"], row["peak_mb_c8"])}
                    best[key] = row
                    print(f"round {round_ + 1}: {label} {name}: p50 {row['p50_ms']:.2f} ms, peak c=1 "
                          f"{peak1 / MiB:.1f} MiB (median {typical1 / MiB:.1f}) of {row['charge_mb']:.1f}", file=sys.stderr)
    finally:
        container.remove(force=True)
        try:
            client.images.remove(TAG)
        except docker.errors.APIError:
            pass
    rows = list(best.values())
    report = {"memory": args.memory, "rounds": args.rounds, "seconds": args.seconds, "onnxruntime": ort.__version__,
              "cpu": _cpu(), "load_generator": "wrk" if shutil.which("wrk") else "python",
              "rows": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]}
    headline = best.get(("255 KB", "/predict JSON"))
    if headline is not None:
        ratio = (headline["p50_ms"] - headline["session_run_ms"]) / headline["stdlib_ms"]
        report["headline"] = {"case": "255 KB /predict JSON", "p50_ms": headline["p50_ms"],
                              "session_run_ms": headline["session_run_ms"], "stdlib_exchange_ms": headline["stdlib_ms"],
                              "adds_over_stdlib": round(ratio, 3), "target": 0.5}
    Path(args.output).write_text(json.dumps(report, indent=1) + "\n")
    print(f"container --memory {args.memory}; load generator {report['load_generator']}; {report['cpu']}")
    print("| body | endpoint | server ms | floor ms | p50 c=1 | req/s c=8 | peak MB c=1 | peak MB c=8 | charge MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} | {r['endpoint']} | {r['server_ms']:.2f} | {r['floor_ms']:.2f} | {r['p50_ms']:.2f} ms | "
              f"{r['rps_c8']:.0f} | {r['peak_mb_c1']:.1f} | {r['peak_mb_c8']:.1f} | {r['charge_mb']:.1f} |")
    if headline is not None:
        print(f"255 KB /predict JSON: p50 {headline['p50_ms']:.2f} ms - session.run {headline['session_run_ms']:.3f} ms "
              f"= {ratio:.2f}x the stdlib exchange ({headline['stdlib_ms']:.2f} ms; target <= 0.5x)")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
