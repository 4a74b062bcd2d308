"""Image size and build time for each provider that builds on this host.

    python bench/provider_sizes.py [--base-image IMG] [--with-cuda-wheels]

Builds examples/mlp with --no-cache for: cpu, openvino, cuda without NVIDIA's libraries
(nvidia_libs: base, link check off: what the onnxruntime-gpu wheel alone weighs), the runtime
base images of cpu and openvino, and a model image on a runtime base; with
--with-cuda-wheels also cuda with NVIDIA's wheels (about 1.7 GB to download). Wheels come
from the user's cache (a first run downloads them). Writes bench/results-providers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> tuple[float, dict]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gpux_pack", *args, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"gpux-pack {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return round(time.perf_counter() - started, 1), json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default=os.environ.get("GPUX_BASE_IMAGE", "gpux-pack/debian-python:bookworm"))
    parser.add_argument("--with-cuda-wheels", action="store_true")
    args = parser.parse_args()
    client = docker.from_env()
    work = Path(tempfile.mkdtemp(prefix="gpux-sizes-"))
    variants = {
        "cpu": ("cpu", ""),
        "openvino": ("openvino", ""),
        "cuda (no NVIDIA libraries)": ("cuda", "  nvidia_libs: base\n  link_check: false\n"),
    }
    if args.with_cuda_wheels:
        variants["cuda (NVIDIA wheels)"] = ("cuda", "")
    rows, made = [], []
    try:
        for label, (provider, pack) in variants.items():
            project = work / f"v{len(rows)}" / "mlp"
            shutil.copytree(ROOT / "examples" / "mlp", project)
            if pack:
                (project / "gpux.yml").write_text((project / "gpux.yml").read_text() + "pack:\n" + pack)
            tag = f"gpux-bench/sizes:{provider}-{len(rows)}"
            seconds, out = cli("build", str(project), "-p", provider, "--base-image", args.base_image,
                               "--tag", tag, "--no-cache", "--quiet")
            made.append(tag)
            image = out["images"][0]
            rows.append({"image": label, "size_mb": round(image["size_bytes"] / 1e6), "build_s": seconds,
                         "onnxruntime": image["onnxruntime"]})
        for provider in ("cpu", "openvino"):
            seconds, out = cli("base", "build", "-p", provider, "--base-image", args.base_image, "--no-cache", "--quiet")
            made.append(out["tag"])
            rows.append({"image": f"runtime base {provider}", "size_mb": round(out["size_bytes"] / 1e6),
                         "build_s": seconds, "onnxruntime": out["tag"].split(":")[1].split("-")[0]})
        seconds, out = cli("build", str(ROOT / "examples" / "mlp"), "-p", "openvino", "--base-image", args.base_image,
                           "--tag", "gpux-bench/sizes:on-runtime", "--quiet")
        made.append("gpux-bench/sizes:on-runtime")
        image = out["images"][0]
        assert image["runtime_base"], "the runtime base was not used"
        rows.append({"image": "openvino model on its runtime base", "size_mb": round(image["size_bytes"] / 1e6),
                     "build_s": seconds, "onnxruntime": image["onnxruntime"]})
    finally:
        for tag in made:
            try:
                client.images.remove(tag, force=True)
            except docker.errors.APIError:
                pass
        shutil.rmtree(work, ignore_errors=True)
    base_mb = round(client.images.get(args.base_image).attrs["Size"] / 1e6)
    out_path = ROOT / "bench" / "results-providers.json"
    out_path.write_text(json.dumps({"base_image": args.base_image, "base_image_mb": base_mb, "images": rows}, indent=2) + "\n")
    print(f"| image (examples/mlp, base {args.base_image}: {base_mb} MB) | size MB | build s | onnxruntime |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['image']} | {r['size_mb']} | {r['build_s']} | {r['onnxruntime']} |")


if __name__ == "__main__":
    main()
