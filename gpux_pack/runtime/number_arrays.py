"""GPUX's /predict body of number arrays, read straight into NumPy: simdjson (pysimdjson) parses
the body and copies each array's numbers into one buffer, without a Python object per number
(GPUX's 95 KiB body for a [1, 3, 64, 64] input: 0.15 ms, against 0.35 ms for orjson's lists and
NumPy's copy of them, and the lists' 12,288 floats to free after).

Only the plainest body is taken: a JSON object whose keys are distinct inputs of a float type,
each value a regular nested array of numbers (every row of a level as long as the first, no
array where a number belongs: the body holds exactly the brackets that shape needs). Anything
else, a body simdjson refuses included, is None: the general decoder then reads it and says
what is wrong, so the answers and the refusals are the same either way."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

_local = threading.local()  # a parser keeps its buffers between bodies: each thread has its own


def arrays(raw: bytes, dtypes: dict[str, np.dtype]) -> dict[str, np.ndarray] | None:
    """{input: array}, each of its input's dtype (`dtypes`: the float inputs'), or None."""
    try:
        import simdjson
    except ImportError:  # `gpux-pack serve` without it: the general decoder
        return None
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = simdjson.Parser()
    try:
        doc = parser.parse(raw)
    except RuntimeError:  # an earlier body's proxies are still alive somewhere: a parser of its own
        parser = _local.parser = simdjson.Parser()
        try:
            doc = parser.parse(raw)
        except (ValueError, RuntimeError):
            return None
    except ValueError:  # not JSON, or numbers simdjson will not read: the general decoder says which
        return None
    try:
        return _read(simdjson, doc, raw, dtypes)
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError):
        return None
    finally:
        del doc  # the parser may parse again only once its proxies are gone


def _read(simdjson: Any, doc: Any, raw: bytes, dtypes: dict[str, np.dtype]) -> dict[str, np.ndarray] | None:
    if not isinstance(doc, simdjson.Object):
        return None
    keys = list(doc.keys())
    if not keys or len(set(keys)) != len(keys) or any(key not in dtypes for key in keys):
        return None  # a repeated key: orjson keeps the last, simdjson the first
    out, brackets = {}, 0
    for key in keys:
        value = doc[key]
        shape = _shape(simdjson, value)
        if shape is None:
            return None
        numbers = np.frombuffer(value.as_buffer(of_type="d"), np.float64)
        del value
        if numbers.size != math.prod(shape):
            return None
        brackets += sum(math.prod(shape[:depth]) for depth in range(len(shape)))
        with np.errstate(over="ignore"):  # past float32's range: inf, as from the lists, without a warning
            out[key] = numbers.reshape(shape).astype(dtypes[key], copy=False)
    if raw.count(b"[") != brackets:  # an array among the last level's numbers, or a '[' in a key
        return None
    return out


def _shape(simdjson: Any, value: Any) -> tuple[int, ...] | None:
    """The shape of a regular nested array: every array of a level as long as the first."""
    if not isinstance(value, simdjson.Array):
        return None
    shape: list[int] = []
    level = [value]
    while True:
        n = len(level[0])
        if any(len(a) != n for a in level):
            return None
        shape.append(n)
        if n == 0 or not isinstance(level[0][0], simdjson.Array):
            return tuple(shape)
        level = [x for a in level for x in a]
        if not all(isinstance(x, simdjson.Array) for x in level):
            return None
