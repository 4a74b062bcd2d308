"""The packager's KServe v2 client (gpux_pack/inference.py) against the runtime's own codec: every
request it encodes reads back through the runtime's decoder as the values given, every answer the
runtime encodes reads back here as the values sent; and `predict`'s v2 call to a real server."""

from __future__ import annotations

import socket
import threading
import time

import ml_dtypes  # the tests' bfloat16 reference (tritonclient's own dependency)
import numpy as np
import pytest
import requests

from gpux_pack.commands import predict
from gpux_pack.errors import PackError
from gpux_pack.inference import (Given, Input, PredictError, bf16_bits, decode, encode, inputs_of, inputs_of_metadata,
                                 to_json, typed)
from gpux_pack.runtime import contract
from gpux_pack.runtime.contract import DTYPES
from gpux_pack.runtime.tensors import RequestError, ServedTensor, float32_to_bf16
from gpux_pack.runtime.v2 import V2Request, decode_rest, encode_v2, split_binary
from tests.in_process import settings, spec_dir

NUMERIC = sorted(k for k in DTYPES if k not in ("string", "bfloat16"))


def runtime_feeds(specs: list[ServedTensor], given: list[Given]) -> dict[str, np.ndarray]:
    """What the runtime makes of the request the client encodes (the server's and the CLI's decoder)."""
    request = encode([Input(s.name, s.datatype, s.required) for s in specs], given)
    header, blobs = split_binary(request.body, str(request.header_length))
    return decode_rest(header, specs, [], blobs=blobs)[0]


def sample(dtype: str) -> np.ndarray:
    if dtype == "bool":
        return np.array([[True, False, True], [False, False, True]])
    values = np.array([[0, 1, 2], [3, 100, 127]])
    if np.dtype(dtype).kind == "f":
        return (values / 7 - 3).astype(dtype)
    return values.astype(dtype)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_every_numeric_type_as_a_file_and_as_json(dtype):
    spec = ServedTensor("x", dtype, ("n", 3))
    arr = sample(dtype)
    from_file = runtime_feeds([spec], [Given("x", arr, "--input x=x.npy")])["x"]
    assert from_file.dtype == np.dtype(dtype) and from_file.tolist() == arr.tolist()
    # JSON values travel as v2 JSON data with their shape: the runtime converts them
    from_json = runtime_feeds([spec], [Given("x", arr.tolist(), "--input x=[...]")])["x"]
    assert from_json.dtype == np.dtype(dtype) and from_json.tolist() == arr.tolist()
    # a big-endian file is sent little-endian, as the extension says
    swapped = runtime_feeds([spec], [Given("x", arr.astype(arr.dtype.newbyteorder(">")), "x")])["x"]
    assert swapped.tolist() == arr.tolist()


def test_strings_as_a_file_and_as_json():
    spec = ServedTensor("t", "string", ("n",))
    words = ["cat", "hé", ""]
    for value in (np.array(words), np.array([w.encode() for w in words]), words):
        got = runtime_feeds([spec], [Given("t", value, "--input t")])["t"]
        assert got.dtype == object and got.tolist() == words


def test_bf16_numbers_become_their_bit_patterns():
    """Round to nearest even (ties included), NaN as 0x7FC0, as the runtime's own conversion."""
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.normal(size=63).astype(np.float32) * 1e3,
                             np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -0.0, np.inf, -np.inf, np.nan, 3.4e38],
                                      np.float32)]).reshape(-1, 5)
    bits = bf16_bits(values)
    np.testing.assert_array_equal(bits, float32_to_bf16(values))
    finite = np.isfinite(values)
    np.testing.assert_array_equal(bits[finite], values[finite].astype(ml_dtypes.bfloat16).view(np.uint16))
    assert bits[np.isnan(values)].tolist() == [0x7FC0]
    spec = ServedTensor("x", "bfloat16", ("n", 5))
    for given in (values, values.tolist()[:2]):  # a file, or JSON numbers (sent as bits all the same)
        got = runtime_feeds([spec], [Given("x", given, "--input x")])["x"]
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(got, bf16_bits(np.asarray(given, np.float32)))
    with pytest.raises(PredictError, match="expected numbers for the BF16 input 'x'"):
        encode([Input("x", "BF16")], [Given("x", [["a"]], "--input x")])


def test_a_media_file_is_one_bytes_element():
    data = b"\x89PNG\r\n\x1a\n\x00\xff not text"
    spec = ServedTensor("image", "string", ("n",), encoded=True)
    got = runtime_feeds([spec], [Given("image", data, "--input image=cat.png")])["image"]
    assert got.shape == (1,) and got[0] == data
    with pytest.raises(PredictError, match="'x' takes float32 values, not a file's bytes"):
        encode([Input("x", "FP32")], [Given("x", data, "--input x=cat.png")])


