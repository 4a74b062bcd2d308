"""GPU check of the cuda image's runtime, in process, without Docker (issue 16, part 5).

    python bench/gpu_check.py [--examples mlp,text-classifier] [--runs 200] [--batch 1] [--atol 1e-3] [--json]
    python bench/gpu_check.py --allow-cpu     # dry run on CPUExecutionProvider: checks the script, not a GPU
    python bench/gpu_check.py --docker        # build -> run -> warmup -> second start (see the end)

Set-up on a machine with an NVIDIA GPU (driver r580+ for CUDA 13); no Docker needed:

    pip install .                           # this repository: the script imports gpux_pack
    pip install onnxruntime-gpu==1.31.1     # the cuda row's pin (gpux_pack/providers.py)

CUDA 13 and cuDNN 9 come from NVIDIA's pip wheels, which the runtime preloads
(onnxruntime.preload_dlls): PyTorch's CUDA 13 wheels bring them, else
`pip install "onnxruntime-gpu[cuda,cudnn]==1.31.1"`. The CPU wheel `onnxruntime` (which
`pip install .[test]` pulls) installs the same `onnxruntime` module: uninstall it first, or
there is no CUDA provider.

For each example under examples/, the folder a cuda image holds (model/ and gpux.json) is made
by the packager's own planning code (pipeline.build.load and plan_for, and the plan's
gpux_json for the cuda row); then the image's runtime runs it in this process
as a container would (Settings.load, Model.load, warmup, tune_threads) with
GPUX_REQUIRE_PROVIDER=1, so a CUDA provider that does not start is an error, never CPU numbers
reported as GPU ones. Reported per example:
  partition  nodes per execution provider, from warmup's profile (all on CUDA, or not)
  accuracy   warmup's worst error per output against a CPU session (checked against --atol)
  latency    p50 of session.run of the CUDA session against a CPU session of the same model
             (the cpu image's runtime: Model.load with GPUX_PROVIDERS=cpu, its thread count
             tuned as at start), same inputs (warmup's first, dynamic batch at --batch),
             --runs runs each, interleaved; inputs and outputs in host memory, copies
             included, as the image calls it. At --batch 1 a tiny model is faster on CPU (a
             kernel launch costs more than its arithmetic): expected, not a failure.
  device     the warmup key's device part: must name the GPU and its compute capability
             ("gpu: NVIDIA H100 80GB HBM3 sm90 (driver 13000)")
  options    the CUDA options in effect (session.get_provider_options()) against those
             gpux.json asks for (the table's device_id, arena_extend_strategy,
             cudnn_conv_algo_search; plus runtime.gpu.memory and pack.provider_options)
examples/strings is skipped: its tensors are strings, for which the CUDA provider has no
kernels (its ai.onnx.ml LabelEncoder runs on CPU only), so none of it would run on the GPU.

Prints a Markdown table (--json: the report as JSON) and, after a run on a GPU only, writes
bench/results-gpu.json. Exit 0: every check passed; 1: a check failed (the table says which);
2: no GPU check is possible here (no CUDA device, onnxruntime-gpu missing, the CUDA provider
not active), said in one line on stderr.

--allow-cpu (same as --provider cpu): the same code path on CPUExecutionProvider
(GPUX_PROVIDERS=cpu) for hosts without a GPU: the gpux.json is still the cuda image's, the
device part is the CPU's and is not checked, accuracy is not measured (the reference would be
CPU too), the CUDA options are shown as asked but not checked. Nothing is written; its numbers
say nothing about GPUs.

--docker (docker_check): the same through images, on a host with Docker, the NVIDIA container
runtime and a GPU, through the gpux-pack CLI (argument lists, never a shell string):
  gpux-pack build EXAMPLE --provider cuda --warmup never --json
  gpux-pack run TAG --port P --detach      first start: /info's active providers and warmup
  gpux-pack warmup TAG --json              the key's device, partition, accuracy (cuda compiles
                                           nothing, so the image is tagged unchanged)
  gpux-pack run WARMED --port P --detach   second start: /info again
It prints one JSON document. It has NOT been run: no machine with Docker and a GPU was available.

The in-process mode ran once on an NVIDIA H100 (onnxruntime-gpu 1.31.1, no Docker): both examples
passed (bench/results-gpu.json). --docker has not run on a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EXAMPLES = ("mlp", "text-classifier", "strings")
RESULTS = ROOT / "bench" / "results-gpu.json"
CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
CHECKED_OPTIONS = ("device_id", "arena_extend_strategy", "cudnn_conv_algo_search")
GPU_DEVICE = re.compile(r"^gpu: (?!none\b).+ sm\d+\b")  # the key's device part names a GPU and its sm


class Refused(Exception):
    """No GPU check is possible here: one line on stderr, exit 2."""


# ---------------------------------------------------------------------------------------------
# what the image holds, made by the packager's own code


def image_folder(example: Path, folder: Path) -> Any:
    """model/ and gpux.json as a cuda image holds them (the build writes the same gpux.json),
    from the real planning code: no Docker, no wheels, no network."""
    from gpux_pack.pipeline.build import load, plan_for
    from gpux_pack import providers
    from gpux_pack.plan import Options, pinned
    from gpux_pack.ui import Reporter
    from gpux_pack.wheels import Pin

    loaded = load(example)
    row = providers.get("cuda")
    pin = Pin(row.ort, row.version, frozenset())  # the row's onnxruntime-gpu, as a lock pins it
    spec = plan_for(loaded, "cuda", "gpu_check: cuda", Options(), None, Reporter(quiet=True), pull=False,
                    resolve=pinned(pin)).gpux_json
    for name in loaded.model.files:  # external data too, at the paths the model names
        target = folder / "model" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(loaded.model.path.parent / name, target)
    (folder / "gpux.json").write_text(json.dumps(spec.to_json(), indent=2, sort_keys=True, allow_nan=False))
    return spec


def skip_reason(spec: Any) -> str | None:
    """Why an example cannot run on CUDA at all (then it is skipped, not failed)."""
    strings = [t.name for t in (*spec.inputs, *spec.outputs) if t.type == "string"]
    if strings:
        return (f"string tensors ({', '.join(strings)}): the CUDA provider has no kernels for them, so none of "
                "the model would run on the GPU")
    return None


def runtime_settings(folder: Path, providers: str | None, verbose: bool = False) -> Any:
    """The container's settings for that folder: its gpux.json, a private cache folder, and
    GPUX_REQUIRE_PROVIDER=1 (a provider that does not start is an error, not a CPU fallback)."""
    from gpux_pack.runtime.settings import Settings

    env = {"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache"),
           "GPUX_REQUIRE_PROVIDER": "1", "GPUX_LOG_LEVEL": "debug" if verbose else "warning"}
    if providers:
        env["GPUX_PROVIDERS"] = providers
    return Settings.load(env)


# ---------------------------------------------------------------------------------------------
# the checks


def preflight(dry_run: bool) -> dict[str, Any]:
    """onnxruntime, its CUDA provider and a CUDA device, before any work: each missing one is a
    one-line refusal (dry run: onnxruntime only)."""
    from gpux_pack import providers
    from gpux_pack.runtime import caches, contract

    pin = providers.get("cuda").version
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise Refused(f"onnxruntime-gpu is not installed ({e}): pip install onnxruntime-gpu=={pin}") from None
    libraries = caches.library_versions()
    builds = ", ".join(f"{k} {v}" for k, v in libraries.items() if k in ("onnxruntime", "onnxruntime-gpu")) or "unknown"
    out = {"onnxruntime": ort.__version__, "distributions": builds, "pin": pin, "libraries": libraries}
    if dry_run:
        return out
    if CUDA_EP not in ort.get_available_providers():
        raise Refused(f"onnxruntime-gpu is missing: this onnxruntime ({builds}) has no {CUDA_EP}; "
                      f"pip uninstall onnxruntime, then pip install onnxruntime-gpu=={pin}")
    device = contract.nvidia_device()
    if not GPU_DEVICE.match(device):
        raise Refused(f"no CUDA device: {device}")
    return {**out, "device": device}


def check_example(name: str, folder: Path, dry_run: bool, runs: int, batch: int, atol: float,
                  verbose: bool = False) -> dict[str, Any]:
    """One example through the image's runtime: warmup's partition and accuracy, the key's
    device, the options in effect, and session.run against a CPU session."""
    from gpux_pack import providers
    from gpux_pack.errors import PackError
    from gpux_pack.runtime import warmup
    from gpux_pack.runtime.session import Model
    from gpux_pack.runtime.settings import StartupError

    ep = CPU_EP if dry_run else CUDA_EP
    out: dict[str, Any] = {"example": name, "provider": ep, "skipped": None, "problems": [], "notes": []}
    try:
        spec = image_folder(ROOT / "examples" / name, folder)
    except PackError as e:
        out["problems"].append(f"cannot plan a cuda image: {e}")
        return _finish(out)
    out["skipped"] = skip_reason(spec)
    if out["skipped"]:
        return _finish(out)
    try:
        model = Model.load(runtime_settings(folder, "cpu" if dry_run else None, verbose), warm_up=True)
    except StartupError as e:  # GPUX_REQUIRE_PROVIDER=1: the provider did not start
        raise Refused(f"{name}: {e}") from None
    if model.active[:1] != [ep]:
        raise Refused(f"{name}: {ep} is not active; active providers: {', '.join(model.active)}")
    out["active"] = model.active
    try:
        warmup.run(model, strict=True)
    except StartupError as e:
        out["problems"].append(str(e))
    warmup.tune_threads(model)
    out["warmup"] = model.warmup_info()
    out["partition"] = partition_summary(out["warmup"].get("partition"), ep)
    out["accuracy"] = out["warmup"].get("accuracy")
    out["accuracy_max_abs"] = worst(out["accuracy"])
    out["device"] = (model.cache.parts.get("device") if model.cache else None) or "unknown"
    out["device_ok"] = None if dry_run else bool(GPU_DEVICE.match(out["device"]))
    asked = dict(model.settings.spec.execution_providers).get(CUDA_EP, {})
    table = providers.get(spec.provider).options.get(CUDA_EP, {})
    effective = model.session.get_provider_options().get(CUDA_EP)
    out["options"] = options_report(asked, table, None if dry_run else (effective or {}))

    cpu = Model.load(runtime_settings(folder, "cpu", verbose), warm_up=False)
    warmup.tune_threads(cpu)
    feeds = batched(warmup.generated_inputs(model)[0], model.inputs, batch)
    ep_ms, cpu_ms = interleaved(model.session, cpu.session, feeds, runs)
    out["latency_ms"] = {"provider": percentiles(ep_ms), "cpu": percentiles(cpu_ms),
                         "cpu_over_provider": round(float(np.median(cpu_ms) / np.median(ep_ms)), 3),
                         "runs": runs, "shapes": {k: list(v.shape) for k, v in feeds.items()},
                         "threads": {"provider": model.threads, "cpu": cpu.threads}}

    part = out["partition"]
    if part["total"] == 0:
        out["problems"].append("warmup's profile names no node")
    elif part["on_provider"] == 0:
        out["problems"].append(f"no node ran on {ep}")
    elif not part["all"]:
        out["notes"].append(f"{part['total'] - part['on_provider']} of {part['total']} nodes not on {ep}")
    if out["accuracy_max_abs"] is not None and not out["accuracy_max_abs"] <= atol:
        out["problems"].append(f"max abs error {out['accuracy_max_abs']:.3g} against CPU exceeds --atol {atol:g}")
    if out["device_ok"] is False:
        out["problems"].append(f"the key's device part does not name a GPU and its sm: {out['device']!r}")
    for key in out["options"]["differ"]:
        row = out["options"]["options"][key]
        out["problems"].append(f"{CUDA_EP} option {key} is {row['effective']!r} in effect, "
                               f"gpux.json asks {row['asked']!r}")
    return _finish(out)


def _finish(out: dict[str, Any]) -> dict[str, Any]:
    out["ok"] = not out["problems"]
    return out


def partition_summary(partition: dict[str, int] | None, ep: str) -> dict[str, Any]:
    """Warmup's nodes per provider, and whether every one ran on `ep`."""
    nodes = dict(partition or {})
    total = sum(nodes.values())
    on = nodes.get(ep, 0)
    return {"nodes": nodes, "total": total, "on_provider": on, "all": total > 0 and on == total}


