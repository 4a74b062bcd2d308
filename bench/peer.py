"""GPUX 0.1.1 against gpux-pack on GPUX's own ground (issue 41): the same model, the same body,
the same base image, in one run, the two sides interleaved.

    python bench/peer.py [--base-image IMG] [--rounds 3] [--requests 400] [--json bench/results-peer.json]
        [--skip-serve] [--skip-builds]

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

The best round of each side is kept (the machine is shared). Build rows (skipped with
--skip-builds; --skip-serve skips the rows above), each the median of --rounds interleaved
rounds, ours / GPUX's with the docker CLI's default builder here (classic: the preinstalled
client has no buildx) and with BuildKit (Debian's CLI, DOCKER_BUILDKIT=1):

  rebuild, new weights + metadata
                             every weight moved, a new doc_string, producer_version and
                             metadata_props (a retraining run's model), written with gpux.yml
                             into both projects anew; `gpux-pack build` against `docker build`
                             of GPUX's Dockerfile, its `pip install` layer cached
  rebuild, weights only      the same with the metadata kept (gpux-pack's replay answers it)
  rebuild, new graph         an Identity node more (its output named anew each round)
  rebuild, gpux.yml edit     gpux.yml's description changed, the model kept
  cold build                 nothing of either image in the engine but the base: gpux-pack with a
                             cache holding only wheels and locks and no runtime base image,
                             against GPUX's Dockerfile built with --no-cache, `pip install`
                             running in the build as its docs have it, from a wheelhouse in the
                             context (nothing can be pulled here; pip and its cache on the host
                             would be faster than what GPUX's users run)

GPUX's image is two Dockerfiles: its `pip install` layer as one image, and the project's
(`FROM` it: model, gpux.yml, WORKDIR, USER, EXPOSE, CMD), so the project's context is the
project folder, as for a GPUX user whose `pip install` comes from PyPI (a context holding the
wheelhouse would be sent again on every classic build: 2 to 4 s that no GPUX user pays).
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
description: a small CNN
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
GPUX_DEPS_DOCKERFILE = """\
FROM {base}
COPY wheels /tmp/wheels
RUN python3 "$(ls /tmp/wheels/pip-*.whl)/pip" install -q --no-index --no-cache-dir --disable-pip-version-check \\
    --find-links /tmp/wheels --target /opt/gpux-peer/site "gpux[serve]==0.1.1"
ENV PYTHONPATH=/opt/gpux-peer/site
"""
GPUX_DOCKERFILE = """\
FROM {deps}
COPY model.onnx gpux.yml /app/
WORKDIR /app
USER 10001
EXPOSE 8080
CMD ["python3", "-c", "import sys; from gpux.cli.main import app; sys.argv[1:] = ['serve', 'tinycnn', '--port', '8080']; app()"]
"""
DEPS_TAG = "gpux-peer-bench/gpux-deps:1"


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


def wheelhouse(folder: Path) -> None:
    """gpux[serve]==0.1.1's wheels for the base's platform, and pip's own: what `pip install gpux`
    would fetch from PyPI inside GPUX's build."""
    platforms = [arg for glibc in ("2_36", "2_34", "2_28", "2_27", "2_17", "2_5") for arg in
                 ("--platform", f"manylinux_{glibc}_x86_64")]  # pip does not widen one to the older ones
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary",
                    ":all:", *platforms, "--python-version", "3.11", "-d", str(folder), "gpux[serve]==0.1.1", "pip"],
                   check=True)


def gpux_contexts(base: str, project: Path, work: Path) -> tuple[Path, Path]:
    """GPUX's two contexts: its `pip install` (the wheelhouse) and its project (model, gpux.yml)."""
    deps, app = work / "gpux-deps", work / "gpux-project"
    deps.mkdir(parents=True)
    app.mkdir(parents=True)
    wheelhouse(deps / "wheels")
    (deps / "Dockerfile").write_text(GPUX_DEPS_DOCKERFILE.format(base=base))
    (app / "Dockerfile").write_text(GPUX_DOCKERFILE.format(deps=DEPS_TAG))
    sync(project, app)
    return deps, app


def sync(project: Path, app: Path) -> None:
    """What a retraining run or an edit leaves in GPUX's project: the same files, written anew."""
    for name in ("model.onnx", "gpux.yml"):
        (app / name).write_bytes((project / name).read_bytes())


def docker_build(context: Path, tag: str, buildkit: bool, no_cache: bool = False) -> float:
    """`docker build` through the docker CLI: the classic builder (the preinstalled client has no
    buildx, so its default), or BuildKit through Debian's CLI."""
    cli = "/usr/bin/docker" if buildkit else "docker"
    command = [cli, "build", "-q", "-t", tag, *(["--no-cache"] if no_cache else []), str(context)]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": str(int(buildkit))})
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"docker build failed:\n{proc.stderr[-2000:]}")
    return seconds


