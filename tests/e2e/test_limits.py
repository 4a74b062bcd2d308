"""Hostile sizes against real containers with small memory limits, locked down as deploy runs
them: a JSON body at the body limit is served or refused (413/503), never an OOM kill; huge or
unfinished request heads are refused and closed, and memory stays where it was."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time

import numpy as np
import pytest
import requests

from tests.e2e.test_serving import _grpc_infer_bytes, _memory, grpc_infer
from tests.conftest import serve

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
LOCKED = {"read_only": True, "tmpfs": {"/tmp": ""}, "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"]}


def _alive(server) -> None:
    container = server.container.get_wrapped_container()
    container.reload()
    assert container.status == "running" and not container.attrs["State"]["OOMKilled"], container.attrs["State"]
    answer = server.post("/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]})
    assert answer.status_code == 200, (answer.text, [line for line in server.get("/metrics").text.splitlines()
                                                     if line.startswith(("gpux_request_room", "gpux_resident", "gpux_in_flight"))], _memory(container))


def _bodies(size: int) -> dict[str, tuple[str, bytes]]:
    """/predict and v2 JSON bodies of float rows, and one that must be parsed whole, of `size` bytes at most."""
    rows = (size - 40) // 18
    predict = b'{"features": [' + b"[5.1,3.5,1.4,0.2]," * (rows - 1) + b"[5.1,3.5,1.4,0.2]]}"
    head = json.dumps({"inputs": [{"name": "features", "shape": [rows, 4], "datatype": "FP32", "data": [0]}]}).encode()
    head = head[: head.rindex(b"[0]")] + b"[" + b"5.1,3.5,1.4,0.2," * (rows - 1) + b"5.1,3.5,1.4,0.2]}]}"
    escaped = predict[:-1] + b', "note": "caf\\u00e9"}'  # a backslash: no split, Python objects
    return {"predict": ("/predict", predict), "v2": ("/v2/models/iris-mlp/infer", head),
            "escaped": ("/predict", escaped)}


@pytest.mark.parametrize("memory", ["256m", "128m"])
def test_json_at_the_body_limit_is_served_or_refused_never_oom_killed(mlp_image, memory):
    limit = int(memory[:-1]) * MiB // 16  # GPUX_MAX_BODY_BYTES's default: a sixteenth of the memory
    with serve(mlp_image["tag"], mem_limit=memory, **LOCKED) as server:
        cases = {f"{k}@limit": v for k, v in _bodies(limit - 64).items()}
        cases["predict@12MiB"] = _bodies(12 * MiB)["predict"]  # the reporter's OOM at 256m
        served = _bodies(limit // 8)  # a 128th of the memory: within the per-request budget, answer included
        cases["predict@served"], cases["v2@served"] = served["predict"], served["v2"]
        seen = {}
        for name, (path, body) in cases.items():
            if len(body) > limit:
                continue
            r = requests.post(server.url + path, data=body, timeout=120)
            seen[name] = r.status_code
            assert r.status_code in (200, 413, 503), (name, r.status_code, r.text[:300])
            _alive(server)
        assert seen["escaped@limit"] == 413, seen  # 40x its size can never fit: refused before parsing
        assert seen["predict@served"] == seen["v2@served"] == 200, seen  # 58,000 rows at 128m, as JSON both ways


def _unfinished_head(port: int, size: int) -> bytes:
    """Send a request head of `size` bytes that never ends; what the server answers before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(size // 65536):
                sock.sendall(b"a" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        return data


def test_huge_and_unfinished_heads_are_closed_and_memory_stays_flat(mlp_image):
    with serve(mlp_image["tag"], mem_limit="256m", env={"GPUX_READ_TIMEOUT": "2"}, **LOCKED) as server:
        port = int(server.url.rsplit(":", 1)[1])
        container = server.container.get_wrapped_container()
        _alive(server)
        idle = _memory(container)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda _: _unfinished_head(port, 4 * MiB), range(16)))
        assert all(a.startswith(b"HTTP/1.1 431") for a in answers), {a[:40] for a in answers}
        with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:  # a head that stops coming
            slow.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: a")
            assert slow.recv(65536).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - started < 20
        assert server.post("/predict", json={"features": [[1, 2, 3, 4]]}, headers={"X-Fine": "a" * 8000}).status_code == 200
        after = _memory(container)
        assert after <= idle * 1.2, (idle, after)
        _alive(server)


