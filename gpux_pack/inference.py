"""The image's runtime as its clients see it: the KServe v2 infer request `predict` sends (to an
image's server, or to the runtime run as a program on a project), the v2 answer it reads back,
/predict's JSON answer typed by gpux.json, and answers as JSON a user reads.

The binary tensor extension: a JSON header of N bytes, then each binary input's bytes in input
order (numbers little-endian, BYTES elements as a 4-byte length and the bytes). Only gpux.json's
element types (runtime.contract) and numpy: the runtime's own codec checks what arrives, so the
packager never imports it, and a mistake reads the same here as from any client.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpux_pack.errors import PackError
from gpux_pack.runtime.contract import BINARY_ONLY, DTYPES, V2_TO_NAME, GpuxJson, Tensor


class PredictError(PackError):
    """The model or server refused the inputs: exit 2, like any bad input."""

    exit_code = 2


@dataclass(frozen=True)
class Given:
    """One --input: a tensor's values from a .npy file (an array), a .json file or inline JSON
    (nested lists), or a media file for a preprocessing step (its bytes)."""

    name: str
    value: Any
    source: str


@dataclass(frozen=True)
class Input:
    """A model's input, as much of it as a request is checked against before it is sent."""

    name: str
    datatype: str  # KServe v2: FP32, INT64, BYTES, BF16, ...
    required: bool = True

    @property
    def dtype(self) -> str | None:
        """The canonical element type (contract.DTYPES), None for a datatype gpux.json has no name for."""
        return V2_TO_NAME.get(self.datatype)


def inputs_of(spec: GpuxJson) -> list[Input]:
    """gpux.json's inputs; one that a preprocessing step feeds may be left out (the step makes it)."""
    fed = spec.preprocessing.fed if spec.preprocessing else frozenset()
    return [Input(t.name, DTYPES[t.type][1] if t.type in DTYPES else "BYTES", t.required and t.name not in fed)
            for t in spec.inputs]


