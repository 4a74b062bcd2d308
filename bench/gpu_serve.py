"""`gpux-pack serve` and `gpux-pack predict` on a GPU, without Docker (issue 18, part 7).

    python bench/gpu_serve.py [--examples mlp,text-classifier] [--provider cuda] [--requests 200]

For each example: `gpux-pack serve EXAMPLE --provider cuda --port P` as a user runs it, then
  ready      seconds from the command's start to /v2/health/ready answering 200
  active     /info's execution_providers.active (must start with the provider's EP: the runtime
             runs with GPUX_REQUIRE_PROVIDER=1 here, so a provider that does not start stops it)
  answers    /predict and KServe v2 JSON infer on warmup-like inputs against onnxruntime's CPU
             provider in this process (worst absolute error per output)
  latency    p50/p99 of --requests sequential v2 JSON requests from this host (HTTP included)
  reload     the model file touched: serve restarts it, /v2/health/ready answers again
  stop       SIGINT: exit code and seconds to exit
then `gpux-pack predict EXAMPLE --provider cuda --input NAME=FILE.npy ...` against the same CPU answer.
Prints one JSON document. Exit 0 when every check passed, 1 otherwise, 2 when nothing could run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EPS = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider", "cpu": "CPUExecutionProvider"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_ready(url: str, process: subprocess.Popen, timeout: float) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"serve exited with {process.returncode} before it was ready")
        try:
            if get(f"{url}/v2/health/ready")[0] == 200:
                return time.perf_counter() - started
        except OSError:
            pass
        time.sleep(0.05)  # polling a readiness endpoint with a deadline
    raise RuntimeError(f"not ready within {timeout} s")


def ready_now(url: str) -> bool:
    try:
        return get(f"{url}/v2/health/ready")[0] == 200
    except OSError:
        return False


def inputs_for(info: dict, batch: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for t in info["inputs"]:
        shape = [d if isinstance(d, int) and d >= 0 else batch for d in t["shape"]]
        if t["type"].startswith("float"):
            out[t["name"]] = rng.random(shape).astype(t["type"])
        else:
            out[t["name"]] = np.zeros(shape, dtype=t["type"])
    return out


def cpu_answer(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def worst(answer: dict, reference: dict) -> dict[str, float]:
    return {k: float(np.max(np.abs(np.asarray(answer[k], dtype=np.float64) - reference[k].astype(np.float64))))
            for k in reference}


def check(example: str, provider: str, requests: int, atol: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="gpu-serve-"))
    project = work / example
    subprocess.run(["cp", "-r", str(ROOT / "examples" / example), str(project)], check=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "GPUX_REQUIRE_PROVIDER": "1"}
    log_file = (work / "serve.log").open("w+")  # a file, not a pipe nobody reads while it serves
    process = subprocess.Popen([sys.executable, "-m", "gpux_pack", "serve", str(project), "--provider", provider,
                                "--port", str(port)], env=env, stderr=log_file)
    out: dict = {"example": example, "provider": provider}
    try:
        out["ready_seconds"] = round(wait_ready(url, process, 300), 3)
        _, info = get(f"{url}/info")
        out["active"] = info["execution_providers"]["active"]
        out["onnxruntime"] = info["onnxruntime"]
        out["threads"] = info.get("threads")
        out["warmup"] = {k: info["warmup"].get(k) for k in ("state", "partition", "accuracy", "seconds")}
        model = project / json.loads(json.dumps(info["model"]))["file"]
        feeds = inputs_for(info)
        reference = cpu_answer(model, feeds)
        _, predicted = get(f"{url}/predict", json.dumps({k: v.tolist() for k, v in feeds.items()}).encode())
        out["predict_error"] = worst(predicted, reference)
        body = json.dumps({"inputs": [{"name": k, "datatype": {"float32": "FP32", "int64": "INT64"}.get(str(v.dtype), "FP32"),
                                       "shape": list(v.shape), "data": v.ravel().tolist()} for k, v in feeds.items()]}).encode()
        status, v2 = get(f"{url}/v2/models/{info['name']}/infer", body)
        out["v2_status"] = status
        out["v2_error"] = worst({o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in v2["outputs"]},
                                reference)
        times = []
        for _ in range(requests):
            t = time.perf_counter()
            get(f"{url}/v2/models/{info['name']}/infer", body)
            times.append(1000 * (time.perf_counter() - t))
        times.sort()
        out["http_p50_ms"] = round(statistics.median(times), 3)
        out["http_p99_ms"] = round(times[min(len(times) - 1, int(len(times) * 0.99))], 3)
        os.utime(model)  # a touch is a change: serve re-validates and restarts
        model.write_bytes(model.read_bytes())
        deadline = time.perf_counter() + 120
        while time.perf_counter() < deadline and ready_now(url):  # the old server drains and goes
            time.sleep(0.05)
        out["reload_ready_seconds"] = round(wait_ready(url, process, 300), 3)
        out["active_after_reload"] = get(f"{url}/info")[1]["execution_providers"]["active"]
        given = []
        for name, value in feeds.items():  # one .npy per input
            np.save(work / f"{name}.npy", value)
            given += ["--input", f"{name}={work / (name + '.npy')}"]
        predict = subprocess.run([sys.executable, "-m", "gpux_pack", "predict", str(project), "--provider", provider,
                                  *given], capture_output=True, text=True, env=env)
        out["predict_cli_exit"] = predict.returncode
        if predict.returncode == 0:
            out["predict_cli_error"] = worst(json.loads(predict.stdout), reference)
        else:
            out["predict_cli_stderr"] = predict.stderr.strip()[-300:]
    except Exception as e:  # reported, not raised: the other examples still run
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        t = time.perf_counter()
        process.send_signal(signal.SIGINT)
        try:
            out["stop_exit"] = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            out["stop_exit"] = "killed after 30 s"
        out["stop_seconds"] = round(time.perf_counter() - t, 3)
        log_file.seek(0)
        log = log_file.read()
        out["log_tail"] = log.strip().splitlines()[-8:]
    ep = EPS.get(provider, "")
    errors = [v for k in ("predict_error", "v2_error", "predict_cli_error") for v in (out.get(k) or {}).values()]
    out["passed"] = bool(
        "error" not in out and out.get("active", [""])[0] == ep and out.get("active_after_reload", [""])[0] == ep
        and out.get("v2_status") == 200 and out.get("stop_exit") == 0 and out.get("predict_cli_exit") == 0
        and all(e <= atol for e in errors)
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", default="mlp,text-classifier")
    parser.add_argument("--provider", default="cuda")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--atol", type=float, default=1e-3)
    args = parser.parse_args()
    try:
        import onnxruntime as ort
    except ImportError:
        print("gpu_serve: onnxruntime is not installed", file=sys.stderr)
        return 2
    report = {"onnxruntime": ort.__version__, "available": ort.get_available_providers(),
              "results": [check(e, args.provider, args.requests, args.atol) for e in args.examples.split(",")]}
    print(json.dumps(report, indent=2))
    return 0 if all(r["passed"] for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
