"""The data plane: the one inference path every protocol calls. HTTP (GPUX /predict, KServe v2
REST) and gRPC (KServe v2 ModelInfer) hand it a request's protocol form and a way to read its
body; in this order it checks readiness and the declared size, charges the in-flight budget
before any work, reads the body (charged as it arrives), decodes it and preprocesses (on the
event loop when cheap, else in a codec thread), charges what the decoded request will hold,
runs it through the scheduler (timeouts, overload refusals), encodes the answer, and hands it
back still holding its bytes: the transport releases them once the answer is out.

A refusal is a RequestError with an HTTP status (400, 404, 413, 415, 503, 504); each transport
maps it to its own (server.py: the status itself; grpc_v2.py: a gRPC status code). What differs
between protocols is a Form: how a body is decoded, how an answer is encoded, and which of
them are cheap enough for the event loop. So the same request gets the same answer and the
same refusal, whichever way it came."""

from __future__ import annotations

import asyncio
import io
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Awaitable, Callable, Mapping, Union

import numpy as np

from . import grpc_v2, number_arrays
from .budget import Budget, Charge, Hold
from .resources import INLINE_BYTES, INLINE_DECODE, REQUEST_OVERHEAD
from .scheduler import Overloaded, Scheduler
from .session import Items, Model, joined, rejected
from .tensors import (JSON_FACTOR, WHOLE_PARSE, RequestError, ServedTensor, check_shape, decode_predict,
                      decode_predict_batch, encode_predict, hole_inputs, labelled, numeric_body, parse_json,
                      plain_numbers, to_array)
from .v2 import V2Request, decode_rest, encode_v2, split_binary

Feeds = Union[dict[str, np.ndarray], list[dict[str, np.ndarray]]]  # one request's, or a /predict array's
Headers = Mapping[bytes, bytes]  # an HTTP request's headers, names in lower case; none for gRPC
# (source, hold, limit) -> the body, each piece charged to hold as it arrives, 413 past limit
Read = Callable[[Any, Hold, int], Awaitable[Union[bytes, bytearray]]]
NO_HEADERS: Headers = {}
JSON = b"application/json"
BINARY_HEADER = b"inference-header-content-length"


@dataclass
class Response:
    """An answer: an HTTP one (status, body, content type, headers), or gRPC's message bytes in
    body. held: the in-flight bytes it is charged, released once it is sent."""

    status: int
    body: bytes
    content_type: bytes = JSON
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    held: Hold | None = None


class Form:
    """A protocol's form of an infer request and its answer. decode runs on the event loop or
    in a codec thread (cheap says which), encode likewise (offload)."""

    v2 = True  # answered as KServe v2 (what Budget.request_bytes counts for the answer)
    keeps_body = False  # the body stays in memory until the answer is made (gRPC's message)
    ready_hint = "/v2/health/ready answers 200"  # what a client waits for after a 503 while not ready

    def __init__(self, plane: DataPlane):
        self.plane = plane

    def cheap(self, body: bytes | bytearray, headers: Headers) -> bool:
        """Decoding this body costs less than the hand-off to a codec thread and back."""
        raise NotImplementedError

    def decode(self, body: bytes | bytearray, headers: Headers, charge: Charge) -> tuple[Feeds, V2Request]:
        """The body's feeds (before preprocessing) and what it asks to be answered; what decoding
        holds at its peak is charged first (charge.decode)."""
        raise NotImplementedError

    def offload(self, outputs: Any, request: V2Request) -> bool:
        """Encoding this answer is worth a codec thread."""
        return sum(getattr(v, "nbytes", 0) for v in outputs.values()) > INLINE_BYTES

    def encode(self, outputs: Any, request: V2Request) -> Response:
        raise NotImplementedError


