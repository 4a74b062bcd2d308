"""The runtime's HTTP side in process: every endpoint, GPUX /predict and KServe v2 REST, validation,
binary and .npy bodies, limits. The same code runs in the containers (tests/e2e)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from gpux_pack.runtime import warmup
from gpux_pack.runtime.session import Model
from gpux_pack.runtime.server import App

from tests.in_process import Client, reference, settings, spec_dir, tiny_dir


def test_predict_and_v2_match_onnxruntime(mlp):
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    logits, probs = reference("mlp", {"features": x})
    status, body, _ = mlp.request("POST", "/predict", {"features": x.tolist()})
    assert status == 200
    np.testing.assert_allclose(body["probs"], probs, atol=1e-6)
    status, body, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", {
        "id": "r1", "inputs": [{"name": "features", "shape": [8, 4], "datatype": "FP32", "data": x.ravel().tolist()}],
        "outputs": [{"name": "logits"}]})
    assert status == 200 and body["id"] == "r1" and body["model_version"] == "1.0.0"
    [out] = body["outputs"]
    assert out["name"] == "logits" and out["shape"] == [8, 3] and out["datatype"] == "FP32"
    np.testing.assert_allclose(np.reshape(out["data"], (8, 3)), logits, atol=1e-6)


def test_metadata_health_info(mlp):
    assert mlp.request("GET", "/health")[:2] == (200, {"status": "healthy", "model": "iris-mlp", "ready": True})
    assert mlp.request("GET", "/v2/health/live")[0] == 200
    assert mlp.request("GET", "/v2/models/iris-mlp/ready")[0] == 200
    assert mlp.request("GET", "/v2/models/iris-mlp/versions/1.0.0/ready")[0] == 200
    status, meta, _ = mlp.request("GET", "/v2/models/iris-mlp")
    assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]
    status, info, _ = mlp.request("GET", "/info")
    assert info["execution_providers"]["active"] == ["CPUExecutionProvider"]
    assert info["warmup"]["state"] == "done" and info["onnxruntime"] == ort.__version__


BAD = [
    ("POST", "/predict", b"{not json", 400, "malformed JSON"),
    ("POST", "/predict", b"", 400, "empty body"),
    ("POST", "/predict", [1, 2], 400, "must be a JSON object"),
    ("POST", "/predict", {"feature": [[1, 2, 3, 4]]}, 400, "unknown input 'feature'"),
    ("POST", "/predict", {}, 400, "missing required input 'features'"),
    ("POST", "/predict", {"features": [[1, 2, 3]]}, 400, "dimension 1 must be 4"),
    ("POST", "/predict", {"features": [1, 2, 3, 4]}, 400, "expected rank 2"),
    ("POST", "/predict", {"features": [[1, 2, 3, 4], [1, 2]]}, 400, "ragged"),
    ("POST", "/predict", {"features": [["a", "b", "c", "d"]]}, 400, "got strings"),
    ("POST", "/predict", {"features": [[True, False, True, False]]}, 400, "got booleans"),
    ("POST", "/predict", {"features": [[1, None, 3, 4]]}, 400, "expected float32 values"),
    ("POST", "/predict", {"features": {"a": 1}}, 400, "got an object"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP64", "data": [1, 2, 3, 4]}]}, 400, "datatype FP64 does not match the model's FP32"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}, 400, "needs 8 values, got 4"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": []}, 400, "non-empty list"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32"}]}, 400, "'data' is missing"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}], "outputs": [{"name": "nope"}]}, 400, "unknown output 'nope'"),
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4], "parameters": {"binary_data_size": 16}}]}, 400, "does not fit the 0 bytes of binary data"),
    ("POST", "/v2/models/other/infer", {"inputs": []}, 404, "unknown model 'other'"),
    ("GET", "/v2/models/iris-mlp/versions/9", b"", 404, "unknown version '9'"),
    ("GET", "/nope", b"", 404, "no such endpoint"),
    ("GET", "/predict", b"", 405, "use POST"),
]


@pytest.mark.parametrize("method, path, body, status, words", BAD, ids=[b[4] for b in BAD])
def test_bad_requests_name_the_problem_and_leave_the_server_serving(mlp, method, path, body, status, words):
    got, answer, headers = mlp.request(method, path, body)
    assert got == status and words in answer["error"]
    if status == 405:
        assert headers[b"allow"] == b"POST"
    assert mlp.request("POST", "/predict", {"features": [[1, 2, 3, 4]]})[0] == 200


def test_body_limit(tmp_path):
    model = Model.load(settings(spec_dir(tmp_path, "mlp"), GPUX_MAX_BODY_BYTES="100"))
    client = Client(App(model))
    client.app.ready.set()
    status, body, _ = client.request("POST", "/predict", {"features": [[1.0] * 4] * 20})
    assert status == 413 and "exceeds the limit of 100" in body["error"]
    status, _, _ = client.request("POST", "/predict", b"{}", headers=[(b"content-length", b"5000")])
    assert status == 413


def test_503_until_warm(tmp_path):
    client = Client(App(Model.load(settings(spec_dir(tmp_path, "mlp")))))
    assert client.request("GET", "/v2/health/ready")[0] == 503
    assert client.request("GET", "/health")[:2] == (503, {"status": "warming up", "model": "iris-mlp", "ready": False})
    status, body, _ = client.request("POST", "/predict", {"features": [[1, 2, 3, 4]]})
    assert status == 503 and "warming up" in body["error"]


def test_int64_inputs_and_shared_dims(tmp_path):
    client = Client(App(Model.load(settings(spec_dir(tmp_path, "text-classifier")))))
    client.app.ready.set()
    ids, mask = [[5, 6, 7, 0], [8, 9, 0, 0]], [[1, 1, 1, 0], [1, 1, 0, 0]]
    status, body, _ = client.request("POST", "/predict", {"input_ids": ids, "attention_mask": mask})
    [expected] = reference("text-classifier", {"input_ids": np.array(ids), "attention_mask": np.array(mask)})
    assert status == 200
    np.testing.assert_allclose(body["logits"], expected, atol=1e-6)
    status, body, _ = client.request("POST", "/predict", {"input_ids": [[1.5, 2, 3]], "attention_mask": [[1, 1, 1]]})
    assert status == 400 and "expected int64 integers, got numbers" in body["error"]
    status, body, _ = client.request("POST", "/predict", {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1]]})
    assert status == 400 and "dimension 'sequence' is 2 here but 3 in input 'input_ids'" in body["error"]
    status, body, _ = client.request("POST", "/predict", {"input_ids": [[2**70]], "attention_mask": [[1]]})
    assert status == 400 and "input 'input_ids'" in body["error"]
    # an index out of the embedding's range is the model's own error: 400, and still serving
    status, body, _ = client.request("POST", "/predict", {"input_ids": [[5000]], "attention_mask": [[1]]})
    assert status == 400 and "rejected the inputs" in body["error"]
    assert client.request("POST", "/predict", {"input_ids": ids, "attention_mask": mask})[0] == 200


def test_deep_json_is_400_and_the_server_goes_on(mlp):
    status, body, _ = mlp.request("POST", "/predict", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and body["error"] == "the JSON body is nested deeper than 1024 levels"
    status, body, _ = mlp.request("POST", "/predict", b'{"features": ' + b"[" * 1024 + b"]" * 1024 + b"}")
    assert status == 400 and "nested deeper than 1024 levels" in body["error"]
    # brackets inside strings do not nest: a v2 request id full of them is fine
    x = [1.0, 2.0, 3.0, 4.0]
    status, body, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", {
        "id": '[{\\"' * 1000, "inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": x}]})
    assert status == 200 and body["id"] == '[{\\"' * 1000
    # 1,000 levels deep is JSON we parse; the input is then refused for its shape, as a 400
    status, body, _ = mlp.request("POST", "/predict", b'{"features": ' + b"[" * 1000 + b"1" + b"]" * 1000 + b"}")
    assert status == 400 and "input 'features'" in body["error"]
    assert mlp.request("POST", "/predict", {"features": [x]})[0] == 200


def test_info_never_500s_on_odd_metadata(mlp):
    odd = {"nan": float("nan"), "inf": float("-inf"), "np": np.float32(1.5),
                                      "set": {1}, "bytes": b"ab", "ok": [1, "a", None]}
    mlp.app.model.settings.spec = mlp.app.model.spec._replace(metadata=odd)
    status, info, _ = mlp.request("GET", "/info")
    assert status == 200
    assert info["metadata"] == {"nan": None, "inf": None, "np": 1.5, "set": "{1}", "bytes": "ab", "ok": [1, "a", None]}


def test_answers_fall_back_to_plain_json():
    from gpux_pack.runtime.tensors import dumps

    body = dumps({"a": float("nan"), "b": np.int64(3), "c": object, "d": np.array([1.5, np.inf], np.float16)})
    assert json.loads(body) == {"a": None, "b": 3, "c": "<class 'object'>", "d": [1.5, None]}


def test_overridable_inputs_are_accepted_not_listed(tiny):
    model = tiny.app.model
    assert [s.name for s in model.overridable] == ["bias"]
    assert [s.name for s in model.inputs] == ["x", "scale"]
    assert [list(f) for f in warmup.generated_inputs(model)] == [["x"]]  # neither generated nor required
    assert model.warmup_state["state"] == "done"
    assert [i["name"] for i in tiny.request("GET", "/info")[1]["inputs"]] == ["x", "scale"]
    assert [i["name"] for i in tiny.request("GET", "/v2/models/tiny")[1]["inputs"]] == ["x", "scale"]

    x = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert tiny.request("POST", "/predict", {"x": x})[1] == {"y": [[2.0, 3.0, 4.0], [1.0, 2.0, 3.0]]}
    status, body, _ = tiny.request("POST", "/predict", {"x": x, "bias": [10, 20, 30], "scale": [2, 2, 2]})
    assert status == 200 and body == {"y": [[12.0, 22.0, 32.0], [10.0, 20.0, 30.0]]}
    status, body, _ = tiny.request("POST", "/v2/models/tiny/infer", {"inputs": [
        {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]},
        {"name": "bias", "shape": [3], "datatype": "FP32", "data": [0, 0, 0]}]})
    assert status == 200 and body["outputs"][0]["data"] == [1.0, 1.0, 1.0]

    # validated like any input; never named in the list of inputs an error offers
    checks = [({"x": x, "bias": [1, 2]}, "input 'bias': dimension 0 must be 3"),
              ({"x": x, "bias": [[1, 2, 3]]}, "input 'bias': expected rank 1"),
              ({"x": x, "bias": ["a", "b", "c"]}, "input 'bias': expected float32 values, got strings"),
              ({"bias": [1, 2, 3]}, "missing required input 'x'"),
              ({"x": x, "weights": [1]}, "unknown input 'weights'; the model's inputs are: x, scale")]
    for request, words in checks:
        status, body, _ = tiny.request("POST", "/predict", request)
        assert status == 400 and body["error"].startswith(words)
    status, body, _ = tiny.request("POST", "/v2/models/tiny/infer", {"inputs": [
        {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]},
        {"name": "bias", "shape": [3], "datatype": "INT64", "data": [0, 0, 0]}]})
    assert status == 400 and body["error"] == "input 'bias': datatype INT64 does not match the model's FP32"


def test_ir3_initializers_are_not_overridable(tmp_path):
    """ONNX Runtime makes an IR-3 graph's initializer inputs constants: a clear 400, not its error."""
    client = Client(App(Model.load(settings(tiny_dir(tmp_path, ir_version=3)))))
    client.app.ready.set()
    assert client.app.model.overridable == []
    status, body, _ = client.request("POST", "/predict", {"x": [[0, 0, 0]], "bias": [1, 1, 1]})
    assert status == 400 and body["error"].startswith("unknown input 'bias'")
    assert client.request("POST", "/predict", {"x": [[0, 0, 0]]})[1] == {"y": [[1.0, 2.0, 3.0]]}


