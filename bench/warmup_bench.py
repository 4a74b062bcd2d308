"""OpenVINO start-to-first-response with a cold cache, a baked cache and a warm volume (issue 8).

    python bench/warmup_bench.py [--base-image IMG] [--model mlp|deep] [--rounds 5]

One openvino image is built with `--warmup never` (as on a CI host), then `gpux-pack warmup`
bakes its cache into a derived image. Each round starts, interleaved:
  cold    the plain image, read-only root, nothing cached: the provider compiles at start
  baked   the warmed image, read-only root: the cache in the image
  volume  the plain image with a named volume at GPUX_CACHE_DIR that an earlier container filled
and measures the seconds from `docker start` to the first 200 of /predict, and the session
load seconds /info reports (where a provider compiles or imports), with the cache /info names. Medians of --rounds. `--model deep` uses a
generated 600-node MLP (300 MatMul + Relu, 64 wide) so that compiling costs something.
Prints a Markdown table and writes bench/results-warmup.json. Run it on a quiet machine.
OpenVINO's plugin offers no device on non-Intel CPUs: there the images run under
qemu-x86_64 -cpu Haswell-noTSX (tests.conftest.on_intel_cpu, test-only), and the table says so;
emulation slows everything, so compare the ratios, not the seconds, with a native Intel run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker
import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpux_pack.runtime.contract import cpu_vendor  # noqa: E402
from tests.conftest import INTEL_CPU_MODEL, intel_cpu, on_intel_cpu  # noqa: E402


def cli(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "gpux_pack", *args, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"gpux-pack {args[0]} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def deep_project(folder: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, prev = [], [], "x"
    for i in range(300):
        weights.append(numpy_helper.from_array((rng.random((64, 64)) * 0.01).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", 64])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True)
    onnx.save(model, folder / "model.onnx")
    (folder / "gpux.yml").write_text("name: deep-mlp\nversion: 1.0.0\nmodel: {source: ./model.onnx}\n")
    return folder


def start(client, image: str, volume: str | None) -> dict:
    volumes = {volume: {"bind": "/opt/gpux/cache", "mode": "rw"}} if volume else {}
    container = client.containers.create(image, read_only=True, tmpfs={"/tmp": "rw"}, volumes=volumes,
                                         ports={"8080/tcp": ("127.0.0.1", None)}, labels={"io.gpux.pack.role": "bench"})
    try:
        started = time.perf_counter()
        container.start()
        container.reload()
        port = container.attrs["NetworkSettings"]["Ports"]["8080/tcp"][0]["HostPort"]
        url = f"http://127.0.0.1:{port}"
        info = client.api.inspect_image(image)["Config"]["Labels"]
        body = _body(url, info)
        while True:
            try:
                r = requests.post(url + "/predict", json=body, timeout=30)
                if r.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.perf_counter() - started > 120:
                sys.exit(f"{image} never answered:\n{container.logs().decode(errors='replace')[-2000:]}")
            time.sleep(0.02)
        first = time.perf_counter() - started
        info = requests.get(url + "/info", timeout=30).json()
        return {"first_response_s": first, "load_s": info["load_seconds"], "cache": info["warmup"].get("cache")}
    finally:
        container.remove(force=True)


_BODIES: dict[str, dict] = {}


def _body(url: str, labels: dict) -> dict:
    name = labels.get("io.gpux.model.name", "")
    if name not in _BODIES:
        for _ in range(600):
            try:
                inputs = requests.get(url + "/info", timeout=5).json()["inputs"]
                break
            except (requests.ConnectionError, ValueError, KeyError):
                time.sleep(0.02)
        _BODIES[name] = {t["name"]: np.ones([d if isinstance(d, int) else 1 for d in t["shape"]]).tolist()
                         for t in inputs}
    return _BODIES[name]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-image", default="gpux-pack/debian-python:bookworm")
    ap.add_argument("--model", choices=("mlp", "deep"), default="mlp")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    client = docker.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        project = ROOT / "examples" / "mlp" if args.model == "mlp" else deep_project(Path(tmp) / "deep")
        tag = f"gpux-bench/warmup-{args.model}:openvino"
        cli("build", str(project), "--provider", "openvino", "--base-image", args.base_image, "--tag", tag,
            "--warmup", "never")
        built = tag
        tag = on_intel_cpu(client, tag, tag + "-intel")
        baked = cli("warmup", tag, "--tag", tag + "-warm")["tag"]
        volume = client.volumes.create(labels={"io.gpux.pack.role": "bench"}).name
        try:
            start(client, tag, volume)  # fills the volume
            runs: dict[str, list[dict]] = {"cold": [], "baked": [], "volume": []}
            for _ in range(args.rounds):
                runs["cold"].append(start(client, tag, None))
                runs["baked"].append(start(client, baked, None))
                runs["volume"].append(start(client, tag, volume))
        finally:
            client.volumes.get(volume).remove(force=True)
            for t in dict.fromkeys((baked, tag, built)):
                client.images.remove(t, force=True)
    rows = []
    for case, samples in runs.items():
        rows.append({"case": case, "model": args.model, "rounds": args.rounds,
                     "first_response_s": round(statistics.median(s["first_response_s"] for s in samples), 3),
                     "load_s": round(statistics.median(s["load_s"] for s in samples), 4),
                     "cache": sorted({s["cache"] for s in samples})})
    cold = rows[0]["first_response_s"]
    vendor, model = cpu_vendor()
    where = "native" if intel_cpu() else f"emulated: qemu-x86_64 -cpu {INTEL_CPU_MODEL} on this {vendor} CPU"
    print(f"CPU: {model} ({where}); {args.model} model, median of {args.rounds}")
    cold_load = rows[0]["load_s"]
    print("| case | start to first response | vs cold | session load (compile or import) | vs cold | /info cache |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['first_response_s']:.3f} s | {r['first_response_s'] / cold:.2f}x | "
              f"{r['load_s']:.4f} s | {r['load_s'] / cold_load:.2f}x | {', '.join(map(str, r['cache']))} |")
    out = ROOT / "bench" / "results-warmup.json"
    out.write_text(json.dumps({"cpu": model, "run": where, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
