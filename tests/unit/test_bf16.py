"""BF16 tensors, in process: accepted at build, carried as uint16 bit patterns over KServe v2
binary data and gRPC raw contents, handed to ONNX Runtime as bfloat16, refused (400 naming the
tensor) wherever JSON would have to carry them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes  # tritonclient's own dependency: the tests' bfloat16, never the image's
import numpy as np
import onnxruntime as ort
import pytest

from gpux_pack.pipeline.build import load, plan_for
from gpux_pack.plan import Options
from gpux_pack.runtime import grpc_v2
from gpux_pack.runtime.server import App
from gpux_pack.runtime import warmup
from gpux_pack.runtime.session import Model
from gpux_pack.runtime.tensors import RequestError, bf16_to_float32, float32_to_bf16
from gpux_pack.ui import Reporter
from tests.in_process import Client, grpc_calls, settings

BF16 = ml_dtypes.bfloat16


def bf16_model(path: Path) -> Path:
    """x: BF16[N, 4] -> Cast FLOAT -> *2 + 1 -> z (FP32) and Cast BF16 -> y (BF16)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xf"], to=T.FLOAT), helper.make_node("Mul", ["xf", "two"], ["m"]),
         helper.make_node("Add", ["m", "one"], ["z"]), helper.make_node("Cast", ["z"], ["y"], to=T.BFLOAT16)],
        "bf16", [helper.make_tensor_value_info("x", T.BFLOAT16, ["N", 4])],
        [helper.make_tensor_value_info("y", T.BFLOAT16, ["N", 4]), helper.make_tensor_value_info("z", T.FLOAT, ["N", 4])],
        [helper.make_tensor("two", T.FLOAT, [], [2.0]), helper.make_tensor("one", T.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path / "model.onnx"))
    (path / "gpux.yml").write_text("name: bf16\nversion: 1.0.0\nmodel: {source: ./model.onnx}\n")
    return path


def spec_folder(tmp_path: Path) -> Path:
    """gpux.json + model as the image holds them, planned by the real build code."""
    loaded = load(bf16_model(tmp_path / "project"))
    plan = plan_for(loaded, "cpu", "test", Options(), None, Reporter(quiet=True), pull=False)
    folder = tmp_path / "image"
    (folder / "model").mkdir(parents=True)
    for name in loaded.model.files:
        shutil.copy(loaded.model.path.parent / name, folder / "model" / name)
    (folder / "gpux.json").write_text(json.dumps(plan.gpux_json.to_json()))
    return folder


@pytest.fixture
def bf16(tmp_path):
    app = App(Model.load(settings(spec_folder(tmp_path))), "test")
    app.start_warmup()
    assert app.ready.wait(10)
    return Client(app)


def _binary(header: dict, blob: bytes) -> tuple[bytes, list]:
    head = json.dumps(header).encode()
    return head + blob, [(b"inference-header-content-length", str(len(head)).encode())]


def _answer(client: Client, header: dict, blob: bytes) -> tuple[dict, bytes]:
    body, headers = _binary(header, blob)
    sent = client.raw("POST", "/v2/models/bf16/infer", body, headers)
    assert sent[0]["status"] == 200, sent[1]["body"]
    n = int(dict(sent[0]["headers"]).get(b"inference-header-content-length", len(sent[1]["body"])))
    return json.loads(sent[1]["body"][:n]), sent[1]["body"][n:]


X = np.array([[1.5, -2.25, 3.0, 0.1], [0.0, 1.0, -7.5, 1e30], [65504, -0.001, 3.14159, 2.5e-5]], BF16)


def test_build_accepts_bf16_and_metadata_says_bf16(bf16):
    spec = bf16.app.model.spec  # the gpux.json the build planned
    assert [(t.name, t.type) for t in spec.inputs] == [("x", "bfloat16")]
    assert [(t.name, t.type) for t in spec.outputs] == [("y", "bfloat16"), ("z", "float32")]
    status, meta, _ = bf16.request("GET", "/v2/models/bf16")
    assert status == 200
    assert [(t["name"], t["datatype"]) for t in meta["inputs"] + meta["outputs"]] == [
        ("x", "BF16"), ("y", "BF16"), ("z", "FP32")]
    [(code, raw)] = grpc_calls(bf16.app, [("ModelMetadata", grpc_v2.message_classes()["ModelMetadataRequest"](
        name="bf16").SerializeToString())])
    answer = grpc_v2.message_classes()["ModelMetadataResponse"].FromString(raw)
    assert code == "OK" and [t.datatype for t in (*answer.inputs, *answer.outputs)] == ["BF16", "BF16", "FP32"]


