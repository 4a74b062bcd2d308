"""One request without the server, for the command line: `predict --request FILE` answers a
KServe v2 infer request (the binary tensor extension included) as /predict answers its inputs,
and `bench` times the model on it. So a program (`gpux-pack predict PATH`) runs the image's
runtime as it is, checks and preprocessing included, instead of importing its parts."""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from .contract import BINARY_ONLY
from .session import Items, Model, joined, rejected
from .tensors import RequestError, bf16_to_float32, labelled
from .v2 import decode_rest, split_binary

STATISTICS = ("mean", "std", "min", "max", "median", "p95", "p99")  # GPUX's `run --benchmark`, in ms


def read(path: str, header_length: int | None) -> tuple[Any, memoryview]:
    """The request's JSON header and the binary data after it, from FILE (- : stdin); without a
    header length the whole file is the JSON request."""
    try:
        if path == "-":
            body = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                body = f.read()
    except OSError as e:
        raise RequestError(f"--request {path}: {e.strerror or e}") from None
    if header_length is None:
        return split_binary(body, None)
    if not 0 <= header_length <= len(body):
        raise RequestError(f"--header-length {header_length}: expected a byte count within the request's "
                           f"{len(body)} bytes")
    return split_binary(body, str(header_length))


def prepared(model: Model, header: Any, blobs: memoryview) -> tuple[Any, dict[str, Any], list[str] | None]:
    """The request checked as the server checks a v2 infer request, then as the graph takes it
    (text tokenized, images decoded); what /predict answers beside the outputs; the outputs asked for."""
    feeds, request = decode_rest(header, model.inputs, model.outputs, model.overridable, blobs)
    feeds, extra = model.preprocess(feeds)
    return feeds, extra, request.outputs


def run(model: Model, feeds: Any, names: list[str] | None = None) -> dict[str, Any]:
    """One run, or one per item (Items) joined as one batch, as the server runs a request; ONNX
    Runtime's refusal of the values is a RequestError, as the server's 400 is."""
    if not isinstance(feeds, Items):
        return _run(model, feeds, names)
    answers = []
    for i, one in enumerate(feeds):
        try:
            answers.append(_run(model, one, names))
        except RequestError as e:
            raise RequestError(f"item [{i}]: {e}", e.status) from None
    return {name: joined([a[name] for a in answers]) for name in answers[0]}


def _run(model: Model, feeds: dict[str, np.ndarray], names: list[str] | None) -> dict[str, Any]:
    try:
        return model.run(feeds, names)
    except Exception as e:
        raise rejected(e) from None


def answer(model: Model, header: Any, blobs: memoryview) -> dict[str, Any]:
    """What /predict answers for the request's inputs: the outputs (BF16 ones as the float32
    values they hold, which JSON carries), gpux.yml's labels and each row's top one, and what
    preprocessing answers beside (a letterbox's geometry)."""
    feeds, extra, names = prepared(model, header, blobs)
    outputs = run(model, feeds, names)
    bf16 = {s.name for s in model.outputs if s.dtype in BINARY_ONLY}
    outputs = {k: bf16_to_float32(v) if k in bf16 else v for k, v in outputs.items()}
    if model.labels:
        outputs = labelled(outputs, model.labels)
    return {**outputs, **extra}


def bench_feeds(model: Model, header: Any, blobs: memoryview) -> dict[str, np.ndarray]:
    """The graph's inputs for one timed run: a request of several items, each its own run (Items),
    is not one run."""
    feeds, _, _ = prepared(model, header, blobs)
    if isinstance(feeds, Items):
        raise RequestError(f"{len(feeds)} items for a model that takes one per run; bench times one run: "
                           "give one item")
    return feeds


def bench(model: Model, feeds: dict[str, np.ndarray], runs: int, warmup: int) -> dict[str, Any]:
    """model.run alone on these inputs, `warmup` untimed runs first: what the model costs here.
    GPUX's statistics (<statistic>_time_ms, throughput_fps = 1 / mean) and the keys `gpux-pack
    bench` reads (p50_ms, p99_ms, providers, shapes)."""
    for _ in range(warmup):
        _run(model, feeds, None)
    times = np.empty(runs)
    for i in range(runs):
        started = time.perf_counter()
        _run(model, feeds, None)
        times[i] = time.perf_counter() - started
    ms = times * 1000
    values = (ms.mean(), ms.std(), ms.min(), ms.max(), np.median(ms), np.percentile(ms, 95), np.percentile(ms, 99))
    out: dict[str, Any] = {f"{name}_time_ms": round(float(v), 4) for name, v in zip(STATISTICS, values)}
    ordered = np.sort(ms)
    shapes = {name: list(a.shape) for name, a in feeds.items()}
    return {**out, "throughput_fps": round(1000 / max(float(ms.mean()), 1e-9), 2), "runs": runs, "warmup": warmup,
            "provider": model.active[0] if model.active else None, "inputs": shapes,
            "p50_ms": float(ordered[runs // 2]), "p99_ms": float(ordered[min(runs - 1, int(runs * 0.99))]),
            "providers": model.active, "shapes": shapes}
