"""KServe v2 over gRPC in process: the messages tritonclient has, client mistakes and their status
codes, readiness, the byte budget, and the same checks and messages as REST (runtime/v2.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpux_pack.runtime.session import Model
from gpux_pack.runtime.settings import Settings
from gpux_pack.runtime.server import App

from tests.in_process import grpc_calls, infer_request, reference, settings, spec_dir


def test_grpc_messages_match_tritonclients():
    """Field names, numbers, types and oneofs of every message, as tritonclient.grpc has them."""
    from tritonclient.grpc import service_pb2

    from gpux_pack.runtime import grpc_v2

    def fields(d):
        out = {f.name: (f.number, f.type, f.is_repeated, f.message_type.full_name if f.message_type else None,
                        f.containing_oneof.name if f.containing_oneof else None) for f in d.fields}
        out.update({f"nested {n.name}": fields(n) for n in d.nested_types})
        return out

    theirs = service_pb2.DESCRIPTOR
    for name, cls in grpc_v2.message_classes().items():
        ours, expected = fields(cls.DESCRIPTOR), fields(theirs.message_types_by_name[name])
        assert {k: v for k, v in expected.items() if k in ours} == ours, name
    service = theirs.services_by_name["GRPCInferenceService"]
    for method, (request, response) in grpc_v2.METHODS.items():
        m = service.methods_by_name[method]
        assert (m.input_type.name, m.output_type.name) == (request, response)


def test_grpc_answers_client_mistakes_with_their_status_codes_and_no_traceback(mlp, caplog, capfd):
    """Bytes that are no protobuf message (grpc used to answer UNKNOWN and log a traceback),
    for every method, and each client mistake: its status code, one line, nothing logged."""
    from gpux_pack.runtime import grpc_v2

    good = infer_request()
    calls = [(method, b"\xff\xff\xff") for method in grpc_v2.METHODS]
    calls += [("ModelInfer", good[:-5]),  # truncated inside raw_input_contents
              ("ModelInfer", infer_request(model_name="nope")),
              ("ModelInfer", infer_request(name="feature")),
              ("ModelInfer", infer_request(shape=[1 << 40, 4])),
              ("ModelInfer", infer_request(shape=[3, 4])),
              ("ModelInfer", good)]
    with caplog.at_level("DEBUG"):
        answers = grpc_calls(mlp.app, calls)
    parse = [(code, details.split(" (")[0]) for code, details in answers[:len(grpc_v2.METHODS) + 1]]
    assert parse == [("INVALID_ARGUMENT", f"{method}: the request is not a valid {request}")
                     for method, (request, _) in [*grpc_v2.METHODS.items(), ("ModelInfer", ("ModelInferRequest", ""))]]
    codes = [code for code, _ in answers[len(grpc_v2.METHODS) + 1:]]
    assert codes == ["NOT_FOUND", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", "OK"]
    assert "unknown model 'nope'" in answers[-5][1] and "unknown input 'feature'" in answers[-4][1]
    response = grpc_v2.message_classes()["ModelInferResponse"].FromString(answers[-1][1])
    [logits, probs] = reference("mlp", {"features": np.ones((2, 4), np.float32)})
    assert [o.name for o in response.outputs] == ["logits", "probs"]
    np.testing.assert_allclose(np.frombuffer(response.raw_output_contents[1], np.float32).reshape(2, 3), probs,
                               atol=1e-6)
    for _, details in answers[:-1]:
        assert details and "\n" not in details and "Traceback" not in details
    assert not [r for r in caplog.records if r.exc_info or r.levelname in ("ERROR", "CRITICAL")], caplog.text
    assert "Traceback" not in caplog.text + "".join(capfd.readouterr())


def test_grpc_is_unavailable_until_ready_and_while_shutting_down(tmp_path):
    app = App(Model.load(settings(spec_dir(tmp_path, "mlp"))), "test")
    [(code, details)] = grpc_calls(app, [("ModelInfer", infer_request())])
    assert code == "UNAVAILABLE" and "warming up" in details
    app.start_warmup()
    assert app.ready.wait(10)
    app.scheduler.close()
    [(code, details)] = grpc_calls(app, [("ModelInfer", infer_request())])
    assert code == "UNAVAILABLE" and "shutting down" in details


def test_grpc_typed_contents_that_do_not_fit_their_datatype_are_a_client_mistake():
    """300 in int_contents for an INT8 input: numpy's OverflowError became UNKNOWN and a traceback."""
    from types import SimpleNamespace

    from gpux_pack.runtime import grpc_v2
    from gpux_pack.runtime.tensors import RequestError, ServedTensor

    spec = ServedTensor("x", "int8", (-1,))
    model = SimpleNamespace(inputs=[spec], overridable=(), outputs=[])
    request = grpc_v2.message_classes()["ModelInferRequest"](model_name="m")
    request.inputs.add(name="x", datatype="INT8", shape=[2]).contents.int_contents.extend([1, 300])
    with pytest.raises(RequestError, match="input 'x': contents do not fit INT8") as e:
        grpc_v2.decode(request, model, 1 << 20)
    assert e.value.status == 400