class RestForm(Form):
    """A body of an HTTP request: JSON (parsed whole, in one call, or its large number arrays read
    from the text), KServe v2 binary data after a JSON header, and for /predict .npy or a raw
    image or audio file."""

    def cheap(self, body: bytes | bytearray, headers: Headers) -> bool:
        # JSON tensors cost time in proportion: off the loop; a small or binary body: here
        plane = self.plane
        return not plane.model.steps and (len(body) <= INLINE_DECODE or
                                          (BINARY_HEADER in headers and not plane.string_inputs))

    def decode(self, body: bytes | bytearray, headers: Headers, charge: Charge) -> tuple[Feeds, V2Request]:
        """What decoding will hold at its peak is charged first: JSON becomes Python objects (up
        to 36x its text) unless its large arrays are all numbers."""
        plane, v2 = self.plane, self.v2
        model, budget = plane.model, plane.model.settings.max_request_bytes
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        npy = not v2 and content_type in (b"application/x-npy", b"application/npy")
        media = not v2 and content_type.startswith((b"image/", b"audio/")) and model.steps is not None
        length = headers.get(BINARY_HEADER) if v2 else None
        numeric = holes = None
        whole = False  # parsed in one call (WHOLE_PARSE)
        direct = False  # large number arrays read from the text (tensors.numeric_body)
        if npy or media:
            cost = len(body)  # np.load's copy; the media's bytes
        elif length is not None:  # the JSON header as objects; the tensors are views of the body
            header_bytes = int(length) if length.strip().isdigit() else len(body)
            cost = min(header_bytes, len(body)) * JSON_FACTOR
        else:  # a top-level array (GPUX's batch form) is parsed whole; so is a small body, in one call
            whole = len(body) <= WHOLE_PARSE and len(body) * JSON_FACTOR <= model.settings.max_request_bytes // 2
            numeric = numeric_body(body) if not whole and (v2 or body[:64].lstrip()[:1] != b"[") else None
            holes = hole_inputs(numeric, model.inputs, model.overridable, v2) if numeric else None
            direct = numeric is not None and holes is not None  # else the body is parsed whole
            if direct:
                itemsize = max((s.itemsize for s in holes.values() if s is not None), default=8)
                cost = numeric.decode_cost(itemsize)
            else:
                cost = len(body) * JSON_FACTOR
        charge.decode(cost)
        if media:  # a raw body: one encoded image or WAV file (its Content-Type says which)
            name = model.steps.body_input(content_type.decode("latin-1"))  # type: ignore[union-attr]
            feeds = {name: np.array([bytes(body)], dtype=object)}
            missing = [s.name for s in model.inputs if s.required and s.name not in feeds]
            if missing:
                raise RequestError(f"a raw body carries '{name}' only, and the model also needs "
                                   f"{', '.join(missing)}: send JSON")
            return feeds, V2Request()
        if npy:
            feeds = decode_npy(body, model.inputs, budget)
            decode_predict({}, [], outputs=model.outputs)  # the JSON answer: a 400 for a BF16 output
            return feeds, V2Request()
        if v2:
            if not body.strip():
                raise RequestError("empty body; expected a JSON infer request")
            if direct:
                header, blobs, fast = numeric.fill(holes.get), memoryview(b""), False  # type: ignore[union-attr]
            else:
                header, blobs = split_binary(body, length.decode("latin-1") if length is not None else None)
                fast = length is None and plain_numbers(body, header, v2=True)
            return decode_rest(header, model.inputs, model.outputs, model.overridable, blobs, budget, fast)
        if not body.strip():
            raise RequestError("empty body; expected JSON")
        parsed, fast = None, False
        if direct:
            parsed = numeric.fill(holes.get)  # type: ignore[union-attr]
        elif whole and model.steps is None and plane.float_inputs:
            parsed = number_arrays.arrays(body, plane.float_inputs)  # None: not the plainest body
        if parsed is None:
            parsed = parse_json(body)
            fast = not isinstance(parsed, list) and plain_numbers(body, parsed, v2=False)
        if model.steps is not None:  # GPUX's image and audio forms, as the checker takes them
            parsed = ([model.steps.gpux_form(one) for one in parsed] if isinstance(parsed, list)
                      else model.steps.gpux_form(parsed))
        if isinstance(parsed, list):
            return decode_predict_batch(parsed, model.inputs, model.overridable, model.outputs,
                                        model.settings.max_queue), V2Request()
        return decode_predict(parsed, model.inputs, model.overridable, fast, model.outputs), V2Request()