def test_json_and_binary_inputs_in_one_request():
    specs = [ServedTensor("a", "float32", ("n", 2)), ServedTensor("b", "int64", ("n",)),
             ServedTensor("c", "string", (1,), encoded=True), ServedTensor("d", "bool", None)]
    got = runtime_feeds(specs, [Given("a", np.ones((3, 2), np.float64), "a"), Given("b", [1, 2, 3], "b"),
                                Given("c", b"\x00\x01", "c"), Given("d", True, "d")])
    assert got["a"].dtype == np.float32 and got["a"].tolist() == [[1, 1]] * 3
    assert got["b"].tolist() == [1, 2, 3] and got["c"].tolist() == [b"\x00\x01"] and got["d"].tolist() is True


def test_what_is_found_before_anything_runs_and_what_the_runtime_finds():
    specs = [ServedTensor("a", "float32", ("batch", 2)), ServedTensor("b", "int64", ("batch",)),
             ServedTensor("o", "float32", None, required=False)]
    inputs = [Input(s.name, s.datatype, s.required) for s in specs]
    with pytest.raises(PredictError, match=r"^--input z=1: the model has no input 'z'; its inputs are: a, b, o$"):
        encode(inputs, [Given("z", 1, "--input z=1")])
    with pytest.raises(PredictError, match=r"^--input: missing b \(the model's inputs: a, b, o\)$"):
        encode(inputs, [Given("a", [[1, 2]], "x")])  # the optional one need not be given
    with pytest.raises(PredictError, match="the file holds float64 values; 'b' takes int64"):
        encode(inputs, [Given("a", [[1, 2]], "x"), Given("b", np.ones(1), "y")])
    with pytest.raises(PredictError, match="holds int64 values; 't' takes strings"):
        encode([Input("t", "BYTES")], [Given("t", np.ones(2, np.int64), "y")])
    with pytest.raises(PredictError, match="NaN and infinities are not JSON"):
        encode(inputs, [Given("a", [[float("nan"), 1]], "x"), Given("b", [1], "y")])
    # shapes, named dimensions and JSON values are the runtime's to check
    for given, message in (([Given("a", [[1, 2]], "x"), Given("b", [1, 2], "y")], "dimension 'batch' is 2 here but 1"),
                           ([Given("a", [[1, 2], [3]], "x"), Given("b", [1, 2], "y")], "ragged"),
                           ([Given("a", [[True, False]], "x"), Given("b", [1], "y")], "got booleans"),
                           ([Given("a", {"k": 1}, "x"), Given("b", [1], "y")], "got an object")):
        with pytest.raises(RequestError, match=message):
            runtime_feeds(specs, given)


def test_the_inputs_of_gpux_json_and_of_the_metadata():
    tensor = contract.Tensor
    spec = type("Spec", (), {})()
    spec.inputs = (tensor("text", "string", ("n",)), tensor("input_ids", "int64", ("n", "s")),
                   tensor("mask", "int64", ("n", "s"), required=False))
    feed = contract.Feed("input_ids", "input_ids", "int64")
    step = contract.TextStep("text", "tok.json", 16, "longest", True, None, None, (feed,))
    spec.preprocessing = contract.Preprocessing(text=step)
    assert inputs_of(spec) == [Input("text", "BYTES"), Input("input_ids", "INT64", False), Input("mask", "INT64", False)]
    meta = {"inputs": [{"name": "x", "datatype": "BF16", "shape": [-1, 4]}]}
    assert inputs_of_metadata(meta, "url") == [Input("x", "BF16")]
    with pytest.raises(PackError, match="url: the model metadata lists no inputs"):
        inputs_of_metadata({}, "url")