def inputs_of_metadata(meta: Any, where: str) -> list[Input]:
    """The v2 model metadata's inputs (it does not say which are optional: all are asked for)."""
    try:
        return [Input(str(t["name"]), str(t["datatype"])) for t in meta["inputs"]]
    except (KeyError, TypeError) as e:
        raise PackError(f"{where}: the model metadata lists no inputs ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class Request:
    body: bytes
    header_length: int  # Inference-Header-Content-Length: the JSON header's bytes


def encode(inputs: list[Input], given: list[Given]) -> Request:
    """One infer request holding every --input, its outputs asked for as binary data (so a BF16
    output can be answered). Found here: what is cheap to find before a model loads or a
    container starts (an input the model lacks, a required one not given, a file whose values
    cannot be the input's type); shapes and JSON values are the runtime's to check."""
    by_name = {i.name: i for i in inputs}
    items: list[str] = []
    blobs: list[bytes] = []
    for g in given:
        spec = by_name.get(g.name)
        if spec is None:
            raise PredictError(f"{g.source}: the model has no input '{g.name}'; its inputs are: {', '.join(by_name)}")
        item, blob = _tensor(spec, g)
        items.append(item)
        if blob is not None:
            blobs.append(blob)
    named = {g.name for g in given}
    missing = [i.name for i in inputs if i.required and i.name not in named]
    if missing:
        raise PredictError(f"--input: missing {', '.join(missing)} (the model's inputs: {', '.join(by_name)})")
    head = ('{"inputs": [' + ", ".join(items) + '], "parameters": {"binary_data_output": true}}').encode()
    return Request(head + b"".join(blobs), len(head))


def _tensor(spec: Input, g: Given) -> tuple[str, bytes | None]:
    """One input's entry in the JSON header, and its bytes when they travel as binary data."""
    value, dtype = g.value, spec.dtype
    if dtype in BINARY_ONLY:  # BF16: given as numbers, sent as its bit patterns (JSON cannot carry it)
        try:
            floats = np.asarray(value, dtype=np.float32)
        except (ValueError, TypeError):
            raise PredictError(f"{g.source}: expected numbers for the {spec.datatype} input '{spec.name}'") from None
        return _binary(spec, floats.shape, bf16_bits(floats).astype("<u2").tobytes())
    if isinstance(value, bytes):  # a media file, as a request carries it: one BYTES element
        if spec.datatype != "BYTES":
            raise PredictError(f"{g.source}: '{spec.name}' takes {dtype or spec.datatype} values, not a file's bytes "
                               "(the model preprocesses no image or audio there)")
        return _binary(spec, (1,), bytes_elements([value]))
    if isinstance(value, np.ndarray):  # a .npy file: its values as the input's type, sent as binary data
        if spec.datatype == "BYTES":
            if value.dtype.kind not in "USO":
                raise PredictError(f"{g.source}: the file holds {value.dtype} values; '{spec.name}' takes strings")
            return _binary(spec, value.shape, bytes_elements(value.reshape(-1)))
        if dtype is None:
            raise PredictError(f"{g.source}: '{spec.name}' is {spec.datatype}, which a .npy file cannot give")
        target = np.dtype(DTYPES[dtype][0])
        if value.dtype != target and not np.can_cast(value.dtype, target, "same_kind"):
            raise PredictError(f"{g.source}: the file holds {value.dtype} values; '{spec.name}' takes {dtype}")
        return _binary(spec, value.shape, np.ascontiguousarray(value, target.newbyteorder("<")).tobytes())
    # JSON values as written, with their shape: the runtime converts and checks them as any request's data
    item = {"name": spec.name, "datatype": spec.datatype, "shape": json_shape(value), "data": value}
    try:
        return json.dumps(item, allow_nan=False), None
    except ValueError:
        raise PredictError(f"{g.source}: NaN and infinities are not JSON values; give them in a .npy file") from None


def _binary(spec: Input, shape: tuple[int, ...], blob: bytes) -> tuple[str, bytes]:
    item = {"name": spec.name, "datatype": spec.datatype, "shape": list(shape),
            "parameters": {"binary_data_size": len(blob)}}
    return json.dumps(item), blob


def json_shape(value: Any) -> list[int]:
    """The shape nested lists have along their first elements (a ragged list is the runtime's to refuse)."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def bytes_elements(values: Any) -> bytes:
    """BYTES elements as binary data: each a 4-byte little-endian length, then its bytes (text as UTF-8)."""
    parts = []
    for v in values:
        b = v if isinstance(v, bytes) else str(v).encode("utf-8")
        parts += [struct.pack("<I", len(b)), b]
    return b"".join(parts)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns, rounded to nearest even; NaN as the quiet NaN 0x7FC0."""
    floats = np.asarray(values, np.float32)
    wide = np.ascontiguousarray(floats).view(np.uint32)
    rounded = ((wide + np.uint32(0x7FFF) + ((wide >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(floats), np.uint16(0x7FC0), rounded)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns as the float32 values they are."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def decode(body: bytes, header_length: str | None, where: str) -> dict[str, Any]:
    """A v2 infer answer's outputs as arrays: numbers of their datatype (BF16 as the float32
    values it holds), BYTES as text (bytes where an element is not UTF-8)."""
    try:
        n = len(body) if header_length is None else int(header_length)
        if not 0 <= n <= len(body):
            raise ValueError(f"a header of {n} bytes in a body of {len(body)}")
        doc = json.loads(body[:n])
        data = memoryview(body)[n:]
        out: dict[str, Any] = {}
        offset = 0
        for o in doc.get("outputs", []):
            name, datatype = str(o["name"]), str(o["datatype"])
            shape = tuple(int(d) for d in o["shape"])
            size = (o.get("parameters") or {}).get("binary_data_size")
            if size is None:
                out[name] = _from_json(o.get("data"), datatype, shape)
                continue
            if not isinstance(size, int) or size < 0 or offset + size > len(data):
                raise ValueError(f"output '{name}': binary_data_size {size!r} runs past the answer")
            out[name] = _from_binary(bytes(data[offset: offset + size]), datatype, shape, name)
            offset += size
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise PackError(f"{where}: not a KServe v2 answer ({type(e).__name__}: {e})") from None


def _from_json(data: Any, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = V2_TO_NAME.get(datatype)
    if dtype is None or dtype == "string":
        return np.array(data, dtype=object).reshape(shape)
    return np.array(data, dtype=DTYPES[dtype][0]).reshape(shape)  # null (a NaN or infinity) as NaN


def _from_binary(blob: bytes, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    count = math.prod(shape)
    dtype = V2_TO_NAME.get(datatype)
    if dtype is None:
        raise ValueError(f"output '{name}': datatype {datatype} is not one gpux.json has")
    if dtype == "string":
        values: list[Any] = []
        pos = 0
        while pos < len(blob):
            (size,) = struct.unpack_from("<I", blob, pos)
            element = blob[pos + 4: pos + 4 + size]
            if len(element) != size:
                raise ValueError(f"output '{name}': a BYTES element runs past its data")
            try:
                values.append(element.decode("utf-8"))
            except UnicodeDecodeError:
                values.append(element)
            pos += 4 + size
        if len(values) != count:
            raise ValueError(f"output '{name}': shape {list(shape)} needs {count} elements, the data holds {len(values)}")
        return np.array(values, dtype=object).reshape(shape)
    little = np.dtype(DTYPES[dtype][0]).newbyteorder("<")
    if len(blob) != count * little.itemsize:
        raise ValueError(f"output '{name}': shape {list(shape)} needs {count * little.itemsize} bytes, got {len(blob)}")
    arr = np.frombuffer(blob, little).astype(little.newbyteorder("="))
    return (bf16_values(arr) if dtype in BINARY_ONLY else arr).reshape(shape)


def typed(answer: dict[str, Any], outputs: tuple[Tensor, ...]) -> dict[str, Any]:
    """/predict's JSON answer with each tensor output an array of its gpux.json type (a .npy
    file keeps it; BF16 as float32, the values /predict's JSON holds); null, a NaN or an
    infinity, as NaN. Labels, top labels and what else it answers stay as they are."""
    types = {t.name: t.type for t in outputs}
    out: dict[str, Any] = {}
    for name, value in answer.items():
        kind = types.get(name)
        if kind not in DTYPES:
            out[name] = value
            continue
        dtype = object if kind == "string" else np.float32 if kind in BINARY_ONLY else DTYPES[kind][0]
        try:
            out[name] = np.array(value, dtype=dtype)
        except (ValueError, TypeError, OverflowError):  # rows of other lengths: items joined as lists
            out[name] = value
    return out


def to_json(value: Any) -> Any:
    """An answer as JSON holds it: arrays as nested lists, NaN and infinities as null (strict
    JSON has neither), bytes as text."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "iub" or (value.dtype.kind == "f" and np.isfinite(value).all()):
            return value.tolist()
        return to_json(value.tolist())
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, np.generic):
        return to_json(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if value is None or isinstance(value, (str, int)):
        return value
    return str(value)  # a type JSON has no word for (complex numbers): its text