def _binary(header: dict, blob: bytes, length: str | None = None):
    head = json.dumps(header).encode()
    return head + blob, [(b"inference-header-content-length", (length or str(len(head))).encode())]


@pytest.mark.parametrize("header, blob, length, words", [
    ({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
     b"\0" * 12, None, "binary_data_size 16 does not fit the 12 bytes"),
    ({"inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
     b"\0" * 16, None, "the shape needs 32 bytes of FP32, binary_data_size is 16"),
    ({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
     b"\0" * 20, None, "4 bytes of binary data that no input claims"),
    ({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
     b"\0" * 16, "x1", "Inference-Header-Content-Length 'x1'"),
    ({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4],
                  "parameters": {"binary_data_size": 0}}]}, b"", None, "both 'data' and binary_data_size"),
])
def test_binary_requests_name_what_is_wrong(mlp, header, blob, length, words):
    body, headers = _binary(header, blob, length)
    status, answer, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", body, headers)
    assert status == 400 and words in answer["error"], answer


def test_binary_in_and_out_equal_json(mlp):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    body, headers = _binary({"inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32",
                                         "parameters": {"binary_data_size": 32}}],
                             "outputs": [{"name": "probs", "parameters": {"binary_data": True}}], "id": "r1"},
                            x.tobytes())
    sent = mlp.raw("POST", "/v2/models/iris-mlp/infer", body, headers)
    start, payload = sent[0], sent[1]["body"]
    hdrs = dict(start["headers"])
    n = int(hdrs[b"inference-header-content-length"])
    head = json.loads(payload[:n])
    assert head["id"] == "r1" and [o["name"] for o in head["outputs"]] == ["probs"]
    probs = np.frombuffer(payload[n:], np.float32).reshape(head["outputs"][0]["shape"])
    status, answer, _ = mlp.request("POST", "/predict", {"features": x.tolist()})
    np.testing.assert_array_equal(probs, np.array(answer["probs"], np.float32))


