"""Large models (issue 31): build memory and time by model size, against a hand-written docker build.

    python bench/model_sizes.py [--sizes 10M,300M,1500M,3000Mx] [--base-image IMG] [--start]

Each size is a chain of square float32 MatMuls ([batch, n] x [n, n] ...) of about that many bytes
of weights; a trailing `x` stores them as external data (one file beside the model, as
`onnx.save(..., save_as_external_data=True)` writes it), otherwise inline. For each, one run:

  ours     `gpux-pack build PROJECT --base-image BASE --tag T -q` under /usr/bin/time: its peak
           RSS (the largest process of the build) and seconds. Its runtime base image exists
           already (a first build of examples/mlp makes it), so both sides add the model only.
  docker   `docker build` (docker CLI, classic builder, --no-cache) of a hand-written Dockerfile
           `FROM <that runtime base>` + `COPY` the model's files + `COPY gpux.json` (taken from our
           image): seconds, and the docker client's peak RSS (the daemon's is not counted).
  start    with --start, each image started (read-only, `-p 127.0.0.1::8080`; ours first, then
           the hand-written one, page cache warm for both): seconds from `docker run -d` to the
           first 200 from /v2/health/ready (polled every 20 ms), and what the container holds
           then (`docker stats`' memory use). Ours keeps large inline weights as external data
           (pack.weights: auto), the hand-written image the model as given.

Prints a Markdown table and writes bench/results-model-sizes.json. Removes its images and models.
A measurement, never a timed test: the machine is shared, read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "gpux-bench/sizes"
HAND_DOCKERFILE = "FROM {base}\n{copies}COPY gpux.json /opt/gpux/gpux.json\n"


def make_model(folder: Path, size: int, external: bool) -> Path:
    """A MatMul chain of about `size` bytes of float32 weights, written one layer at a time into the
    proto (each layer's array let go once serialised into it)."""
    width = 2048 if size < 400e6 else 4096
    layers = max(1, round(size / (width * width * 4)))
    if size < 50e6:
        width = int((size / 4) ** 0.5)
        layers = 1
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for i in range(layers):
        w = (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        del w
        nodes.append(helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [f"h{i}"]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info(f"h{layers - 1}", TensorProto.FLOAT, ["batch", width])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    if external:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data")
    else:
        onnx.save(model, str(path))
    (folder / "gpux.yml").write_text("name: sizes\nversion: 1.0.0\nmodel:\n  source: ./model.onnx\n")
    return path


def timed(argv: list[str], env: dict | None = None) -> tuple[float, int, subprocess.CompletedProcess]:
    """(seconds, peak RSS in bytes of the largest process, the result) of argv under /usr/bin/time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
        started = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-o", out.name, "-f", "%M", *argv], capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=1800)
        seconds = time.perf_counter() - started
        peak = int(re.findall(r"^(\d+)$", out.read(), re.M)[-1]) * 1024
    if proc.returncode:
        sys.exit(f"{argv[:3]} failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return seconds, peak, proc


def image_file(image: str, path: str) -> bytes:
    container = subprocess.run(["docker", "create", image], capture_output=True, text=True, check=True).stdout.strip()
    try:
        return subprocess.run(["docker", "cp", f"{container}:{path}", "-"], capture_output=True, check=True).stdout
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)


def untar_one(data: bytes) -> bytes:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.extractfile(tar.getmembers()[0]).read()


def start(image: str) -> tuple[float, int]:
    """(seconds from `docker run -d` to ready, the container's memory use then)."""
    import urllib.request

    started = time.perf_counter()
    cid = subprocess.run(["docker", "run", "-d", "--read-only", "--tmpfs", "/tmp", "-p", "127.0.0.1::8080", image],
                         capture_output=True, text=True, check=True).stdout.strip()
    try:
        port = subprocess.run(["docker", "port", cid, "8080/tcp"], capture_output=True, text=True,
                              check=True).stdout.split(":")[-1].strip()
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - started > 300:
                sys.exit(f"{image} not ready in 300 s")
            time.sleep(0.02)
        seconds = time.perf_counter() - started
        usage = subprocess.run(["docker", "stats", "--no-stream", "--format", "{{json .}}", cid], capture_output=True,
                               text=True, check=True).stdout
        return seconds, json.loads(usage)["MemUsage"].split("/")[0].strip()
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10M,300M,1500M,3000Mx")
    parser.add_argument("--base-image", default=os.environ.get("GPUX_TEST_BASE_IMAGE", "gpux-pack/debian-python:bookworm"))
    parser.add_argument("--start", action="store_true")
    args = parser.parse_args()
    gpux = [sys.executable, "-m", "gpux_pack"]
    rows = []
    images = []
    with tempfile.TemporaryDirectory(prefix="gpux-sizes-", dir=os.environ.get("GPUX_BENCH_TMP")) as tmp:
        first = subprocess.run([*gpux, "build", str(ROOT / "examples" / "mlp"), "--base-image", args.base_image,
                                "--tag", f"{PREFIX}:warm", "--json"], capture_output=True, text=True)
        if first.returncode:
            sys.exit(first.stderr)
        images.append(f"{PREFIX}:warm")
        runtime = json.loads(first.stdout)["images"][0]["runtime_base"]
        for spec in args.sizes.split(","):
            external = spec.endswith("x")
            size = int(float(spec.rstrip("xM")) * 1e6)
            project = Path(tmp) / spec
            make_model(project, size, external)
            files = sorted(p.name for p in project.iterdir() if p.name != "gpux.yml")
            total = sum((project / f).stat().st_size for f in files)
            tag = f"{PREFIX}:{spec.lower()}"
            ours_s, ours_rss, _ = timed([*gpux, "build", str(project), "--base-image", args.base_image, "--tag", tag,
                                         "-q"])
            images.append(tag)
            (project / "gpux.json").write_bytes(untar_one(image_file(tag, "/opt/gpux/gpux.json")))
            copies = "".join(f"COPY {f} /opt/gpux/model/{f}\n" for f in files)
            (project / "Dockerfile").write_text(HAND_DOCKERFILE.format(base=runtime, copies=copies))
            (project / ".dockerignore").write_text("gpux.yml\n")
            docker_s, docker_rss, _ = timed(["docker", "build", "--no-cache", "-t", f"{tag}-docker", str(project)],
                                            env={"DOCKER_BUILDKIT": "0"})
            images.append(f"{tag}-docker")
            row = {"model": spec, "weights": "external data" if external else "inline", "bytes": total,
                   "ours_s": round(ours_s, 2), "ours_peak_rss": ours_rss, "ours_rss_over_model": ours_rss - total,
                   "docker_s": round(docker_s, 2), "docker_client_rss": docker_rss,
                   "ours_vs_docker": round(ours_s / docker_s, 2)}
            if args.start:
                row["start_s"], row["start_memory"] = start(tag)
                row["docker_start_s"], row["docker_start_memory"] = start(f"{tag}-docker")
                row["start_vs_docker"] = round(row["start_s"] / row["docker_start_s"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
            for f in project.iterdir():
                f.unlink()
    subprocess.run(["docker", "rmi", "-f", *images], capture_output=True)
    mb = 1e6
    print("\n| model | weights | MB | build s | docker build s | ratio | build peak RSS MB | over the model MB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['weights']} | {r['bytes'] / mb:.0f} | {r['ours_s']} | {r['docker_s']} | "
              f"{r['ours_vs_docker']} | {r['ours_peak_rss'] / mb:.0f} | {r['ours_rss_over_model'] / mb:.0f} |")
    started = [r for r in rows if "start_s" in r]
    if started:
        print("\n| model | start s (ours) | start s (hand-written) | ratio | memory (ours) | memory (hand-written) |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in started:
            print(f"| {r['model']} | {r['start_s']:.2f} | {r['docker_start_s']:.2f} | {r['start_vs_docker']} | "
                  f"{r['start_memory']} | {r['docker_start_memory']} |")
    results = ROOT / "bench" / "results-model-sizes.json"  # rows of other sizes and runs are kept
    kept = json.loads(results.read_text())["rows"] if results.is_file() else []
    measured = {r["model"] for r in rows}
    rows = sorted([*(r for r in kept if r["model"] not in measured), *rows], key=lambda r: r["bytes"])
    results.write_text(json.dumps({"base_image": args.base_image, "runtime_base": runtime, "cpus": os.cpu_count(),
                                   "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
