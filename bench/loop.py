"""The model developer's loop (issue 18): ratios measured in one run, interleaved, on one engine.

    python bench/loop.py [--rounds 5] [--base-image IMG] [--provider P] [--starts 10]
        [--skip-rebuild] [--skip-version] [--skip-start] [--skip-threads] [--no-heavy]

The machine is shared and noisy, so every row is a ratio of medians of --rounds rounds taken in
the same run, the two sides interleaved (their order alternates from round to round); the
absolute times are in the JSON only to read the ratios by. Rows:

  model rebuild vs changed docker build
                   On a copy of examples/mlp, built once first (so its runtime base image exists),
                   each round changes the model's weights (bump_weights) and times the whole CLI,
                   `gpux-pack build COPY --base-image BASE --tag T -q` (a subprocess, `python -m
                   gpux_pack`), against the docker CLI (a subprocess, DOCKER_BUILDKIT=0: the
                   client here has no buildx, so the classic builder) building a hand-written
                   Dockerfile `FROM <runtime base>` + `COPY model.onnx /opt/gpux/model/model.onnx`
                   + `COPY gpux.json /opt/gpux/gpux.json` (the gpux.json taken from our image)
                   after the same weight change, so its COPY layers rebuild (checked: no
                   "Using cache" step). Target <= 1.0x.
  model rebuild vs cached docker build
                   The same rebuild against the same docker build with nothing changed (every
                   step "Using cache", checked): the least a docker build of this model costs,
                   the anchor. Target <= 1.0x.
  model rebuild after a sync vs GPUX's Dockerfile, cached
                   As the peers' benchmark builds: each round writes gpux.yml (the same bytes)
                   and the changed model into the project anew (new mtimes, as a CI checkout or
                   a sync tool leaves them), then `gpux-pack build`; against a cached docker
                   build (classic and BuildKit) of GPUX's documented Dockerfile (GPUX_DOCKERFILE
                   below). Target <= 1.0x.
  --version vs python -c pass
                   `gpux-pack --version` (the CLI's start) against the interpreter's own start
                   (`python -c pass`, the same interpreter), both subprocesses.
  start to first inference
                   From the docker SDK's containers.run(detach=True) call to the first 200 from
                   POST /predict (polled every 5 ms on the port published on 127.0.0.1): our
                   image of examples/mlp against a minimal server of the same model on the same
                   runtime base image (onnxruntime, numpy and uvicorn are in it): a 30-line raw
                   ASGI app loading an InferenceSession at import, run by `uvicorn app:app`,
                   USER 10001, HEALTHCHECK NONE. Both run read-only with a tmpfs /tmp; each
                   container is removed after its round. Their answers must agree. Target <= 0.9x.
                   In the same rounds, what happens once the container runs, timed inside it
                   (a probe script mounted read-only starts the server and polls it over the
                   container's loopback every ms): ours, the minimal server, and `python3 -c
                   "import uvicorn, numpy, onnxruntime"` alone (to its exit). floor_vs_minimal
                   is the ratio ours would reach if its Python did only those three imports.
  thread choice    --starts fresh containers of the mlp image (and, unless --no-heavy, of a
                   model of 4 MatMul+Relu layers, [32, 384] x [384, 384]: over the runtime's
                   0.25 ms one-thread line, where the mlp is far under it), interleaved, each
                   reading /info's `threads` (bench/thread_choice.py's one_start, reused): the
                   intra-op counts and how many of the starts chose the most common one.
                   Target: all of them.

Prints a Markdown table and writes the rows it measured into bench/results-loop.json (the rows
it skipped keep their earlier values). Removes the images and containers it made (not the
runtime base image). A measurement, never a timed test.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import docker
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from ratios import bump_weights  # noqa: E402
from thread_choice import one_start  # noqa: E402

PREFIX = "gpux-bench/loop"
BODY = {"features": [[5.1, 3.5, 1.4, 0.2]]}

MINIMAL_APP = '''\
"""A minimal ONNX server: one InferenceSession, POST /predict {"features": [[...]]} -> outputs."""
import json

import numpy as np
import onnxruntime as ort

session = ort.InferenceSession("/opt/model.onnx", providers=["CPUExecutionProvider"])
INPUT = session.get_inputs()[0].name
OUTPUTS = [o.name for o in session.get_outputs()]


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["method"] != "POST" or scope["path"] != "/predict":
        status, answer = 404, {"error": "not found"}
    else:
        x = np.asarray(json.loads(body)["features"], dtype=np.float32)
        status, answer = 200, dict(zip(OUTPUTS, (y.tolist() for y in session.run(None, {INPUT: x}))))
    data = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
'''

MINIMAL_DOCKERFILE = """\
FROM {base}
COPY model.onnx /opt/model.onnx
COPY app.py /opt/app/app.py
WORKDIR /opt/app
USER 10001
HEALTHCHECK NONE
ENTRYPOINT ["python3", "-m", "uvicorn", "app:app", "--host", "0.0.0.0", "--port", "8080"]
"""

PHASE_PROBE = r"""
# Inside the container: seconds from starting argv to the first 200 from POST /predict on
# 127.0.0.1:8080 (polled every ms), or with --exit, to argv's exit.
import socket, subprocess, sys, time