def worst(accuracy: dict[str, dict[str, float]] | None) -> float | None:
    """The largest max_abs over the outputs (None: not measured, the provider is CPU)."""
    if not accuracy:
        return None
    return max(float(v["max_abs"]) for v in accuracy.values())


def options_report(asked: dict[str, Any], table: dict[str, Any], effective: dict[str, Any] | None) -> dict[str, Any]:
    """Each checked option as the table has it, as gpux.json asks, and as ONNX Runtime runs
    it (effective None: not checked, the CUDA provider is not in the session)."""
    keys = sorted(set(CHECKED_OPTIONS) | set(asked))
    rows = {k: {"table": table.get(k), "asked": asked.get(k),
                "effective": None if effective is None else effective.get(k)} for k in keys}
    differ = [] if effective is None else [
        k for k in keys if asked.get(k) is not None and str(effective.get(k)) != str(asked[k])
    ]
    return {"options": rows, "checked": effective is not None, "differ": differ}


def batched(feeds: dict[str, np.ndarray], inputs: list[Any], batch: int) -> dict[str, np.ndarray]:
    """Warmup's inputs (dynamic dimensions at 1) with a dynamic first dimension at `batch`."""
    if batch == 1:
        return feeds
    out = dict(feeds)
    for spec in inputs:
        first = (spec.shape or (0,))[0]
        if spec.name in feeds and feeds[spec.name].ndim and not (isinstance(first, int) and first >= 0):
            out[spec.name] = np.repeat(feeds[spec.name], batch, axis=0)
    return out


