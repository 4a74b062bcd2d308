"""HTTP serving: GPUX endpoints and the KServe v2 / Open Inference Protocol REST endpoints.

A bare ASGI app on uvicorn: the image needs no web framework, and every error path is ours
(400 naming the input, 404, 405, 413, 503 while warming, 504 on timeout).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from .session import AccuracyError, Model
from .tensors import RequestError, decode_predict, decode_v2, encode_predict, encode_v2, parse_json, to_json

log = logging.getLogger("gpux")

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]

_V2_MODEL = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<rest>/ready|/infer)?$")


class App:
    def __init__(self, model: Model, pack_version: str = ""):
        self.model = model
        self.ready = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=model.settings.max_workers, thread_name_prefix="infer")
        self.pack_version = pack_version
        self.outputs = {o.name: o for o in model.outputs}
        self.server: Any = None  # uvicorn's, to stop it when warmup finds wrong answers
        self.failed: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start_warmup(self) -> None:
        """Warm up off the event loop: health endpoints answer (503) meanwhile."""
        if self.model.spec.get("warmup") == "none":
            self.model.warmup_state = {"state": "skipped"}
            self.model.publish_cache()
            self.ready.set()
            return

        def work() -> None:
            try:
                self.model.warmup()
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

    # -- ASGI --------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        allow = None
        try:
            status, body = await self._route(scope, receive)
        except RequestError as e:
            status, body, allow = e.status, {"error": str(e)}, e.allow
        except Exception as e:  # never let one request take the server down
            log.exception("unexpected error")
            status, body = 500, {"error": f"internal error: {type(e).__name__}: {e}"}
        await _respond(send, status, body, allow)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.start_warmup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.pool.shutdown(wait=True)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope: dict[str, Any], receive: Receive) -> tuple[int, Any]:
        method, path = scope["method"], scope["path"].rstrip("/") or "/"
        model = self.model
        name, version = model.spec["name"], model.spec["version"]

        if path == "/health":
            self._only(method, "GET")
            return (200, {"status": "ready"}) if self.ready.is_set() else (503, {"status": "warming up"})
        if path == "/info":
            self._only(method, "GET")
            return 200, to_json(model.info())  # metadata from the model may hold NaN or odd types
        if path == "/predict":
            self._only(method, "POST")
            body = await self._json(scope, receive)
            self._need_ready()
            feeds = decode_predict(body, model.inputs, model.overridable)
            return 200, encode_predict(await self._infer(feeds, None))
        if path == "/v2":
            self._only(method, "GET")
            return 200, {"name": "gpux", "version": self.pack_version, "extensions": []}
        if path == "/v2/health/live":
            self._only(method, "GET")
            return 200, {"live": True}
        if path == "/v2/health/ready":
            self._only(method, "GET")
            return (200, {"ready": True}) if self.ready.is_set() else (503, {"ready": False})
        m = _V2_MODEL.match(path)
        if m:
            if m["name"] != name:
                raise RequestError(f"unknown model '{m['name']}'; this server serves '{name}'", 404)
            if m["version"] is not None and m["version"] != version:
                raise RequestError(f"unknown version '{m['version']}' of '{name}'; it has '{version}'", 404)
            rest = m["rest"]
            if rest is None:
                self._only(method, "GET")
                return 200, self._metadata()
            if rest == "/ready":
                self._only(method, "GET")
                return (200, {"name": name, "ready": True}) if self.ready.is_set() else (503, {"name": name, "ready": False})
            self._only(method, "POST")
            body = await self._json(scope, receive)
            self._need_ready()
            feeds, wanted = decode_v2(body, model.inputs, model.outputs, model.overridable)
            outputs = await self._infer(feeds, wanted)
            answer: dict[str, Any] = {"model_name": name, "model_version": version}
            if isinstance(body.get("id"), str):
                answer["id"] = body["id"]
            answer["outputs"] = encode_v2(outputs, self.outputs)
            return 200, answer
        raise RequestError(f"no such endpoint: {method} {scope['path']}", 404)

    @staticmethod
    def _only(method: str, allowed: str) -> None:
        if method != allowed:
            raise RequestError(f"method {method} not allowed here; use {allowed}", 405, allow=allowed)

    def _need_ready(self) -> None:
        if not self.ready.is_set():
            raise RequestError("the model is warming up; retry when /v2/health/ready answers 200", 503)

    def _metadata(self) -> dict[str, Any]:
        m = self.model
        return {
            "name": m.spec["name"],
            "versions": [m.spec["version"]],
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": s.name, "datatype": s.datatype, "shape": s.v2_shape} for s in m.inputs],
            "outputs": [{"name": s.name, "datatype": s.datatype, "shape": s.v2_shape} for s in m.outputs],
        }

    async def _json(self, scope: dict[str, Any], receive: Receive) -> Any:
        limit = self.model.settings.max_body_bytes
        for key, value in scope.get("headers", []):
            if key == b"content-length" and value.isdigit() and int(value) > limit:
                raise RequestError(f"request body of {int(value)} bytes exceeds the limit of {limit}", 413)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestError("client went away", 400)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestError(f"request body exceeds the limit of {limit} bytes", 413)
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        if not raw.strip():
            raise RequestError("empty body; expected JSON")
        return parse_json(raw)

    async def _infer(self, feeds: dict[str, Any], names: list[str] | None) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        timeout = self.model.settings.timeout
        job = loop.run_in_executor(self.pool, self.model.run, feeds, names)
        try:
            return await asyncio.wait_for(job, timeout)
        except asyncio.TimeoutError:
            raise RequestError(f"inference took longer than {timeout:g}s", 504) from None
        except Exception as e:
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
            if type(e).__name__ in ("InvalidArgument", "InvalidGraph", "Fail"):
                raise RequestError(f"the model rejected the inputs: {text}") from None
            raise


async def _respond(send: Send, status: int, body: Any, allow: str | None = None) -> None:
    try:
        payload = _encode(body)
    except (TypeError, ValueError, RecursionError) as e:
        log.error("cannot encode an answer as JSON: %s", e)
        status, payload = 500, b'{"error":"internal error: the answer cannot be encoded as JSON"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if allow and status == 405:
        headers.append((b"allow", allow.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _encode(body: Any) -> bytes:
    """Strict JSON; a body it cannot hold (NaN, a numpy scalar, a set) goes through to_json
    (null, plain values, str) rather than turning an answer into a 500."""
    try:
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError):
        return json.dumps(to_json(body), separators=(",", ":"), allow_nan=False).encode()


def serve(model: Model, pack_version: str = "", handoff: Callable[[Any], None] | None = None) -> int:
    """Run uvicorn in this thread. `handoff(server)` is called just before uvicorn takes over
    SIGTERM/SIGINT, so the caller's handler can stop the server instead of the process."""
    import uvicorn

    settings = model.settings
    app = App(model, pack_version)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        server_header=False,
        timeout_graceful_shutdown=max(10, int(settings.timeout) + 5),
        access_log=settings.log_level == "debug",
        http="h11",
        loop="asyncio",
    )
    server = uvicorn.Server(config)
    app.server = server
    if handoff is not None:
        handoff(server)
    server.run()
    return 0 if server.started and app.failed is None else 1
