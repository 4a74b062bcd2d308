"""KServe v2 infer requests: REST (JSON, with the binary tensor extension) and gRPC decode into one
request type, and one checker validates it (names, datatypes, shapes, the byte budget, required
inputs, outputs) with one set of messages. How a tensor's values arrive (JSON data, binary data,
raw_input_contents, typed contents) is the transport's; each input carries its own way of
turning them into an array, called once its shape and budget are checked."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .contract import BINARY_ONLY, DTYPES
from .tensors import (RequestError, ServedTensor, binary_view, check_shape, dumps, from_binary, json_refused,
                      parse_json, to_array, to_binary, to_json)

# (the input's spec, how many values its shape holds, "input 'name'") -> its values, flat or shaped
Content = Callable[[ServedTensor, int, str], np.ndarray]


@dataclass
class V2Input:
    name: str
    datatype: str
    shape: Any  # as sent: checked to be a list of non-negative integers
    content: Content


@dataclass
class V2Request:
    """One infer request, from either transport: its inputs and what it asks to be answered."""

    inputs: list[V2Input] = field(default_factory=list)
    id: str | None = None
    outputs: list[str] | None = None  # None: all
    binary: dict[str, bool] = field(default_factory=dict)  # output -> as binary data
    binary_default: bool = False  # parameters.binary_data_output; gRPC answers raw bytes always
    extra: dict[str, Any] = field(default_factory=dict)  # /predict: what preprocessing adds to the answer

    def wants_binary(self, name: str) -> bool:
        return self.binary.get(name, self.binary_default)


def check(request: V2Request, inputs: Sequence[ServedTensor], outputs: Sequence[ServedTensor],
          overridable: Sequence[ServedTensor] = (), budget: int | None = None) -> dict[str, np.ndarray]:
    """The request's feeds, every input and output checked against the model's; budget: the most
    tensor bytes one request may hold, checked from the shapes before any value is converted."""
    by_name = {s.name: s for s in (*overridable, *inputs)}
    feeds: dict[str, np.ndarray] = {}
    dims: dict[str, tuple[int, str]] = {}
    total = 0
    for item in request.inputs:
        what = f"input '{item.name}'"
        spec = by_name.get(item.name)
        if spec is None:
            raise RequestError(f"unknown input '{item.name}'; the model's inputs are: "
                               f"{', '.join(s.name for s in inputs)}")
        if item.name in feeds:
            raise RequestError(f"{what} is given twice")
        shape = item.shape
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise RequestError(f"{what}: 'shape' must be a list of non-negative integers")
        if item.datatype != spec.datatype:
            raise RequestError(f"{what}: datatype {item.datatype} does not match the model's {spec.datatype}")
        count = math.prod(shape)
        total += count * spec.itemsize
        if budget is not None and total > budget:
            raise RequestError(f"{what}: shape {shape} makes the request's tensors {total} bytes, more than this "
                               f"server's budget of {budget} bytes per request (GPUX_MAX_REQUEST_BYTES)", 413)
        arr = item.content(spec, count, what)
        if arr.size != count:
            raise RequestError(f"{what}: shape {shape} needs {count} values, got {arr.size}")
        arr = arr.reshape(shape)
        check_shape(spec, arr, what, dims)
        feeds[item.name] = arr
    for spec in inputs:
        if spec.required and spec.name not in feeds:
            raise RequestError(f"missing required input '{spec.name}'")
    known = [s.name for s in outputs]
    for name in request.outputs or ():
        if name not in known:
            raise RequestError(f"unknown output '{name}'; the model's outputs are: {', '.join(known)}")
    if request.outputs is not None and len(set(request.outputs)) != len(request.outputs):
        twice = next(n for n in request.outputs if request.outputs.count(n) > 1)
        raise RequestError(f"output '{twice}' is asked for twice")
    for spec in outputs:
        if spec.dtype in BINARY_ONLY and (request.outputs is None or spec.name in request.outputs) \
                and not request.wants_binary(spec.name):
            raise json_refused(spec, output=True)
    return feeds


# ---------------------------------------------------------------------------------------------
# REST: a JSON header, and the binary tensor extension's bytes after it


def from_rest(body: Any, blobs: memoryview | None = None, fast: bool = False) -> V2Request:
    """The JSON header (and the binary data after it) as a request; what is JSON's to check
    (objects, lists, names, binary data sizes) is checked here, the rest by check()."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object with an 'inputs' list")
    items = body.get("inputs")
    if not isinstance(items, list) or not items:
        raise RequestError("'inputs' must be a non-empty list of tensors")
    blobs = blobs if blobs is not None else memoryview(b"")
    request = V2Request()
    offset = 0
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RequestError(f"inputs[{i}]: expected an object with name, shape, datatype and data")
        name = item.get("name")
        if not isinstance(name, str):
            raise RequestError(f"inputs[{i}]: 'name' is missing")
        what = f"input '{name}'"
        params = item.get("parameters") or {}
        if not isinstance(params, dict):
            raise RequestError(f"{what}: 'parameters' must be an object")
        for key in ("shape", "datatype"):
            if key not in item:
                raise RequestError(f"{what}: '{key}' is missing")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(blobs):
                raise RequestError(f"{what}: binary_data_size {size!r} does not fit the {len(blobs) - offset} bytes "
                                   "of binary data left in the body")
            if "data" in item:
                raise RequestError(f"{what}: has both 'data' and binary_data_size")
            content = _binary(blobs[offset: offset + size])
            offset += size
        else:
            content = _json(item.get("data"), "data" in item, fast)
        request.inputs.append(V2Input(name, item["datatype"], item["shape"], content))
    if offset != len(blobs):
        raise RequestError(f"the body has {len(blobs) - offset} bytes of binary data that no input claims")
    if "id" in body:
        if not isinstance(body["id"], str):
            raise RequestError("'id' must be a string")
        request.id = body["id"]
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError("'parameters' must be an object")
    request.binary_default = params.get("binary_data_output") is True
    wanted = body.get("outputs")
    if wanted is not None:
        if not isinstance(wanted, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in wanted):
            raise RequestError("'outputs' must be a list of objects with a 'name'")
        request.outputs = [o["name"] for o in wanted]
        for o in wanted:
            oparams = o.get("parameters") or {}
            if not isinstance(oparams, dict):
                raise RequestError(f"output '{o['name']}': 'parameters' must be an object")
            if "binary_data" in oparams:
                request.binary[o["name"]] = oparams["binary_data"] is True
    return request