body = b'BODY_JSON'
request = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
request += b"Content-Length: %d\r\n\r\n" % len(body) + body
wait_exit = sys.argv[1] == "--exit"
argv = sys.argv[2:] if wait_exit else sys.argv[1:]
started = time.perf_counter()
child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while not wait_exit:
    try:
        with socket.create_connection(("127.0.0.1", 8080), timeout=10) as s:
            s.sendall(request)
            answer = b"".join(iter(lambda: s.recv(65536), b""))
        if answer.startswith(b"HTTP/1.1 200"):
            break
    except OSError:
        pass
    if time.perf_counter() - started > 60:
        sys.exit("no answer in 60 s")
    time.sleep(0.001)
code = child.wait() if wait_exit else 0
print(f"{time.perf_counter() - started:.4f}")
child.terminate()
sys.exit(code)
""".replace("BODY_JSON", json.dumps(BODY))

HAND_DOCKERFILE = """\
FROM {base}
COPY model.onnx /opt/gpux/model/model.onnx
COPY gpux.json /opt/gpux/gpux.json
"""


# GPUX's documented Dockerfile (docs/deployment: FROM python:3.11-slim, pip install gpux, COPY the
# model and gpux.yml, EXPOSE, CMD), on our runtime base instead of python:3.11-slim (nothing is pulled
# here) and with `RUN true` for its pip install: cached, as the peers' benchmark times it.
GPUX_DOCKERFILE = """\
FROM {base}
RUN true
COPY model.onnx gpux.yml /app/
WORKDIR /app
EXPOSE 8080
CMD ["gpux", "serve", "model", "--port", "8080"]
"""


def timed(argv: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})})
    return time.perf_counter() - started, proc


def gpux(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    return timed([sys.executable, "-m", "gpux_pack", *args])


def build_json(project: Path, base: str, tag: str, provider: str | None) -> dict:
    extra = ["--provider", provider] if provider else []
    _, proc = gpux("build", str(project), "--base-image", base, "--tag", tag, "--json", *extra)
    if proc.returncode != 0:
        sys.exit(f"gpux-pack build failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)["images"][0]


def docker_build(context: Path, tag: str, buildkit: str = "0") -> tuple[float, int]:
    """`docker build` through the docker CLI, classic builder; or BuildKit through Debian's CLI (the
    preinstalled client has no buildx); (seconds, steps taken from cache, which the classic builder prints)."""
    cli = "/usr/bin/docker" if buildkit == "1" else "docker"
    seconds, proc = timed([cli, "build", "-t", tag, str(context)], env={"DOCKER_BUILDKIT": buildkit})
    if proc.returncode != 0:
        sys.exit(f"docker build failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return seconds, proc.stdout.count("Using cache")


def file_from_image(client, image: str, path: str) -> bytes:
    container = client.containers.create(image)
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            return tar.extractfile(tar.getmembers()[0]).read()
    finally:
        container.remove(force=True)


def heavy_project(folder: Path, layers: int = 4, width: int = 384, rows: int = 32) -> Path:
    """4 MatMul+Relu layers on a fixed [32, 384] input: about 19 M multiply-adds a run, well over the
    runtime's 0.25 ms one-thread line on a 2-CPU machine (the mlp is far under it)."""
    rng = np.random.default_rng(0)
    nodes, weights, prev = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "heavy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [rows, width])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    (folder / "gpux.yml").write_text("name: heavy-matmul\nversion: 1.0.0\nmodel: {source: ./model.onnx}\n")
    return folder


