"""What the SBOM, the provenance and a signature add to a build and a push (issue 34), one run:

    python bench/attestations.py [--rounds 5] [--big-mb 300]

For examples/mlp and a model of --big-mb MB (bench/model_sizes.py's MatMul chain), on the
offline base with the cpu provider:
  build      `gpux-pack build` end to end (its runtime base present), median of --rounds, and the
             part of it spent recording the SBOM and provenance (attest.record, timed in process
             on the same plan, median of --rounds);
  push       the push to a Distribution 2.8 registry started here on 127.0.0.1 (a fresh, empty
             registry each round: every layer is sent), the part spent attaching the SBOM and
             provenance (referrers.attach), and a signature (signatures.sign) on its own;
  sizes      the SBOM's and the provenance statement's bytes.
Writes bench/results-attestations.json and prints a Markdown table. A measurement, never a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import docker  # noqa: E402

from gpux_pack.image import provenance, sbom  # noqa: E402
from gpux_pack.pipeline import attest  # noqa: E402
from gpux_pack.pipeline.build import load, plan_for, resolver  # noqa: E402
from gpux_pack.plan import Options  # noqa: E402
from gpux_pack.registry import referrers, signatures  # noqa: E402
from gpux_pack.registry.push import push  # noqa: E402
from gpux_pack.ui import Reporter  # noqa: E402

BASE = os.environ.get("GPUX_TEST_BASE_IMAGE", "gpux-pack/debian-python:bookworm")


def _cli(*args: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gpux_pack", *args], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return time.perf_counter() - started


def registry(root: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yml").write_text(f"version: 0.1\nlog: {{level: warn}}\nstorage: {{filesystem: {{rootdirectory: "
                                     f"{root / 'data'}}}}}\nhttp: {{addr: '127.0.0.1:{port}'}}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    import requests

    for _ in range(100):
        try:
            requests.get(f"http://127.0.0.1:{port}/v2/", timeout=1)
            return proc, f"127.0.0.1:{port}"
        except requests.ConnectionError:
            time.sleep(0.1)
    raise SystemExit("the registry did not start")


def measure(name: str, project: Path, rounds: int, address: str, key) -> dict:
    client = docker.from_env()
    ui = Reporter(quiet=True)
    tag = f"{address}/bench-{name}/model:1"
    _cli("build", str(project), "--provider", "cpu", "--base-image", BASE, "--tag", tag, "--quiet")  # warm
    builds = [_cli("build", str(project), "--provider", "cpu", "--base-image", BASE, "--tag", tag, "--quiet")
              for _ in range(rounds)]
    plan = plan_for(load(project), "cpu", "bench", Options(base_image=BASE, tag=tag), client, ui, pull=False,
                    resolve=resolver(ui))
    image = client.images.get(tag)
    from gpux_pack.image.builder import BuiltImage

    built = BuiltImage(tag=tag, id=image.id, size_bytes=0, seconds=0, steps=0, cached_steps=0, assembled=True)
    records = []
    for _ in range(rounds):
        started = time.perf_counter()
        attest.record(plan, built, attest.now(), {})
        records.append(time.perf_counter() - started)
    pushes, attaches, signs = [], [], []
    for i in range(rounds):
        fresh, round_address = registry(Path(tempfile.mkdtemp()) / "registry")  # empty: every layer is sent
        round_tag = f"{round_address}/bench-{name}-{i}/model:1"
        image.tag(round_tag)
        started = time.perf_counter()
        pushed = push(client, round_tag, ui)
        pushes.append(time.perf_counter() - started)
        found = attest.recorded(image.id)
        repository, digest = pushed.digest.split("@")
        started = time.perf_counter()
        referrers.attach(client, repository, digest, [
            referrers.Artifact(sbom.MEDIA_TYPE, found[0], {"dev.gpux.kind": "sbom"}),
            referrers.Artifact(provenance.MEDIA_TYPE, provenance.statement([(repository, digest)], found[1]),
                               {"dev.gpux.kind": "provenance"})])
        attaches.append(time.perf_counter() - started)
        started = time.perf_counter()
        signatures.sign(client, repository, digest, key)
        signs.append(time.perf_counter() - started)
        client.images.remove(round_tag)
        fresh.terminate()
    document, predicate = attest.recorded(image.id)
    med = statistics.median
    return {"model_mb": round(plan.model.size_bytes / 1e6, 1), "build_s": round(med(builds), 3),
            "record_s": round(med(records), 3), "record_share": round(med(records) / med(builds), 3),
            "push_s": round(med(pushes), 3), "attach_s": round(med(attaches), 3),
            "attach_share": round(med(attaches) / med(pushes), 3), "sign_s": round(med(signs), 3),
            "sbom_bytes": len(document), "provenance_bytes": len(provenance.statement([("r", "sha256:0")], predicate))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--big-mb", type=int, default=300)
    args = parser.parse_args()
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    tmp = Path(tempfile.mkdtemp())
    proc, address = registry(tmp / "registry")
    try:
        from model_sizes import make_model

        big = make_model(tmp / "big", args.big_mb << 20, external=False).parent
        rows = {"mlp": measure("mlp", ROOT / "examples" / "mlp", args.rounds, address, key),
                f"{args.big_mb} MB": measure("big", big, args.rounds, address, key)}
    finally:
        proc.terminate()
        shutil.rmtree(tmp, ignore_errors=True)
    (ROOT / "bench" / "results-attestations.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("| model | build s | SBOM + provenance s | share | push s | attach s | share | sign s | SBOM bytes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} ({r['model_mb']} MB) | {r['build_s']} | {r['record_s']} | {r['record_share']} | "
              f"{r['push_s']} | {r['attach_s']} | {r['attach_share']} | {r['sign_s']} | {r['sbom_bytes']} |")


if __name__ == "__main__":
    main()
