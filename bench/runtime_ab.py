"""Two builds of the same project, A and B (e.g. the runtime before and after a change), served
side by side in rounds that alternate: start to ready, /predict p50 at one client and req/s at
eight, one body per image. Ratios B/A from one run; the machine is shared, so the best round of
each is kept.

    python bench/runtime_ab.py IMAGE_A IMAGE_B --body body.json [--type application/json]
                               [--requests 400] [--rounds 3] [--memory 256m] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import statistics
import time
from pathlib import Path

import docker


def _ready(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/v2/health/ready")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError("not ready in time")


def _latencies(port: int, body: bytes, kind: str, count: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    for _ in range(count):
        started = time.perf_counter()
        conn.request("POST", "/predict", body=body, headers={"Content-Type": kind})
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status
        out.append(time.perf_counter() - started)
    return out


def _round(client, image: str, body: bytes, kind: str, count: int, memory: str) -> dict[str, float]:
    started = time.monotonic()
    container = client.containers.run(image, detach=True, read_only=True, tmpfs={"/tmp": ""}, mem_limit=memory,
                                      ports={"8080/tcp": ("127.0.0.1", None)})
    try:
        container.reload()
        port = int(container.attrs["NetworkSettings"]["Ports"]["8080/tcp"][0]["HostPort"])
        _ready(port, started + 120)
        ready = time.monotonic() - started
        _latencies(port, body, kind, 20)  # warm the connection and the allocator
        one = _latencies(port, body, kind, count)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            done = sum(len(r) for r in pool.map(lambda _: _latencies(port, body, kind, count // 8), range(8)))
        rate = done / (time.perf_counter() - t0)
        return {"ready_s": ready, "p50_ms": statistics.median(one) * 1000, "c8_req_s": rate}
    finally:
        container.remove(force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--body", type=Path, required=True)
    parser.add_argument("--type", default="application/json")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory", default="1g")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    client = docker.from_env()
    body = args.body.read_bytes()
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for _ in range(args.rounds):
        for name in ("a", "b"):
            runs[name].append(_round(client, getattr(args, name), body, args.type, args.requests, args.memory))
    best = {name: {"ready_s": min(r["ready_s"] for r in rs), "p50_ms": min(r["p50_ms"] for r in rs),
                   "c8_req_s": max(r["c8_req_s"] for r in rs)} for name, rs in runs.items()}
    ratios = {k: best["b"][k] / best["a"][k] for k in best["a"]}
    for key in ("ready_s", "p50_ms", "c8_req_s"):
        print(f"{key:10} A {best['a'][key]:9.3f}  B {best['b'][key]:9.3f}  B/A {ratios[key]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"a": args.a, "b": args.b, "body": args.body.name, "best": best,
                                         "ratios": ratios, "rounds": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