def _binary(rows: int) -> tuple[bytes, dict[str, str]]:
    x = np.full((rows, 4), 0.5, np.float32)
    head = json.dumps({"inputs": [{"name": "features", "shape": [rows, 4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


@pytest.mark.parametrize("memory, big", [("128m", 6_400_000), ("256m", 6_400_000), ("512m", 25_600_000)])
def test_parallel_and_sequential_requests_inside_the_limits_never_oom_kill(grpc_images, memory, big):
    """The reporter's OOM kills, each under its own limits: at 128 MiB four parallel 6.4 MB binary
    v2 requests (two answered, then exit 137), at 512 MiB ten of 25.6 MB, at 256 MiB eight 6 MiB
    gRPC calls (grpc reads a message before any handler can refuse it: now at most 16 calls and
    a 64th of the in-flight budget each are read at once); JSON at the body limit in parallel
    too. Every answer is 200 (or OK), 413 or 503 (RESOURCE_EXHAUSTED, UNAVAILABLE): what does not
    fit is refused before it is held, counted with its outputs, its answer and the model's own
    tensors. A request that fits is answered after each burst, and the container is never killed."""
    limit = int(memory[:-1]) * MiB // 16  # the body limit
    small, small_headers = _binary(4096)
    bursts = {"binary": [_binary(big // 16)] * (10 if memory == "512m" else 4),
              "json": [(_bodies(limit - 64)["v2"][1], {})] * 4}
    with serve(grpc_images["mlp"]["tag"], extra_ports=(8001,), mem_limit=memory, **LOCKED) as server:
        url = server.url + "/v2/models/iris-mlp/infer"
        for name, requests_ in bursts.items():
            for parallel in (True, False):
                def send(item: tuple[bytes, dict[str, str]]) -> int:
                    return requests.post(url, data=item[0], headers=item[1], timeout=120).status_code

                with concurrent.futures.ThreadPoolExecutor(len(requests_) if parallel else 1) as pool:
                    codes = list(pool.map(send, requests_))
                assert set(codes) <= {200, 413, 503}, (name, parallel, codes)
                _alive(server)
                assert send((small, small_headers)) == 200
        largest = max(MiB, min(limit, int(memory[:-1]) * MiB // 128))  # grpc_v2.call_limits: a 64th of the in-flight half
        with grpc_infer(server) as call:
            for size in (big, largest - 64 * 1024):  # the reporter's, and the largest message read
                for parallel in (8, 1):
                    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
                        codes = list(pool.map(call, [_grpc_infer_bytes(False, size)] * 8))
                    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED", "UNAVAILABLE"}, (size, parallel, codes)
                    _alive(server)
            last = call(_grpc_infer_bytes(False, 4096 * 16))
            assert last == "OK", (last, [line for line in server.get("/metrics").text.splitlines()
                                         if line.startswith(("gpux_request_room", "gpux_resident", "gpux_in_flight"))])


def test_eight_trickling_uploads_do_not_hold_other_clients_off(mlp_image):
    """`--memory 128m` (a 64 MiB in-flight budget): eight connections declare 8 MiB bodies and
    send a few bytes now and then. Charged by what they declared, they held the whole budget and
    every other request was 503 for as long as they trickled; charged by what arrived, they hold
    a few kilobytes, and other clients are answered 200 meanwhile, the container alive."""
    with serve(mlp_image["tag"], mem_limit="128m", env={"GPUX_READ_TIMEOUT": "30"}, **LOCKED) as server:
        port = int(server.url.rsplit(":", 1)[1])
        slow = []
        try:
            for _ in range(8):
                sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 8388608\r\n\r\n" + b'{"features": [' + b"[1,2,3,4]," * 100)
                slow.append(sock)
            for _ in range(3):  # the tricklers keep sending (each under the read timeout) while others ask
                for sock in slow:
                    sock.sendall(b"[1,2,3,4]," * 10)
                answers = [server.post("/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]] * 1000}).status_code
                           for _ in range(10)]
                assert answers == [200] * 10, answers
            metrics = server.get("/metrics").text
            assert 'gpux_refused_total{reason="memory"}' not in metrics or \
                   'gpux_refused_total{reason="memory"} 0.0' in metrics
        finally:
            for sock in slow:
                sock.close()
        _alive(server)