def test_npy_body_on_predict(mlp):
    import io

    x = np.ones((3, 4), np.float32)
    buf = io.BytesIO()
    np.save(buf, x)
    status, answer, _ = mlp.request("POST", "/predict", buf.getvalue(), [(b"content-type", b"application/x-npy")])
    assert status == 200 and np.shape(answer["probs"]) == (3, 3)
    status, answer, _ = mlp.request("POST", "/predict", b"not npy", [(b"content-type", b"application/x-npy")])
    assert status == 400 and "not a .npy array" in answer["error"]


def test_a_request_over_the_tensor_budget_is_413_before_converting(tmp_path):
    folder = spec_dir(tmp_path, "mlp")
    app = App(Model.load(settings(folder, GPUX_MAX_REQUEST_BYTES="1000")), "test")
    app.start_warmup()
    assert app.ready.wait(10)
    client = Client(app)
    status, answer, _ = client.request("POST", "/v2/models/iris-mlp/infer", {"inputs": [
        {"name": "features", "shape": [1000000, 4], "datatype": "FP32", "data": [1]}]})
    assert status == 413 and "GPUX_MAX_REQUEST_BYTES" in answer["error"]
    status, answer, _ = client.request("POST", "/predict", {"features": [[1, 2, 3, 4]] * 100})
    assert status == 413 and "intermediate tensors and outputs they imply" in answer["error"]


@pytest.mark.parametrize("body, words", [
    ({"features": [["1", "2", "3", "4"]]}, "got strings"),
    ({"features": [[True, False, True, True]]}, "got booleans"),
    ({"features": [[1, None, 3, 4]]}, "or nulls"),
])
def test_numbers_as_text_are_still_refused(mlp, body, words):
    status, answer, _ = mlp.request("POST", "/predict", body)
    assert status == 400 and words in answer["error"], answer
    status, answer, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", {"inputs": [
        {"name": "features", "shape": [1, 4], "datatype": "FP32", "data": body["features"][0]}]})
    assert status == 400 and words in answer["error"], answer