def test_binary_bf16_in_and_out_equal_onnxruntime(bf16):
    """The bits that go in reach the model as bfloat16 values; the bits that come out are ORT's."""
    ort_y, ort_z = _ort_reference(bf16.app.model.path, X)
    np.testing.assert_array_equal(ort_z, X.astype(np.float32) * 2 + 1)  # the reference is right
    np.testing.assert_array_equal(ort_y.view(np.uint16), ort_z.astype(BF16).view(np.uint16))
    head, blob = _answer(bf16, {"inputs": [{"name": "x", "shape": [3, 4], "datatype": "BF16",
                                            "parameters": {"binary_data_size": X.nbytes}}],
                                "parameters": {"binary_data_output": True}}, X.tobytes())
    assert [(o["name"], o["datatype"], o["shape"], o["parameters"]["binary_data_size"]) for o in head["outputs"]] == [
        ("y", "BF16", [3, 4], 24), ("z", "FP32", [3, 4], 48)]
    np.testing.assert_array_equal(np.frombuffer(blob[:24], np.uint16), ort_y.view(np.uint16).ravel())
    np.testing.assert_array_equal(np.frombuffer(blob[24:], np.float32), ort_z.ravel())
    # output selection: y alone as binary, z alone as JSON
    head, blob = _answer(bf16, {"inputs": [{"name": "x", "shape": [3, 4], "datatype": "BF16",
                                            "parameters": {"binary_data_size": X.nbytes}}],
                                "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}, X.tobytes())
    assert [o["name"] for o in head["outputs"]] == ["y"]
    np.testing.assert_array_equal(np.frombuffer(blob, np.uint16), ort_y.view(np.uint16).ravel())
    head, blob = _answer(bf16, {"inputs": [{"name": "x", "shape": [3, 4], "datatype": "BF16",
                                            "parameters": {"binary_data_size": X.nbytes}}],
                                "outputs": [{"name": "z"}]}, X.tobytes())
    assert blob == b""
    np.testing.assert_array_equal(np.array(head["outputs"][0]["data"], np.float32), ort_z.ravel())


def _ort_reference(path: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(y, z) from onnxruntime in process, through its own bfloat16 OrtValues: y's bits read
    from its OrtValue's memory (OrtValue.numpy() has no numpy type for bfloat16)."""
    import ctypes

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x.view(np.uint16), onnx_element_type=16)
    y, z = session.run_with_ort_values(["y", "z"], {"x": value})
    bits = ctypes.string_at(y.data_ptr(), y.tensor_size_in_bytes())
    return np.frombuffer(bits, BF16).reshape(y.shape()), z.numpy()


@pytest.mark.parametrize("endpoint, header, words", [
    ("/v2/models/bf16/infer", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "BF16", "data": [1, 2, 3, 4]}],
                               "parameters": {"binary_data_output": True}},
     "input 'x' is BF16, which JSON cannot carry: send it as binary data (parameters.binary_data_size)"),
    ("/v2/models/bf16/infer", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "BF16",
                                           "parameters": {"binary_data_size": 8}}]},
     "output 'y' is BF16, which JSON cannot carry: ask for it as binary data (parameters.binary_data: true)"),
    ("/v2/models/bf16/infer", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "BF16",
                                           "parameters": {"binary_data_size": 8}}],
                               "outputs": [{"name": "z"}, {"name": "y", "parameters": {"binary_data": False}}]},
     "output 'y' is BF16, which JSON cannot carry"),
    ("/predict", {"x": [[1, 2, 3, 4]]}, "input 'x' is BF16, which JSON cannot carry: send it to the KServe v2 infer "
                                        "endpoint as binary data (parameters.binary_data_size), or use gRPC"),
])
def test_json_that_would_need_bf16_is_a_400_naming_the_tensor(bf16, endpoint, header, words):
    blob = X[:1].tobytes() if "binary_data_size" in json.dumps(header) else b""
    body, headers = _binary(header, blob) if blob else (json.dumps(header).encode(), [])
    status, answer, _ = bf16.request("POST", endpoint, body, headers)
    assert status == 400 and answer["error"].startswith(words), answer
    assert bf16.request("GET", "/v2/health/ready")[0] == 200


def test_predict_refuses_a_bf16_output_even_with_no_bf16_input(tmp_path):
    """A .npy body, or a model whose only BF16 tensor is an output: the answer's JSON cannot hold it."""
    from gpux_pack.runtime.tensors import ServedTensor, decode_predict

    outputs = [ServedTensor("y", "bfloat16", (-1,))]
    with pytest.raises(RequestError, match="output 'y' is BF16, which JSON cannot carry") as e:
        decode_predict({"x": [1.0]}, [ServedTensor("x", "float32", (-1,))], outputs=outputs)
    assert e.value.status == 400
    assert decode_predict({"x": [1.0]}, [ServedTensor("x", "float32", (-1,))])["x"].tolist() == [1.0]


def test_npy_predict_on_bf16_is_a_400(bf16):
    import io

    buf = io.BytesIO()
    np.save(buf, X.view(np.uint16))
    status, answer, _ = bf16.request("POST", "/predict", buf.getvalue(), [(b"content-type", b"application/x-npy")])
    assert status == 400 and answer["error"].startswith("input 'x' is BF16, which JSON cannot carry"), answer