def first_inference(client, image: str) -> tuple[float, float, dict]:
    """Seconds from containers.run to the first 200 from POST /predict, seconds the run call took,
    and that first answer."""
    body = json.dumps(BODY).encode()
    started = time.perf_counter()
    container = client.containers.run(image, detach=True, ports={"8080/tcp": ("127.0.0.1", None)}, read_only=True,
                                      tmpfs={"/tmp": "rw"}, labels={"io.gpux.pack.role": "bench"})
    try:
        run_call = time.perf_counter() - started
        container.reload()
        port = int(container.ports["8080/tcp"][0]["HostPort"])
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read()
                conn.close()
                if response.status == 200:
                    return time.perf_counter() - started, run_call, json.loads(data)
            except (OSError, http.client.HTTPException):
                pass
            if time.perf_counter() - started > 120:
                sys.exit(f"{image} never answered:\n{container.logs().decode(errors='replace')[-2000:]}")
            time.sleep(0.005)
    finally:
        container.remove(force=True)


def med(values: list[float], digits: int = 3) -> float:
    return round(statistics.median(values), digits)


def rebuild_rows(client, args, work: Path, made: set[str]) -> dict:
    project = work / "rebuild"
    shutil.copytree(ROOT / "examples" / "mlp", project)
    tag, hand_tag = f"{PREFIX}:rebuild", f"{PREFIX}:handwritten"
    first = build_json(project, args.base_image, tag, args.provider)  # makes the runtime base when missing
    runtime = first["runtime_base"]
    made.add(client.images.get(tag).id)
    hand = work / "handwritten"
    hand.mkdir()
    (hand / "Dockerfile").write_text(HAND_DOCKERFILE.format(base=runtime))
    shutil.copy(project / "model.onnx", hand / "model.onnx")
    (hand / "gpux.json").write_bytes(file_from_image(client, tag, "/opt/gpux/gpux.json"))
    docker_build(hand, hand_tag)  # once, so that the "cached" side has its layers
    made.add(client.images.get(hand_tag).id)
    extra = ["--provider", args.provider] if args.provider else []

    def ours() -> float:
        bump_weights(project / "model.onnx")
        seconds, proc = gpux("build", str(project), "--base-image", args.base_image, "--tag", tag, "-q", *extra)
        if proc.returncode != 0:
            sys.exit(f"gpux-pack build failed:\n{proc.stderr[-2000:]}")
        made.add(client.images.get(tag).id)
        return seconds

    def changed() -> float:
        bump_weights(hand / "model.onnx")
        seconds, cached = docker_build(hand, hand_tag)
        assert cached == 0, f"the changed docker build took {cached} step(s) from cache"
        made.add(client.images.get(hand_tag).id)
        return seconds

    def cached() -> float:
        seconds, cached = docker_build(hand, hand_tag)
        assert cached == 2, f"the cached docker build took {cached} of 2 steps from cache"
        return seconds

    staged = work / "staged"  # what a CI checkout or a sync tool writes: every file anew, gpux.yml's bytes unchanged
    shutil.copytree(project, staged)
    gpux_style = work / "gpux-style"
    gpux_style.mkdir()
    (gpux_style / "Dockerfile").write_text(GPUX_DOCKERFILE.format(base=runtime))
    for name in ("model.onnx", "gpux.yml"):
        shutil.copy(project / name, gpux_style / name)
    for builder in ("0", "1"):
        docker_build(gpux_style, f"{PREFIX}:gpux-style", buildkit=builder)
    made.add(client.images.get(f"{PREFIX}:gpux-style").id)

    def synced() -> float:
        bump_weights(staged / "model.onnx")
        for name in ("model.onnx", "gpux.yml"):
            shutil.copy(staged / name, project / name)
        seconds, proc = gpux("build", str(project), "--base-image", args.base_image, "--tag", tag, "-q", *extra)
        if proc.returncode != 0:
            sys.exit(f"gpux-pack build failed:\n{proc.stderr[-2000:]}")
        made.add(client.images.get(tag).id)
        return seconds

    def gpux_cached(buildkit: str):
        def step() -> float:
            seconds, cached = docker_build(gpux_style, f"{PREFIX}:gpux-style", buildkit=buildkit)
            assert buildkit == "1" or cached == 5, f"the cached GPUX-style build took {cached} of 5 steps from cache"
            return seconds
        return step

    times: dict[str, list[float]] = {"ours": [], "changed": [], "cached": [], "synced": [], "gpux_classic": [],
                                     "gpux_buildkit": []}
    steps = {"ours": ours, "changed": changed, "cached": cached, "synced": synced,
             "gpux_classic": gpux_cached("0"), "gpux_buildkit": gpux_cached("1")}
    for i in range(args.rounds):
        order = list(steps) if i % 2 == 0 else list(reversed(steps))
        for name in order:
            times[name].append(steps[name]())
        print(f"rebuild round {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()), flush=True)
    return {
        "runtime_base": runtime,
        "provider": first.get("provider"),
        "docker_build": "docker CLI, DOCKER_BUILDKIT=0 (classic builder)",
        "model_rebuild_s": med(times["ours"]),
        "changed_docker_build_s": med(times["changed"]),
        "cached_docker_build_s": med(times["cached"]),
        "rebuild_vs_changed": round(statistics.median(times["ours"]) / statistics.median(times["changed"]), 2),
        "rebuild_vs_cached": round(statistics.median(times["ours"]) / statistics.median(times["cached"]), 2),
        "synced_rebuild_s": med(times["synced"]),
        "gpux_style_cached_classic_s": med(times["gpux_classic"]),
        "gpux_style_cached_buildkit_s": med(times["gpux_buildkit"]),
        "synced_vs_gpux_style_classic": round(statistics.median(times["synced"])
                                              / statistics.median(times["gpux_classic"]), 2),
        "synced_vs_gpux_style_buildkit": round(statistics.median(times["synced"])
                                               / statistics.median(times["gpux_buildkit"]), 2),
        "samples_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }


def version_rows(args) -> dict:
    times: dict[str, list[float]] = {"version": [], "python": []}
    for i in range(args.rounds):
        for name in (("version", "python") if i % 2 == 0 else ("python", "version")):
            argv = [sys.executable, "-m", "gpux_pack", "--version"] if name == "version" else [sys.executable, "-c", "pass"]
            seconds, proc = timed(argv)
            assert proc.returncode == 0, proc.stderr
            times[name].append(seconds)
    return {
        "version_s": med(times["version"]),
        "python_s": med(times["python"]),
        "version_vs_python": round(statistics.median(times["version"]) / statistics.median(times["python"]), 2),
        "samples_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }


def start_rows(client, args, work: Path, made: set[str]) -> tuple[dict, str]:
    project = work / "mlp"
    shutil.copytree(ROOT / "examples" / "mlp", project)
    tag, minimal_tag = f"{PREFIX}:mlp", f"{PREFIX}:minimal"
    image = build_json(project, args.base_image, tag, args.provider)
    made.add(client.images.get(tag).id)
    context = work / "minimal"
    context.mkdir()
    (context / "Dockerfile").write_text(MINIMAL_DOCKERFILE.format(base=image["runtime_base"]))
    (context / "app.py").write_text(MINIMAL_APP)
    shutil.copy(project / "model.onnx", context / "model.onnx")
    docker_build(context, minimal_tag)
    made.add(client.images.get(minimal_tag).id)
    times: dict[str, list[float]] = {"ours": [], "minimal": []}
    run_call: dict[str, list[float]] = {"ours": [], "minimal": []}
    answers: dict[str, dict] = {}
    images = {"ours": tag, "minimal": minimal_tag}
    probe = work / "probe"
    probe.mkdir(mode=0o755)
    probe.chmod(0o755)  # uid 10001 reads it in the container
    (probe / "probe.py").write_text(PHASE_PROBE)
    python = client.images.get(tag).attrs["Config"]["Entrypoint"][0]
    phases: dict[str, list[float]] = {name: [] for name in PHASES}
    for i in range(args.rounds):
        for name in (("ours", "minimal") if i % 2 == 0 else ("minimal", "ours")):
            seconds, call, answers[name] = first_inference(client, images[name])
            times[name].append(seconds)
            run_call[name].append(call)
        for name in (list(PHASES) if i % 2 == 0 else list(reversed(PHASES))):
            phases[name].append(in_container(client, images[PHASES[name][0]], python, probe, *PHASES[name][1:]))
        print(f"start round {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items())
              + "; in the container: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in phases.items()), flush=True)
    for key in answers["minimal"]:
        np.testing.assert_allclose(answers["ours"][key], answers["minimal"][key], rtol=1e-3, atol=1e-3)
    ours, minimal = statistics.median(times["ours"]), statistics.median(times["minimal"])
    inside = {k: statistics.median(v) for k, v in phases.items()}
    return {
        "ours_s": med(times["ours"]),
        "minimal_s": med(times["minimal"]),
        "ours_vs_minimal": round(ours / minimal, 2),
        "run_call_s": {k: med(v) for k, v in run_call.items()},
        "flags": "read_only, tmpfs /tmp, -p 127.0.0.1::8080",
        "samples_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "in_container_s": {k: round(v, 4) for k, v in inside.items()},
        "in_container_ours_vs_minimal": round(inside["ours"] / inside["minimal"], 2),
        # ours if its Python did nothing but import the three libraries: the least it can reach
        "floor_vs_minimal": round((ours - inside["ours"] + inside["imports"]) / minimal, 2),
        "in_container_samples_s": {k: [round(x, 4) for x in v] for k, v in phases.items()},
    }, tag


# What the start costs once the container runs, measured by PHASE_PROBE in the container:
# name -> (image, probe arguments). "imports" is the three libraries every such server loads,
# in the minimal server's order, with the runtime's environment, timed to the end of the imports
# (os._exit: the interpreter's teardown is no part of a start): a floor for any server of them.
PHASES = {
    "ours": ("ours", "-m", "gpux_runtime", "serve"),
    "minimal": ("minimal", "-m", "uvicorn", "app:app", "--host", "0.0.0.0", "--port", "8080"),
    "imports": ("ours", "--exit", "-c", "import uvicorn, numpy, onnxruntime, os; os._exit(0)"),  # no teardown
}


def in_container(client, image: str, python: str, probe: Path, *argv: str) -> float:
    """PHASE_PROBE's seconds for argv run by the image's python, in the image's container
    (read-only, tmpfs /tmp, nothing published)."""
    wait_exit = argv[0] == "--exit"
    command = ["/gpux-bench/probe.py", *(["--exit"] if wait_exit else []), python, *argv[wait_exit:]]
    out = client.containers.run(image, command, entrypoint=[python], remove=True, read_only=True,
                                tmpfs={"/tmp": "rw"}, volumes={str(probe): {"bind": "/gpux-bench", "mode": "ro"}},
                                environment={"OPENBLAS_NUM_THREADS": "1", "ORT_DISABLE_TELEMETRY": "1"} if wait_exit else {},
                                labels={"io.gpux.pack.role": "bench"})
    return float(out.decode().split()[-1])


def thread_rows(client, args, work: Path, made: set[str], mlp_tag: str | None) -> list[dict]:
    images = {}
    if mlp_tag is None:
        project = work / "threads-mlp"
        shutil.copytree(ROOT / "examples" / "mlp", project)
        mlp_tag = f"{PREFIX}:mlp"
        build_json(project, args.base_image, mlp_tag, args.provider)
        made.add(client.images.get(mlp_tag).id)
    images["mlp"] = mlp_tag
    if not args.no_heavy:
        heavy_tag = f"{PREFIX}:heavy"
        build_json(heavy_project(work / "heavy"), args.base_image, heavy_tag, args.provider)
        made.add(client.images.get(heavy_tag).id)
        images["heavy (4 MatMul [32,384]x[384,384])"] = heavy_tag
    seen: dict[str, list[dict]] = {name: [] for name in images}
    for _ in range(args.starts):  # interleaved: one start of each image per round
        for name, tag in images.items():
            seen[name].append(one_start(client, tag, 8080, None))
    rows = []
    for name, threads in seen.items():
        counts = collections.Counter(t["intra_op"] for t in threads)
        most, how_many = counts.most_common(1)[0]
        rows.append({
            "model": name,
            "starts": args.starts,
            "cpus": len(os.sched_getaffinity(0)),
            "intra_op": [t["intra_op"] for t in threads],
            "intra_op_counts": {str(k): v for k, v in sorted(counts.items())},
            "most_common": most,
            "equal": how_many,
            "run_ms": [t.get("run_ms") for t in threads],
            "why": threads[0].get("why"),
        })
    return rows


def cleanup(client, made: set[str]) -> None:
    """Untag our tags, then remove the images we made that no tag names any more (an assembled
    image can be byte-identical to one somebody else tagged: never force-remove by id)."""
    for name in ("rebuild", "handwritten", "gpux-style", "mlp", "minimal", "heavy"):
        try:
            client.images.remove(f"{PREFIX}:{name}")
        except docker.errors.APIError:
            pass
    for image_id in made:
        try:
            if not client.images.get(image_id).tags:
                client.images.remove(image_id)
        except docker.errors.APIError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base-image", default=os.environ.get("GPUX_TEST_BASE_IMAGE", "gpux-pack/debian-python:bookworm"))
    parser.add_argument("--provider", default=None, help="passed to every gpux-pack build (default: none, i.e. auto)")
    parser.add_argument("--starts", type=int, default=10, help="container starts per image for the thread choice")
    parser.add_argument("--skip-rebuild", action="store_true")
    parser.add_argument("--skip-version", action="store_true")
    parser.add_argument("--skip-start", action="store_true")
    parser.add_argument("--skip-threads", action="store_true")
    parser.add_argument("--no-heavy", action="store_true", help="thread choice on the mlp image only")
    args = parser.parse_args()
    client = docker.from_env(timeout=600)
    made: set[str] = set()
    result: dict = {"base_image": args.base_image, "cpus": len(os.sched_getaffinity(0))}
    try:
        with tempfile.TemporaryDirectory(prefix="gpux-loop-") as tmp:
            work = Path(tmp)
            mlp_tag = None
            if not args.skip_rebuild:
                result["rebuild"] = rebuild_rows(client, args, work, made)
            if not args.skip_version:
                result["version"] = version_rows(args)
            if not args.skip_start:
                result["start"], mlp_tag = start_rows(client, args, work, made)
            if not args.skip_threads:
                result["threads"] = thread_rows(client, args, work, made, mlp_tag)
    finally:
        cleanup(client, made)
    for row in ("rebuild", "version", "start"):
        if row in result:
            result[row]["rounds"] = args.rounds
    results = ROOT / "bench" / "results-loop.json"
    earlier = json.loads(results.read_text()) if results.exists() else {}
    results.write_text(json.dumps({**earlier, **result}, indent=2) + "\n")

    print(f"\n{args.rounds} rounds, interleaved; medians; {result['cpus']} CPUs\n")
    print("| step | ours | against | ratio | target |")
    print("|---|---|---|---|---|")
    if "rebuild" in result:
        r = result["rebuild"]
        print(f"| model rebuild (`build -q`) | {r['model_rebuild_s']} s | changed `docker build`: "
              f"{r['changed_docker_build_s']} s | {r['rebuild_vs_changed']}x | <= 1.0x |")
        print(f"| model rebuild (`build -q`) | {r['model_rebuild_s']} s | cached `docker build`: "
              f"{r['cached_docker_build_s']} s | {r['rebuild_vs_cached']}x | <= 1.0x |")
        for kind, key in (("classic", "classic"), ("BuildKit", "buildkit")):
            print(f"| model rebuild after a sync (files rewritten) | {r['synced_rebuild_s']} s | GPUX's Dockerfile, "
                  f"cached ({kind}): {r[f'gpux_style_cached_{key}_s']} s | {r[f'synced_vs_gpux_style_{key}']}x | "
                  "<= 1.0x |")
    if "version" in result:
        r = result["version"]
        print(f"| `gpux-pack --version` | {r['version_s']} s | `python -c pass`: {r['python_s']} s "
              f"| {r['version_vs_python']}x | |")
    if "start" in result:
        r = result["start"]
        print(f"| start to first inference | {r['ours_s']} s | minimal uvicorn+onnxruntime: {r['minimal_s']} s "
              f"| {r['ours_vs_minimal']}x | <= 0.9x |")
        c = r["in_container_s"]
        print(f"| ... of it in the container | {c['ours']} s | minimal: {c['minimal']} s; the three imports alone: "
              f"{c['imports']} s | {r['in_container_ours_vs_minimal']}x (floor {r['floor_vs_minimal']}x) | |")
    for r in result.get("threads", []):
        print(f"| thread choice, {r['model']} | intra-op {r['intra_op_counts']} | {r['starts']} starts "
              f"| {r['equal']} of {r['starts']} equal | {r['starts']} of {r['starts']} |")


if __name__ == "__main__":
    main()
