"""Warmup: the model run on generated inputs before it is ready (every declared and profiled
shape, dynamic dimensions at 1), then which provider ran which nodes (from the profile), its
answers against the CPU provider's (pack.accuracy), the compiled cache published, and the
intra-op thread rule. session.Model loads and runs the model; this decides what to run and what
to make of the answers. (caches.py keys and verifies the compiled caches; `gpux-pack warmup`
bakes them into an image.)"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from . import caches
from .contract import BINARY_ONLY, DTYPES
from .session import every_cpu, last_line, run_bf16, session_options
from .settings import StartupError
from .tensors import bf16_to_float32, float32_to_bf16

log = logging.getLogger("gpux")


class AccuracyError(StartupError):
    """The provider's answers differ from the CPU provider's beyond pack.accuracy."""


MAX_TUNE_BYTES = 512 << 20  # larger models keep every CPU: no second session, even briefly
# A run (median, on every CPU) under this is too cheap for intra-op parallelism to pay: 1 thread.
# Far from both sides' typical costs (a small MLP: 0.01-0.05 ms; convs and transformers: 1 ms
# and up), so timing noise does not move a model across it from one start to the next.
ONE_THREAD_MS = 0.25
FAR = 10  # two runs this many times over ONE_THREAD_MS settle it: a slow model pays 2 runs, not 7


def generated_inputs(model: Any) -> list[dict[str, np.ndarray]]:
    """Inputs for warmup: every declared shape, dynamic dimensions at 1, plus the shapes
    of any configured profiles (min/opt/max), so compiled artefacts cover them. Floats are
    values spread over [0, 1), the same on every start (the accuracy check needs more than
    zeros; bfloat16 as its bit patterns); integers, booleans and strings are zeros, false
    and empty (valid indices and tokens)."""
    rng = _Spread()
    runs = []
    for shapes in caches.warmup_shapes(model.spec):
        feeds = {}
        for spec in model.inputs:
            if spec.name in shapes:
                feeds[spec.name] = _sample(spec.dtype, shapes[spec.name], rng)
        runs.append(feeds)
    return runs

def run(model: Any, strict: bool = False) -> dict[str, Any]:
    """Run the warmup inputs, then: which provider ran which nodes (from the profile),
    the error against the CPU provider per output, and the compiled cache published.
    strict: a failure is an error (the warmup command), not a warning (serving)."""
    cache = model.cache
    state: dict[str, Any] = {"state": "running", "key": cache.key if cache else None,
                             "cache": cache.source if cache else "none"}
    model.warmup_state = state
    started = time.perf_counter()
    runs: list[dict[str, np.ndarray]] = []
    try:
        runs = generated_inputs(model)
        answers = [model.run(feeds) for feeds in runs]
    except Exception as e:  # the model may need real inputs; serving goes on
        model.end_profiling()
        state.update(state="failed", error=str(e).splitlines()[0][:300])
        if strict:
            raise StartupError(f"warmup failed: {state['error']}") from None
        log.warning("warmup failed (%s); serving anyway", state["error"])
        return state
    seconds = time.perf_counter() - started
    state["partition"], cpu_ops = _partition(model)
    state["accuracy"], reference = _accuracy(model, runs, answers)
    primary = model.requested[0]
    if primary != "CPUExecutionProvider" and state["partition"]:
        total = sum(state["partition"].values())
        on_cpu = state["partition"].get("CPUExecutionProvider", 0)
        if total and on_cpu * 2 > total:
            log.warning("%s runs only %d of %d nodes; %d run on CPU (%s)", primary, total - on_cpu, total, on_cpu,
                        ", ".join(cpu_ops[:12]))
    shapes = [{k: list(v.shape) for k, v in feeds.items()} for feeds in runs]
    model.publish_cache({"shapes": shapes, "seconds": round(seconds, 4), "partition": state["partition"],
                        "accuracy": state["accuracy"]})
    state.update(state="done", runs=len(runs), seconds=round(seconds, 4))
    limits = model.spec.accuracy
    if limits and state["accuracy"] and reference is not None:
        problem = caches.violation(state["accuracy"], reference[0], reference[1], limits.atol, limits.rtol)
        if problem:
            state.update(state="failed", error=problem)
            raise AccuracyError(problem)
    return state


def tune_threads(model: Any) -> dict[str, Any]:
    """On CPU with the thread count left to us, after warmup: a fixed rule, so that the same
    image serves with the same thread count on every start. The all-CPU session already
    loaded times a few warm runs (their median, see _run_cost); a run under ONE_THREAD_MS is
    too cheap for parallelism to pay (extra threads only take the HTTP side's CPU), and only
    then a 1-thread session replaces it (before ready, so no request sees the swap). Every
    other model keeps every CPU, without a second session. GPUX_THREADS wins."""
    settings, current = model.settings, model.threads
    cpus = settings.threads
    if model.active[:1] != ["CPUExecutionProvider"] and not settings.threads_set:
        model.threads = {**current, "chosen": "accelerator",
                        "why": f"{model.active[0]} runs the model; the intra-op threads ({cpus}) serve only "
                               "the nodes it leaves to the CPU, so no run is timed"}
        return model.threads
    if settings.threads_set or cpus < 2 or model.path is None:
        return current
    if model.spec.runtime.enable_profiling:
        why = f"{every_cpu(cpus)}; runtime.enable_profiling keeps the profiled session"
        model.threads = {**current, "why": why}
        return model.threads
    feeds = (generated_inputs(model) or [{}])[0]
    try:
        run_ms = round(_run_cost(lambda: model.run(feeds), ONE_THREAD_MS), 3)
    except Exception as e:  # choosing is an optimisation: never a reason not to serve
        log.warning("could not time a run (%s); keeping %d threads", last_line(e), cpus)
        model.threads = {**current, "why": f"{every_cpu(cpus)}; a run could not be timed ({last_line(e)})"}
        return model.threads
    if run_ms >= ONE_THREAD_MS:
        model.threads = {"intra_op": cpus, "chosen": "rule", "run_ms": run_ms,
                        "why": f"a run takes {run_ms:g} ms on {cpus} threads (>= {ONE_THREAD_MS:g} ms): "
                               f"{every_cpu(cpus)}"}
        log.info("intra-op threads: %d (%s)", cpus, model.threads["why"])
        return model.threads
    limits, size = settings.limits, model.spec.model.size_bytes
    if size > MAX_TUNE_BYTES or (limits is not None and size * 4 > limits.memory):
        model.threads = {"intra_op": cpus, "chosen": "rule", "run_ms": run_ms,
                        "why": f"a run takes {run_ms:g} ms on {cpus} threads (< {ONE_THREAD_MS:g} ms), but the "
                               f"model ({size >> 20} MiB) is too large to load a 1-thread session beside it: "
                               f"{every_cpu(cpus)}"}
        return model.threads
    import onnxruntime as ort

    every = model.session
    try:
        model.session = ort.InferenceSession(str(model.path), session_options(settings, 1),
                                            providers=["CPUExecutionProvider"],
                                            disabled_optimizers=list(model.spec.model.transformers_done) or None)
        model.run(feeds)  # warm: its first run allocates
    except Exception as e:
        model.session = every
        log.warning("could not load a 1-thread session (%s); keeping %d threads", last_line(e), cpus)
        model.threads = {**current, "why": f"{every_cpu(cpus)}; a 1-thread session failed ({last_line(e)})"}
        return model.threads
    model.threads = {"intra_op": 1, "chosen": "rule", "run_ms": run_ms,
                    "why": f"a run takes {run_ms:g} ms on {cpus} threads (< {ONE_THREAD_MS:g} ms): too cheap for "
                           f"parallelism to pay; 1 thread, the other CPUs serve HTTP"}
    log.info("intra-op threads: 1 (%s)", model.threads["why"])
    return model.threads


def inline_run_bytes(model: Any, batching: bool) -> int:
    """Input bytes up to which a request's run is made on the event loop itself, not handed to a
    worker thread and back (0: never). Only for a model tune_threads found too cheap for threads
    (one intra-op thread, a run of the warmup's inputs under ONE_THREAD_MS) and without batching
    (a batch is made in the scheduler): up to twice the warmup's input bytes, a run of at most
    about a millisecond; the two hand-offs it saves cost more than the run (8 clients: 1.13x the
    requests a second for a small CNN)."""
    threads = model.threads
    if batching or threads.get("intra_op") != 1 or threads.get("chosen") != "rule" or \
            not 0 < float(threads.get("run_ms") or ONE_THREAD_MS) < ONE_THREAD_MS:
        return 0
    inputs = generated_inputs(model)
    return 2 * sum(a.nbytes for a in inputs[0].values()) if inputs else 0


def _partition(model: Any) -> tuple[dict[str, int], list[str]]:
    events = model.end_profiling()
    if model.requested == ["CPUExecutionProvider"] and not events:  # not profiled: every node on CPU
        nodes = model.spec.model.nodes
        return ({"CPUExecutionProvider": int(nodes)} if nodes else {}), []
    if not events:
        return {}, []
    return caches.partition(events, model.spec.model.nodes)

def _accuracy(model: Any, runs: list[dict[str, np.ndarray]],
              answers: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, Any]:
    """Against a CPU session of the same model, on the warmup inputs: the worst error per output,
    and the two sets of answers compared (ours, the CPU provider's)."""
    if model.active[:1] == ["CPUExecutionProvider"] or not runs:
        return None, None
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    path = model.settings.root / model.spec.model.path
    cpu = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in model.outputs]
    bf16 = {s.name for s in (*model.inputs, *model.outputs) if s.dtype in BINARY_ONLY}
    ref_runs = [dict(zip(names, run_bf16(cpu, names, feeds, None, bf16) if bf16 else cpu.run(names, feeds)))
                for feeds in runs]
    # bfloat16 compared as the float32 values its bits stand for, not as the bits
    values = {n: bf16_to_float32 if n in bf16 else np.ravel for n in names}
    ours = {n: np.concatenate([np.ravel(values[n](a[n])) for a in answers]) for n in names}
    reference = {n: np.concatenate([np.ravel(values[n](r[n])) for r in ref_runs]) for n in names}
    return caches.accuracy(ours, reference), (ours, reference)


def _run_cost(run: Any, threshold: float, most: int = 7) -> float:
    """The median time (ms) of up to `most` warm runs, stopping once the side of `threshold` it
    falls on is settled: a majority of `most` runs on one side, or two runs FAR times over it.
    A median over a majority is robust to the odd run a busy machine slows down."""
    times: list[float] = []
    while len(times) < most:
        started = time.perf_counter()
        run()
        times.append(1000 * (time.perf_counter() - started))
        above = sum(t >= threshold for t in times)
        if max(above, len(times) - above) > most // 2 or (len(times) >= 2 and min(times) >= FAR * threshold):
            break
    times.sort()  # the median by hand: np.median imports numpy.ma, statistics fractions (8 ms of start-up each)
    return (times[(len(times) - 1) // 2] + times[len(times) // 2]) / 2


class _Spread:
    """Values in [0, 1) that cover the interval as evenly as random ones (a golden-ratio Weyl
    sequence, continued from one tensor to the next), without numpy.random: importing it costs
    10 to 15 ms of every start, and warmup needs varied values, not random ones."""

    STEP = 0.6180339887498949  # the golden ratio's fractional part

    def __init__(self) -> None:
        self.done = 0

    def random(self, shape: list[int], dtype: Any) -> np.ndarray:
        n = 1
        for d in shape:
            n *= d
        values = (np.arange(self.done, self.done + n, dtype=np.float64) * self.STEP + 0.5) % 1.0
        self.done += n
        # the float64 values are under 1; rounding to a narrower type must not reach 1 either
        return np.minimum(values.astype(dtype), np.nextafter(np.asarray(1, dtype), 0)).reshape(shape)


def _sample(dtype: str, shape: list[int], rng: _Spread) -> np.ndarray:
    if dtype == "string":
        return np.full(shape, "", dtype=object)
    np_type = DTYPES[dtype][0]
    if dtype in BINARY_ONLY:  # bfloat16: float32 values in [0, 1) as its bit patterns
        return float32_to_bf16(rng.random(shape, dtype=np.float32))
    if np.issubdtype(np_type, np.floating):
        return rng.random(shape, dtype=np_type)  # under 1 in np_type too (float16 rounds up)
    return np.zeros(shape, dtype=np_type)
