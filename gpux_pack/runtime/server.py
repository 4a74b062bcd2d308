"""HTTP serving: GPUX endpoints and the KServe v2 / Open Inference Protocol REST endpoints,
binary tensor extension included, plus /metrics.

A bare ASGI app on uvicorn: the image needs no web framework, and every error path is ours
(400 naming the input, 404, 405, 413, 503 while warming, draining or full, 504 on timeout).
The event loop only moves bytes: bodies are parsed and answers encoded in a codec thread pool,
inference runs in the scheduler's workers (bounded queue, dynamic batching), so a large body
never holds up /v2/health/ready.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Mapping, Union

import numpy as np

from . import number_arrays, openapi
from .metrics import Metrics, route
from .budget import Budget, Charge, Hold, trim, tune_malloc
from .resources import INLINE_BYTES, INLINE_DECODE, REQUEST_OVERHEAD
from .routes import Routes
from .scheduler import Batching, Overloaded, Scheduler
from . import warmup
from .session import Items, Model, joined, rejected
from .warmup import AccuracyError
from .tensors import (JSON_FACTOR, WHOLE_PARSE, labelled, RequestError, ServedTensor, decode_predict, decode_predict_batch, dumps,
                      encode_predict, hole_inputs, numeric_body, parse_json, plain_numbers, to_json)
from .contract import BINARY_ONLY, DTYPES
from .v2 import V2Request, decode_rest, encode_v2, split_binary

log = logging.getLogger("gpux")
access = logging.getLogger("gpux.access")

Feeds = Union[dict[str, np.ndarray], list[dict[str, np.ndarray]]]  # one request's, or a /predict array's
Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Scope = dict[str, Any]
Params = Mapping[str, str]  # a path pattern's parameters (routes.py)
Handler = Callable[[Scope, Receive, Params], Awaitable["Response"]]

JSON = b"application/json"
BINARY_HEADER = b"inference-header-content-length"


@dataclass
class Response:
    status: int
    body: bytes
    content_type: bytes = JSON
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    held: Hold | None = None  # the in-flight bytes this answer is charged, released once it is sent


def _encode_each(answers: list[dict[str, Any]]) -> bytes:
    return b"[" + b",".join(encode_predict(a) for a in answers) + b"]"


def _json(status: int, value: Any) -> Response:
    return Response(status, dumps(value))


def _wants_json(scope: dict[str, Any]) -> bool:
    """Accept names application/json before any text type (GPUX's clients); scrapers ask for text."""
    accept = b",".join(v for k, v in scope.get("headers") or () if k == b"accept").lower()
    kinds = [part.split(b";")[0].strip() for part in accept.split(b",")]
    return b"application/json" in kinds and not any(k.startswith(b"text/") for k in kinds[:kinds.index(b"application/json")])


class App:
    def __init__(self, model: Model, pack_version: str = ""):
        self.model = model
        settings = model.settings
        self.ready = threading.Event()
        self.pack_version = pack_version
        self.outputs = {o.name: o for o in model.outputs}
        self.server: Any = None  # uvicorn's: its should_exit is the drain, and warmup can stop it
        self.grpc: Any = None  # the grpc.aio server, when serving.grpc_port is set
        self.failed: str | None = None
        self.openapi: bytes | None = None  # /openapi.json, made on the first request
        self.metrics = Metrics()
        cpus = settings.limits.cpus if settings.limits else 2
        self.codec = ThreadPoolExecutor(max_workers=max(2, min(8, cpus)), thread_name_prefix="codec")
        fed = model.steps.fed if model.steps else set()  # a step's graph inputs: optional to send, always run
        self.batchable = _batchable([replace(s, required=True) if s.name in fed else s for s in model.inputs],
                                    model.outputs)
        self.string_inputs = any(s.dtype == "string" for s in (*model.inputs, *model.overridable))
        # the inputs a /predict body's number arrays may be read straight into (number_arrays.py)
        self.float_inputs = {s.name: np.dtype(DTYPES[s.dtype][0]) for s in (*model.overridable, *model.inputs)
                             if s.dtype in DTYPES and s.dtype not in BINARY_ONLY
                             and np.dtype(DTYPES[s.dtype][0]).kind == "f"}
        batching = None
        if settings.batching:
            if self.batchable:
                batching = Batching(*settings.batching)
            else:
                log.warning("serving.batching is off: it needs a dynamic first dimension on every input and output")
        import onnxruntime as ort

        self.scheduler = Scheduler(model.run, ort.RunOptions, settings.max_workers, settings.max_queue, batching,
                                   self.metrics.observe_run)
        self.budget = Budget(model, self.codec)
        self.inline_run = 0  # input bytes up to which a run is made on the event loop (warmup.inline_run_bytes)
        self.routes = self._routes()

    # -- lifecycle ---------------------------------------------------------------------------

    def start_warmup(self) -> None:
        """Warm up off the event loop: health endpoints answer (503) meanwhile."""
        if self.model.spec.warmup == "none":
            self.model.warmup_state = {"state": "skipped"}
            self.model.publish_cache()
            self.budget.measure(start=True)
            self.ready.set()
            return

        def work() -> None:
            try:
                warmup.run(self.model)
                if self.model.warmup_state.get("state") == "done":
                    warmup.tune_threads(self.model)
                    self.inline_run = warmup.inline_run_bytes(self.model, self.scheduler.batching is not None)
                trim()  # what warmup freed goes back: the floor is the model's
                self.budget.measure(start=True)
            except AccuracyError as e:  # wrong answers are worse than none: stop, exit 1
                log.error("gpux: %s", e)
                self.failed = str(e)
                if self.server is not None:
                    self.server.should_exit = True
                return
            self.ready.set()
            state = self.model.warmup_state
            log.info("ready: warmup %s, cache %s, %ss", state.get("state"), state.get("cache"), state.get("seconds"))

        threading.Thread(target=work, name="warmup", daemon=True).start()

    @property
    def draining(self) -> bool:
        return self.server is not None and bool(self.server.should_exit)

    def is_ready(self) -> bool:
        return self.ready.is_set() and not self.draining

    # -- ASGI --------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        allow = None
        try:
            handler, params = self.routes.find(scope["method"], scope["path"])
            response = await handler(scope, receive, params)
        except RequestError as e:
            # KServe v2's error body is {"error"}; GPUX's (FastAPI's) {"detail"}: both, off /v2
            body = {"error": str(e)} if scope["path"].startswith("/v2") else {"error": str(e), "detail": str(e)}
            response, allow = _json(e.status, body), e.allow
            self.count_refusal(e)
            if e.status == 503:
                response.headers.append((b"retry-after", b"1"))
        except Exception as e:  # never let one request take the server down
            log.exception("unexpected error")
            response = _json(500, {"error": f"internal error: {type(e).__name__}: {e}"})
        if allow and response.status == 405:
            response.headers.append((b"allow", allow.encode()))
        try:
            await _send(send, response)
        finally:
            if response.held is not None:
                response.held.release()
        seconds = time.perf_counter() - started
        path = scope["path"]
        self.metrics.observe_request(route(path.rstrip("/") or "/", self.model.spec.name), response.status, seconds)
        if access.isEnabledFor(logging.INFO):
            access.info("%s %s %d %.1fms", scope["method"], path, response.status, seconds * 1000,
                        extra={"method": scope["method"], "path": path, "status": response.status,
                               "seconds": round(seconds, 6), "bytes": len(response.body),
                               "client": (scope.get("client") or ("", 0))[0]})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                settings = self.model.settings
                if settings.grpc_port:
                    from . import grpc_v2

                    try:
                        self.grpc = await grpc_v2.start(self, settings.grpc_port, settings.host)
                    except Exception as e:  # a port in use: say so, do not serve half
                        await send({"type": "lifespan.startup.failed",
                                    "message": f"cannot serve gRPC on port {settings.grpc_port}: {e}"})
                        return
                self.start_warmup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.grpc is not None:
                    await self.grpc.stop(self.model.settings.drain_seconds)
                self.scheduler.close()
                await asyncio.get_running_loop().run_in_executor(None, self.scheduler.join, 2.0)
                self.codec.shutdown(wait=False)
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _routes(self) -> Routes[Handler]:
        """Every endpoint: (method, path) -> its handler; 404 and 405 (with Allow) follow from it."""
        return Routes([
            ("GET", "/health", self.health),  # GPUX's answer (monitoring checks status == "healthy"), and ours
            ("GET", "/info", self.info),
            ("GET", "/metrics", self.metrics_page),
            ("POST", "/predict", self.predict),
            ("GET", "/openapi.json", self.openapi_document),  # GPUX's (FastAPI's) API description,
            ("GET", "/docs", self.docs_page),  # and a page that renders it
            ("GET", "/redoc", self.docs_page),
            ("GET", "/v2", self.server_metadata),
            ("GET", "/v2/health/live", self.live),
            ("GET", "/v2/health/ready", self.server_ready),
            ("GET", "/v2/models/{model}[/versions/{version}]", self.model_metadata),
            ("GET", "/v2/models/{model}[/versions/{version}]/ready", self.model_ready),
            ("POST", "/v2/models/{model}[/versions/{version}]/infer", self.infer_v2),
        ], check=self.known_model)

    def known_model(self, params: Mapping[str, str]) -> None:
        """A /v2/models path's model and version are this server's, or 404."""
        name, version = self.model.spec.name, self.model.spec.version
        if params["model"] != name:
            raise RequestError(f"unknown model '{params['model']}'; this server serves '{name}'", 404)
        if params["version"] is not None and params["version"] != version:
            raise RequestError(f"unknown version '{params['version']}' of '{name}'; it has '{version}'", 404)

    async def health(self, scope: Scope, receive: Receive, params: Params) -> Response:
        title, ready = self.model.spec.title, self.is_ready()
        return _json(200 if ready else 503, {"status": "healthy" if ready else self.state(), "model": title,
                                             "ready": ready})

    async def info(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return _json(200, to_json(self.model.info()))  # metadata from the model may hold NaN or odd types

    async def metrics_page(self, scope: Scope, receive: Receive, params: Params) -> Response:
        if _wants_json(scope):  # GPUX's /metrics: the provider in use and what onnxruntime offers
            return _json(200, self.model.provider_report())
        self.metrics.queue.set(self.scheduler.depth)
        self.metrics.in_flight.set(self.budget.in_flight_bytes)
        self.metrics.room.set(self.budget.room)
        self.metrics.floor.set(self.budget.floor or 0)
        body, content_type = self.metrics.render()
        return Response(200, body, content_type.encode())

    async def predict(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return await self._infer_request(scope, receive, v2=False)

    async def openapi_document(self, scope: Scope, receive: Receive, params: Params) -> Response:
        if self.openapi is None:
            self.openapi = dumps(openapi.document(self.model.spec, self.pack_version))
        return Response(200, self.openapi)

    async def docs_page(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return Response(200, openapi.DOCS_PAGE, b"text/html; charset=utf-8")

    async def server_metadata(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return _json(200, {"name": "gpux", "version": self.pack_version, "extensions": ["binary_tensor_data"]})

    async def live(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return _json(200, {"live": True})

    async def server_ready(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return _json(200, {"ready": True}) if self.is_ready() else _json(503, {"ready": False})

    async def model_metadata(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return _json(200, self.metadata())

    async def model_ready(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return _json(200 if self.is_ready() else 503, {"name": self.model.spec.name, "ready": self.is_ready()})

    async def infer_v2(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return await self._infer_request(scope, receive, v2=True)

    def state(self) -> str:
        return "draining" if self.draining else "warming up"

    def metadata(self) -> dict[str, Any]:
        m = self.model
        return {
            "name": m.spec.name,
            "versions": [m.spec.version],
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": s.name, "datatype": s.datatype, "shape": s.v2_shape} for s in m.inputs],
            "outputs": [{"name": s.name, "datatype": s.datatype, "shape": s.v2_shape} for s in m.outputs],
        }

    # -- inference ---------------------------------------------------------------------------

    async def _infer_request(self, scope: dict[str, Any], receive: Receive, v2: bool) -> Response:
        if not self.is_ready():
            raise RequestError(f"the model is {self.state()}; retry when /v2/health/ready answers 200", 503,
                               refused="not_ready")
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"")
        limit = self.model.settings.max_body_bytes
        declared = int(length) if length.isdigit() else 0
        if declared > limit:
            raise RequestError(f"request body of {declared} bytes exceeds the limit of {limit} "
                               "(GPUX_MAX_BODY_BYTES)", 413)
        with self.budget.held(REQUEST_OVERHEAD) as hold:
            body = await self._read(receive, hold, limit)
            loop = asyncio.get_running_loop()
            self.scheduler.arrive(1)
            try:  # JSON tensors cost time in proportion: off the loop; a small or binary body: here
                cheap = not self.model.steps and (len(body) <= INLINE_DECODE or
                                                 (BINARY_HEADER in headers and not self.string_inputs))
                if not cheap:
                    feeds, request, needed = await loop.run_in_executor(self.codec, self._decode, body, headers, v2)
                else:
                    feeds, request, needed = self._decode(body, headers, v2)
            finally:
                self.scheduler.arrive(-1)
            del body
            # the body is gone: from here on the request holds its tensors, the model's and its answer
            hold.swap(needed)
            if isinstance(feeds, list) and not isinstance(feeds, Items):  # GPUX's batch form: each item a run
                parts = await self._predict_each(feeds, request.extra.get("each") or [])
                return Response(200, parts, held=hold.transfer())  # released once the answer is sent
            outputs = await self.run(feeds, request.outputs)
            del feeds
            large = sum(getattr(v, "nbytes", 0) for v in outputs.values()) > INLINE_BYTES // 4
            if not v2:
                outputs = labelled(outputs, self.model.labels) if self.model.labels else outputs
                outputs = {**outputs, **request.extra} if request.extra else outputs
                if large:
                    payload = await loop.run_in_executor(self.codec, encode_predict, outputs)
                else:
                    payload = encode_predict(outputs)
                return Response(200, payload, held=hold.transfer())
            head = {"model_name": self.model.spec.name, "model_version": self.model.spec.version}
            if request.id is not None:
                head["id"] = request.id
            if large and not request.binary_default and not request.binary:
                payload, header_length = await loop.run_in_executor(self.codec, encode_v2, outputs, self.outputs,
                                                                    request, head)
            else:
                payload, header_length = encode_v2(outputs, self.outputs, request, head)
            del outputs
            if header_length is None:
                return Response(200, payload, held=hold.transfer())
            return Response(200, payload, b"application/octet-stream",
                            [(BINARY_HEADER, str(header_length).encode())], hold.transfer())

    async def _predict_each(self, feeds: list[dict[str, np.ndarray]], extras: list[dict[str, Any]]) -> bytes:
        """Run every item of a /predict array at once; the answers in the same order (each with
        what its preprocessing answers beside: a letterbox's geometry), or the first item's error,
        naming it. Waits for every run, so what they hold is released after them."""
        answers = await asyncio.gather(*(self.run(one, None) for one in feeds), return_exceptions=True)
        for i, answer in enumerate(answers):
            if isinstance(answer, RequestError):
                raise RequestError(f"request [{i}]: {answer}", answer.status, refused=answer.refused) from None
            if isinstance(answer, BaseException):
                raise answer
        if self.model.labels:
            answers = [labelled(a, self.model.labels) for a in answers]
        if extras:
            answers = [{**a, **extra} for a, extra in zip(answers, extras)]
        return await asyncio.get_running_loop().run_in_executor(self.codec, _encode_each, answers)

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

    def count_refusal(self, e: RequestError) -> None:
        """gpux_refused_total, once per refused request (HTTP and gRPC alike)."""
        if e.refused:
            self.metrics.refused.labels(e.refused).inc()

    async def _read(self, receive: Receive, hold: Hold, limit: int) -> bytes | bytearray:
        """The body, within the limit. Each piece is charged to the in-flight budget (hold) as it
        arrives, not the length the client declared: a client that declares 8 MiB and trickles it
        holds what it has sent, so eight of them cannot hold every other request off (503) for as
        long as they trickle. The pieces go into one buffer that grows in place (past 1 MiB malloc
        maps it and grows it with mremap: no copy), so memory grows with what arrived, as the
        charge does."""
        buffer: bytearray | None = None
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestError("client went away", 400)
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            if buffer is None and not more:
                if len(chunk) > limit:
                    raise RequestError(f"request body exceeds the limit of {limit} bytes (GPUX_MAX_BODY_BYTES)", 413)
                hold.grow(len(chunk))
                return chunk  # the whole body at once: no copy
            if buffer is None:
                buffer = bytearray()
            if len(buffer) + len(chunk) > limit:
                raise RequestError(f"request body exceeds the limit of {limit} bytes (GPUX_MAX_BODY_BYTES)", 413)
            hold.grow(len(chunk))
            buffer += chunk
            if not more:
                return buffer

    def _decode(self, body: bytes | bytearray, headers: dict[bytes, bytes], v2: bool) -> tuple[Feeds, V2Request, int]:
        """In a codec thread: the body as feeds, checked against the per-request budget, and the
        bytes the rest of the request will hold (its tensors, the graph's intermediate tensors,
        the outputs and the answer).
        What decoding will hold at its peak is counted against the in-flight budget first: JSON
        becomes Python objects (up to 36x its text) unless its large arrays are all numbers."""
        model, budget = self.model, self.model.settings.max_request_bytes
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
        with Hold(self.budget) as decoding, Charge(self.budget, len(body)) as charge:
            decoding.grow_decode(cost, len(body))
            if media:  # a raw body: one encoded image or WAV file (its Content-Type says which)
                name = model.steps.body_input(content_type.decode("latin-1"))  # type: ignore[union-attr]
                feeds = {name: np.array([bytes(body)], dtype=object)}
                missing = [s.name for s in model.inputs if s.required and s.name not in feeds]
                if missing:
                    raise RequestError(f"a raw body carries '{name}' only, and the model also needs "
                                       f"{', '.join(missing)}: send JSON")
                request = V2Request()
            elif npy:
                feeds = _decode_npy(body, model.inputs, budget)
                decode_predict({}, [], outputs=model.outputs)  # the JSON answer: a 400 for a BF16 output
                request = V2Request()
            elif v2:
                if not body.strip():
                    raise RequestError("empty body; expected a JSON infer request")
                if direct:
                    header, blobs, fast = numeric.fill(holes.get), memoryview(b""), False  # type: ignore[union-attr]
                else:
                    header, blobs = split_binary(body, length.decode("latin-1") if length is not None else None)
                    fast = length is None and plain_numbers(body, header, v2=True)
                feeds, request = decode_rest(header, model.inputs, model.outputs, model.overridable, blobs, budget, fast)
            else:
                if not body.strip():
                    raise RequestError("empty body; expected JSON")
                parsed, fast = None, False
                if direct:
                    parsed = numeric.fill(holes.get)  # type: ignore[union-attr]
                elif whole and model.steps is None and self.float_inputs:
                    parsed = number_arrays.arrays(body, self.float_inputs)  # None: not the plainest body
                if parsed is None:
                    parsed = parse_json(body)
                    fast = not isinstance(parsed, list) and plain_numbers(body, parsed, v2=False)
                if model.steps is not None:  # GPUX's image and audio forms, as the checker takes them
                    parsed = ([model.steps.gpux_form(one) for one in parsed] if isinstance(parsed, list)
                              else model.steps.gpux_form(parsed))
                if isinstance(parsed, list):
                    feeds = decode_predict_batch(parsed, model.inputs, model.overridable, model.outputs,
                                                 model.settings.max_queue)
                else:
                    feeds = decode_predict(parsed, model.inputs, model.overridable, fast, model.outputs)
                request = V2Request()
            feeds, request.extra = model.prepare(feeds, charge)  # text tokenized, images decoded: the graph's inputs
        return feeds, request, self.budget.request_bytes(feeds, request, v2)

    async def run(self, feeds: dict[str, Any], names: list[str] | None) -> dict[str, Any]:
        if isinstance(feeds, Items):
            return await self._run_items(feeds, names)
        if self.inline_run and not self.scheduler.closed and \
                sum(getattr(a, "nbytes", 0) for a in feeds.values()) <= self.inline_run:
            started = time.perf_counter()  # a run cheaper than the hand-offs to a worker and back: here
            try:
                outputs = self.model.run(feeds, names)
            except Exception as e:
                raise rejected(e) from None
            self.metrics.observe_run(1, time.perf_counter() - started)
            return outputs
        timeout = self.model.settings.timeout
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


def _batchable(inputs: list[ServedTensor], outputs: list[ServedTensor]) -> bool:
    """Requests can share a run when every tensor's first dimension is a dynamic batch."""
    def dynamic_first(s: ServedTensor) -> bool:
        return bool(s.shape) and not (isinstance(s.shape[0], int) and s.shape[0] >= 0)

    return bool(inputs) and all(dynamic_first(s) for s in inputs if s.required) and all(
        dynamic_first(s) for s in outputs)


def _decode_npy(body: bytes, inputs: list[ServedTensor], budget: int) -> dict[str, np.ndarray]:
    """/predict with one .npy array as the body: the model's single required input."""
    import io

    from .tensors import check_shape, to_array

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


SEND_PIECE = 256 * 1024  # a larger answer goes out in pieces this large


async def _send(send: Send, response: Response) -> None:
    """The answer, a large one in pieces: uvicorn waits for the socket to drain between them, so
    the transport never copies more than a piece of what the client has not read yet (given the
    whole answer at once, it copied the rest of a 13 MB answer into its own buffer)."""
    body = response.body
    headers = [(b"content-type", response.content_type), (b"content-length", str(len(body)).encode()),
               *response.headers]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    if len(body) <= SEND_PIECE:
        await send({"type": "http.response.body", "body": body})
        return
    view = memoryview(body)
    for at in range(0, len(body), SEND_PIECE):
        await send({"type": "http.response.body", "body": view[at: at + SEND_PIECE],
                    "more_body": at + SEND_PIECE < len(body)})


def serve(model: Model, pack_version: str = "", handoff: Callable[[Any], None] | None = None) -> int:
    """Run uvicorn in this thread. `handoff(server)` is called just before uvicorn takes over
    SIGTERM/SIGINT, so the caller's handler can stop the server instead of the process. On
    SIGTERM: readiness turns 503, no new connections, in-flight requests get drain_seconds."""
    import uvicorn

    settings = model.settings
    app = App(model, pack_version)
    tune_malloc()
    try:
        from .protocol import protocol

        http: Any = protocol(settings.max_header_bytes, settings.read_timeout,
                             lambda reason: app.metrics.refused.labels(reason).inc())
    except ImportError:  # no httptools: h11, which bounds an unfinished head by itself (no timer)
        http = "h11"
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # our handlers (text or JSON lines) for uvicorn's loggers too
        lifespan="on",
        proxy_headers=False,  # X-Forwarded-* are not read: a middleware on every request for nothing
        server_header=False,
        timeout_graceful_shutdown=max(1, int(settings.drain_seconds)),
        access_log=False,  # ours, with the fields the JSON format needs
        http=http,  # httptools with a head limit and read timeouts (protocol.py), else h11
        h11_max_incomplete_event_size=settings.max_header_bytes,
        loop="asyncio",
    )
    server = uvicorn.Server(config)
    app.server = server
    if handoff is not None:
        handoff(server)
    server.run()
    return 0 if server.started and app.failed is None else 1
