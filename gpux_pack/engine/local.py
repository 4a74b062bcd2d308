"""A local engine's client with the standard library alone, over its unix socket: what a build asks
of the engine (images, their inspect and history, `docker load`, info, version) costs no import
of the Docker SDK and requests (49 ms of a 0.4 s rebuild). What it does not serve (containers,
the builder, pull, push, the credential helpers) goes to the SDK's client, made on first use,
so those behave as they always did. Its errors are interface.py's, with the SDK's wording."""

from __future__ import annotations

import codecs
import http.client
import json
from typing import IO, Any, Iterable, Iterator
from urllib.parse import quote, urlencode

from gpux_pack.engine.interface import EngineError, EngineGone, ImageNotFound
from gpux_pack.engine.unix_socket import Connection

TIMEOUT = 600  # seconds, as the SDK's client is made with
BASE_URL = "http+docker://localhost"  # what the SDK calls a local socket (engine._is_local reads it)
SMALL = 64 << 10  # body pieces below this are gathered and sent as one chunk
# a 404 saying one of these is the SDK's ImageNotFound (docker/errors.py)
_NOT_FOUND = ("no such image", "not found: does not exist or no pull access", "repository does not exist",
              "was found but does not match the specified platform")


class LocalEngine:
    """The engine at a unix socket, spoken to in its API version (from /_ping, as the SDK's URLs
    name theirs)."""

    def __init__(self, path: str, api_version: str):
        self.path, self.api_version = path, api_version
        self.images = Images(self)
        self.api = Api(self)
        self._sdk: Any = None

    @property
    def containers(self) -> Any:
        return self.sdk().containers

    def sdk(self) -> Any:
        """The Docker SDK's client for the same engine, made as connect() made it before."""
        if self._sdk is None:
            import docker

            self._sdk = docker.from_env(timeout=TIMEOUT, version=self.api_version)
        return self._sdk

    def info(self) -> dict[str, Any]:
        return self.json("GET", "/info")

    def version(self) -> dict[str, Any]:
        return self.json("GET", "/version")

    def ping(self) -> bool:
        return self.call("GET", "/_ping") == b"OK"

    # -- HTTP -----------------------------------------------------------------------------------

    def json(self, method: str, path: str, params: dict[str, str] | None = None) -> Any:
        return json.loads(self.call(method, path, params))

    def call(self, method: str, path: str, params: dict[str, str] | None = None) -> bytes:
        response, conn = self.open(method, path, params)
        try:
            return response.read()
        except (OSError, http.client.HTTPException) as e:
            raise _gone(e) from None
        finally:
            conn.close()

    def open(self, method: str, path: str, params: dict[str, str] | None = None,
             body: bytes | Iterable[bytes] | None = None,
             headers: dict[str, str] | None = None) -> tuple[http.client.HTTPResponse, Connection]:
        """Send a request (a body streamed in chunks) and read its answer's head: the answer and
        its connection, for the caller to read and close; an error status raises."""
        url = f"/v{self.api_version}{path}" + (f"?{urlencode(params)}" if params else "")
        conn = Connection(self.path, TIMEOUT)
        try:
            if body is None:
                conn.request(method, url, headers=headers or {})
            else:
                conn.putrequest(method, url, skip_accept_encoding=True)
                for key, value in {**(headers or {}), "Transfer-Encoding": "chunked"}.items():
                    conn.putheader(key, value)
                conn.endheaders()
                _send_chunked(conn, [body] if isinstance(body, (bytes, bytearray)) else body)
            response = conn.getresponse()
            if response.status >= 400:
                raise _refused(response.status, response.reason, url, response.read())
        except _BodyFailed as e:  # reading what was sent failed: that error, not the engine's
            conn.close()
            raise e.error from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _gone(e) from None
        except BaseException:
            conn.close()
            raise
        return response, conn


def _quoted(name: str) -> str:
    if not name:
        raise ImageNotFound("no image name or id given")
    return quote(name, safe="/:")  # as the SDK's URLs


def _flag(value: bool) -> str:
    return "1" if value else "0"


class _BodyFailed(Exception):
    def __init__(self, error: BaseException):
        self.error = error


def _send_chunked(conn: Connection, body: Iterable[bytes]) -> None:
    """The body in HTTP chunks: small pieces (tar headers, small files) gathered, large ones sent
    as they are (not copied)."""
    pending = bytearray()
    pieces = iter(body)
    while True:
        try:
            piece = next(pieces, None)
        except Exception as e:
            raise _BodyFailed(e) from None
        if piece is None or len(piece) >= SMALL or len(pending) >= SMALL:
            if pending:
                conn.send(b"%X\r\n%s\r\n" % (len(pending), pending))
                pending.clear()
        if piece is None:
            break
        if len(piece) >= SMALL:
            conn.send(b"%X\r\n" % len(piece))
            conn.send(piece)
            conn.send(b"\r\n")
        else:
            pending += piece
    conn.send(b"0\r\n\r\n")