def interleaved(a: Any, b: Any, feeds: dict[str, np.ndarray], runs: int) -> tuple[list[float], list[float]]:
    """Run times (ms) of two sessions on the same inputs, in turn, so a busy machine slows
    both alike; 10 untimed runs each first."""
    for _ in range(min(10, runs)):
        a.run(None, feeds)
        b.run(None, feeds)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        for session, out in zip((a, b), times):
            started = time.perf_counter()
            session.run(None, feeds)
            out.append(1000 * (time.perf_counter() - started))
    return times


def percentiles(ms: list[float]) -> dict[str, float]:
    return {"p50": round(float(np.percentile(ms, 50)), 4), "p90": round(float(np.percentile(ms, 90)), 4)}


def run_checks(names: list[str], dry_run: bool, runs: int, batch: int, atol: float,
               verbose: bool = False) -> dict[str, Any]:
    """Every example, after the preflight: the whole report."""
    facts = preflight(dry_run)
    report: dict[str, Any] = {
        "mode": "dry-run-cpu" if dry_run else "gpu", **facts, "python": platform.python_version(),
        "runs": runs, "batch": batch, "atol": atol, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with tempfile.TemporaryDirectory(prefix="gpux-gpu-check-") as tmp:
        report["examples"] = [check_example(n, Path(tmp) / n, dry_run, runs, batch, atol, verbose) for n in names]
    devices = {e["device"] for e in report["examples"] if e.get("device")}
    report["device"] = facts.get("device") or (devices.pop() if len(devices) == 1 else None)
    report["ok"] = all(e["ok"] for e in report["examples"])
    return report


# ---------------------------------------------------------------------------------------------
# output


def markdown(report: dict[str, Any]) -> str:
    """The report as one Markdown table, with what failed below it."""
    dry = report["mode"] != "gpu"
    lines = [
        f"gpu check: {report['distributions']} (the cuda row pins onnxruntime-gpu {report['pin']}), "
        f"Python {report['python']}, {report['runs']} runs, batch {report['batch']}",
        f"device (warmup key): {report.get('device') or 'unknown'}",
    ]
    if dry:
        lines.append("DRY RUN on CPUExecutionProvider (--allow-cpu): no GPU involved; these numbers say nothing "
                     "about GPUs")
    lines += ["", "| example | provider | nodes on it | accuracy vs CPU (max abs) | p50 ms | CPU p50 ms | CPU / it "
              "| CUDA options | result |", "|---|---|---|---|---|---|---|---|---|"]
    for e in report["examples"]:
        if e["skipped"] or "partition" not in e:
            why = f"skipped: {e['skipped']}" if e["skipped"] else "; ".join(e["problems"])
            lines.append(f"| {e['example']} | - | - | - | - | - | - | - | {why} |")
            continue
        part, lat = e["partition"], e["latency_ms"]
        nodes = f"{part['on_provider']}/{part['total']}" + (" (all)" if part["all"] else "")
        acc = "n/a (CPU)" if e["accuracy_max_abs"] is None else f"{e['accuracy_max_abs']:.3g}"
        opts = e["options"]
        column = "effective" if opts["checked"] else "asked"
        shown = ", ".join(f"{k} {v[column]}" for k, v in opts["options"].items())
        verdict = ("DIFFER" if opts["differ"] else "as asked") if opts["checked"] else "asked, not checked"
        result = "ok" if e["ok"] else "FAILED"
        lines.append(f"| {e['example']} | {e['provider'].removesuffix('ExecutionProvider')} | {nodes} | {acc} | "
                     f"{lat['provider']['p50']:.4f} | {lat['cpu']['p50']:.4f} | {lat['cpu_over_provider']:.2f}x | "
                     f"{verdict} ({shown}) | {result} |")
    for e in report["examples"]:
        lines += [f"- {e['example']}: {p}" for p in e["problems"]]
        lines += [f"- {e['example']}: note: {n}" for n in e["notes"]]
    return "\n".join(lines)


def strict(value: Any) -> Any:
    """JSON-safe: a non-finite float (an output of another shape: error inf) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# --docker: the same through images (NOT RUN here: no GPU, no NVIDIA container runtime)


def docker_check(example: Path, port: int = 18080) -> dict[str, Any]:
    """build -> run -> warmup -> second start through the gpux-pack CLI, on a host with Docker,
    the NVIDIA runtime and a GPU. Untested in this project: it had neither."""
    built = json.loads(_cli("build", str(example), "--provider", "cuda", "--warmup", "never", "--json"))
    tag = built["images"][0]["tag"]
    first = _start(tag, port)
    warmed = json.loads(_cli("warmup", tag, "--json"))
    second = _start(warmed.get("tag") or tag, port)
    problems = [f"{which} start: {CUDA_EP} is not active ({start['providers']})"
                for which, start in (("first", first), ("second", second))
                if (start["providers"].get("active") or [None])[0] != CUDA_EP]
    if not GPU_DEVICE.match(str(warmed.get("device") or "")):
        problems.append(f"warmup's key device does not name a GPU: {warmed.get('device')!r}")
    return {"example": example.name, "image": tag, "first_start": first, "warmup": warmed, "second_start": second,
            "problems": problems, "ok": not problems}


def docker_skip(name: str) -> str | None:
    """skip_reason of the example's cuda gpux.json (planned in a scratch folder)."""
    with tempfile.TemporaryDirectory(prefix="gpux-gpu-check-") as tmp:
        return skip_reason(image_folder(ROOT / "examples" / name, Path(tmp)))


def _cli(*args: str) -> str:
    """One gpux-pack command (an argument list, no shell); its stdout, or Refused naming it."""
    proc = subprocess.run([sys.executable, "-m", "gpux_pack", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise Refused(f"gpux-pack {args[0]} failed (exit {proc.returncode}): {tail}")
    return proc.stdout


def _start(tag: str, port: int) -> dict[str, Any]:
    """`gpux-pack run --detach` (it returns once the container is ready), then /info, then the
    container is stopped and removed."""
    from gpux_pack import engine

    started = time.perf_counter()
    lines = _cli("run", tag, "--port", str(port), "--detach").split()
    ready = time.perf_counter() - started
    container = engine.connect().containers.get(lines[-1])  # the last line is its id
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=30) as r:
            info = json.load(r)
    finally:
        try:
            container.stop(timeout=15)
        finally:
            engine.remove_container(container)
    return {"seconds_to_ready": round(ready, 2), "providers": info["execution_providers"],
            "warmup": info["warmup"], "load_seconds": info["load_seconds"]}


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", default=",".join(EXAMPLES), help="comma-separated names under examples/")
    ap.add_argument("--provider", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a dry run on CPUExecutionProvider, for hosts without a GPU")
    ap.add_argument("--allow-cpu", dest="provider", action="store_const", const="cpu", help="same as --provider cpu")
    ap.add_argument("--runs", type=int, default=200, help="timed session.run calls per session (default 200)")
    ap.add_argument("--batch", type=int, default=1, help="the dynamic first dimension of the timed inputs")
    ap.add_argument("--atol", type=float, default=1e-3, help="largest abs error against CPU that passes")
    ap.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    ap.add_argument("--verbose", action="store_true", help="the runtime and ONNX Runtime log at debug level")
    ap.add_argument("--docker", action="store_true", help="build, run, warmup, run again (Docker + NVIDIA runtime)")
    ap.add_argument("--port", type=int, default=18080, help="--docker: the host port the containers publish")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.examples.split(",") if n.strip()]
    unknown = [n for n in names if not (ROOT / "examples" / n / "gpux.yml").is_file()]
    if not names or unknown:
        ap.error(f"--examples: no example {', '.join(unknown) or '(none given)'} under {ROOT / 'examples'}")
    if args.runs < 1 or args.batch < 1:
        ap.error("--runs and --batch must be at least 1")
    try:
        if args.docker:
            results = [docker_check(ROOT / "examples" / n, args.port) for n in names if not docker_skip(n)]
            print(json.dumps(strict(results), indent=2))
            return 0 if all(r["ok"] for r in results) else 1
        report = run_checks(names, args.provider == "cpu", args.runs, args.batch, args.atol, args.verbose)
    except Refused as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    print(json.dumps(strict(report), indent=2, sort_keys=True) if args.json else markdown(report))
    if report["mode"] == "gpu":
        RESULTS.write_text(json.dumps(strict(report), indent=2, sort_keys=True) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