class PredictForm(RestForm):
    """GPUX's POST /predict: a JSON object of inputs (or an array of them), .npy, or a raw image
    or audio file; answered {output: values}, labels and what preprocessing adds beside."""

    v2 = False

    def offload(self, outputs: Any, request: V2Request) -> bool:
        return isinstance(outputs, list) or sum(getattr(v, "nbytes", 0) for v in outputs.values()) > INLINE_BYTES // 4

    def encode(self, outputs: Any, request: V2Request) -> Response:
        labels = self.plane.model.labels
        if isinstance(outputs, list):  # the array form: each request's answer, with what its preprocessing adds
            answers = [labelled(a, labels) for a in outputs] if labels else outputs
            extras = request.extra.get("each")
            if extras:
                answers = [{**a, **extra} for a, extra in zip(answers, extras)]
            return Response(200, b"[" + b",".join(encode_predict(a) for a in answers) + b"]")
        outputs = labelled(outputs, labels) if labels else outputs
        outputs = {**outputs, **request.extra} if request.extra else outputs
        return Response(200, encode_predict(outputs))


class V2RestForm(RestForm):
    """KServe v2 REST infer: a JSON request, or a JSON header and binary data after it
    (Inference-Header-Content-Length); answered likewise, as the request asks."""

    def offload(self, outputs: Any, request: V2Request) -> bool:
        return not request.binary_default and not request.binary and \
            sum(getattr(v, "nbytes", 0) for v in outputs.values()) > INLINE_BYTES // 4

    def encode(self, outputs: Any, request: V2Request) -> Response:
        spec = self.plane.model.spec
        head = {"model_name": spec.name, "model_version": spec.version}
        if request.id is not None:
            head["id"] = request.id
        payload, header_length = encode_v2(outputs, self.plane.outputs, request, head)
        if header_length is None:
            return Response(200, payload)
        return Response(200, payload, b"application/octet-stream", [(BINARY_HEADER, str(header_length).encode())])


class GrpcForm(Form):
    """KServe v2 gRPC ModelInfer: a ModelInferRequest's bytes, parsed here (grpc hands them over
    unparsed: grpc_v2.start), inputs as raw or typed contents; answered as a ModelInferResponse's
    bytes, every output in raw_output_contents, serialized here rather than by grpc on the
    event loop. A large message is parsed in a codec thread (16 MiB of typed contents held the
    loop, and readiness, for 0.8 s). grpc keeps the message until the call is answered: it
    stays charged (keeps_body)."""

    keeps_body = True
    ready_hint = "ServerReady is true"

    def __init__(self, plane: DataPlane):
        super().__init__(plane)
        self.messages = grpc_v2.message_classes()

    def cheap(self, body: bytes | bytearray, headers: Headers) -> bool:
        return len(body) <= INLINE_BYTES and not self.plane.model.steps  # preprocessing: off the event loop

    def decode(self, body: bytes | bytearray, headers: Headers, charge: Charge) -> tuple[Feeds, V2Request]:
        # what parsing holds was charged with the message (grpc_v2: PARSE_FACTOR), as it arrived
        spec = self.plane.model.spec
        message = grpc_v2.parse(self.messages["ModelInferRequest"], "ModelInfer", body)
        grpc_v2.check_model(message, spec.name, spec.version)
        return grpc_v2.decode(message, self.plane.model, self.plane.model.settings.max_request_bytes)

    def encode(self, outputs: Any, request: V2Request) -> Response:
        spec = self.plane.model.spec
        message = grpc_v2.encode(self.messages["ModelInferResponse"], outputs, self.plane.outputs, spec.name,
                                 spec.version, request.id or "")
        return Response(200, message.SerializeToString())


