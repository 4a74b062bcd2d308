"""How a model's storage form changes ONNX Runtime's start (issue 31): inline weights against
external data, one run.

    python bench/ort_load.py [--sizes 300M,1500M] [--rounds 3]

For each size (a MatMul chain, bench/model_sizes.py's make_model), three forms of the same graph:
  inline     the weights inside model.onnx (as exporters write models under 2 GB)
  external   onnx.save(..., save_as_external_data=True): one data file, offsets as onnx packs them
  aligned    gpux-pack's external form (gpux_pack.project.skeleton.external_form): the same data
             file with each weight at a page-aligned offset, which ONNX Runtime's CPU provider maps
             instead of reading
each loaded `--rounds` times in a fresh Python (forms interleaved, page cache warm: the first
round of each form is read from disk once before timing), CPU provider, default options and
with `session.disable_prepacking` (prepacking copies MatMul weights into the layout its kernel
wants, which undoes a mapping). Measured in the child: InferenceSession seconds, peak RSS, RSS
after the load, and the median of 5 runs of a [1, n] input. Outputs checked equal across forms.
Writes bench/results-ort-load.json and prints a Markdown table of medians. A measurement, never
a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from model_sizes import make_model  # noqa: E402

from gpux_pack.project.skeleton import copy_ranges, external_form  # noqa: E402

CHILD = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
def kb(key):
    return int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]) * 1024
path, prepack = sys.argv[1], sys.argv[2] == "1"
options = ort.SessionOptions()
if not prepack:
    options.add_session_config_entry("session.disable_prepacking", "1")
base = kb("VmRSS")
t = time.perf_counter()
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
load = time.perf_counter() - t
after = kb("VmRSS") - base
peak = kb("VmHWM") - base
x = np.random.default_rng(1).standard_normal((1, session.get_inputs()[0].shape[1]), dtype=np.float32)
times = []
for _ in range(5):
    t = time.perf_counter()
    y = session.run(None, {session.get_inputs()[0].name: x})[0]
    times.append(time.perf_counter() - t)
print(json.dumps({"load_s": load, "peak": peak, "after": after, "run_s": sorted(times)[2],
                  "out": float(np.abs(y).sum())}))
"""


def forms(folder: Path, size: int) -> dict[str, Path]:
    inline = make_model(folder / "inline", size, external=False)
    ext_dir = folder / "external"
    ext_dir.mkdir()
    onnx.save(onnx.load(str(inline)), str(ext_dir / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.onnx.data")
    aligned_dir = folder / "aligned"
    aligned_dir.mkdir()
    form = external_form(inline, "model.onnx.data")
    (aligned_dir / "model.onnx").write_bytes(form.model)
    with open(aligned_dir / "model.onnx.data", "wb") as f:
        for piece in copy_ranges(inline, form.ranges):
            f.write(piece)
    return {"inline": inline, "external": ext_dir / "model.onnx", "aligned": aligned_dir / "model.onnx"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="300M,1500M")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = []
    for spec in args.sizes.split(","):
        size = int(float(spec.rstrip("M")) * 1e6)
        with tempfile.TemporaryDirectory(prefix="gpux-ortload-", dir=os.environ.get("GPUX_BENCH_TMP")) as tmp:
            paths = forms(Path(tmp) / spec, size)
            samples: dict[tuple[str, bool], list[dict]] = {}
            for r in range(args.rounds + 1):  # round 0 warms the page cache
                order = list(paths.items())
                order = order[r % len(order):] + order[: r % len(order)]
                for prepack in (True, False):
                    for name, path in order:
                        proc = subprocess.run([sys.executable, "-c", CHILD, str(path), "1" if prepack else "0"],
                                              capture_output=True, text=True, timeout=900)
                        if proc.returncode:
                            sys.exit(proc.stderr[-2000:])
                        if r:
                            samples.setdefault((name, prepack), []).append(json.loads(proc.stdout))
            outs = {round(s[0]["out"], 2) for s in samples.values()}
            for (name, prepack), runs in samples.items():
                row = {"model": spec, "form": name, "prepacking": prepack,
                       "bytes": sum(p.stat().st_size for p in paths[name].parent.iterdir()),
                       **{k: statistics.median(s[k] for s in runs) for k in ("load_s", "peak", "after", "run_s")},
                       "same_outputs": len(outs) == 1}
                results.append(row)
                print(json.dumps(row), flush=True)
    print("\n| model | form | prepacking | load s | vs inline | peak RSS MB | RSS after load MB | run ms |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for row in results:
        inline = next(r for r in results if r["model"] == row["model"] and r["form"] == "inline"
                      and r["prepacking"] == row["prepacking"])
        print(f"| {row['model']} | {row['form']} | {'on' if row['prepacking'] else 'off'} | {row['load_s']:.2f} | "
              f"{row['load_s'] / inline['load_s']:.2f} | {row['peak'] / 1e6:.0f} | {row['after'] / 1e6:.0f} | "
              f"{row['run_s'] * 1e3:.2f} |")
    (ROOT / "bench" / "results-ort-load.json").write_text(json.dumps({"cpus": os.cpu_count(), "rows": results},
                                                                     indent=1) + "\n")


if __name__ == "__main__":
    main()
