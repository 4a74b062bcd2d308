"""KServe v2 / Open Inference Protocol over gRPC (`serving.grpc_port`), so `tritonclient.grpc`
works: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer of the
`inference.GRPCInferenceService` service.

The messages are described here as data (names, field numbers and types of the protocol's
`grpc_predict_v2.proto`, which Triton's `grpc_service.proto` extends) and built at start with
protobuf's descriptor API: no protoc step, no generated files. A test compares every field
with tritonclient's own descriptors. grpcio and protobuf are in the image only when the port
is set. ModelInfer is the data plane's (dataplane.py), the path REST's infer takes: same
readiness, budget, queue, batching, limits and messages; this module is gRPC's wire: the
messages, their parsing and encoding, and the status code each refusal maps to.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np

from .budget import body_over_limit
from .contract import BINARY_ONLY, DTYPES
from .tensors import RequestError, from_binary, to_binary
from .v2 import V2Input, V2Request, check

log = logging.getLogger("gpux")

PACKAGE = "inference"
PARSE_FACTOR = 3  # a ModelInfer message as bytes, parsed, and its tensors: what it holds before it is decoded
SERVICE = "GRPCInferenceService"

_PARAMS = ("parameters", "map:InferParameter")
_TENSOR = [("name", 1, "string"), ("datatype", 2, "string"), ("shape", 3, "repeated int64")]
# message -> [(field, number, type)]; "map:T" is map<string, T>; nested messages as (name, fields)
MESSAGES: dict[str, list] = {
    "ServerLiveRequest": [], "ServerLiveResponse": [("live", 1, "bool")],
    "ServerReadyRequest": [], "ServerReadyResponse": [("ready", 1, "bool")],
    "ModelReadyRequest": [("name", 1, "string"), ("version", 2, "string")],
    "ModelReadyResponse": [("ready", 1, "bool")],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [("name", 1, "string"), ("version", 2, "string"), ("extensions", 3, "repeated string")],
    "ModelMetadataRequest": [("name", 1, "string"), ("version", 2, "string")],
    "ModelMetadataResponse": [
        ("TensorMetadata", _TENSOR),
        ("name", 1, "string"), ("versions", 2, "repeated string"), ("platform", 3, "string"),
        ("inputs", 4, "repeated ModelMetadataResponse.TensorMetadata"),
        ("outputs", 5, "repeated ModelMetadataResponse.TensorMetadata"),
    ],
    "InferParameter": [("bool_param", 1, "oneof bool"), ("int64_param", 2, "oneof int64"),
                       ("string_param", 3, "oneof string"), ("double_param", 4, "oneof double"),
                       ("uint64_param", 5, "oneof uint64")],
    "InferTensorContents": [
        ("bool_contents", 1, "repeated bool"), ("int_contents", 2, "repeated int32"),
        ("int64_contents", 3, "repeated int64"), ("uint_contents", 4, "repeated uint32"),
        ("uint64_contents", 5, "repeated uint64"), ("fp32_contents", 6, "repeated float"),
        ("fp64_contents", 7, "repeated double"), ("bytes_contents", 8, "repeated bytes"),
    ],
    "ModelInferRequest": [
        ("InferInputTensor", [*_TENSOR, (_PARAMS[0], 4, _PARAMS[1]), ("contents", 5, "InferTensorContents")]),
        ("InferRequestedOutputTensor", [("name", 1, "string"), (_PARAMS[0], 2, _PARAMS[1])]),
        ("model_name", 1, "string"), ("model_version", 2, "string"), ("id", 3, "string"),
        (_PARAMS[0], 4, _PARAMS[1]), ("inputs", 5, "repeated ModelInferRequest.InferInputTensor"),
        ("outputs", 6, "repeated ModelInferRequest.InferRequestedOutputTensor"),
        ("raw_input_contents", 7, "repeated bytes"),
    ],
    "ModelInferResponse": [
        ("InferOutputTensor", [*_TENSOR, (_PARAMS[0], 4, _PARAMS[1]), ("contents", 5, "InferTensorContents")]),
        ("model_name", 1, "string"), ("model_version", 2, "string"), ("id", 3, "string"),
        (_PARAMS[0], 4, _PARAMS[1]), ("outputs", 5, "repeated ModelInferResponse.InferOutputTensor"),
        ("raw_output_contents", 6, "repeated bytes"),
    ],
}
METHODS = {name: (f"{name}Request", f"{name}Response")
           for name in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")}
# the typed contents field of each datatype, for requests that send contents instead of raw bytes
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
            "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
            "BYTES": "bytes_contents"}


def file_descriptor() -> Any:
    from google.protobuf import descriptor_pb2

    scalar = {"bool": 8, "int64": 3, "string": 9, "double": 1, "uint64": 4, "int32": 5, "uint32": 13, "float": 2,
              "bytes": 12}
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="gpux_grpc_predict_v2.proto", package=PACKAGE, syntax="proto3")

    def fill(msg: Any, path: str, fields: list) -> None:
        oneof = None
        for item in fields:
            if len(item) == 2:  # a nested message
                fill(msg.nested_type.add(name=item[0]), f"{path}.{item[0]}", item[1])
                continue
            name, number, kind = item
            field = msg.field.add(name=name, number=number, json_name=_camel(name))
            field.label = F.LABEL_OPTIONAL
            if kind.startswith("repeated "):
                field.label, kind = F.LABEL_REPEATED, kind[len("repeated "):]
            if kind.startswith("oneof "):
                if oneof is None:
                    msg.oneof_decl.add(name="parameter_choice")
                    oneof = 0
                field.oneof_index, kind = oneof, kind[len("oneof "):]
            if kind.startswith("map:"):
                entry = msg.nested_type.add(name=_camel(name, upper=True) + "Entry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, json_name="key")
                entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, json_name="value",
                                type_name=f".{PACKAGE}.{kind[4:]}")
                field.label, field.type = F.LABEL_REPEATED, F.TYPE_MESSAGE
                field.type_name = f".{path}.{entry.name}"
            elif kind in scalar:
                field.type = scalar[kind]
            else:
                field.type, field.type_name = F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"

    for name, fields in MESSAGES.items():
        fill(fd.message_type.add(name=name), f"{PACKAGE}.{name}", fields)
    service = fd.service.add(name=SERVICE)
    for method, (request, response) in METHODS.items():
        service.method.add(name=method, input_type=f".{PACKAGE}.{request}", output_type=f".{PACKAGE}.{response}")
    return fd


def _camel(name: str, upper: bool = False) -> str:
    parts = name.split("_")
    text = parts[0] + "".join(p.title() for p in parts[1:])
    return text[:1].upper() + text[1:] if upper else text


@functools.lru_cache(maxsize=None)
def message_classes() -> dict[str, Any]:
    """Every message's class, made once (the servicer and the data plane share them)."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    file = pool.Add(file_descriptor())
    del file
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in MESSAGES}