def test_grpc_raw_contents_carry_bf16_and_typed_contents_are_invalid_argument(bf16):
    classes = grpc_v2.message_classes()
    request = classes["ModelInferRequest"](model_name="bf16", id="g")
    request.inputs.add(name="x", datatype="BF16", shape=[3, 4])
    request.raw_input_contents.append(X.tobytes())
    typed = classes["ModelInferRequest"](model_name="bf16")
    typed.inputs.add(name="x", datatype="BF16", shape=[1, 4]).contents.uint_contents.extend([16256] * 4)
    typed_fp32 = classes["ModelInferRequest"](model_name="bf16")
    typed_fp32.inputs.add(name="x", datatype="BF16", shape=[1, 4]).contents.fp32_contents.extend([1.0] * 4)
    answers = grpc_calls(bf16.app, [("ModelInfer", request.SerializeToString()),
                                     ("ModelInfer", typed.SerializeToString()),
                                     ("ModelInfer", typed_fp32.SerializeToString())])
    (code, raw), *refused = answers
    assert code == "OK"
    response = classes["ModelInferResponse"].FromString(raw)
    ort_y, ort_z = _ort_reference(bf16.app.model.path, X)
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("y", "BF16", [3, 4]),
                                                                               ("z", "FP32", [3, 4])]
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.uint16), ort_y.view(np.uint16).ravel())
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[1], np.float32), ort_z.ravel())
    for code, details in refused:
        assert code == "INVALID_ARGUMENT" and details == (
            "input 'x' is BF16, which typed contents cannot carry: send it in raw_input_contents")


def test_warmup_feeds_are_bf16_values_and_accuracy_compares_values_not_bits(bf16):
    model = bf16.app.model
    assert model.warmup_state["state"] == "done"
    [feeds] = warmup.generated_inputs(model)
    x = feeds["x"]
    assert x.dtype == np.uint16 and x.shape == (1, 4)
    values = x.view(BF16).astype(np.float32)
    assert ((values >= 0) & (values <= 1)).all() and len(set(values.ravel().tolist())) > 1  # random, not zeros
    answers = [model.run(feeds)]
    model.active = ["SomeGpuExecutionProvider", "CPUExecutionProvider"]  # accuracy runs only off the CPU
    assert warmup._accuracy(model, [feeds], answers)[0] == {"y": {"max_abs": 0.0, "max_rel": 0.0},
                                                          "z": {"max_abs": 0.0, "max_rel": 0.0}}
    # one bfloat16 step off in y: an error the size of that step in value, not 1 (one bit pattern)
    off = {**answers[0], "y": answers[0]["y"] + np.uint16(1)}
    errors = warmup._accuracy(model, [feeds], [off])[0]
    step = float(np.max(np.abs(bf16_to_float32(off["y"]) - bf16_to_float32(answers[0]["y"]))))
    assert 0 < step < 0.05 and errors["y"]["max_abs"] == pytest.approx(step)


def test_batched_bf16_requests_answer_each_its_own_rows(tmp_path):
    """The scheduler concatenates uint16 bit patterns like any array, and splits the outputs."""
    model = Model.load(settings(spec_folder(tmp_path)), warm_up=False)
    rows = [X[:1], X[1:3], X[2:]]
    merged = model.run({"x": np.concatenate([r.view(np.uint16) for r in rows])})
    for i, r in enumerate(rows):
        alone = model.run({"x": r.view(np.uint16)})
        start = sum(len(p) for p in rows[:i])
        np.testing.assert_array_equal(merged["y"][start: start + len(r)], alone["y"])
        assert alone["y"].dtype == np.uint16 and alone["z"].dtype == np.float32


def test_bf16_conversions_match_ml_dtypes():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(size=1000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 1000),
                             np.array([0, -0.0, 1, 65504, 3.4e38, -3.4e38, 1e-40, np.inf, -np.inf], np.float32)])
    np.testing.assert_array_equal(float32_to_bf16(values), values.astype(BF16).view(np.uint16))
    assert np.isnan(bf16_to_float32(float32_to_bf16(np.array([np.nan], np.float32)))).all()
    bits = rng.integers(0, 1 << 16, 5000).astype(np.uint16)
    finite = ~np.isnan(bits.view(BF16).astype(np.float32))
    np.testing.assert_array_equal(bf16_to_float32(bits)[finite], bits.view(BF16).astype(np.float32)[finite])


def test_dtypes_table_stays_pure_data_and_knows_bf16():
    from gpux_pack.runtime import contract as dtypes

    assert dtypes.DTYPES["bfloat16"] == ("uint16", "BF16", 16)
    assert dtypes.canonical("BF16") == dtypes.canonical("bf16") == dtypes.canonical("tensor(bfloat16)") == "bfloat16"
    source = Path(dtypes.__file__).read_text()
    assert "import numpy" not in source and "import onnx" not in source
