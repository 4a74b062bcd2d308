"""Request bodies -> validated numpy feeds, and outputs -> JSON.

Every check names the input and what is wrong; a bad request costs the server nothing.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import orjson

from .contract import BINARY_ONLY, DTYPES, Tensor


class RequestError(Exception):
    """A client mistake, or a request refused: answered with `status` and {"error": message}.
    `refused`: the reason gpux_refused_total counts it under (503s are "busy" and 504s "timeout"
    unless they say otherwise); counted once, where the answer is made."""

    def __init__(self, message: str, status: int = 400, allow: str | None = None, refused: str | None = None):
        super().__init__(message)
        self.status, self.allow = status, allow
        self.refused = refused or {503: "busy", 504: "timeout"}.get(status)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16, how the runtime carries BF16) as the float32 values they are."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns, rounded to nearest even (NaN stays NaN)."""
    wide = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = ((wide + np.uint32(0x7FFF) + ((wide >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def json_refused(spec: "ServedTensor", output: bool = False, v2: bool = True) -> RequestError:
    """The 400 for a tensor whose datatype JSON cannot carry (BF16), naming it and the way that works."""
    if output:
        how = "ask for it as binary data (parameters.binary_data: true)" if v2 else \
            "ask the KServe v2 infer endpoint for it as binary data (parameters.binary_data: true), or use gRPC"
    else:
        how = "send it as binary data (parameters.binary_data_size)" if v2 else \
            "send it to the KServe v2 infer endpoint as binary data (parameters.binary_data_size), or use gRPC"
    kind = "output" if output else "input"
    return RequestError(f"{kind} '{spec.name}' is {spec.datatype}, which JSON cannot carry: {how}")


MAX_DEPTH = 1024  # orjson's own limit: deeper is one clean error, never a recursion in Python
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_NUMERIC = b"0123456789.,-+eE[] \n\r\t"


def plain_numbers(raw: bytes, body: Any, v2: bool) -> bool:
    """The tensors' data hold numbers only, so a float input may convert in one step (numpy
    would take true as 1.0 and "1.5" as 1.5): no true/false/null in the body, and every quote
    in it belongs to a key or a value outside the data."""
    rest = raw.translate(None, _NUMERIC)  # one pass; what is left is keys, strings and literals
    if b"tru" in rest or b"fals" in rest or b"null" in rest or b"\\" in rest:  # the e's went with exponents
        return False
    return rest.count(b'"') == 2 * _strings(body, skip_values=not v2)


def _strings(value: Any, skip_values: bool = False) -> int:
    """Keys and string values outside tensor data ("data", or a /predict body's values)."""
    if isinstance(value, dict):
        return len(value) + sum(0 if skip_values or k == "data" else _strings(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_strings(v) for v in value if isinstance(v, (dict, list, str)))
    return 1 if isinstance(value, str) else 0


def parse_json(raw: bytes | memoryview, what: str = "malformed JSON") -> Any:
    """A request body as JSON (orjson: several times stdlib json's speed; it refuses nesting
    deeper than MAX_DEPTH itself, in C, without recursing)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if str(e).startswith("depth limit exceeded"):
            raise RequestError(f"the JSON body is nested deeper than {MAX_DEPTH} levels") from None
        raise RequestError(f"{what}: {e}") from None


def dumps(value: Any) -> bytes:
    """Strict JSON, numpy arrays written by orjson itself (no tolist); NaN and infinities become
    null. What orjson cannot hold (a float16 array, an object array, a set) goes through to_json."""
    try:
        return orjson.dumps(value, option=_OPTIONS)
    except TypeError:
        return orjson.dumps(to_json(value), option=_OPTIONS)


# ---------------------------------------------------------------------------------------------
# Large numeric arrays straight from the JSON text: the Python objects of one piece at a time


JSON_FACTOR = 40  # what orjson's Python objects peak at per byte of JSON text: measured 13x (true)
                  # to 23x (float rows) and 36x (small dicts), bench/json_memory.py
FAST_MIN = 64 * 1024  # arrays this large (bytes of text) are decoded from the text itself ...
WHOLE_PARSE = 1 << 20  # ... in a body larger than this: up to it a body is parsed in one call (orjson, then
                       # NumPy), 1.3-1.5x faster than reading its arrays from the text (95 KiB: 0.35 against 0.52 ms
                       # and the 0.13 ms scan), where the request's budget holds what that takes (JSON_FACTOR x)
CHUNK = 64 * 1024  # both passes work on pieces of text this large: bounded scratch memory, reused
                  # from the heap (blocks from mmap are page-faulted in afresh every time)
SCRATCH = 2 << 20  # what a pass holds besides the skeleton and the array: a piece's Python objects
                   # (16x its text at worst, "0,0,..."), its copies and its numpy temporaries
_RUN = re.compile(rb"\[[0-9.eE+\-\[\], \t\n\r]*+")  # possessive: each run is scanned once
_TOKENS = bytes.maketrans(b"0123456789.eE+-", b"n" * 15)  # a number's characters -> n
_UNBRACKET = bytes.maketrans(b"[]", b"  ")
_WS = b" \t\n\r"
_PLACEHOLDER = b'{"\\u0000":%d}'  # a key no request can hold: a raw control character is not JSON
_HOLE = "\0"
_NUMERIC_KINDS = "fiu"  # inputs whose JSON data may be read from the text: floats and integers


@dataclass
class NumericBody:
    """A JSON body whose large arrays are all numbers: the rest parsed (small), each array left
    as a hole {"\\0": i} to be filled from spans[i] of the text."""

    raw: bytes
    skeleton: Any
    spans: list[tuple[int, int]]

    def decode_cost(self, itemsize: int = 8) -> int:
        """Bytes decoding may hold at once: the skeleton's objects, the structure check (twice
        the arrays' text at most), each array (at most one number per two bytes of text), and
        one pass's scratch (bench/json_memory.py: 1.8x to 6.5x for a 2 MB body, all counted)."""
        text = sum(end - start for start, end in self.spans)
        return (len(self.raw) - text) * JSON_FACTOR + text * (4 + itemsize) // 2 + SCRATCH

    def fill(self, spec_of: Any) -> Any:
        """The skeleton with each hole replaced by its array, for the input `spec_of(path)`
        gives (None: the hole stays, and the decoders refuse it as an object where a list belongs)."""
        return self._filled(self.skeleton, (), spec_of)

    def _filled(self, value: Any, path: tuple, spec_of: Any) -> Any:
        """A method, not a recursive closure: a closure that calls itself is a reference cycle,
        and it kept each body's text alive until the garbage collector's next full pass (a burst
        of large bodies held 40-75 MB more than after it)."""
        if isinstance(value, dict):
            if len(value) == 1 and _HOLE in value:
                spec = spec_of(path)
                return value if spec is None else numeric_array(self.raw, *self.spans[value[_HOLE]], spec)
            return {k: self._filled(v, (*path, k), spec_of) for k, v in value.items()}
        if isinstance(value, list):
            return [self._filled(v, (*path, i), spec_of) for i, v in enumerate(value)]
        return value


def numeric_body(raw: bytes) -> NumericBody | None:
    """The body's large all-number arrays found without parsing it (None: there are none, or
    the text cannot be split safely). An array counts only as an object's value (after `:`,
    before `,` or `}`), outside strings (quote parity; a body with a backslash is not split)."""
    if len(raw) < FAST_MIN or b"\\" in raw:
        return None
    spans: list[tuple[int, int]] = []
    quotes, last = 0, 0
    for m in _RUN.finditer(raw):
        start, end = m.span()
        if end - start < FAST_MIN:
            continue
        end = raw.rindex(b"]", start, end) + 1
        quotes += raw.count(b'"', last, start)
        last = start
        if end - start < FAST_MIN or quotes & 1 or raw.count(b"[", start, end) != raw.count(b"]", start, end):
            continue
        if raw[max(0, start - 64): start].rstrip(_WS)[-1:] != b":" or raw[end: end + 64].lstrip(_WS)[:1] not in (b",", b"}"):
            continue
        spans.append((start, end))
    if not spans:
        return None
    parts, at = [], 0
    for i, (start, end) in enumerate(spans):
        parts += [raw[at:start], _PLACEHOLDER % i]
        at = end
    parts.append(raw[at:])
    return NumericBody(raw, parse_json(b"".join(parts)), spans)


def hole_inputs(body: NumericBody, inputs: Sequence["ServedTensor"], overridable: Sequence["ServedTensor"],
                v2: bool) -> dict[tuple, "ServedTensor | None"] | None:
    """The input each hole's array is the data of (None: the hole is no input's data, and the
    decoders refuse it as they would any object there). None for the whole body when a hole is
    the data of an input that is not numeric (strings, booleans, BF16): then the body is parsed
    as usual, and the decoders' own messages apply."""
    by_name = {s.name: s for s in (*overridable, *inputs)}
    out: dict[tuple, ServedTensor | None] = {}
    for path in _holes(body.skeleton, ()):
        spec = None
        if v2 and len(path) == 3 and path[0] == "inputs" and path[2] == "data":
            item = body.skeleton["inputs"][path[1]]
            spec = by_name.get(item.get("name"))  # type: ignore[arg-type]
            if spec is not None and item.get("datatype") != spec.datatype:
                spec = None  # v2.check names the mismatch
        elif not v2 and (len(path) == 1 or len(path) == 2 and path[0] == "inputs" and "inputs" not in by_name):
            spec = by_name.get(path[-1])
        if spec is None:
            out[path] = None
        elif spec.dtype not in BINARY_ONLY and np.dtype(DTYPES.get(spec.dtype, ("O",))[0]).kind in _NUMERIC_KINDS:
            out[path] = spec
        else:
            return None
    return out


def _holes(value: Any, path: tuple) -> list[tuple]:
    if isinstance(value, dict):
        if len(value) == 1 and _HOLE in value:
            return [path]
        return [p for k, v in value.items() for p in _holes(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _holes(v, (*path, i))]
    return []


def numeric_array(raw: bytes, start: int, end: int, spec: "ServedTensor") -> np.ndarray:
    """raw[start:end], a JSON array of numbers, as an array of `spec`'s dtype. Two passes, each
    over bounded pieces: the structure (its shape from the brackets, every row the same length,
    or a 400), then the numbers, parsed by orjson a piece at a time with the brackets blanked
    out, so JSON's own grammar judges every number and the Python objects of one piece at most
    exist at once."""
    what = f"input '{spec.name}'"
    shape = _shape(raw, start, end, what)
    count = math.prod(shape)
    out = np.empty(count, np.dtype(DTYPES[spec.dtype][0]))
    if not count:
        return out.reshape(shape)  # the structure check saw no number at all
    filled, a = 0, start
    while True:
        b = raw.find(b",", min(end, a + CHUNK), end)  # pieces end between two numbers
        last = b < 0
        piece = b"[" + raw[a: end if last else b].translate(_UNBRACKET) + b"]"
        try:
            values = orjson.loads(piece)
        except orjson.JSONDecodeError:
            raise RequestError(f"{what}: malformed JSON number") from None
        del piece
        if filled + len(values) > count:
            break
        out[filled: filled + len(values)] = to_array(spec, values, what, fast=True)
        filled += len(values)
        del values
        if last:
            break
        a = b + 1
    if filled != count or not last:
        raise RequestError(f"{what}: the nested lists hold {count} places but the numbers do not fill them")
    return out.reshape(shape)


def _shape(raw: bytes, start: int, end: int, what: str) -> tuple[int, ...]:
    """The shape of the nested lists in raw[start:end], from their skeleton (each number one
    'n', whitespace gone), built in pieces; a 400 unless every row has the same length."""
    pieces, previous = [], False
    for a in range(start, end, CHUNK):
        text = np.frombuffer(raw[a: min(end, a + CHUNK)].translate(_TOKENS, _WS), np.uint8)
        if not text.size:
            continue
        number = text == ord("n")
        follows = np.empty_like(number)
        follows[0], follows[1:] = previous, number[:-1]
        pieces.append(text[~(number & follows)].tobytes())
        previous = bool(number[-1])
        del text, number, follows
    skeleton = b"".join(pieces)
    del pieces
    shape = _shape_of(skeleton)
    if shape is None or _skeleton(shape) != skeleton:
        if any(bad in skeleton for bad in (b",,", b",]", b"[,", b"n[", b"]n", b"][")):
            raise RequestError(f"{what}: malformed JSON array")
        raise RequestError(f"{what}: ragged nested lists (every row needs the same length)")
    return shape


def _shape_of(skeleton: bytes) -> tuple[int, ...] | None:
    """The shape a regular array's skeleton ([[n,n],[n,n]]) would have, read along its first
    row at each depth (the caller compares the skeleton of that shape with the whole)."""
    rank = len(skeleton) - len(skeleton.lstrip(b"["))
    if rank == 0 or rank > 32:
        return None
    shape = []
    for depth in range(rank - 1, 0, -1):  # depth: how many brackets an element still has
        end = skeleton.find(b"]" * depth, 1)
        if end < 0:
            return None
        element = skeleton[1: end + depth]
        count, rest = divmod(len(skeleton) - 1, len(element) + 1)
        if rest:
            return None
        shape.append(count)
        skeleton = element
    shape.append(skeleton.count(b",") + 1 if skeleton != b"[]" else 0)
    return tuple(shape)


def _skeleton(shape: tuple[int, ...]) -> bytes:
    """The skeleton of a regular array of this shape."""
    row = b"n," * (shape[-1] - 1) + b"n" if shape[-1] else b""
    row = b"[" + row + b"]"
    for n in reversed(shape[:-1]):
        row = b"[" + (row + b",") * (n - 1) + row + b"]" if n else b"[]"
    return row


@dataclass(frozen=True)
class ServedTensor:
    """An input or output as the runtime serves it, read from gpux.json (gpux.yml's declaration is
    project.config.TensorSpec)."""

    name: str
    dtype: str  # canonical dtype, or sequence/map/optional for non-tensor outputs
    shape: tuple[int | str, ...] | None  # int >= 0 fixed, -1 or str dynamic
    required: bool = True
    encoded: bool = False  # BYTES of encoded media (an image): kept as bytes, not read as UTF-8 text

    @classmethod
    def of(cls, t: Tensor, required: bool | None = None) -> "ServedTensor":
        """gpux.json's entry; required: where a preprocessing step may feed it instead."""
        return cls(t.name, t.type, t.shape, t.required if required is None else required, t.encoded)

    @property
    def datatype(self) -> str:
        """KServe v2 datatype."""
        return DTYPES[self.dtype][1] if self.dtype in DTYPES else "BYTES"

    @property
    def itemsize(self) -> int:
        """Bytes an element holds in memory (a string or non-tensor value counts as a pointer's 8)."""
        return np.dtype(DTYPES[self.dtype][0]).itemsize if self.dtype in DTYPES and self.dtype != "string" else 8

    @property
    def v2_shape(self) -> list[int]:
        return [d if isinstance(d, int) else -1 for d in (self.shape or ())]


def _kind_name(arr: np.ndarray) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers", "U": "strings", "S": "strings"}.get(
        arr.dtype.kind, "mixed values"
    )


def to_array(spec: ServedTensor, value: Any, what: str, fast: bool = False) -> np.ndarray:
    """A JSON value (nested lists or a scalar) as an array of the input's dtype. fast: the body
    holds no true/false/null, so a float input converts in one step (numpy would otherwise take
    booleans as numbers)."""
    if isinstance(value, dict):
        raise RequestError(f"{what}: expected a nested list of values, got an object")
    if spec.dtype in BINARY_ONLY:
        raise json_refused(spec, v2=False)
    if spec.dtype == "string":
        try:
            arr = np.array(value, dtype=object)
        except ValueError:
            raise RequestError(f"{what}: ragged nested lists (every row needs the same length)") from None
        if not all(isinstance(v, str) for v in arr.ravel()):
            raise RequestError(f"{what}: expected strings")
        return arr
    target = np.dtype(DTYPES[spec.dtype][0])
    if fast and target.kind == "f" and isinstance(value, list):
        try:  # straight to the input's dtype: no float64 array on the way
            return np.array(value, dtype=target)
        except (ValueError, TypeError, OverflowError):
            pass  # strings, ragged lists, ...: the checks below say what is wrong
    try:
        arr = np.asarray(value)
    except (ValueError, OverflowError) as e:
        msg = "ragged nested lists (every row needs the same length)" if "inhomogeneous" in str(e) else str(e)
        raise RequestError(f"{what}: {msg}") from None
    kind = arr.dtype.kind
    if arr.size == 0 and kind == "f":
        kind = target.kind  # [] parses as float64: nothing in it to be of a wrong type
    if kind == "O" or kind in "US":
        raise RequestError(f"{what}: expected {spec.dtype} values, got {_kind_name(arr)} (or nulls)")
    if target.kind == "b" and kind != "b":
        raise RequestError(f"{what}: expected booleans (true/false), got {_kind_name(arr)}")
    if target.kind in "iu":
        if kind not in "iu":
            raise RequestError(f"{what}: expected {spec.dtype} integers, got {_kind_name(arr)}")
        if arr.size:
            info = np.iinfo(target)
            lo, hi = arr.min(), arr.max()
            if int(lo) < info.min or int(hi) > info.max:
                raise RequestError(f"{what}: values outside the {spec.dtype} range [{info.min}, {info.max}]")
    if target.kind == "f" and kind == "b":
        raise RequestError(f"{what}: expected {spec.dtype} numbers, got booleans")
    return arr.astype(target, copy=False)


def check_shape(spec: ServedTensor, arr: np.ndarray, what: str, dims: dict[str, tuple[int, str]]) -> None:
    """Rank and fixed dimensions as the model declares them; a named dynamic dimension must
    have one size across all inputs of a request."""
    if spec.shape is None:
        return
    if arr.ndim != len(spec.shape):
        raise RequestError(
            f"{what}: expected rank {len(spec.shape)} {_shape_text(spec.shape)}, got shape {list(arr.shape)}"
        )
    for i, (want, got) in enumerate(zip(spec.shape, arr.shape)):
        if isinstance(want, int) and want >= 0 and want != got:
            raise RequestError(
                f"{what}: dimension {i} must be {want} {_shape_text(spec.shape)}, got shape {list(arr.shape)}"
            )
        if isinstance(want, str):
            seen = dims.setdefault(want, (got, spec.name))
            if seen[0] != got:
                raise RequestError(
                    f"{what}: dimension '{want}' is {got} here but {seen[0]} in input '{seen[1]}'"
                )


def _shape_text(shape: tuple[int | str, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def decode_predict(
    body: Any, inputs: list[ServedTensor], overridable: Sequence[ServedTensor] = (), fast: bool = False,
    outputs: Sequence[ServedTensor] = (),
) -> dict[str, np.ndarray]:
    """GPUX: {"<input>": nested list, ...}. `overridable` inputs (initializers) are accepted but
    never named in errors: a model-zoo graph has hundreds. `outputs`: the answer's tensors, all
    of them JSON (one JSON cannot carry is a 400 here, before the model runs)."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object mapping input names to nested lists")
    by_name = {s.name: s for s in (*overridable, *inputs)}
    if "inputs" in body and "inputs" not in by_name and isinstance(body["inputs"], dict):
        body = body["inputs"]  # tolerate {"inputs": {...}} as GPUX clients sometimes send
    for name in body:
        if name not in by_name:
            raise RequestError(f"unknown input '{name}'; the model's inputs are: {_names(inputs)}")
    for spec in inputs:
        if spec.required and spec.name not in body:
            raise RequestError(f"missing required input '{spec.name}'")
    for name in body:
        if by_name[name].dtype in BINARY_ONLY:
            raise json_refused(by_name[name], v2=False)
    for spec in outputs:
        if spec.dtype in BINARY_ONLY:
            raise json_refused(spec, output=True, v2=False)
    feeds: dict[str, np.ndarray] = {}
    dims: dict[str, tuple[int, str]] = {}
    for name, value in body.items():
        spec = by_name[name]
        what = f"input '{name}'"
        arr = to_array(spec, value, what, fast)
        if arr.ndim == 0 and spec.shape is not None and tuple(spec.shape) == (1,):
            arr = arr.reshape(1)  # GPUX's {"text": "I love this product!"} for an input of shape [1]
        check_shape(spec, arr, what, dims)
        feeds[name] = arr
    return feeds


def decode_predict_batch(
    body: list[Any], inputs: list[ServedTensor], overridable: Sequence[ServedTensor], outputs: Sequence[ServedTensor],
    most: int,
) -> list[dict[str, np.ndarray]]:
    """GPUX's batch form: a JSON array of /predict objects, each decoded as one; an error names
    the item. At most `most` items (the scheduler's queue: each is a run)."""
    if not body:
        raise RequestError("the array holds no request; send [{\"<input>\": ...}, ...] or one object")
    if len(body) > most:
        raise RequestError(f"{len(body)} requests in one array; this server takes at most {most} at once "
                           "(GPUX_MAX_QUEUE)", 413)
    feeds = []
    for i, item in enumerate(body):
        try:
            feeds.append(decode_predict(item, inputs, overridable, False, outputs))
        except RequestError as e:
            raise RequestError(f"request [{i}]: {e}", e.status) from None
    return feeds


def _names(inputs: list[ServedTensor]) -> str:
    return ", ".join(s.name for s in inputs)


def encode_predict(outputs: dict[str, Any]) -> bytes:
    """GPUX: {"<output>": nested list}, numpy arrays written by orjson directly."""
    return dumps({name: _plain(value) for name, value in outputs.items()})


def labelled(outputs: dict[str, Any], labels: dict[str, list[str]]) -> dict[str, Any]:
    """/predict's answer with GPUX's "labels" (gpux.yml's outputs[].labels) and, per row, the top
    label and its score ("predicted"); keyed by output when several outputs have labels. An
    output whose last dimension does not match its labels (a dynamic one) answers without them."""
    found: dict[str, tuple[list[str], list[dict[str, Any]]]] = {}
    for name, names in labels.items():
        value = outputs.get(name)
        if not isinstance(value, np.ndarray) or value.ndim == 0 or value.shape[-1] != len(names) or not names:
            continue
        if value.dtype.kind not in "fiub":
            continue
        rows = value.reshape(-1, value.shape[-1])
        top = rows.argmax(axis=1)
        scores = rows[np.arange(len(top)), top].tolist()  # one NumPy pass, not an index per row
        found[name] = (names, [{"label": names[j], "score": score} for j, score in zip(top.tolist(), scores)])
    if not found or "labels" in outputs or "predicted" in outputs:
        return outputs
    if len(found) == 1:
        names, predicted = next(iter(found.values()))
        return {**outputs, "labels": names, "predicted": predicted}
    return {**outputs, "labels": {k: v[0] for k, v in found.items()}, "predicted": {k: v[1] for k, v in found.items()}}


def _plain(value: Any) -> Any:
    """An answer's value as orjson takes it: a numeric array as it is; lists and dicts (labels,
    predicted, a sequence output) too, dumps() falling back to to_json where orjson cannot (a key
    that is no string, bytes): walking 3,072 `predicted` rows in Python cost 3.5 ms, orjson 0.3."""
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value) if value.dtype.kind not in "OUS" and value.dtype != np.float16 \
            else to_json(value)
    return value if isinstance(value, (list, dict)) else to_json(value)


def to_json(value: Any) -> Any:
    """numpy -> JSON-able; non-finite floats become null (strict JSON has no NaN), anything
    else JSON cannot hold becomes its str()."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return _finite(value.tolist())
        if value.dtype.kind in "SO":
            return [to_json(v) for v in value] if value.ndim else to_json(value.item())
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return to_json(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, (str, int, float)):
        return value
    return str(value)  # anything else JSON has no word for: its text rather than a 500


def _finite(v: Any) -> Any:
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v if not isinstance(v, float) or math.isfinite(v) else None


# ---------------------------------------------------------------------------------------------
# KServe v2 / Open Inference Protocol (REST, JSON tensors)


def from_binary(spec: ServedTensor, data: memoryview, count: int, what: str) -> np.ndarray:
    """Raw little-endian tensor bytes, or BYTES elements as a 4-byte length and the bytes."""
    if spec.dtype == "string":
        out, pos, raw = [], 0, bytes(data)
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise RequestError(f"{what}: BYTES data ends inside an element's length")
            (n,) = struct.unpack_from("<I", raw, pos)
            pos += 4
            if pos + n > len(raw):
                raise RequestError(f"{what}: a BYTES element of {n} bytes runs past the tensor's data")
            try:
                out.append(raw[pos: pos + n] if spec.encoded else raw[pos: pos + n].decode("utf-8"))
            except UnicodeDecodeError:
                raise RequestError(f"{what}: a BYTES element is not UTF-8 text") from None
            pos += n
        if len(out) != count:
            raise RequestError(f"{what}: the shape needs {count} elements, the binary data holds {len(out)}")
        return np.array(out, dtype=object)
    dtype = np.dtype(DTYPES[spec.dtype][0]).newbyteorder("<")
    if len(data) != count * dtype.itemsize:
        raise RequestError(f"{what}: the shape needs {count * dtype.itemsize} bytes of {spec.datatype}, "
                           f"binary_data_size is {len(data)}")
    return np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("="), copy=False)


def to_binary(arr: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for v in arr.reshape(-1):
            b = v if isinstance(v, bytes) else str(v).encode("utf-8")
            parts += [struct.pack("<I", len(b)), b]
        return b"".join(parts)
    return binary_view(arr).tobytes()


def binary_view(arr: np.ndarray) -> memoryview:
    """A numeric array's little-endian bytes without copying them (joined into the answer once)."""
    return memoryview(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).reshape(-1)).cast("B")