def test_grpc_charges_a_message_before_parsing_it_and_counts_one_refusal(tmp_path):
    """The gRPC path reserved its budget only after the message was received and parsed: eight
    6 MiB calls in a 256 MiB container were OOM-killed. Now the message's size is charged first,
    and a full budget is UNAVAILABLE before any parsing, counted once, as memory."""
    from gpux_pack.runtime.resources import Limits

    folder = spec_dir(tmp_path, "mlp")
    env = {"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache")}
    app = App(Model.load(Settings.load(env, limits=Limits(1, 512 << 20, "given"))), "test")  # 256 MiB in flight
    app.start_warmup()
    assert app.ready.wait(10)
    big = infer_request(x=np.ones((200_000, 4), np.float32))  # 3.2 MB: 3x that and 2 MiB charged to parse
    held = app.budget.hold(app.budget.room - (1 << 20))  # all but 1 MiB of what requests may hold
    try:
        [(code, details)] = grpc_calls(app, [("ModelInfer", big)])
    finally:
        app.budget.release(held)
    assert code == "UNAVAILABLE" and "in flight" in details, details
    assert app.metrics.refused.values == {"memory": 1} and app.budget.in_flight_bytes == 0
    [(code, _)] = grpc_calls(app, [("ModelInfer", infer_request(x=np.ones((20_000, 4), np.float32)))])
    assert code == "OK" and app.budget.in_flight_bytes == 0


def test_grpc_reads_a_bounded_number_and_size_of_messages_at_once():
    """grpc reads a call's whole message before a handler can refuse it, and holds it about four
    times: what it may read at once is bounded up front, within the in-flight budget (16 calls,
    each a 64th of it)."""
    from types import SimpleNamespace

    from gpux_pack.runtime import grpc_v2, resources

    def limits(mib: int) -> tuple[int, int]:
        lim = resources.Limits(2, mib << 20, "given")
        return grpc_v2.call_limits(SimpleNamespace(max_queue=16, max_body_bytes=resources.default_body_bytes(lim),
                                                   max_in_flight_bytes=resources.default_in_flight_bytes(lim)))

    assert [limits(m) for m in (128, 256, 1024, 4096, 16384)] == [
        (16, 1 << 20), (16, 2 << 20), (16, 8 << 20), (16, 32 << 20), (16, 64 << 20)]


def test_rest_and_grpc_refuse_the_same_mistakes_with_the_same_messages(mlp):
    """One checker (runtime/v2.py): each bad request, sent as REST JSON, REST binary and gRPC (raw
    and typed contents), gets one message whatever the transport; a good one passes all four. Values
    that do not fill the shape are told in the form they came in: bytes for REST binary data and
    gRPC raw contents, values for JSON data and typed contents."""
    from gpux_pack.runtime import grpc_v2

    ok = np.ones((2, 4), np.float32)
    cases = {  # what is wrong -> (input name, datatype, shape, values, outputs asked for)
        "unknown input": ("feature", "FP32", [2, 4], ok, None),
        "datatype": ("features", "FP64", [2, 4], ok.astype(np.float64), None),
        "negative dimension": ("features", "FP32", [-2, 4], ok, None),
        "count": ("features", "FP32", [3, 4], ok, None),
        "rank": ("features", "FP32", [8], ok, None),
        "fixed dimension": ("features", "FP32", [4, 2], ok, None),
        "budget": ("features", "FP32", [1 << 40, 4], ok, None),
        "unknown output": ("features", "FP32", [2, 4], ok, ["logit"]),
        "output twice": ("features", "FP32", [2, 4], ok, ["probs", "probs"]),
        "good": ("features", "FP32", [2, 4], ok, ["probs"]),
    }

    def rest(name, datatype, shape, x, outputs, binary):
        item = {"name": name, "datatype": datatype, "shape": shape}
        tail = b""
        if binary:
            tail = x.tobytes()
            item["parameters"] = {"binary_data_size": len(tail)}
        else:
            item["data"] = x.ravel().tolist()
        doc = {"inputs": [item], **({"outputs": [{"name": o} for o in outputs]} if outputs else {})}
        header = json.dumps(doc).encode()
        headers = [(b"inference-header-content-length", str(len(header)).encode())] if binary else []
        status, body, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", header + tail, headers=headers)
        return "OK" if status == 200 else body["error"]

    def grpc_message(name, datatype, shape, x, outputs, typed):
        request = grpc_v2.message_classes()["ModelInferRequest"](model_name="iris-mlp")
        item = request.inputs.add(name=name, datatype=datatype, shape=shape)
        if typed:
            getattr(item.contents, "fp64_contents" if datatype == "FP64" else "fp32_contents").extend(x.ravel().tolist())
        else:
            request.raw_input_contents.append(x.tobytes())
        for o in outputs or ():
            request.outputs.add(name=o)
        return request.SerializeToString()

    calls = [("ModelInfer", grpc_message(*case, typed)) for case in cases.values() for typed in (False, True)]
    answers = iter(grpc_calls(mlp.app, calls))
    for what, case in cases.items():
        as_json, as_binary = rest(*case, binary=False), rest(*case, binary=True)
        raw, typed = ("OK" if code == "OK" else details for code, details in (next(answers), next(answers)))
        assert as_json == typed and as_binary == raw, (what, as_json, typed, as_binary, raw)
        assert what == "count" or as_json == as_binary, (what, as_json, as_binary)
        assert (as_json == "OK") == (what == "good"), (what, as_json)
    assert "needs 12 values, got 8" in rest(*cases["count"], binary=False)
    assert "needs 48 bytes of FP32, binary_data_size is 32" in rest(*cases["count"], binary=True)