def test_answers_the_runtime_encodes_read_back_as_sent():
    outputs = {f"o_{d}": sample(d) for d in NUMERIC}
    outputs["s"] = np.array([["a", "é"], ["", "z"]], dtype=object)
    outputs["raw"] = np.array([b"\xff\x00"], dtype=object)
    outputs["bf"] = float32_to_bf16(np.array([[1.5, -2.25], [np.nan, 3.0]], np.float32))
    specs = {name: ServedTensor(name, name[2:] if name.startswith("o_") else "string", None) for name in outputs}
    specs["bf"] = ServedTensor("bf", "bfloat16", None)
    body, length = encode_v2(outputs, specs, V2Request(binary_default=True))
    got = decode(body, str(length), "url")
    for name, sent in outputs.items():
        if name == "bf":
            assert got[name].dtype == np.float32
            np.testing.assert_array_equal(got[name][0], [1.5, -2.25])
            assert np.isnan(got[name][1, 0]) and got[name][1, 1] == 3.0
        elif name in ("s", "raw"):
            assert got[name].tolist() == sent.tolist()  # text as text, bytes that are no UTF-8 as bytes
        else:
            assert got[name].dtype == sent.dtype and got[name].tolist() == sent.tolist(), name
    # answered as JSON (no binary asked for): the same values, null read as NaN
    outputs = {"f": np.array([[1.5, np.nan]], np.float32), "i": np.array([7], np.int64), "s": np.array(["x"], object)}
    specs = {"f": ServedTensor("f", "float32", None), "i": ServedTensor("i", "int64", None),
             "s": ServedTensor("s", "string", None)}
    body, length = encode_v2(outputs, specs, V2Request())
    assert length is None
    got = decode(body, None, "url")
    assert got["f"].dtype == np.float32 and got["f"][0, 0] == 1.5 and np.isnan(got["f"][0, 1])
    assert got["i"].tolist() == [7] and got["s"].tolist() == ["x"]
    for bad in (b"not json", b'{"outputs": [{"name": "x"}]}'):
        with pytest.raises(PackError, match="url: not a KServe v2 answer"):
            decode(bad, None, "url")


def test_printed_and_typed_answers():
    answer = {"probs": [[0.5, None]], "labels": ["a", "b"], "predicted": [{"label": "a", "score": 0.5}],
              "text": [["x"]], "y": [1.5]}
    outputs = (contract.Tensor("probs", "float32", None), contract.Tensor("text", "string", None),
               contract.Tensor("y", "bfloat16", None))
    got = typed(answer, outputs)
    assert got["probs"].dtype == np.float32 and np.isnan(got["probs"][0, 1]) and got["text"].dtype == object
    assert got["y"].dtype == np.float32 and got["labels"] == ["a", "b"]  # labels stay JSON
    assert to_json(got) == {**answer, "y": [1.5]}
    assert to_json({"b": b"caf\xc3\xa9", "n": np.float32(np.inf), "a": np.array([1, 2], np.uint8)}) == {
        "b": "café", "n": None, "a": [1, 2]}


def test_a_message_naming_an_input_names_the_input_given():
    given = [Given("x", 1, "--input x=wide.npy")]
    assert predict.named("input 'x': dimension 1 must be 4", given) == "--input x=wide.npy: dimension 1 must be 4"
    assert predict.named("input 'y': bad", given) == "input 'y': bad"
    assert predict.named("missing required input 'x'", given) == "missing required input 'x'"


@pytest.fixture
def served(tmp_path):
    """The runtime's own server on 127.0.0.1, as in an image (uvicorn)."""
    from gpux_pack.runtime import server
    from gpux_pack.runtime.session import Model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = Model.load(settings(spec_dir(tmp_path, "mlp"), GPUX_PORT=str(port), GPUX_HOST="127.0.0.1"))
    handed: list = []
    thread = threading.Thread(target=server.serve, args=(model, "test", handed.append), daemon=True)
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
    yield url
    handed[0].should_exit = True
    thread.join(10)


def test_predict_asks_a_server_over_v2(served):
    """What `predict IMAGE` does once a container answers: metadata, one binary request, its answer."""
    import onnxruntime as ort

    from tests.in_process import ROOT

    x = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)
    given = [Given("features", x, "--input features=x.npy")]
    meta = requests.get(f"{served}/v2/models/iris-mlp", timeout=10).json()
    got = predict.infer(served, "iris-mlp", encode(inputs_of_metadata(meta, served), given), given, 30)
    session = ort.InferenceSession(str(ROOT / "examples" / "mlp" / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, probs = session.run(["logits", "probs"], {"features": x})
    assert got["logits"].dtype == np.float32 and got["probs"].shape == (3, 3)
    np.testing.assert_allclose(got["logits"], logits, atol=1e-5)
    np.testing.assert_allclose(got["probs"], probs, atol=1e-6)
    # the server's refusal: exit 2, naming the --input as the user wrote it
    wide = [Given("features", np.zeros((2, 5), np.float32), "--input features=wide.npy")]
    with pytest.raises(PredictError, match=r"^the server answered 400: --input features=wide.npy: dimension 1 must be 4"):
        predict.infer(served, "iris-mlp", encode(inputs_of_metadata(meta, served), wide), wide, 30)