class DataPlane:
    def __init__(self, model: Model, budget: Budget, scheduler: Scheduler, codec: Executor, *,
                 ready: Callable[[], bool], state: Callable[[], str], observe_run: Callable[[int, float], None],
                 batchable: bool, string_inputs: bool, float_inputs: dict[str, np.dtype]):
        """ready/state: whether the server takes requests, and what it is doing when not;
        observe_run(rows, seconds): a run made on the event loop, for the metrics; batchable:
        requests may share a run; string_inputs: the model takes text; float_inputs: the inputs
        a /predict body's number arrays may be read straight into (number_arrays.py)."""
        self.model, self.budget, self.scheduler, self.codec = model, budget, scheduler, codec
        self.settings = model.settings
        self.ready, self.state, self.observe_run = ready, state, observe_run
        self.batchable, self.string_inputs, self.float_inputs = batchable, string_inputs, float_inputs
        self.outputs = {o.name: o for o in model.outputs}
        self.inline_run = 0  # input bytes up to which a run is made on the event loop (warmup.inline_run_bytes)
        self.predict = PredictForm(self)
        self.v2 = V2RestForm(self)

    @cached_property
    def grpc(self) -> GrpcForm:
        """Made on the first gRPC call (on the event loop): protobuf is loaded only with a gRPC port."""
        return GrpcForm(self)

    async def infer(self, form: Form, read: Read, source: Any, headers: Headers = NO_HEADERS) -> Response:
        """The answer to one infer request, holding its bytes: whoever sends it releases them
        (`response.held`) once it is sent. read(source, hold, limit): the transport's body (from
        an ASGI receive, a gRPC message), at most limit bytes (413 past it), each piece charged
        to hold as it arrives."""
        if not self.ready():
            raise RequestError(f"the model is {self.state()}; retry when {form.ready_hint}", 503, refused="not_ready")
        limit = self.settings.max_body_bytes
        length = headers.get(b"content-length", b"")
        declared = int(length) if length.isdigit() else 0
        if declared > limit:
            raise RequestError(f"request body of {declared} bytes exceeds the limit of {limit} "
                               "(GPUX_MAX_BODY_BYTES)", 413)
        with self.budget.held(REQUEST_OVERHEAD) as hold:
            body = await read(source, hold, limit)
            loop = asyncio.get_running_loop()
            self.scheduler.arrive(1)
            try:
                if form.cheap(body, headers):
                    feeds, request, needed = self.decode(form, body, headers)
                else:
                    feeds, request, needed = await loop.run_in_executor(self.codec, self.decode, form, body, headers)
            finally:
                self.scheduler.arrive(-1)
            kept = len(body) if form.keeps_body else 0
            del body
            # from here on the request holds its tensors, the model's, its answer (and a kept body)
            hold.swap(needed + kept)
            if isinstance(feeds, list) and not isinstance(feeds, Items):  # GPUX's array form: each item a run
                outputs: Any = await self.run_each(feeds)
            else:
                outputs = await self.run(feeds, request.outputs)
            del feeds
            if form.offload(outputs, request):
                response = await loop.run_in_executor(self.codec, form.encode, outputs, request)
            else:
                response = form.encode(outputs, request)
            del outputs
            response.held = hold.transfer()  # released once the answer is sent
        return response

    def decode(self, form: Form, body: bytes | bytearray, headers: Headers = NO_HEADERS) -> tuple[Feeds, V2Request, int]:
        """In a codec thread, or on the event loop when cheap: the body as the graph's feeds
        (decoded, then preprocessed: text tokenized, images decoded), what it asks to be
        answered, and the bytes the rest of the request will hold (its tensors, the graph's
        intermediate tensors, the outputs and the answer; 413 past the per-request budget).
        What decoding and preprocessing hold is charged while they work, released after."""
        with Charge(self.budget, len(body)) as charge:
            feeds, request = form.decode(body, headers, charge)
            feeds, request.extra = self.model.preprocess(feeds, charge)
        return feeds, request, self.budget.request_bytes(feeds, request, form.v2)

    async def run(self, feeds: dict[str, Any], names: list[str] | None) -> dict[str, Any]:
        """One request's outputs: on the event loop when warmup found a run cheaper than the
        hand-offs to a worker and back, else through the scheduler (503 when its queue is full,
        504 past serving.timeout)."""
        if isinstance(feeds, Items):
            return await self._run_items(feeds, names)
        if self.inline_run and not self.scheduler.closed and \
                sum(getattr(a, "nbytes", 0) for a in feeds.values()) <= self.inline_run:
            started = time.perf_counter()
            try:
                outputs = self.model.run(feeds, names)
            except Exception as e:
                raise rejected(e) from None
            self.observe_run(1, time.perf_counter() - started)
            return outputs
        timeout = self.settings.timeout
        try:
            job = self.scheduler.submit(feeds, names, self.batchable)
        except Overloaded as e:
            raise RequestError(str(e), 503) from None
        waiting = asyncio.wrap_future(job.future)
        try:
            return await asyncio.wait_for(waiting, timeout)
        except asyncio.TimeoutError:
            job.abandon()
            raise RequestError(f"inference took longer than {timeout:g}s", 504) from None
        except Exception as e:
            raise rejected(e) from None

    async def run_each(self, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, Any]]:
        """Every request of a /predict array at once, their outputs in the same order, or the
        first one's error, naming it. Waits for every run, so what they hold is released after."""
        answers = await asyncio.gather(*(self.run(one, None) for one in feeds), return_exceptions=True)
        for i, answer in enumerate(answers):
            if isinstance(answer, RequestError):
                raise RequestError(f"request [{i}]: {answer}", answer.status, refused=answer.refused) from None
            if isinstance(answer, BaseException):
                raise answer
        return answers  # type: ignore[return-value]

    async def _run_items(self, items: Items, names: list[str] | None) -> dict[str, Any]:
        """Each item's run (batched when batching is on), the outputs joined along the first
        dimension as the model's own batch would answer them; the first failing item's error."""
        answers = await asyncio.gather(*(self.run(one, names) for one in items), return_exceptions=True)
        for i, answer in enumerate(answers):
            if isinstance(answer, RequestError):
                raise RequestError(f"item [{i}]: {answer}", answer.status, refused=answer.refused) from None
            if isinstance(answer, BaseException):
                raise answer
        return {name: joined([a[name] for a in answers]) for name in answers[0]}




