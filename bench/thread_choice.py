"""Thread choice over N starts of the same image: does it serve at the same speed every time?

    python bench/thread_choice.py [--image TAG] [--example mlp] [--starts 10] [--cpus 2]
        [--base-image IMG] [--json]

Builds the example's cpu image (unless --image names one), then runs it --starts times (each a
fresh container, `--cpus` when given), waits for /v2/health/ready and reads /info's `threads`
(intra_op, chosen, run_ms, why). Reports how many starts chose each intra-op count and whether
all chose the same (the runtime's rule: 1 thread only when a warm run on every CPU takes under
0.25 ms; the measured alternative it replaced chose 1 thread in 2 of 15 starts of one image and
2 in 13). Writes bench/results-thread-choice.json. A measurement, not a timed test.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(example: str, base: str) -> str:
    work = Path(tempfile.mkdtemp(prefix="gpux-threads-"))
    try:
        project = work / example
        shutil.copytree(ROOT / "examples" / example, project)
        tag = f"gpux-bench/{example}:threads"
        proc = subprocess.run([sys.executable, "-m", "gpux_pack", "build", str(project), "--provider", "cpu",
                               "--base-image", base, "--tag", tag, "--json"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"build failed:\n{proc.stderr[-2000:]}")
        return tag
    finally:
        shutil.rmtree(work, ignore_errors=True)


def one_start(client, tag: str, port: int, cpus: float | None) -> dict:
    extra = {"nano_cpus": int(cpus * 1e9)} if cpus else {}
    container = client.containers.run(tag, detach=True, ports={f"{port}/tcp": ("127.0.0.1", None)},
                                      read_only=True, tmpfs={"/tmp": "rw"}, **extra)
    try:
        container.reload()
        base = f"http://127.0.0.1:{container.ports[f'{port}/tcp'][0]['HostPort']}"
        started = time.perf_counter()
        while True:
            try:
                if urllib.request.urlopen(base + "/v2/health/ready", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.01)
            if time.perf_counter() - started > 60:
                raise RuntimeError(f"not ready after 60 s:\n{container.logs().decode()[-2000:]}")
        with urllib.request.urlopen(base + "/info", timeout=5) as r:
            return json.loads(r.read())["threads"]
    finally:
        container.remove(force=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="an image already built (default: build --example's cpu image)")
    parser.add_argument("--example", default="mlp")
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--cpus", type=float, default=None, help="docker run --cpus for each start")
    parser.add_argument("--base-image", default=os.environ.get("GPUX_BASE_IMAGE", "gpux-pack/debian-python:bookworm"))
    parser.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    args = parser.parse_args(argv)

    import docker

    client = docker.from_env()
    tag = args.image or build(args.example, args.base_image)
    port = 9000 if args.example == "text-classifier" and not args.image else 8080
    try:
        threads = [one_start(client, tag, port, args.cpus) for _ in range(args.starts)]
    finally:
        if not args.image:
            try:
                client.images.remove(tag, force=True)
            except docker.errors.APIError:
                pass
    counts = collections.Counter(t["intra_op"] for t in threads)
    most, how_many = counts.most_common(1)[0]
    result = {
        "image": args.image or f"{args.example} (cpu, built here)",
        "starts": args.starts,
        "cpus": args.cpus or len(os.sched_getaffinity(0)),
        "intra_op_counts": {str(k): v for k, v in sorted(counts.items())},
        "equal": how_many,  # starts that chose the most common count
        "all_equal": len(counts) == 1,
        "chosen": sorted({t.get("chosen") for t in threads}),
        "run_ms": [t.get("run_ms") for t in threads],
        "why": threads[0].get("why"),
    }
    (ROOT / "bench" / "results-thread-choice.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{how_many} of {args.starts} starts chose {most} intra-op thread(s); counts {result['intra_op_counts']}")
        print(f"why (first start): {result['why']}")
    return 0 if result["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
