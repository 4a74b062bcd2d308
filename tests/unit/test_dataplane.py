"""The data plane (runtime/dataplane.py) in process: the same infer requests sent over KServe v2
REST (JSON, and binary data) and over gRPC get one answer and one refusal, the refusal's status
mapped to each protocol's own; a request's bytes are given back once it is answered
(budget.Hold)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from gpux_pack.runtime import grpc_v2
from gpux_pack.runtime.server import App
from gpux_pack.runtime.session import Model
from gpux_pack.runtime.tensors import RequestError

from tests.in_process import Client, grpc_calls, reference, settings, spec_dir

# how each HTTP status a refusal carries is told over gRPC
GRPC_CODE = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 413: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE",
             504: "DEADLINE_EXCEEDED"}
DTYPE = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64}


@dataclass
class Ask:
    """One infer request, as every protocol carries it."""

    inputs: list[tuple[str, str, list[int], np.ndarray]]  # (name, datatype, shape, values)
    outputs: list[str] | None = None  # None: all
    model: str = "iris-mlp"


X = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
GOOD = Ask([("features", "FP32", [2, 4], X)])


def rest(client: Client, ask: Ask, binary: bool) -> tuple:
    """("OK", {output: (datatype, array)}) or (HTTP status, message), asked as v2 REST: JSON
    data, or binary data in and out (the binary tensor extension)."""
    items, tail = [], b""
    for name, datatype, shape, x in ask.inputs:
        item = {"name": name, "datatype": datatype, "shape": shape}
        if binary:
            item["parameters"] = {"binary_data_size": x.nbytes}
            tail += x.tobytes()
        else:
            item["data"] = x.ravel().tolist()
        items.append(item)
    doc: dict = {"inputs": items, "parameters": {"binary_data_output": binary}}
    if ask.outputs is not None:
        doc["outputs"] = [{"name": o} for o in ask.outputs]
    header = json.dumps(doc).encode()
    headers = [(b"inference-header-content-length", str(len(header)).encode())] if binary else []
    start, sent = client.raw("POST", f"/v2/models/{ask.model}/infer", header + tail, headers)
    body = bytes(sent["body"])
    if start["status"] != 200:
        return start["status"], json.loads(body)["error"]
    length = dict(start["headers"]).get(b"inference-header-content-length")
    assert (length is not None) == binary, "binary data answered as asked"
    head, at = json.loads(body[:int(length)] if binary else body), int(length or 0)
    out = {}
    for o in head["outputs"]:
        dtype = DTYPE[o["datatype"]]
        if binary:
            size = o["parameters"]["binary_data_size"]
            values, at = np.frombuffer(body[at:at + size], dtype), at + size
        else:
            values = np.asarray(o["data"], dtype)
        out[o["name"]] = (o["datatype"], values.reshape(o["shape"]))
    assert at == len(body) if binary else True
    return "OK", out


def grpc_message(ask: Ask) -> bytes:
    message = grpc_v2.message_classes()["ModelInferRequest"](model_name=ask.model)
    for name, datatype, shape, x in ask.inputs:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_input_contents.append(x.tobytes())
    for o in ask.outputs or ():
        message.outputs.add(name=o)
    return message.SerializeToString()


def grpc_answer(code: str, details) -> tuple:
    """("OK", {output: (datatype, array)}) or (gRPC status code, message)."""
    if code != "OK":
        return code, details
    response = grpc_v2.message_classes()["ModelInferResponse"].FromString(details)
    return "OK", {o.name: (o.datatype, np.frombuffer(raw, DTYPE[o.datatype]).reshape(list(o.shape)))
                  for o, raw in zip(response.outputs, response.raw_output_contents)}


def over_every_protocol(client: Client, asks: list[Ask]) -> list[tuple]:
    """Each request over REST JSON, REST binary and gRPC: one answer (the same outputs, datatypes,
    shapes and values) or one refusal (the same message, the status told in each protocol's way).
    What each got, as REST JSON got it."""
    grpc = [grpc_answer(*a) for a in grpc_calls(client.app, [("ModelInfer", grpc_message(ask)) for ask in asks])]
    got = []
    for ask, over_grpc in zip(asks, grpc):
        as_json, as_binary = rest(client, ask, False), rest(client, ask, True)
        if as_json[0] == "OK":
            for other in (as_binary, over_grpc):
                assert other[0] == "OK", (ask, other)
                assert list(other[1]) == list(as_json[1]), (ask, other)  # the same outputs, in the same order
                for name, (datatype, values) in as_json[1].items():
                    assert other[1][name][0] == datatype and other[1][name][1].shape == values.shape, (ask, name)
                    np.testing.assert_array_equal(other[1][name][1], values)
        else:
            assert as_binary == as_json, (ask, as_json, as_binary)
            assert over_grpc == (GRPC_CODE[as_json[0]], as_json[1]), (ask, as_json, over_grpc)
        got.append(as_json)
    assert client.app.budget.in_flight_bytes == 0  # every request's bytes given back
    return got


def _app(tmp_path, warm: bool = True, **env: str) -> Client:
    app = App(Model.load(settings(spec_dir(tmp_path, "mlp"), **env)), "test")
    if warm:
        app.start_warmup()
        assert app.ready.wait(10)
    return Client(app)


def test_answers_are_the_same_over_rest_and_grpc_and_an_output_filter_is_kept(mlp):
    logits, probs = reference("mlp", {"features": X})
    everything, only_probs = over_every_protocol(mlp, [GOOD, Ask(GOOD.inputs, outputs=["probs"])])
    assert everything[0] == "OK" and list(everything[1]) == ["logits", "probs"]
    assert everything[1]["logits"][0] == "FP32"
    np.testing.assert_allclose(everything[1]["logits"][1], logits, atol=1e-6)
    np.testing.assert_allclose(everything[1]["probs"][1], probs, atol=1e-6)
    assert only_probs[0] == "OK" and list(only_probs[1]) == ["probs"]
    np.testing.assert_array_equal(only_probs[1]["probs"][1], everything[1]["probs"][1])


MISTAKES = {  # what is wrong -> (the request, its status, its message)
    "unknown input": (Ask([("feature", "FP32", [2, 4], X)]), 400,
                      "unknown input 'feature'; the model's inputs are: features"),
    "wrong datatype": (Ask([("features", "FP64", [2, 4], X.astype(np.float64))]), 400,
                       "input 'features': datatype FP64 does not match the model's FP32"),
    "wrong shape": (Ask([("features", "FP32", [4, 2], X)]), 400, "input 'features': dimension 1 must be 4 [batch, 4], got shape [4, 2]"),
    "unknown output": (Ask(GOOD.inputs, outputs=["logit"]), 400,
                       "unknown output 'logit'; the model's outputs are: logits, probs"),
    "unknown model": (Ask(GOOD.inputs, model="nope"), 404, "unknown model 'nope'; this server serves 'iris-mlp'"),
    "over the tensor budget": (Ask([("features", "FP32", [1 << 40, 4], X)]), 413,
                               f"input 'features': shape [{1 << 40}, 4] makes the request's tensors {16 << 40} bytes, "
                               "more than this server's budget of {budget} bytes per request (GPUX_MAX_REQUEST_BYTES)"),
}


@pytest.mark.parametrize("what", MISTAKES)
def test_a_mistake_is_refused_alike_over_rest_and_grpc(mlp, what):
    ask, status, message = MISTAKES[what]
    [got] = over_every_protocol(mlp, [ask])
    assert got == (status, message.replace("{budget}", str(mlp.app.model.settings.max_request_bytes)))
    assert mlp.app.metrics.refused.values == {}  # a mistake is no refusal of service


def test_a_missing_input_is_refused_alike_over_rest_and_grpc(tiny):
    """The tiny model's `scale` is optional, its `x` required: a request with `scale` only."""
    scale = np.ones(3, np.float32)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    missing, good = over_every_protocol(tiny, [Ask([("scale", "FP32", [3], scale)], model="tiny"),
                                               Ask([("x", "FP32", [2, 3], x), ("scale", "FP32", [3], scale * 2)],
                                                   model="tiny")])
    assert missing == (400, "missing required input 'x'")
    assert good[0] == "OK"
    np.testing.assert_array_equal(good[1]["y"][1], x * 2 + np.array([1, 2, 3], np.float32))


def test_a_body_over_the_limit_is_refused_alike_over_rest_and_grpc(tmp_path):
    """GPUX_MAX_BODY_BYTES holds for a gRPC message as for an HTTP body (grpc's own limit is
    never under 1 MiB)."""
    client = _app(tmp_path, GPUX_MAX_BODY_BYTES="2000")
    large = Ask([("features", "FP32", [200, 4], np.ones((200, 4), np.float32))])  # 3200 bytes in every form
    refused, answered = over_every_protocol(client, [large, GOOD])
    assert refused == (413, "request body exceeds the limit of 2000 bytes (GPUX_MAX_BODY_BYTES)")
    assert answered[0] == "OK"


def test_not_ready_is_503_and_unavailable_and_says_what_to_wait_for(tmp_path):
    client = _app(tmp_path, warm=False)
    expected = "the model is warming up; retry when {}"
    for _ in range(2):
        [over_grpc] = [grpc_answer(*a) for a in grpc_calls(client.app, [("ModelInfer", grpc_message(GOOD))])]
        as_json, as_binary = rest(client, GOOD, False), rest(client, GOOD, True)
        assert as_json == as_binary == (503, expected.format("/v2/health/ready answers 200"))
        assert over_grpc == ("UNAVAILABLE", expected.format("ServerReady is true"))
        expected = "the model is draining; retry when {}"
        client.app.ready.set()
        client.app.server = SimpleNamespace(should_exit=True)  # SIGTERM: draining
    assert client.app.metrics.refused.values == {"not_ready": 6}  # each refusal counted once, whichever way
    assert client.app.budget.in_flight_bytes == 0


def test_a_full_budget_and_a_stopped_scheduler_are_refused_alike_over_rest_and_grpc(mlp):
    """Charged before any work: a request that finds the in-flight budget full is 503 before it
    is read; one that finds the scheduler stopped is 503 too. Each counted once."""
    app = mlp.app
    held = app.budget.hold(app.budget.room - (1 << 20))  # another request holds all but 1 MiB
    try:
        grpc = [grpc_answer(*a) for a in grpc_calls(app, [("ModelInfer", grpc_message(GOOD))])]
        as_json, as_binary = rest(mlp, GOOD, False), rest(mlp, GOOD, True)
    finally:
        app.budget.release(held)
    assert as_json == as_binary == (503, "too many request bytes in flight; retry shortly")
    assert grpc == [("UNAVAILABLE", as_json[1])]
    assert app.metrics.refused.values == {"memory": 3}
    app.scheduler.close()
    [stopped] = over_every_protocol(mlp, [GOOD])
    assert stopped == (503, "the server is shutting down")
    assert app.metrics.refused.values == {"memory": 3, "busy": 3}


# -- the budget held by a context manager ----------------------------------------------------


def test_a_hold_is_given_back_when_its_block_ends_however_it_ends(mlp):
    budget = mlp.app.budget
    with budget.held(1000) as hold:
        hold.grow(500)
        assert budget.in_flight_bytes == 1500
    assert budget.in_flight_bytes == 0 and hold.bytes == 0
    with pytest.raises(ValueError):
        with budget.held(1000):
            raise ValueError("a bug")
    assert budget.in_flight_bytes == 0
    with pytest.raises(RequestError) as refused:
        with budget.held(1000) as hold:
            hold.swap(budget.room)  # the new charge does not fit beside the old: 503, the old still held
    assert refused.value.status == 503 and budget.in_flight_bytes == 0


def test_a_transferred_hold_outlives_its_block_and_is_given_back_once(mlp):
    """What an answer sent after its handler returns holds: released once it is sent, once."""
    budget = mlp.app.budget
    with budget.held(1000) as hold:
        hold.swap(300)
        answer = hold.transfer()
    assert budget.in_flight_bytes == 300
    answer.release()
    answer.release()
    assert budget.in_flight_bytes == 0
    with budget.held(700) as hold:
        answer = hold.transfer()
    with answer:  # gRPC's way: its sender's own block
        assert budget.in_flight_bytes == 700
    assert budget.in_flight_bytes == 0
    with pytest.raises(ValueError):
        with budget.held(700) as hold:
            hold.transfer()
            raise ValueError("the answer is never sent")
    assert budget.in_flight_bytes == 0


def test_an_answer_sent_in_pieces_holds_its_bytes_until_the_last_piece_is_sent(mlp):
    """The bytes of a /predict answer are released after it is sent, not when the handler returns."""
    app = mlp.app
    seen = []
    body = json.dumps({"features": np.ones((40000, 4)).tolist()}).encode()

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        seen.append((message["type"], app.budget.in_flight_bytes))

    asyncio.run(app({"type": "http", "method": "POST", "path": "/predict", "headers": []}, receive, send))
    assert seen[0][0] == "http.response.start" and len(seen) > 2  # in pieces
    assert all(held > 0 for _, held in seen)  # held while every piece went out
    assert app.budget.in_flight_bytes == 0