def split_binary(body: bytes, header_length: str | None) -> tuple[Any, memoryview]:
    """The binary tensor extension: the first `Inference-Header-Content-Length` bytes are the
    JSON header, the rest the tensors' bytes in input order."""
    view = memoryview(body)
    if header_length is None:
        return parse_json(view), view[len(view):]
    text = header_length.strip()
    if not text.isdigit() or int(text) > len(body):
        raise RequestError(f"Inference-Header-Content-Length {text[:40]!r}: expected a byte count within the body "
                           f"({len(body)} bytes)")
    n = int(text)
    return parse_json(view[:n]), view[n:]


def _binary(data: memoryview) -> Content:
    return lambda spec, count, what: from_binary(spec, data, count, what)


def _json(data: Any, given: bool, fast: bool) -> Content:
    def content(spec: ServedTensor, count: int, what: str) -> np.ndarray:
        if spec.dtype in BINARY_ONLY:
            raise json_refused(spec)
        if not given:
            raise RequestError(f"{what}: 'data' is missing")
        return to_array(spec, data, what, fast).reshape(-1)

    return content


def decode_rest(body: Any, inputs: Sequence[ServedTensor], outputs: Sequence[ServedTensor],
                overridable: Sequence[ServedTensor] = (), blobs: memoryview | None = None,
                budget: int | None = None, fast: bool = False) -> tuple[dict[str, np.ndarray], V2Request]:
    """A REST request's feeds, and what to answer."""
    request = from_rest(body, blobs, fast)
    return check(request, inputs, outputs, overridable, budget), request


def encode_v2(outputs: dict[str, Any], specs: dict[str, ServedTensor], request: V2Request | None = None,
              head: dict[str, Any] | None = None) -> tuple[bytes, int | None]:
    """The v2 response: (body, the JSON header's length when binary data follows it, else None)."""
    request = request or V2Request()
    items, blobs = [], []
    for name, value in outputs.items():
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        spec = specs.get(name)
        datatype = spec.datatype if spec and spec.dtype in DTYPES else "BYTES"
        item: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if request.wants_binary(name) and (datatype != "BYTES" or arr.dtype.kind in "OUS"):
            blob = to_binary(arr, datatype) if datatype == "BYTES" else binary_view(arr)
            item["parameters"] = {"binary_data_size": blob.nbytes if isinstance(blob, memoryview) else len(blob)}
            blobs.append(blob)
        elif spec is not None and spec.dtype in BINARY_ONLY:  # check() refused such a request already
            raise json_refused(spec, output=True)
        elif datatype == "BYTES" or arr.dtype.kind in "OUS" or arr.dtype == np.float16:
            item["data"] = to_json(arr.reshape(-1)) if arr.ndim else [to_json(value)]
        else:
            item["data"] = np.ascontiguousarray(arr).reshape(-1)
        items.append(item)
    header = dumps({**(head or {}), "outputs": items})
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)
