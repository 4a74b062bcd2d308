"""GPUX 0.1.1 against gpux-pack on GPUX's own ground (issue 41): the same model, the same body,
the same base image, in one run, the two sides interleaved.

    python bench/peer.py [--base-image IMG] [--rounds 3] [--requests 400] [--json bench/results-peer.json]

GPUX's side is its documented Dockerfile (docs/deployment: pip install gpux, COPY the model and
gpux.yml, `gpux serve`) on the same offline Debian base as ours: nothing can be pulled or pip
installed inside a build here, so `gpux[serve]==0.1.1` and its dependencies are installed on the
host for the image's platform (uv, as gpux-pack installs its own lock) and copied in. The model is
a small CNN (input [1, 3, 64, 64], 10 logits), the body GPUX's JSON form {"input": nested lists}
of 4-decimal floats (about 85 KB). Its input is float64: GPUX 0.1.1's /predict makes every JSON
list a float64 array (np.array) and ONNX Runtime refuses that for a float32 input (a 400), so
float64 is the only float input both can serve from JSON; the graph casts it to float32 first. Rows, each ours / GPUX's:

  start to first inference   containers.run() to the first 200 from POST /predict (polled)
  /predict p50, 1 client     keep-alive HTTP/1.1, --requests in a row after 20 to warm up
  /predict req/s, 8 clients  8 keep-alive connections for 5 s with wrk (Debian's; it takes less of
                             the two CPUs than a Python client would), else --requests in all from
                             8 Python threads
  idle memory                the server's VmRSS once it has answered

The best round of each side is kept (the machine is shared). Removes what it made.
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
import time
from pathlib import Path

import docker
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GPUX_YML = """\
name: tinycnn
version: 1.0.0
model:
  source: ./model.onnx
inputs:
  input:
    type: float64
    shape: [1, 3, 64, 64]
outputs:
  logits:
    type: float32
    shape: [1, 10]
