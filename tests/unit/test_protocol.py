"""The HTTP server's limits on a request's head and on silent clients, through real sockets on
127.0.0.1 against the runtime's own `serve` (uvicorn with httptools, as in the image)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import requests

from gpux_pack.runtime import server as runtime_server
from gpux_pack.runtime.session import Model
from tests.in_process import settings, spec_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(tmp_path):
    port = _free_port()
    model = Model.load(settings(spec_dir(tmp_path, "mlp"), GPUX_PORT=str(port), GPUX_HOST="127.0.0.1",
                                GPUX_READ_TIMEOUT="1", GPUX_MAX_HEADER_BYTES="16384"))
    handed: list = []
    thread = threading.Thread(target=runtime_server.serve, args=(model, "test", handed.append), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert thread.is_alive(), "the server stopped"
        try:
            if requests.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                break
        except requests.ConnectionError:
            time.sleep(0.05)
    yield port, url
    handed[0].should_exit = True
    thread.join(10)


def _answer(sock: socket.socket, within: float) -> bytes:
    """Everything the server sends until it closes the connection (fails if it stays open)."""
    sock.settimeout(within)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_a_huge_header_is_431_and_closed_the_server_goes_on(served):
    port, url = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(64):  # up to 4 MiB, never finished
                sock.sendall(b"a" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending: what we want
        answer = _answer(sock, 5)
    assert answer.startswith(b"HTTP/1.1 431") and b"GPUX_MAX_HEADER_BYTES" in answer, answer[:200]
    assert requests.get(url + "/v2/health/live", headers={"X-Fine": "a" * 8000}, timeout=5).status_code == 200
    metrics = requests.get(url + "/metrics", timeout=5).text
    assert 'gpux_refused_total{reason="headers"} 1.0' in metrics


def test_unfinished_headers_and_silent_bodies_are_closed_within_the_timeout(served):
    port, url = served
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as idle, \
            socket.create_connection(("127.0.0.1", port)) as partial, \
            socket.create_connection(("127.0.0.1", port)) as body:
        partial.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        body.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"features\": [[1, 2")
        answers = [_answer(s, 5) for s in (idle, partial, body)]
    assert time.monotonic() - started < 4
    assert answers[0].startswith(b"HTTP/1.1 408") and answers[1].startswith(b"HTTP/1.1 408"), answers
    assert b"GPUX_READ_TIMEOUT" in answers[1]
    assert not answers[2].startswith(b"HTTP/1.1 2"), answers[2]  # no answer to half a body
    assert requests.post(url + "/predict", json={"features": [[1, 2, 3, 4]]}, timeout=5).status_code == 200


def test_keep_alive_requests_are_each_timed_afresh(served):
    port, _ = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(3):  # three requests, more time in all than the timeout: each head is timely
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(5)
            data = b""
            while not data.endswith(b'{"live":true}'):
                chunk = sock.recv(65536)
                assert chunk, data  # closed: the keep-alive connection must stay open
                data += chunk
            assert data.startswith(b"HTTP/1.1 200")
            time.sleep(0.4)  # a client pausing between requests (not synchronisation)


@pytest.mark.parametrize("count, header", [(200, 1024), (50, 2048), (8, 15000)])
def test_pipelined_requests_are_each_held_to_the_head_limit_not_together(served, count, header):
    """200 GETs with 1 KiB of headers each in one write: 200 heads of about 1 KiB against a 16 KiB
    limit (their sum, 200 KiB, was counted as one head: two answers, then 431)."""
    port, _ = served
    one = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * header + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(one * count)
        sock.settimeout(10)
        data = b""
        while data.count(b"HTTP/1.1 200") < count:
            chunk = sock.recv(1 << 20)
            assert chunk and b"HTTP/1.1 4" not in data, data[-300:]
            data += chunk
    assert data.count(b"HTTP/1.1 ") == count and b"431" not in data


def test_a_pipelined_request_past_the_limit_is_431_and_closes_the_connection(served):
    port, url = served
    fine = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    big = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(fine + big + fine)
        answer = _answer(sock, 5)
    assert b"HTTP/1.1 431" in answer and answer.count(b"HTTP/1.1 200") <= 1, answer[-300:]
    assert requests.get(url + "/v2/health/live", timeout=5).status_code == 200
