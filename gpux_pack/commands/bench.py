"""`gpux-pack bench IMAGE|PATH`: each provider's image started and warmed, then the model alone
(session.run inside the container, the image's own `bench` command) and end to end (KServe v2
binary requests from this host at a given concurrency): one comparison table, like the GPUX
guide's provider table, or JSON for CI.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from gpux_pack import engine
from gpux_pack.engine.containers import start_container
from gpux_pack.engine.interface import Engine
from gpux_pack.errors import DockerError
from gpux_pack.plan import PYTHON
from gpux_pack.runtime.contract import DTYPES, V2_TO_NAME
from gpux_pack.pipeline import build
from gpux_pack.plan import Options
from gpux_pack.ui import Reporter, escape


@dataclass(frozen=True)
class Result:
    image: str
    provider: str
    active: list[str]
    model_p50_ms: float
    model_p99_ms: float
    http_p50_ms: float
    http_p99_ms: float
    throughput_rps: float
    runs: int
    concurrency: int

    def row(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def bench(client: Engine, image: str, ui: Reporter, runs: int, concurrency: int) -> Result:
    started = start_container(client, image, ui)
    try:
        code, out = started.container.exec_run([PYTHON, "-m", "gpux_runtime", "bench", "--runs", str(runs)])
        if code != 0:
            raise DockerError(f"{image}: the model benchmark failed in the container: "
                              f"{out.decode(errors='replace').strip().splitlines()[-1:]}")
        inside = json.loads(out.decode().strip().splitlines()[-1])
        body, headers, path = _request(started.url)
        http_ms, rps = load_test(started.url, path, body, headers, runs, concurrency)
    finally:
        try:
            started.container.stop(timeout=15)
        finally:
            engine.remove_container(started.container)
    return Result(image, started.provider, inside["providers"], inside["p50_ms"], inside["p99_ms"],
                  http_ms[len(http_ms) // 2], http_ms[min(len(http_ms) - 1, int(len(http_ms) * 0.99))], rps, runs,
                  concurrency)


def _request(url: str) -> tuple[bytes, dict[str, str], str]:
    """A v2 binary infer request of the model's inputs (dynamic dimensions at 1)."""
    host = urlparse(url)
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
    conn.request("GET", "/info")
    info = json.loads(conn.getresponse().read())
    conn.request("GET", f"/v2/models/{info['name']}")
    meta = json.loads(conn.getresponse().read())
    conn.close()
    rng = np.random.default_rng(0)
    items, blobs = [], []
    for t in meta["inputs"]:
        shape = [d if d >= 0 else 1 for d in t["shape"]]
        if t["datatype"] == "BYTES":
            blob = b"".join(len(b"a").to_bytes(4, "little") + b"a" for _ in range(int(np.prod(shape))))
        else:
            kind = np.dtype(DTYPES[V2_TO_NAME[t["datatype"]]][0]).type
            arr = rng.random(shape).astype(kind) if np.issubdtype(kind, np.floating) else np.zeros(shape, kind)
            blob = arr.tobytes()
        items.append({"name": t["name"], "shape": shape, "datatype": t["datatype"],
                      "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    head = json.dumps({"inputs": items, "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head)),
                                    "Content-Type": "application/octet-stream"}, f"/v2/models/{info['name']}/infer"


def load_test(url: str, path: str, body: bytes, headers: dict[str, str], total: int, concurrency: int
              ) -> tuple[list[float], float]:
    """`total` requests over `concurrency` keep-alive connections: sorted latencies (ms), req/s."""
    host = urlparse(url)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    per = max(1, total // concurrency)

    def client() -> None:
        conn = http.client.HTTPConnection(host.hostname, host.port, timeout=60)
        mine = []
        for _ in range(per):
            t0 = time.perf_counter()
            conn.request("POST", path, body, headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                with lock:
                    errors.append(f"HTTP {r.status}")
                break
            mine.append(1000 * (time.perf_counter() - t0))
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors or not latencies:
        raise DockerError(f"the end-to-end benchmark got {errors[0] if errors else 'no answers'}")
    latencies.sort()
    return latencies, len(latencies) / seconds


def bench_target(client: Engine, target: str, provider: str | None, tag: str | None, options: Options | None, runs: int,
                 concurrency: int, ui: Reporter, failed: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """A project is built first (one image per provider), an image is benched as it is."""
    images = [target]
    if options is not None:
        loaded, decision, _ = build.open_project(Path(target), provider, tag, lambda: client, ui)
        build.check_tag(tag, decision.providers)
        made, failures, _ = build.build_each(loaded, decision, [options], client, ui, failed)
        if failures:
            return [], failures
        images = [m.built.tag for m in made]
    return [bench(client, image, ui, runs, concurrency).row() for image in images], []


def table(results: list[dict[str, Any]], runs: int, concurrency: int) -> Any:
    from rich.table import Table

    out = Table(title=f"{runs} runs, concurrency {concurrency}")
    for col in ("provider", "active", "model p50", "model p99", "HTTP p50", "HTTP p99", "req/s", "image"):
        out.add_column(col)
    for r in results:
        out.add_row(*(escape(str(c)) for c in (
            r["provider"], r["active"][0], f"{r['model_p50_ms']:.3f} ms", f"{r['model_p99_ms']:.3f} ms",
            f"{r['http_p50_ms']:.3f} ms", f"{r['http_p99_ms']:.3f} ms", f"{r['throughput_rps']:.0f}", r["image"])))
    return out