"""
GPUX_DOCKERFILE = """\
FROM {base}
COPY site /opt/gpux-peer/site
ENV PYTHONPATH=/opt/gpux-peer/site
COPY model.onnx gpux.yml /app/
WORKDIR /app
USER 10001
EXPOSE 8080
CMD ["python3", "-c", "import sys; from gpux.cli.main import app; sys.argv[1:] = ['serve', 'tinycnn', '--port', '8080']; app()"]
"""


def tiny_cnn(path: Path) -> None:
    """Two 3x3 convolutions (16 and 32 channels, stride 2), global average pool, a 32x10 dense layer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {"w1": rng.normal(0, 0.1, (16, 3, 3, 3)), "b1": np.zeros(16), "w2": rng.normal(0, 0.1, (32, 16, 3, 3)),
               "b2": np.zeros(32), "fc": rng.normal(0, 0.1, (32, 10)), "fb": np.zeros(10)}
    nodes = [helper.make_node("Cast", ["input"], ["x"], to=TensorProto.FLOAT),
             helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["logits"])]
    graph = helper.make_graph(nodes, "tinycnn", [helper.make_tensor_value_info("input", TensorProto.DOUBLE, [1, 3, 64, 64])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def body() -> bytes:
    x = np.round(np.random.default_rng(1).random((1, 3, 64, 64)), 4)
    return json.dumps({"input": x.tolist()}).encode()


def gpux_image(client, base: str, project: Path, work: Path, tag: str) -> None:
    """GPUX's documented image, its packages installed on the host for the base's platform."""
    context = work / "gpux-context"
    context.mkdir()
    subprocess.run([shutil.which("uv") or str(Path(sys.executable).parent / "uv"), "pip", "install", "-q", "--target",
                    str(context / "site"), "--python-platform", "x86_64-manylinux_2_36", "--python-version", "3.11",
                    "--only-binary", ":all:", "gpux[serve]==0.1.1"], check=True)
    for name in ("model.onnx", "gpux.yml"):
        shutil.copy(project / name, context / name)
    (context / "Dockerfile").write_text(GPUX_DOCKERFILE.format(base=base))
    client.images.build(path=str(context), tag=tag, rm=True)


def our_image(base: str, project: Path, tag: str) -> None:
    subprocess.run([sys.executable, "-m", "gpux_pack", "build", str(project), "--base-image", base, "--tag", tag,
                    "-p", "cpu", "-q"], check=True, cwd=ROOT)


def _post(conn: http.client.HTTPConnection, data: bytes) -> int:
    conn.request("POST", "/predict", body=data, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


def _latencies(port: int, data: bytes, count: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    for _ in range(count):
        started = time.perf_counter()
        assert _post(conn, data) == 200
        out.append(time.perf_counter() - started)
    conn.close()
    return out


def _rate(port: int, data: bytes, count: int) -> float:
    """Requests a second from 8 keep-alive connections: wrk where it is installed, else Python threads."""
    wrk = shutil.which("wrk")
    if wrk:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "body").write_bytes(data)
            script = Path(tmp) / "post.lua"
            script.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                              f'local f = io.open("{Path(tmp) / "body"}", "rb"); wrk.body = f:read("*all"); f:close()\n')
            out = subprocess.run([wrk, "-t2", "-c8", "-d5s", "-s", str(script), f"http://127.0.0.1:{port}/predict"],
                                 capture_output=True, text=True, check=True).stdout
        assert "Non-2xx" not in out, out
        return float(next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec")))
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        done = sum(len(r) for r in pool.map(lambda _: _latencies(port, data, count // 8), range(8)))
    return done / (time.perf_counter() - t0)


def one_round(client, image: str, data: bytes, count: int) -> dict[str, float]:
    started = time.perf_counter()
    container = client.containers.run(image, detach=True, tmpfs={"/tmp": ""}, ports={"8080/tcp": ("127.0.0.1", None)})
    try:
        port = None
        while time.perf_counter() - started < 120:
            if port is None:
                container.reload()
                bound = (container.attrs["NetworkSettings"]["Ports"] or {}).get("8080/tcp")
                port = int(bound[0]["HostPort"]) if bound else None
            if port is not None:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    if _post(conn, data) == 200:
                        break
                except OSError:
                    pass
            time.sleep(0.005)
        else:
            raise RuntimeError(f"{image} did not answer: {container.logs()[-2000:]!r}")
        first = time.perf_counter() - started
        _latencies(port, data, 20)
        p50 = statistics.median(_latencies(port, data, count))
        rate = _rate(port, data, count)
        code, out = container.exec_run(["python3", "-c", "print(open('/proc/1/status').read())"])
        rss = next(int(line.split()[1]) * 1024 for line in out.decode().splitlines() if line.startswith("VmRSS:"))
        return {"first_inference_s": first, "p50_ms": p50 * 1000, "c8_req_s": rate, "idle_rss_mb": rss / 1e6}
    finally:
        container.remove(force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default=os.environ.get("GPUX_TEST_BASE_IMAGE", "gpux-pack/debian-python:bookworm"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    client = docker.from_env()
    tags = {"gpux": "gpux-peer-bench/gpux:1", "ours": "gpux-peer-bench/ours:1"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        project = work / "project"
        project.mkdir()
        tiny_cnn(project / "model.onnx")
        (project / "gpux.yml").write_text(GPUX_YML)
        try:
            gpux_image(client, args.base_image, project, work, tags["gpux"])
            our_image(args.base_image, project, tags["ours"])
            data = body()
            rounds: dict[str, list[dict[str, float]]] = {"gpux": [], "ours": []}
            for i in range(args.rounds):
                for side in (("gpux", "ours") if i % 2 == 0 else ("ours", "gpux")):
                    rounds[side].append(one_round(client, tags[side], data, args.requests))
        finally:
            for tag in tags.values():
                try:
                    client.images.remove(tag, force=True)
                except docker.errors.ImageNotFound:
                    pass
    best = {side: {"first_inference_s": min(r["first_inference_s"] for r in rs),
                   "p50_ms": min(r["p50_ms"] for r in rs), "c8_req_s": max(r["c8_req_s"] for r in rs),
                   "idle_rss_mb": min(r["idle_rss_mb"] for r in rs)} for side, rs in rounds.items()}
    ratios = {k: best["ours"][k] / best["gpux"][k] for k in best["gpux"]}
    print(f"body {len(data)} bytes, {args.rounds} rounds, best of each side")
    print("| row | GPUX 0.1.1 | gpux-pack | ours / GPUX |\n|---|---:|---:|---:|")
    for key, label in (("first_inference_s", "start to first inference (s)"), ("p50_ms", "/predict p50, 1 client (ms)"),
                       ("c8_req_s", "/predict req/s, 8 clients"), ("idle_rss_mb", "idle memory (MB)")):
        print(f"| {label} | {best['gpux'][key]:.3f} | {best['ours'][key]:.3f} | {ratios[key]:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps({"body_bytes": len(data), "best": best, "ratios": ratios, "rounds": rounds},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
