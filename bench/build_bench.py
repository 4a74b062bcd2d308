"""Build and start-up numbers for an example, measured on a real Docker engine.

    python bench/build_bench.py [--example mlp] [--base-image IMG] [--starts 5] [--requests 300]

Measures, for one copy of the example in a temporary folder:
  cold build        no layer cache (--no-cache) and an empty wheel cache: downloads included
  warm-wheels build no layer cache, wheels already cached (a new machine with a warm cache)
  no-op rebuild     nothing changed
  model rebuild     only the model's weights changed
  image size        as the engine reports it, and the base image's share
  start-to-ready    docker run -> first 200 from /v2/health/ready (median of --starts)
  predict latency   POST /predict, batch 1, sequential, over loopback (p50/p99)
Prints a Markdown table and writes bench/results-<example>.json. Speed belongs here, not in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import docker
import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent


def build(project: Path, tag: str, base: str, env: dict, *extra: str) -> tuple[float, dict]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gpux_pack", "build", str(project), "--base-image", base, "--tag", tag, "--json", *extra],
        capture_output=True, text=True, env={**os.environ, **env},
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"build failed:\n{proc.stderr[-2000:]}")
    return round(seconds, 2), json.loads(proc.stdout)["images"][0]


def bump_weights(model_path: Path) -> None:
    model = onnx.load(str(model_path))
    init = model.graph.initializer[-1]
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(0.5), init.name))
    onnx.save(model, str(model_path))


def start_to_ready(client, tag: str, port: int) -> float:
    started = time.perf_counter()
    container = client.containers.run(tag, detach=True, ports={f"{port}/tcp": ("127.0.0.1", None)},
                                      read_only=True, tmpfs={"/tmp": "rw"})
    try:
        container.reload()
        host_port = container.ports[f"{port}/tcp"][0]["HostPort"]
        url = f"http://127.0.0.1:{host_port}/v2/health/ready"
        while True:
            try:
                if urllib.request.urlopen(url, timeout=1).status == 200:
                    return time.perf_counter() - started
            except OSError:
                time.sleep(0.005)
            if time.perf_counter() - started > 60:
                raise RuntimeError("not ready after 60 s")
    finally:
        container.remove(force=True)


def latency(client, tag: str, port: int, body: dict, n: int) -> dict:
    container = client.containers.run(tag, detach=True, ports={f"{port}/tcp": ("127.0.0.1", None)})
    try:
        container.reload()
        base = f"http://127.0.0.1:{container.ports[f'{port}/tcp'][0]['HostPort']}"
        while True:
            try:
                if urllib.request.urlopen(base + "/v2/health/ready", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.01)
        data = json.dumps(body).encode()
        times = []
        for _ in range(n):
            req = urllib.request.Request(base + "/predict", data, {"Content-Type": "application/json"})
            t = time.perf_counter()
            urllib.request.urlopen(req).read()
            times.append((time.perf_counter() - t) * 1000)
        times.sort()
        return {"p50_ms": round(times[len(times) // 2], 2), "p99_ms": round(times[int(len(times) * 0.99) - 1], 2), "n": n}
    finally:
        container.remove(force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="mlp")
    parser.add_argument("--base-image", default=os.environ.get("GPUX_BASE_IMAGE", "gpux-pack/debian-python:bookworm"))
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()

    client = docker.from_env()
    work = Path(tempfile.mkdtemp(prefix="gpux-bench-"))
    project = work / args.example
    shutil.copytree(ROOT / "examples" / args.example, project)
    empty_cache = {"GPUX_PACK_CACHE_DIR": str(work / "cache")}
    tag = f"gpux-bench/{args.example}:run"
    port = 9000 if args.example == "text-classifier" else 8080
    results: dict = {"example": args.example, "base_image": args.base_image}
    try:
        results["cold_build_s"], first = build(project, tag, args.base_image, empty_cache, "--no-cache")
        results["warm_wheels_build_s"], _ = build(project, tag, args.base_image, empty_cache, "--no-cache")
        results["noop_rebuild_s"], noop = build(project, tag, args.base_image, empty_cache)
        bump_weights(project / "model.onnx")
        results["model_rebuild_s"], changed = build(project, tag, args.base_image, empty_cache)
        results["model_rebuild_steps_rerun"] = changed["steps"] - changed["cached_steps"] - 2
        results["image_size_mb"] = round(changed["size_bytes"] / 1e6, 1)
        results["base_image_size_mb"] = round(client.images.get(args.base_image).attrs["Size"] / 1e6, 1)
        results["wheelhouse_mb"] = round(sum(p.stat().st_size for p in (work / "cache" / "wheels").glob("*.whl")) / 1e6, 1)
        starts = [start_to_ready(client, tag, port) for _ in range(args.starts)]
        results["start_to_ready_s"] = {"median": round(statistics.median(starts), 3), "min": round(min(starts), 3), "max": round(max(starts), 3)}
        if args.example == "mlp":
            results["predict_batch1"] = latency(client, tag, port, {"features": [[5.1, 3.5, 1.4, 0.2]]}, args.requests)
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.APIError:
            pass
        shutil.rmtree(work, ignore_errors=True)

    out = ROOT / "bench" / f"results-{args.example}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"| measure ({args.example}, base {args.base_image}) | value |\n|---|---|")
    for key, value in results.items():
        if key not in ("example", "base_image"):
            print(f"| {key} | {value} |")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