# ---------------------------------------------------------------------------------------------
# the server


class Servicer:
    """GRPCInferenceService, one method per RPC, answering from `app` (server.App): each takes the
    parsed request (ModelInfer: the raw bytes, parsed once they are charged) and the context."""

    def __init__(self, app: Any):
        self.app, self.m = app, message_classes()
        self.name, self.version = app.model.spec.name, app.model.spec.version

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return self.m["ServerLiveResponse"](live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return self.m["ServerReadyResponse"](ready=self.app.is_ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        self.check_model(request)
        return self.m["ModelReadyResponse"](ready=self.app.is_ready())

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return self.m["ServerMetadataResponse"](name="gpux", version=self.app.pack_version, extensions=[])

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        self.check_model(request)
        meta = self.app.metadata()
        out = self.m["ModelMetadataResponse"](name=meta["name"], versions=meta["versions"], platform=meta["platform"])
        for key in ("inputs", "outputs"):
            for t in meta[key]:
                getattr(out, key).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return out

    async def ModelInfer(self, raw: bytes, context: Any) -> bytes:
        """The data plane's answer (dataplane.py: the path REST takes too), as the response's bytes.
        grpc has read the whole message (within call_limits): it is charged PARSE_FACTOR times
        before it is parsed (the parse holds it twice, the tensors once more), and released once
        the answer is handed back."""
        plane = self.app.plane
        response = await plane.infer(plane.grpc, _charged, raw)
        with response.held:
            return response.body

    def check_model(self, request: Any) -> None:
        check_model(request, self.name, self.version)


async def _charged(raw: bytes, hold: Any, limit: int) -> bytes:
    """The message grpc has read, charged as the data plane reads a body: past the body limit
    413, as an HTTP body (grpc's own limit, call_limits, is never under 1 MiB); then PARSE_FACTOR
    times its size before it is parsed."""
    if len(raw) > limit:
        raise body_over_limit(limit)
    hold.grow(PARSE_FACTOR * len(raw))
    return raw


def check_model(request: Any, name: str, version: str) -> None:
    """A request's model (and version, when it names one) are this server's, or 404."""
    infer = request.DESCRIPTOR.name == "ModelInferRequest"
    asked = request.model_name if infer else request.name
    if asked != name:
        raise RequestError(f"unknown model '{asked}'; this server serves '{name}'", 404)
    asked_version = request.model_version if infer else request.version
    if asked_version and asked_version != version:
        raise RequestError(f"unknown version '{asked_version}' of '{name}'; it has '{version}'", 404)


async def start(app: Any, port: int, host: str) -> Any:
    """A grpc.aio server on the running loop, answering from `app` (server.App) through a Servicer.
    Every method takes its request as bytes and parses it itself: grpc would parse before the
    handler and answer bytes that are no protobuf message with UNKNOWN and a logged traceback.
    A client's mistake is its status code and one line; anything else INTERNAL, logged."""
    import grpc

    servicer = Servicer(app)
    status = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 405: grpc.StatusCode.UNIMPLEMENTED,
              413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE,
              504: grpc.StatusCode.DEADLINE_EXCEEDED}

    def handler(method: str, message: Any) -> Any:
        rpc = getattr(servicer, method)

        async def call(raw: bytes, context: Any) -> Any:
            try:
                return await rpc(raw if method == "ModelInfer" else parse(message, method, raw), context)
            except RequestError as e:
                app.count_refusal(e)
                await context.abort(status.get(e.status, grpc.StatusCode.INVALID_ARGUMENT), str(e))
            except Exception as e:  # a bug, not the client's: logged with its traceback, as HTTP's 500
                log.exception("unexpected error")
                await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")

        return call

    rpcs = {
        method: grpc.unary_unary_rpc_method_handler(
            handler(method, servicer.m[request]), request_deserializer=None,
            response_serializer=None if method == "ModelInfer" else servicer.m[response].SerializeToString)
        for method, (request, response) in METHODS.items()
    }
    calls, limit = call_limits(app.model.settings)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", -1)], maximum_concurrent_rpcs=calls)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(f"{PACKAGE}.{SERVICE}", rpcs),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    server.add_insecure_port(address)
    await server.start()
    return server


def call_limits(settings: Any) -> tuple[int, int]:
    """(calls served at once, largest message). grpc reads a call's whole message before any
    handler can refuse it, and a message is then held about four times (grpc's buffer, its bytes,
    parsed, its tensors), so what the calls being read hold is bounded up front, within the
    in-flight budget: as many calls as the scheduler queues (more: RESOURCE_EXHAUSTED at once),
    each a message of at most a quarter of their share, and no larger than an HTTP body (eight
    6 MiB calls at 256 MiB, read before any was charged, were OOM-killed). 1 MiB at 128 MiB, 2 at
    256, 8 at 1 GiB, 32 at 4 GiB, 64 from 8 GiB."""
    calls = settings.max_queue
    return calls, max(1 << 20, min(settings.max_body_bytes, settings.max_in_flight_bytes // (4 * calls)))


def parse(message: Any, method: str, raw: bytes) -> Any:
    """The message, or a 400 naming what is wrong with its bytes."""
    from google.protobuf.message import DecodeError

    try:
        return message.FromString(raw)
    except (DecodeError, ValueError) as e:  # ValueError: invalid UTF-8 in a string, some runtimes
        detail = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise RequestError(f"{method}: the request is not a valid {message.DESCRIPTOR.name} ({detail})") from None


def decode(message: Any, model: Any, budget: int) -> tuple[dict[str, np.ndarray], V2Request]:
    """ModelInferRequest -> feeds, checked as a REST request is (v2.check: one set of messages),
    and what to answer (every output as raw bytes)."""
    raw = list(message.raw_input_contents)
    if raw and len(raw) != len(message.inputs):
        raise RequestError(f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs")
    request = V2Request(id=message.id, outputs=[o.name for o in message.outputs] or None, binary_default=True)
    for i, item in enumerate(message.inputs):
        content = _raw(memoryview(raw[i])) if raw else _typed(item)
        request.inputs.append(V2Input(item.name, item.datatype, list(item.shape), content))
    return check(request, model.inputs, model.outputs, model.overridable, budget), request


def _raw(data: memoryview) -> Any:
    return lambda spec, count, what: from_binary(spec, data, count, what)


def _typed(item: Any) -> Any:
    """An input's typed contents (InferTensorContents) as an array, once its spec is known."""
    def content(spec: Any, count: int, what: str) -> np.ndarray:
        if spec.dtype in BINARY_ONLY:  # no typed contents field holds BF16 (Triton's neither)
            raise RequestError(f"{what} is {spec.datatype}, which typed contents cannot carry: send it in "
                               "raw_input_contents")
        field = CONTENTS.get(item.datatype, "bytes_contents")
        values = getattr(item.contents, field)  # not a list: a Python object per number holds 32 bytes for 4
        if field in FIXED_WIDTH and len(item.contents.ListFields()) == 1:
            return packed(item.contents, FIXED_WIDTH[field])
        if spec.dtype == "string":
            try:
                return np.array([v if spec.encoded else v.decode("utf-8") for v in values], dtype=object)
            except UnicodeDecodeError:
                raise RequestError(f"{what}: a BYTES element is not UTF-8 text") from None
        try:  # 300 in int_contents for INT8, bytes_contents for FP16: numpy refuses
            return np.array(values, dtype=np.dtype(DTYPES[spec.dtype][0]))
        except (OverflowError, ValueError, TypeError) as e:
            raise RequestError(f"{what}: contents do not fit {spec.datatype}: {str(e).splitlines()[0][:200]}") from None

    return content


# typed contents of fixed width: numpy reads their packed bytes (a conversion element by element
# held the GIL 0.3 s for 16 MiB of floats, and the event loop with it; this takes 0.04 s)
FIXED_WIDTH = {"fp32_contents": np.dtype("<f4"), "fp64_contents": np.dtype("<f8")}


def packed(contents: Any, dtype: np.dtype) -> np.ndarray:
    """The one field an InferTensorContents holds, a packed repeated fixed-width number, as an
    array: serialized, it is that field's tag, its length as a varint, then the numbers."""
    data = contents.SerializeToString()
    length = shift = 0
    at = 1  # past the tag (field 6 or 7, length-delimited: one byte)
    while True:
        byte = data[at]
        at += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    if length != len(data) - at or length % dtype.itemsize:
        raise RequestError("the typed contents are not one packed field")  # protobuf wrote them: never seen
    return np.frombuffer(data, dtype, length // dtype.itemsize, at).astype(dtype.newbyteorder("="), copy=False)


def encode(response_class: Any, outputs: dict[str, Any], specs: dict[str, Any], name: str, version: str,
           request_id: str) -> Any:
    """Every output as raw bytes (raw_output_contents), as Triton answers."""
    response = response_class(model_name=name, model_version=version, id=request_id)
    for out_name, value in outputs.items():
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        spec = specs.get(out_name)
        datatype = spec.datatype if spec is not None and spec.dtype in DTYPES else "BYTES"
        response.outputs.add(name=out_name, datatype=datatype, shape=list(arr.shape))
        response.raw_output_contents.append(to_binary(arr, datatype))
    return response
