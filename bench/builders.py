"""Other builders of `render --output` (issue 19): build time and layer diff ids, one run.

    python bench/builders.py [--base-image IMG] [--rounds 1]

On a copy of examples/mlp: `render --output`, then each builder builds the context without its
cache, interleaved round by round (their order rotates): the classic builder and BuildKit
(Debian's /usr/bin/docker, DOCKER_BUILDKIT=0/1), `podman build` and `buildah bud --layers`
(--format docker), and `gpux-pack build` itself with its runtime base image removed first
(assembled on the Docker engine). Each row: the median seconds, its ratio to gpux-pack build's,
and whether its added layers' diff ids equal gpux-pack build's on the Docker engine, or
(podman, buildah) gpux-pack's bytes with empty owner names, which is what podman's engine and
Docker 23+ give. Writes bench/results-builders.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKER = "/usr/bin/docker"
SAME_TIME = {"SOURCE_DATE_EPOCH": "1767225600"}
LAYERS = ("packages", "runtime", "cache", "model", "config")


def run(cmd: list[str], **env: str) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=900)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - started, proc.stdout


def docker_layers(ref: str) -> list[str]:
    return json.loads(run(["docker", "image", "inspect", ref])[1])[0]["RootFS"]["Layers"]


def podman_layers(ref: str) -> list[str]:
    return json.loads(run(["podman", "image", "inspect", ref])[1])[0]["RootFS"]["Layers"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default=os.environ.get("GPUX_TEST_BASE_IMAGE", "gpux-pack/debian-python:bookworm"))
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    gpux = [sys.executable, "-m", "gpux_pack"]
    with tempfile.TemporaryDirectory(prefix="gpux-builders-") as tmp:
        project = Path(tmp) / "mlp"
        subprocess.run(["cp", "-r", str(ROOT / "examples" / "mlp"), str(project)], check=True)
        context = Path(tmp) / "context"
        run([*gpux, "render", str(project), "--provider", "cpu", "--base-image", args.base_image, "--output",
             str(context)], **SAME_TIME)
        if subprocess.run(["podman", "image", "exists", args.base_image]).returncode:
            run(["podman", "pull", "-q", f"docker-daemon:{args.base_image}"])
        empty_owner = ["sha256:" + hashlib.sha256((context / f"{n}.tar").read_bytes()).hexdigest() for n in LAYERS]
        base = docker_layers(args.base_image)

        def ours() -> dict:
            out = json.loads(run([*gpux, "build", str(project), "--provider", "cpu", "--base-image", args.base_image,
                                  "--tag", "gpux-bench/builders:gpux-pack", "--json"], **SAME_TIME)[1])
            runtime_base = out["images"][0]["runtime_base"]
            subprocess.run(["docker", "rmi", "-f", "gpux-bench/builders:gpux-pack", runtime_base], capture_output=True)
            return out["images"][0]

        first = ours()  # its runtime base image's tag, removed before each timed build
        builders = {
            "gpux-pack build (cold: runtime base assembled too)": None,
            "classic docker build": ([DOCKER, "build", "--no-cache", "-q", "-t", "gpux-bench/builders:classic",
                                      str(context)], {"DOCKER_BUILDKIT": "0"}, "docker"),
            "BuildKit": ([DOCKER, "build", "--no-cache", "-q", "-t", "gpux-bench/builders:buildkit", str(context)],
                         {"DOCKER_BUILDKIT": "1"}, "docker"),
            "podman build": (["podman", "build", "--format", "docker", "--pull=never", "--no-cache", "-q", "-t",
                              "localhost/gpux-bench/builders:podman", str(context)], {}, "podman"),
            "buildah bud --layers": (["buildah", "bud", "--layers", "--format", "docker", "--pull=never", "--no-cache",
                                      "-q", "-t", "localhost/gpux-bench/builders:buildah", str(context)], {},
                                     "podman"),
        }
        times: dict[str, list[float]] = {name: [] for name in builders}
        layers: dict[str, list[str]] = {}
        names = list(builders)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                spec = builders[name]
                if spec is None:
                    started = time.perf_counter()
                    out = json.loads(run([*gpux, "build", str(project), "--provider", "cpu", "--base-image",
                                          args.base_image, "--tag", "gpux-bench/builders:gpux-pack", "--json"],
                                         **SAME_TIME)[1])
                    times[name].append(time.perf_counter() - started)
                    assert out["images"][0]["runtime_base_built"] or out["images"][0]["assembled"]
                    layers[name] = docker_layers("gpux-bench/builders:gpux-pack")[len(base) :]
                    subprocess.run(["docker", "rmi", "-f", "gpux-bench/builders:gpux-pack", first["runtime_base"]],
                                   capture_output=True)
                    continue
                cmd, env, engine = spec
                seconds, _ = run(cmd, **env)
                times[name].append(seconds)
                tag = cmd[cmd.index("-t") + 1]
                layers[name] = (docker_layers if engine == "docker" else podman_layers)(tag)[len(base) :]
                remove = ["docker", "rmi", "-f", tag] if engine == "docker" else ["podman", "rmi", tag]
                subprocess.run(remove, capture_output=True)
        reference = layers[names[0]]
        rows = []
        for name in names:
            median = statistics.median(times[name])
            rows.append({
                "builder": name, "seconds": round(median, 2),
                "vs_gpux_pack": round(median / statistics.median(times[names[0]]), 2),
                "same_diff_ids_as_gpux_pack_build": layers[name] == reference,
                "same_as_gpux_pack_bytes_with_empty_owner_names": layers[name] == empty_owner,
                "samples_s": [round(t, 3) for t in times[name]],
                "diff_ids": [d[7:19] for d in layers[name]],
            })
    result = {"base_image": args.base_image, "rounds": args.rounds, "cpus": len(os.sched_getaffinity(0)),
              "empty_owner_diff_ids": [d[7:19] for d in empty_owner],
              "note": "builds without cache of examples/mlp's render --output; gpux-pack build with its runtime base "
                      "image removed first", "rows": rows}
    (ROOT / "bench" / "results-builders.json").write_text(json.dumps(result, indent=2) + "\n")
    for row in rows:
        print(f"| {row['builder']} | {row['seconds']} s | {row['vs_gpux_pack']}x | "
              f"{row['same_diff_ids_as_gpux_pack_build']} | {row['same_as_gpux_pack_bytes_with_empty_owner_names']} |")


if __name__ == "__main__":
    main()