def _refused(status: int, reason: str, url: str, data: bytes) -> EngineError:
    """The engine's error answer, worded as the SDK's APIError."""
    try:
        explanation = str(json.loads(data)["message"])
    except (ValueError, KeyError, TypeError):
        explanation = data.decode("utf-8", "replace").strip()
    message = f"{status} {'Client' if status < 500 else 'Server'} Error for {BASE_URL}{url}: {reason}"
    if explanation:
        message += f' ("{explanation}")'
    found = status == 404 and any(f in explanation.lower() for f in _NOT_FOUND)
    return (ImageNotFound if found else EngineError)(message, status, explanation)


def _gone(e: BaseException) -> EngineGone:
    return EngineGone(str(e) or type(e).__name__)


class Image:
    """An image as `docker image inspect` gave it."""

    def __init__(self, engine: LocalEngine, attrs: dict[str, Any]):
        self._engine = engine
        self.attrs = attrs

    @property
    def id(self) -> str:
        return self.attrs["Id"]

    @property
    def tags(self) -> list[str]:
        return [t for t in self.attrs.get("RepoTags") or [] if t != "<none>:<none>"]

    def tag(self, repository: str, tag: str | None = None) -> bool:
        params = {"repo": repository, "force": "0", **({"tag": tag} if tag is not None else {})}
        self._engine.call("POST", f"/images/{_quoted(self.id)}/tag", params)
        return True

    def __repr__(self) -> str:
        return f"<Image: {', '.join(self.tags) or self.id[7:19]}>"


class Images:
    def __init__(self, engine: LocalEngine):
        self._engine = engine

    def get(self, name: str) -> Image:
        return Image(self._engine, self._engine.api.inspect_image(name))

    def remove(self, image: str, *, force: bool = False, noprune: bool = False) -> None:
        self._engine.call("DELETE", f"/images/{_quoted(image)}", {"force": _flag(force), "noprune": _flag(noprune)})

    def list(self, *, filters: dict[str, Any] | None = None) -> list[Image]:
        """Each listed image inspected (as the SDK does: the list's rows lack LastTagTime); one
        removed meanwhile is left out."""
        params = {"only_ids": "0", "all": "0", **({"filters": _filters(filters)} if filters else {})}
        found = []
        for row in self._engine.json("GET", "/images/json", params):
            try:
                found.append(self.get(row["Id"]))
            except ImageNotFound:
                continue
        return found


def _filters(filters: dict[str, Any]) -> str:
    """The SDK's filter encoding: each value a list of strings, booleans as true/false."""
    out = {}
    for key, value in filters.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        out[key] = [v if isinstance(v, str) else str(v) for v in (value if isinstance(value, list) else [value])]
    return json.dumps(out)


class Api:
    base_url = BASE_URL

    def __init__(self, engine: LocalEngine):
        self._engine = engine

    @property
    def credstore_env(self) -> dict[str, str] | None:
        return self._engine.sdk().api.credstore_env

    def build(self, *, fileobj: IO[bytes] | Iterable[bytes], **kwargs: Any) -> Iterator[dict[str, Any]]:
        return self._engine.sdk().api.build(fileobj=fileobj, **kwargs)

    def pull(self, repository: str, **kwargs: Any) -> Any:
        return self._engine.sdk().api.pull(repository, **kwargs)

    def push(self, repository: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        return self._engine.sdk().api.push(repository, **kwargs)

    def inspect_image(self, image: str) -> dict[str, Any]:
        return self._engine.json("GET", f"/images/{_quoted(image)}/json")

    def history(self, image: str) -> list[dict[str, Any]]:
        return self._engine.json("GET", f"/images/{_quoted(image)}/history")

    def containers(self, *, all: bool = False) -> list[dict[str, Any]]:
        return self._engine.json("GET", "/containers/json", {"all": _flag(all), "limit": "-1", "size": "0"})

    def load_image(self, data: Iterable[bytes], *, quiet: bool | None = None) -> Iterator[dict[str, Any]]:
        """The archive is sent whole before this returns (as the SDK's); then the engine's
        progress events, decoded, as they come."""
        params = {} if quiet is None else {"quiet": _flag(quiet)}
        response, conn = self._engine.open("POST", "/images/load", params, data, {"Content-Type": "application/x-tar"})
        return _events(response, conn)


def _events(response: http.client.HTTPResponse, conn: Connection) -> Iterator[dict[str, Any]]:
    """The JSON objects of a streamed answer, each as soon as it is whole."""
    decoder, text = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8")("replace")
    buffer = ""
    try:
        while True:
            try:
                piece = response.read1(1 << 16)
            except (OSError, http.client.HTTPException) as e:
                raise _gone(e) from None
            buffer += text.decode(piece, final=not piece)
            while buffer := buffer.lstrip():
                try:
                    event, end = decoder.raw_decode(buffer)
                except ValueError:
                    break  # not whole yet
                buffer = buffer[end:]
                yield event
            if not piece:
                break
        if buffer:
            raise EngineError(f"the engine's answer ended inside an event: {buffer[:100]!r}")
    finally:
        conn.close()