def batchable(inputs: list[ServedTensor], outputs: list[ServedTensor]) -> bool:
    """Requests can share a run when every tensor's first dimension is a dynamic batch."""
    def dynamic_first(s: ServedTensor) -> bool:
        return bool(s.shape) and not (isinstance(s.shape[0], int) and s.shape[0] >= 0)

    return bool(inputs) and all(dynamic_first(s) for s in inputs if s.required) and all(
        dynamic_first(s) for s in outputs)


def decode_npy(body: bytes | bytearray, inputs: list[ServedTensor], budget: int) -> dict[str, np.ndarray]:
    """/predict with one .npy array as the body: the model's single required input."""
    required = [s for s in inputs if s.required]
    if len(required) != 1:
        raise RequestError(f"a .npy body carries one array; this model needs {len(required)} inputs: send JSON")
    spec = required[0]
    try:
        arr = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise RequestError(f"the body is not a .npy array: {str(e).splitlines()[0][:200]}") from None
    if arr.nbytes > budget:
        raise RequestError(f"the array holds {arr.nbytes} bytes, more than the budget of {budget}", 413)
    what = f"input '{spec.name}'"
    if arr.dtype.kind in "fiub" and spec.dtype != "string":
        arr = to_array(spec, arr, what)
    else:
        raise RequestError(f"{what}: a .npy body holds numbers; this input is {spec.dtype}")
    check_shape(spec, arr, what, {})
    return {spec.name: arr}