def gpux_image(deps: Path, app: Path, tag: str, buildkit: bool = False, no_cache: bool = False) -> float:
    """GPUX's documented image: its `pip install` layer, then the project on it; the seconds."""
    return docker_build(deps, DEPS_TAG, buildkit, no_cache) + docker_build(app, tag, buildkit, no_cache)


def our_image(base: str, project: Path, tag: str, env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpux_pack", "build", str(project), "--base-image", base, "--tag", tag,
                    "-p", "cpu", "-q"], check=True, cwd=ROOT, env={**os.environ, **(env or {})},
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


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


def retrain(path: Path, step: int, metadata: bool = True, graph: bool = False) -> None:
    """The model as a retraining run leaves it: every weight moved; with metadata, a new
    doc_string, producer_version and metadata_props; with graph, an Identity node in front of
    the dense layer, its output named anew (another graph every time)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(1e-6 * step), init.name))
    if metadata:
        model.doc_string, model.producer_name, model.producer_version = f"run {step}", "trainer", f"1.{step}"
        del model.metadata_props[:]
        entry = model.metadata_props.add()
        entry.key, entry.value = "run", str(step)
    if graph:
        nodes = model.graph.node
        for node in [n for n in nodes if n.op_type == "Identity"]:
            for other in nodes:
                other.input[:] = [node.input[0] if name == node.output[0] else name for name in other.input]
            nodes.remove(node)
        dense = next(n for n in nodes if n.op_type == "Gemm")
        named = f"{dense.input[0]}_{step}"
        nodes.insert(list(nodes).index(dense), helper.make_node("Identity", [dense.input[0]], [named]))
        dense.input[0] = named
    onnx.save(model, str(path))


def edit_yml(path: Path, step: int) -> None:
    text = path.read_text()
    path.write_text(text[:text.index("description:")] + f"description: a small CNN, edit {step}\n"
                    + text[text.index("\n", text.index("description:")) + 1:])


REBUILDS = {  # row -> how the project changes before each build
    "rebuild, new weights + metadata": lambda project, step: retrain(project / "model.onnx", step),
    "rebuild, weights only": lambda project, step: retrain(project / "model.onnx", step, metadata=False),
    "rebuild, new graph": lambda project, step: retrain(project / "model.onnx", step, graph=True),
    "rebuild, gpux.yml edit": lambda project, step: edit_yml(project / "gpux.yml", step),
}
SIDES = ("ours", "gpux classic", "gpux BuildKit")


def build_rows(client, base: str, project: Path, work: Path, rounds: int, tags: dict[str, str]) -> dict:
    """Every build row: {row: {side: [seconds per round]}}, the sides interleaved."""
    deps, app = gpux_contexts(base, project, work)
    rows: dict[str, dict[str, list[float]]] = {}
    step = int.from_bytes(os.urandom(2), "little")  # this run's models: none the builders cached in an earlier run

    def one(side: str, change) -> float:
        nonlocal step
        step += 1
        change(project, step)
        sync(project, app)
        if side == "ours":
            return our_image(base, project, tags["ours"])
        return docker_build(app, tags["gpux"], buildkit=side == "gpux BuildKit")

    gpux_image(deps, app, tags["gpux"])  # the cached `pip install` layer, and the first build of each
    our_image(base, project, tags["ours"])
    for row, change in REBUILDS.items():
        rows[row] = {side: [] for side in SIDES}
        one("ours", change)  # the first build after another kind of change
        for i in range(rounds):
            for side in (SIDES if i % 2 == 0 else tuple(reversed(SIDES))):
                rows[row][side].append(one(side, change))
    rows["cold build"] = {side: [] for side in SIDES}
    runtime = json.loads(subprocess.run([sys.executable, "-m", "gpux_pack", "build", str(project), "--base-image", base,
                                         "--tag", tags["ours"], "-p", "cpu", "-q", "--json"], check=True, cwd=ROOT,
                                        capture_output=True, text=True).stdout)["images"][0]["runtime_base"]
    cache = Path(os.environ.get("GPUX_PACK_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpux-pack")
    ours_only = set(client.images.get(runtime).attrs["RootFS"]["Layers"]) - set(
        client.images.get(base).attrs["RootFS"]["Layers"])
    for i in range(rounds):
        for side in (SIDES if i % 2 == 0 else tuple(reversed(SIDES))):
            if side == "ours":
                _remove(client, tags["ours"], runtime)
                holding = [image for image in client.images.list(all=True)
                           if ours_only & set(image.attrs["RootFS"]["Layers"])]
                _remove(client, *(image.id for image in holding if not image.tags))  # the rebuilds' earlier images
                kept = [image.tags for image in holding if image.tags]
                if kept:  # the engine would skip what they share: the cold build would be less than cold
                    sys.exit(f"remove {kept} first: they hold layers of {runtime}")
                fresh = Path(tempfile.mkdtemp(prefix="gpux-peer-cache-"))
                try:
                    for name in ("wheels", "locks"):  # what a first build of this lock on a machine has
                        if (cache / name).is_dir():
                            shutil.copytree(cache / name, fresh / name, copy_function=os.link)
                    rows["cold build"][side].append(our_image(base, project, tags["ours"],
                                                              {"GPUX_PACK_CACHE_DIR": str(fresh)}))
                finally:
                    shutil.rmtree(fresh, ignore_errors=True)
            else:
                _remove(client, tags["gpux"], DEPS_TAG)
                rows["cold build"][side].append(gpux_image(deps, app, tags["gpux"], buildkit=side == "gpux BuildKit",
                                                           no_cache=True))
    return rows


def _remove(client, *refs: str) -> None:
    for ref in refs:
        try:
            client.images.remove(ref, force=True)
        except docker.errors.ImageNotFound:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default=os.environ.get("GPUX_TEST_BASE_IMAGE", "gpux-pack/debian-python:bookworm"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--skip-builds", action="store_true")
    args = parser.parse_args()
    client = docker.from_env()
    tags = {"gpux": "gpux-peer-bench/gpux:1", "ours": "gpux-peer-bench/ours:1"}
    out: dict = json.loads(args.json.read_text()) if args.json and args.json.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        project = work / "project"
        project.mkdir()
        tiny_cnn(project / "model.onnx")
        (project / "gpux.yml").write_text(GPUX_YML)
        try:
            if not args.skip_builds:
                builds = build_rows(client, args.base_image, project, work / "builds", args.rounds, tags)
                medians = {row: {side: statistics.median(v) for side, v in sides.items()} for row, sides in builds.items()}
                out["builds"] = {"rounds": builds, "medians": medians, "ratios": {
                    row: {"vs classic": m["ours"] / m["gpux classic"], "vs BuildKit": m["ours"] / m["gpux BuildKit"]}
                    for row, m in medians.items()}}
            if not args.skip_serve:
                deps, app = gpux_contexts(args.base_image, project, work / "serve")
                gpux_image(deps, app, tags["gpux"])
                our_image(args.base_image, project, tags["ours"])
                data = body()
                rounds: dict[str, list[dict[str, float]]] = {"gpux": [], "ours": []}
                for i in range(args.rounds):
                    for side in (("gpux", "ours") if i % 2 == 0 else ("ours", "gpux")):
                        rounds[side].append(one_round(client, tags[side], data, args.requests))
                best = {side: {"first_inference_s": min(r["first_inference_s"] for r in rs),
                               "p50_ms": min(r["p50_ms"] for r in rs), "c8_req_s": max(r["c8_req_s"] for r in rs),
                               "idle_rss_mb": min(r["idle_rss_mb"] for r in rs)} for side, rs in rounds.items()}
                out.update(body_bytes=len(data), best=best, rounds=rounds,
                           ratios={k: best["ours"][k] / best["gpux"][k] for k in best["gpux"]})
        finally:
            _remove(client, *tags.values(), DEPS_TAG)
            _remove(client, *(image.id for image in client.images.list(filters={"dangling": True})
                              if image.labels.get("io.gpux.model.name") == "tinycnn"
                              or image.attrs["Config"].get("WorkingDir") == "/app"))  # the rebuilds' earlier images
    if "builds" in out:
        print(f"builds: median of {args.rounds} interleaved rounds, seconds")
        print("| row | GPUX classic | GPUX BuildKit | gpux-pack | vs classic | vs BuildKit |\n|---|---:|---:|---:|---:|---:|")
        for row, m in out["builds"]["medians"].items():
            r = out["builds"]["ratios"][row]
            print(f"| {row} | {m['gpux classic']:.3f} | {m['gpux BuildKit']:.3f} | {m['ours']:.3f} "
                  f"| {r['vs classic']:.2f}x | {r['vs BuildKit']:.2f}x |")
    if "best" in out:
        print(f"\nserving: body {out['body_bytes']} bytes, {args.rounds} rounds, best of each side")
        print("| row | GPUX 0.1.1 | gpux-pack | ours / GPUX |\n|---|---:|---:|---:|")
        for key, label in (("first_inference_s", "start to first inference (s)"), ("p50_ms", "/predict p50, 1 client (ms)"),
                           ("c8_req_s", "/predict req/s, 8 clients"), ("idle_rss_mb", "idle memory (MB)")):
            print(f"| {label} | {out['best']['gpux'][key]:.3f} | {out['best']['ours'][key]:.3f} | {out['ratios'][key]:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
