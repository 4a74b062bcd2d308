"""HTTP serving: GPUX endpoints and the KServe v2 / Open Inference Protocol REST endpoints,
binary tensor extension included, plus /metrics.

A bare ASGI app on uvicorn: the image needs no web framework, and every error path is ours
(400 naming the input, 404, 405, 413, 503 while warming, draining or full, 504 on timeout).
Endpoints are a table (routes.py); the infer endpoints read their body and hand it to the data
plane (dataplane.py), the path gRPC's ModelInfer takes too. The event loop only moves bytes:
large bodies are parsed and answers encoded in a codec thread pool, inference runs in the
scheduler's workers (bounded queue, dynamic batching), so a large body never holds up
/v2/health/ready.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Awaitable, Callable, Mapping

import numpy as np

from . import openapi
from .metrics import Metrics, route
from .budget import Budget, Hold, body_over_limit, trim, tune_malloc
from .dataplane import DataPlane, Response, batchable
from .routes import Routes
from .scheduler import Batching, Scheduler
from . import warmup
from .session import Model
from .warmup import AccuracyError
from .tensors import RequestError, dumps, to_json
from .contract import BINARY_ONLY, DTYPES

log = logging.getLogger("gpux")
access = logging.getLogger("gpux.access")

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Scope = dict[str, Any]
Params = Mapping[str, str]  # a path pattern's parameters (routes.py)
Handler = Callable[[Scope, Receive, Params], Awaitable[Response]]


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
        self.server: Any = None  # uvicorn's: its should_exit is the drain, and warmup can stop it
        self.grpc: Any = None  # the grpc.aio server, when serving.grpc_port is set
        self.failed: str | None = None
        self.openapi: bytes | None = None  # /openapi.json, made on the first request
        self.metrics = Metrics()
        cpus = settings.limits.cpus if settings.limits else 2
        self.codec = ThreadPoolExecutor(max_workers=max(2, min(8, cpus)), thread_name_prefix="codec")
        fed = model.steps.fed if model.steps else set()  # a step's graph inputs: optional to send, always run
        self.batchable = batchable([replace(s, required=True) if s.name in fed else s for s in model.inputs],
                                   model.outputs)
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
        # the inputs a /predict body's number arrays may be read straight into (number_arrays.py)
        float_inputs = {s.name: np.dtype(DTYPES[s.dtype][0]) for s in (*model.overridable, *model.inputs)
                        if s.dtype in DTYPES and s.dtype not in BINARY_ONLY and np.dtype(DTYPES[s.dtype][0]).kind == "f"}
        self.plane = DataPlane(model, self.budget, self.scheduler, self.codec, ready=self.is_ready, state=self.state,
                               observe_run=self.metrics.observe_run, batchable=self.batchable,
                               string_inputs=any(s.dtype == "string" for s in (*model.inputs, *model.overridable)),
                               float_inputs=float_inputs)
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
                    self.plane.inline_run = warmup.inline_run_bytes(self.model, self.scheduler.batching is not None)
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

    # -- inference: the data plane's (dataplane.py), the body read here --------------------------

    async def predict(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return await self.plane.infer(self.plane.predict, _read, receive, dict(scope.get("headers") or ()))

    async def infer_v2(self, scope: Scope, receive: Receive, params: Params) -> Response:
        return await self.plane.infer(self.plane.v2, _read, receive, dict(scope.get("headers") or ()))

    def count_refusal(self, e: RequestError) -> None:
        """gpux_refused_total, once per refused request (HTTP and gRPC alike)."""
        if e.refused:
            self.metrics.refused.labels(e.refused).inc()


async def _read(receive: Receive, hold: Hold, limit: int) -> bytes | bytearray:
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
                raise body_over_limit(limit)
            hold.grow(len(chunk))
            return chunk  # the whole body at once: no copy
        if buffer is None:
            buffer = bytearray()
        if len(buffer) + len(chunk) > limit:
            raise body_over_limit(limit)
        hold.grow(len(chunk))
        buffer += chunk
        if not more:
            return buffer


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
