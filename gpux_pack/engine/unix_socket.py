"""The engine's API over its local unix socket with the standard library alone: the model-only
rebuild (pipeline/rebuild.py) talks to the engine before the Docker SDK and requests could even
be imported, and the engine client of a build (engine/local.py) through the same connection."""

from __future__ import annotations

import http.client
import json
import os
import socket
from typing import Any
from urllib.parse import quote


class Unreachable(Exception):
    """No local engine socket, or it did not answer: the caller takes its slower path."""


class Connection(http.client.HTTPConnection):
    """HTTP over the engine's unix socket (the engine ignores the Host header)."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def socket_path() -> str:
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://") or os.environ.get("DOCKER_CONTEXT"):
        raise Unreachable("the engine is not on a local unix socket")
    return host[len("unix://"):]


def call(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
         timeout: float = 600) -> tuple[int, bytes]:
    conn = Connection(socket_path(), timeout)
    try:
        conn.request(method, url, body=body, headers=headers or {}, encode_chunked=body is not None)
        response = conn.getresponse()
        return response.status, response.read()
    except OSError as e:
        raise Unreachable(f"the engine did not answer ({e})") from None
    finally:
        conn.close()


def image_id(ref: str) -> str | None:
    status, body = call("GET", f"/images/{quote(ref, safe='')}/json")
    return json.loads(body).get("Id") if status == 200 else None


def api_version() -> str | None:
    """The engine's API version, from its cheap /_ping (the Docker SDK asks /version, which
    the engine answers only after asking containerd and runc theirs: 10 ms); None when it is
    not a local engine that answers."""
    try:
        conn = Connection(socket_path(), 5)
    except Unreachable:
        return None
    try:
        conn.request("GET", "/_ping")
        response = conn.getresponse()
        response.read()
        version = response.getheader("Api-Version")
        return version if response.status == 200 and version else None
    except OSError:
        return None
    finally:
        conn.close()
