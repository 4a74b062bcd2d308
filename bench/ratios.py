"""Build-time ratios and image sizes, measured in one run on one engine (issue 7's targets).

    python bench/ratios.py [--base-image IMG] [--providers cpu,openvino] [--rounds 5]

For each provider, on a copy of examples/mlp:
  cold build       `gpux-pack build --no-cache` with its runtime base image removed: no layer
                   of it in the engine. Twice: "first" with a cache holding only the wheels
                   and locks (base export, host install and link check included: the first
                   build of a lock on a machine), and "warm" with gpux-pack's whole cache
                   (the install and base export of an earlier build of that lock), against
  hand-written     an offline Dockerfile that pip-installs the same wheel files into a venv
                   (`docker build --no-cache` through the same SDK), the usual way to do it;
                   ratio = cold / hand-written (median of --rounds, interleaved)
  model rebuild    the whole CLI after the model's weights changed, against `gpux-pack --version`
                   (the CLI's own start-up); ratio = rebuild / version (medians, interleaved)
  size above base  the image's size minus its base image's
Prints a Markdown table and writes bench/results-ratios.json. Do not run it while something else
heavy runs: the ratios are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
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
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpux_pack import staging, wheels  # noqa: E402


def cli(*args: str, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gpux_pack", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    return time.perf_counter() - started, proc


def build(project: Path, provider: str, base: str, tag: str, *extra: str, env: dict | None = None) -> tuple[float, dict]:
    seconds, proc = cli("build", str(project), "--provider", provider, "--base-image", base, "--tag", tag, "--json",
                        *extra, env=env)
    if proc.returncode != 0:
        sys.exit(f"build failed:\n{proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout)["images"][0]


def bump_weights(model_path: Path) -> None:
    model = onnx.load(str(model_path))
    init = model.graph.initializer[-1]
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(0.5), init.name))
    onnx.save(model, str(model_path))


def fresh_cache(source: Path) -> Path:
    """A cache dir with the wheels and locks of `source` (hard links) and nothing derived."""
    out = Path(tempfile.mkdtemp(prefix="gpux-bench-cache-"))
    for name in ("wheels", "locks"):
        if (source / name).is_dir():
            shutil.copytree(source / name, out / name, copy_function=os.link)
    return out


def handwritten_context(wheel_paths: list[Path], model: Path, base: str) -> io.BytesIO:
    dockerfile = (
        f"FROM {base}\n"
        "COPY wheels/ /tmp/wheels/\n"
        "RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-index --no-deps --no-cache-dir "
        "/tmp/wheels/*.whl && rm -rf /tmp/wheels\n"
        "COPY model.onnx /opt/model/model.onnx\n"
        'ENTRYPOINT ["/opt/venv/bin/python"]\n'
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for path in wheel_paths:
            tar.add(str(path), arcname=f"wheels/{path.name}")
        tar.add(str(model), arcname="model.onnx")
    buf.seek(0)
    return buf


def handwritten(client, context: bytes, tag: str) -> float:
    started = time.perf_counter()
    for _ in client.api.build(fileobj=io.BytesIO(context), custom_context=True, tag=tag, nocache=True, rm=True,
                              forcerm=True, decode=True):
        pass
    seconds = time.perf_counter() - started
    client.images.get(tag)  # raises when the build failed
    return seconds


def remove(client, ref: str) -> None:
    try:
        client.images.remove(ref, force=True)
    except docker.errors.ImageNotFound:
        pass


def measure(client, provider: str, base: str, rounds: int, work: Path) -> dict:
    project = work / provider
    shutil.copytree(ROOT / "examples" / "mlp", project)
    tag = f"gpux-bench/ratios:{provider}"
    _, first = build(project, provider, base, tag)  # fills the wheel cache, makes the runtime base
    runtime = first["runtime_base"]
    cache = staging.cache_dir()
    # the exact wheel files of this image's lock
    site_wheels = _wheels_of(project, provider, base)
    context = handwritten_context(site_wheels, project / "model.onnx", base).getvalue()

    first, cold, hand, rebuild, version = [], [], [], [], []
    for _ in range(rounds):
        remove(client, runtime)
        tmp_cache = fresh_cache(cache)
        try:
            seconds, image = build(project, provider, base, tag, "--no-cache", env={"GPUX_PACK_CACHE_DIR": str(tmp_cache)})
        finally:
            shutil.rmtree(tmp_cache, ignore_errors=True)
        assert image["runtime_base_built"], "the cold build must build its runtime base"
        first.append(seconds)
        remove(client, runtime)
        seconds, image = build(project, provider, base, tag, "--no-cache")
        assert image["runtime_base_built"]
        cold.append(seconds)
        hand.append(handwritten(client, context, f"gpux-bench/handwritten:{provider}"))
        bump_weights(project / "model.onnx")
        seconds, image = build(project, provider, base, tag)
        assert not image["runtime_base_built"]
        rebuild.append(seconds)
        seconds, proc = cli("--version")
        assert proc.returncode == 0
        version.append(seconds)
    size = client.images.get(tag).attrs["Size"]
    base_size = client.images.get(base).attrs["Size"]
    hand_size = client.images.get(f"gpux-bench/handwritten:{provider}").attrs["Size"]
    remove(client, f"gpux-bench/handwritten:{provider}")
    remove(client, tag)
    med = statistics.median
    return {
        "provider": provider,
        "first_build_s": round(med(first), 2),
        "cold_build_s": round(med(cold), 2),
        "handwritten_build_s": round(med(hand), 2),
        "first_vs_handwritten": round(med(first) / med(hand), 2),
        "cold_vs_handwritten": round(med(cold) / med(hand), 2),
        "model_rebuild_s": round(med(rebuild), 3),
        "version_s": round(med(version), 3),
        "rebuild_vs_version": round(med(rebuild) / med(version), 2),
        "size_above_base_mb": round((size - base_size) / 1e6, 1),
        "handwritten_above_base_mb": round((hand_size - base_size) / 1e6, 1),
        "rounds": rounds,
    }


def _wheels_of(project: Path, provider: str, base: str) -> list[Path]:
    """The wheel files `gpux-pack render` would install, found through the CLI's own lock."""
    from gpux_pack import engine
    from gpux_pack.pipeline.build import load, plan_for, resolver
    from gpux_pack.plan import Options
    from gpux_pack.ui import Reporter

    ui = Reporter(quiet=True)
    plan = plan_for(load(project), provider, "bench", Options(base_image=base), engine.connect(), ui, pull=False,
                    resolve=resolver(ui))
    return [w.path for w in wheels.fetch(plan.lock).wheels]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default=os.environ.get("GPUX_TEST_BASE_IMAGE", "gpux-pack/debian-python:bookworm"))
    parser.add_argument("--providers", default="cpu,openvino")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    client = docker.from_env(timeout=600)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for provider in args.providers.split(","):
            rows.append(measure(client, provider, args.base_image, args.rounds, Path(work)))
            print(json.dumps(rows[-1]), flush=True)
    out = ROOT / "bench" / "results-ratios.json"
    out.write_text(json.dumps({"base_image": args.base_image, "results": rows}, indent=2) + "\n")
    print("\n| provider | first build | cold build | hand-written | ratios | model rebuild | --version | ratio | above base |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['provider']} | {r['first_build_s']} s | {r['cold_build_s']} s | {r['handwritten_build_s']} s "
              f"| {r['first_vs_handwritten']}x, {r['cold_vs_handwritten']}x "
              f"| {r['model_rebuild_s']} s | {r['version_s']} s | {r['rebuild_vs_version']}x "
              f"| {r['size_above_base_mb']} MB (hand-written {r['handwritten_above_base_mb']} MB) |")


if __name__ == "__main__":
    main()
