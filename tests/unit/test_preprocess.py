"""Text preprocessing and labels, planned by the packager and run by the image's runtime in this
process: the tokenizer gpux.yml names feeds the graph exactly what the `tokenizers` library
itself encodes (seen through the model's Identity outputs), over /predict, KServe v2 JSON and
gRPC; bad requests are one 400 naming the input; labels answer on /predict."""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from gpux_pack.errors import ConfigError, UsageError
from gpux_pack.pipeline.build import load, plan_for
from gpux_pack.plan import Options
from gpux_pack.project import preprocess
from gpux_pack.runtime.contract import ImageStep
from gpux_pack.runtime.server import App
from gpux_pack.runtime.session import Model
from gpux_pack.ui import Reporter
from tests import text_project
from tests.in_process import ROOT, Client, grpc_calls, settings

TEXTS = ["I love this product!", "I hate this bad movie, not great", "it is"]


def _plan(project: Path):
    return plan_for(load(project), "cpu", "test", Options(), None, Reporter(quiet=True), pull=False)


def _image_folder(tmp_path: Path, project: Path) -> Path:
    """gpux.json, the model and the tokenizer laid out as the image holds them."""
    plan = _plan(project)
    folder = tmp_path / "image"
    (folder / "model").mkdir(parents=True)
    (folder / "assets").mkdir()
    shutil.copy(project / "model.onnx", folder / "model" / "model.onnx")
    for name, path in plan.assets:
        shutil.copy(path, folder / "assets" / name)
    (folder / "gpux.json").write_text(json.dumps(plan.gpux_json.to_json()))
    return folder


def _client(folder: Path) -> Client:
    app = App(Model.load(settings(folder), warm_up=False))
    app.start_warmup()
    deadline = time.monotonic() + 60
    while not app.is_ready() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert app.is_ready(), app.state()
    return Client(app)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Client:
    tmp = tmp_path_factory.mktemp("text")
    return _client(_image_folder(tmp, text_project.make(tmp / "project")))


def test_the_plan_serves_text_bakes_the_tokenizer_and_adds_its_library(tmp_path):
    project = text_project.make(tmp_path / "p")
    plan = _plan(project)
    spec = plan.gpux_json.to_json()
    text = spec["preprocessing"]["text"]
    assert text["input"] == "text" and text["file"] == "assets/tokenizer.json" and text["max_length"] == 16
    assert [f["name"] for f in text["feeds"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert plan.gpux_json.inputs[0].entry() == {"name": "text", "type": "string", "shape": None, "required": False,
                                                "max_length": 16}
    assert "tokenizers>=0.15" in plan.requirements and plan.excludes == ("huggingface-hub",)
    assert plan.assets == (("tokenizer.json", (project / "tokenizer.json").resolve()),)
    assert spec["outputs"][0]["labels"] == ["negative", "positive"]
    # an image without preprocessing carries neither the library nor the layer
    plain = plan_for(load(ROOT / "examples" / "mlp"), "cpu", "test", Options(), None, Reporter(quiet=True), pull=False)
    assert not plain.assets and not any(r.startswith("tokenizers") for r in plain.requirements)
    assert plain.gpux_json.preprocessing is None


def test_token_ids_fed_equal_the_tokenizers_library_s_own(served):
    for body, texts in (({"text": TEXTS[0]}, TEXTS[:1]), ({"text": TEXTS}, TEXTS)):
        status, answer, _ = served.request("POST", "/predict", body)
        assert status == 200, answer
        want = text_project.expected(texts, None, 16)
        for name, value in want.items():
            np.testing.assert_array_equal(np.array(answer[f"{name}_seen"]), value)
        assert answer["labels"] == ["negative", "positive"]
        assert [p["label"] for p in answer["predicted"]] == ["positive", "negative", "negative"][:len(texts)]
    # KServe v2 JSON: a BYTES tensor, [n] or [n, 1]
    for shape in ([3], [3, 1]):
        status, answer, _ = served.request("POST", "/v2/models/sentiment/infer", {"inputs": [
            {"name": "text", "datatype": "BYTES", "shape": shape, "data": TEXTS}]})
        assert status == 200, answer
        seen = {o["name"]: o for o in answer["outputs"]}["input_ids_seen"]
        np.testing.assert_array_equal(np.array(seen["data"]).reshape(seen["shape"]),
                                      text_project.expected(TEXTS, None, 16)["input_ids"])
        assert "labels" not in answer  # a tensor protocol: labels are /predict's


def test_a_list_of_texts_on_a_model_of_batch_1_is_run_text_by_text(tmp_path, served):
    """GPUX's clients send several texts at once; a graph that takes one per run answers them as
    its batch would, over /predict, v2 JSON and gRPC (issue 42)."""
    one = _client(_image_folder(tmp_path, text_project.make(tmp_path / "p", batch=1)))
    status, answer, _ = one.request("POST", "/predict", {"text": TEXTS})
    assert status == 200, answer
    status, batched, _ = served.request("POST", "/predict", {"text": TEXTS})
    assert answer["logits"] == batched["logits"] and answer["predicted"] == batched["predicted"]
    assert answer["input_ids_seen"] == batched["input_ids_seen"]  # tokenized together, padded alike
    status, v2, _ = one.request("POST", "/v2/models/sentiment/infer", {"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [3], "data": TEXTS}]})
    logits = {o["name"]: o for o in v2["outputs"]}["logits"]
    assert status == 200 and logits["shape"] == [3, 2], v2
    status, answer, _ = one.request("POST", "/predict", {"text": TEXTS[:1] * 1000})
    assert status == 413 and "GPUX_MAX_QUEUE" in answer["error"], answer
    status, answer, _ = one.request("POST", "/predict", [{"text": t} for t in TEXTS])  # GPUX's array form as before
    assert status == 200 and [a["predicted"][0] for a in answer] == batched["predicted"], answer
    from gpux_pack.runtime import grpc_v2
    from tests.in_process import grpc_calls

    m = grpc_v2.message_classes()
    request = m["ModelInferRequest"](model_name="sentiment")
    request.inputs.add(name="text", datatype="BYTES", shape=[3]).contents.bytes_contents.extend(t.encode() for t in TEXTS)
    (code, raw), = grpc_calls(one.app, [("ModelInfer", request.SerializeToString())])
    assert code == "OK", raw
    logits = next(o for o in m["ModelInferResponse"].FromString(raw).outputs if o.name == "logits")
    assert list(logits.shape) == [3, 2]


def test_a_scalar_for_an_input_of_shape_1(tmp_path):
    """GPUX's top-level README: {"text": "I love this product!"} for `text: {type: string, shape: [1]}`."""
    import onnx
    from onnx import TensorProto, helper

    project = tmp_path / "p"
    project.mkdir()
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["echo"]), helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("text", TensorProto.STRING, [1]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("echo", TensorProto.STRING, [1]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(project / "model.onnx"))
    (project / "gpux.yml").write_text("name: echo\nversion: 1.0.0\nmodel:\n  source: ./model.onnx\ninputs:\n"
                                      "  text: {type: string, shape: [1]}\n  x: {type: float32, shape: [1]}\n")
    client = _client(_image_folder(tmp_path, project))
    status, answer, _ = client.request("POST", "/predict", {"text": "I love this product!", "x": 2.5})
    assert status == 200 and answer == {"echo": ["I love this product!"], "y": [2.5]}, answer
    status, answer, _ = client.request("POST", "/predict", {"text": ["I love this product!"], "x": [2.5]})
    assert status == 200 and answer["y"] == [2.5]


def test_the_model_s_own_token_inputs_still_work(served):
    want = text_project.expected(TEXTS[:1], None, 16)
    status, answer, _ = served.request("POST", "/predict", {k: v.tolist() for k, v in want.items()})
    assert status == 200 and answer["logits"] == [[0.0, 2.0]], answer


@pytest.mark.parametrize("body, status, message", [
    ({"text": "hi", "input_ids": [[1]]}, 400, "input 'text' and input_ids: send the text or the token inputs, not both"),
    ({"attention_mask": [[1]]}, 400, "missing input 'text' (the text to tokenize), or the model's own input_ids, "
                                     "attention_mask, token_type_ids"),
    ({"text": [["a", "b"]]}, 400, "input 'text': shape [1, 2]; send a string, a list of strings, or a tensor of "
                                  "shape [n] or [n, 1]"),
    ({"text": []}, 400, "input 'text': no text"),
])
def test_bad_text_requests_are_one_400_naming_the_input(served, body, status, message):
    got, answer, _ = served.request("POST", "/predict", body)
    assert (got, answer["error"]) == (status, message)
    assert served.request("GET", "/v2/health/ready")[0] == 200


def _without_unk(project: Path) -> None:
    """The project's tokenizer.json with its [UNK] entry gone (as a save of a vocabulary with a
    repeated id drops one): it loads, and refuses every text with a word outside its vocabulary."""
    doc = json.loads((project / "tokenizer.json").read_text())
    del doc["model"]["vocab"]["[UNK]"]
    (project / "tokenizer.json").write_text(json.dumps(doc))


def test_a_tokenizer_that_cannot_encode_is_refused_at_build_and_a_400_in_the_image(tmp_path):
    project = text_project.make(tmp_path / "p")
    _without_unk(project)
    with pytest.raises(UsageError, match=r"tokenizer.json: the tokenizers library loads it but cannot encode a sample "
                                         r"text \('Checking.*\): WordLevel error: Missing \[UNK\] token"):
        preprocess.read_tokenizer(_plan(project).signature.text)
    # an image that has such a tokenizer anyway (built before the check): the request's fault, one line
    client = _client(_image_folder(tmp_path, project))
    got, answer, _ = client.request("POST", "/predict", {"text": ["i love this", "i love zebras"]})
    assert (got, answer["error"]) == (400, "input 'text'[1]: the model's tokenizer cannot encode this text "
                                           "(WordLevel error: Missing [UNK] token from the vocabulary)")
    assert client.request("POST", "/predict", {"text": "i love this"})[0] == 200


def test_grpc_bytes_are_tokenized_and_bad_utf8_is_named(served):
    from gpux_pack.runtime import grpc_v2

    def call(values: list[bytes]) -> bytes:
        request = grpc_v2.message_classes()["ModelInferRequest"](model_name="sentiment")
        request.inputs.add(name="text", datatype="BYTES", shape=[len(values)])
        request.raw_input_contents.append(b"".join(struct.pack("<I", len(v)) + v for v in values))
        request.outputs.add(name="input_ids_seen")
        return request.SerializeToString()

    (code, raw), (bad_code, details) = grpc_calls(served.app, [("ModelInfer", call([t.encode() for t in TEXTS])),
                                                               ("ModelInfer", call([b"ok", b"\xff\xfe"]))])
    assert code == "OK"
    response = grpc_v2.message_classes()["ModelInferResponse"].FromString(raw)
    ids = np.frombuffer(response.raw_output_contents[0], np.int64).reshape(list(response.outputs[0].shape))
    np.testing.assert_array_equal(ids, text_project.expected(TEXTS, None, 16)["input_ids"])
    assert bad_code == "INVALID_ARGUMENT" and "text" in details and "UTF-8" in details, details


def test_a_fixed_sequence_pads_every_text_to_it_and_refuses_a_longer_max_length(tmp_path):
    project = text_project.make(tmp_path / "p", max_length=8, sequence=8)
    client = _client(_image_folder(tmp_path, project))
    status, answer, _ = client.request("POST", "/predict", {"text": "I love it, I love it, I love it, I love it"})
    assert status == 200, answer
    np.testing.assert_array_equal(np.array(answer["input_ids_seen"]),
                                  text_project.expected(["I love it, I love it, I love it, I love it"], 8, 8)["input_ids"])
    too_long = text_project.make(tmp_path / "q", max_length=16, sequence=8)
    with pytest.raises(ConfigError, match=r"max_length: 16 tokens, but the model's 'input_ids' takes 8"):
        load(too_long)


def test_labels_that_do_not_match_the_output_are_refused_at_build(tmp_path):
    project = text_project.make(tmp_path / "p")
    text = (project / "gpux.yml").read_text().replace("labels: [negative, positive]", "labels: [a, b, c]")
    (project / "gpux.yml").write_text(text)
    model = text_project.model()
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 2
    with pytest.raises(ConfigError, match=r"outputs.logits.labels: 3 labels, but the model's 'logits' has 2 entries "
                                          r"in its last dimension"):
        load(project)


def test_a_tokenizer_on_a_model_without_token_inputs_is_a_note(tmp_path):
    project = tmp_path / "mlp"
    shutil.copytree(ROOT / "examples" / "mlp", project)
    with open(project / "gpux.yml", "a") as f:
        f.write("\npreprocessing:\n  tokenizer: bert-base-uncased\n  resize: [224, 224]\n")
    loaded = load(project)
    assert loaded.signature.text is None
    notes = " | ".join(loaded.signature.notes)
    assert "preprocessing.tokenizer: not applied: the model has no token input 'input_ids'" in notes
    assert "preprocessing.resize: not applied" in notes


def test_an_unreachable_hub_is_one_line_saying_where_to_put_the_file(tmp_path, monkeypatch):
    project = text_project.make(tmp_path / "p")
    (project / "tokenizer.json").unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    # offline as huggingface_hub knows it (an unreachable endpoint gives the same line after its retries)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    loaded = load(project)
    assert loaded.signature.text.tokenizer.source == "download"
    with pytest.raises(UsageError) as e:
        preprocess.download(loaded.signature.text, tmp_path / "hf")
    line = str(e.value)
    assert "\n" not in line and line.startswith("preprocessing.tokenizer: cannot download tokenizer.json of "
                                                "'bert-base-uncased' from the Hugging Face Hub (")
    assert line.endswith("put it beside the model, or set preprocessing.tokenizer to its path")


# ---------------------------------------------------------------------------------------------
# images

def _image_client(tmp_path: Path, **make) -> Client:
    from tests import image_project

    return _client(_image_folder(tmp_path, image_project.make(tmp_path / "project", **make)))


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Client:
    return _image_client(tmp_path_factory.mktemp("images"))


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def test_every_image_form_feeds_the_documented_steps_within_1e5(pictures):
    from tests.image_project import picture, reference

    png, jpeg = picture(fmt="PNG"), picture(fmt="JPEG", seed=1)
    for data in (png, jpeg):
        want = reference(data)
        forms = [("/predict", {"image": _b64(data), "format": "jpeg"}, None),  # GPUX's (the hint does not bind)
                 ("/predict", {"input": {"b64": _b64(data)}}, None),  # {"<input>": {"b64": ...}}
                 ("/predict", {"input": _b64(data)}, None),
                 ("/predict", data, [(b"content-type", b"image/png")]),  # a raw body
                 ("/v2/models/colours/infer", {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1],
                                                           "data": [_b64(data)]}]}, None)]
        for path, body, headers in forms:
            sent = pictures.raw("POST", path, body if isinstance(body, bytes) else json.dumps(body).encode(), headers)
            answer = json.loads(sent[1]["body"])
            assert sent[0]["status"] == 200, (path, answer)
            if path == "/predict":
                seen = np.array(answer["seen"], np.float32)
                assert answer["labels"] == ["red", "green", "blue"] and len(answer["predicted"]) == 1
            else:
                out = {o["name"]: o for o in answer["outputs"]}["seen"]
                seen = np.array(out["data"], np.float32).reshape(out["shape"])
            np.testing.assert_allclose(seen, want, atol=1e-5, rtol=0, err_msg=path)
    # two images: a batch of two rows
    status, answer, _ = pictures.request("POST", "/predict", {"image": [_b64(png), _b64(jpeg)]})
    assert status == 200 and np.array(answer["seen"]).shape == (2, 3, 32, 32)


def test_exif_orientation_and_every_mode_become_upright_rgb(pictures):
    from tests.image_project import picture, reference

    for data in (picture(fmt="JPEG", orientation=6), picture(mode="RGBA"), picture(mode="P", fmt="GIF"),
                 picture(mode="L"), picture(mode="CMYK", fmt="JPEG"), picture(fmt="WEBP"), picture(fmt="BMP"),
                 picture(fmt="TIFF")):
        status, answer, _ = pictures.request("POST", "/predict", {"image": _b64(data)})
        assert status == 200, answer
        np.testing.assert_allclose(np.array(answer["seen"], np.float32), reference(data), atol=1e-5, rtol=0)


@pytest.mark.parametrize("body, status, start", [
    ({"image": "bm90IGFuIGltYWdl"}, 400, "input 'image': not an image (jpeg, png, webp, bmp, gif, tiff)"),
    ({"image": "%%%"}, 400, "input 'image': not base64 text"),
    ({"image": "aGk=", "input": np.zeros((1, 3, 32, 32)).tolist()}, 400, "input 'image' and 'input': send the image or the tensor"),
    ({"image": "aGk=", "format": "svg"}, 400, "format: 'svg' is not a format this model takes (bmp, gif, jpeg"),
    ({"input": {"b64": 1}}, 400, 'an image is {"b64": "<base64>"} or the base64 text itself'),
])
def test_bad_images_are_one_400_naming_the_input(pictures, body, status, start):
    got, answer, _ = pictures.request("POST", "/predict", body)
    assert got == status and answer["error"].startswith(start), answer
    assert pictures.request("GET", "/v2/health/ready")[0] == 200


def test_a_decompression_bomb_is_413_before_it_is_decoded(pictures):
    from tests.image_project import picture

    import zlib

    # a PNG whose header says 20000 x 20000 (1.2 GB of RGB): refused from the header, so its data
    # need not be all there (a real bomb's zeros compress to 1.2 MB)
    rows = zlib.compress(b"\0" * (1 + 3 * 20000) * 4, 9)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    status, answer, _ = pictures.request("POST", "/predict", {"image": _b64(bomb)})
    assert status == 413 and answer["error"] == ("input 'image': 20000x20000 is 400000000 pixels, more than "
                                                 "40000000 (GPUX_MAX_IMAGE_PIXELS)"), answer
    truncated = picture(fmt="PNG")[:200]
    status, answer, _ = pictures.request("POST", "/predict", {"image": _b64(truncated)})
    assert status == 400 and answer["error"].startswith("input 'image': cannot "), answer
    assert pictures.request("GET", "/v2/health/ready")[0] == 200


def test_letterbox_keeps_the_aspect_and_reports_the_geometry(tmp_path):
    from tests.image_project import picture, reference

    client = _image_client(tmp_path, preprocessing="  resize: [32, 32]\n  normalize: none\n  letterbox: true")
    data = picture(width=64, height=40)
    status, answer, _ = client.request("POST", "/predict", {"image": _b64(data)})
    assert status == 200, answer
    np.testing.assert_allclose(np.array(answer["seen"], np.float32), reference(data, normalize=False, letterbox=True),
                               atol=1e-5, rtol=0)
    assert answer["letterbox"] == [{"scale": 0.5, "offset": [0, 6], "size": [64, 40]}]
    # GPUX's array of requests: each answer with its own image's geometry
    tall = picture(width=20, height=40)
    status, answers, _ = client.request("POST", "/predict", [{"image": _b64(data)}, {"image": _b64(tall)}])
    assert status == 200, answers
    assert [a["letterbox"] for a in answers] == [[{"scale": 0.5, "offset": [0, 6], "size": [64, 40]}],
                                                 [{"scale": 0.8, "offset": [8, 0], "size": [20, 40]}]], answers


def test_resize_then_centre_crop_and_an_nhwc_graph(tmp_path):
    from tests.image_project import picture, reference

    client = _image_client(tmp_path, preprocessing="  custom:\n    mean: [0.485, 0.456, 0.406]\n"
                                                   "    std: [0.229, 0.224, 0.225]\n    resize: [40, 36]\n"
                                                   "    crop: [32, 32]", layout="NHWC")
    data = picture(width=50, height=45)
    status, answer, _ = client.request("POST", "/predict", {"image": _b64(data)})
    assert status == 200, answer
    want = reference(data, crop=(32, 32), resize=(40, 36)).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(np.array(answer["seen"], np.float32), want, atol=1e-5, rtol=0)


def test_image_settings_the_graph_cannot_take_are_refused_at_build(tmp_path):
    from tests import image_project

    cases = [("  resize: [64, 64]", {}, "preprocessing.resize: [64, 64] (width, height), but the model's 'input' "
                                        "takes [32, 32]"),
             ("  normalize: imagenet", {"height": "h", "width": "w"},
              "preprocessing.normalize: the model's 'input' does not fix its height and width: set "
              "preprocessing.resize: [width, height]"),
             ("  normalize: sepia", {}, "preprocessing.normalize: 'sepia': expected imagenet, none"),
             ("  custom: {mean: [0.5, 0.5], std: [1, 1, 1]}", {}, "preprocessing.custom.mean: [0.5, 0.5]: expected "
                                                                 "three numbers")]
    for i, (pre, shape, message) in enumerate(cases):
        project = image_project.make(tmp_path / str(i), preprocessing=pre, **shape)
        with pytest.raises(ConfigError) as e:
            load(project)
        assert message in str(e.value), str(e.value)


def test_grpc_and_v2_binary_carry_the_image_s_own_bytes(pictures):
    from gpux_pack.runtime import grpc_v2
    from tests.image_project import picture, reference

    data = picture(fmt="PNG", seed=3)
    request = grpc_v2.message_classes()["ModelInferRequest"](model_name="colours")
    request.inputs.add(name="image", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(struct.pack("<I", len(data)) + data)
    request.outputs.add(name="seen")
    [(code, raw)] = grpc_calls(pictures.app, [("ModelInfer", request.SerializeToString())])
    assert code == "OK", raw
    response = grpc_v2.message_classes()["ModelInferResponse"].FromString(raw)
    seen = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(list(response.outputs[0].shape))
    np.testing.assert_allclose(seen, reference(data), atol=1e-5, rtol=0)
    header = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1],
                                     "parameters": {"binary_data_size": len(data) + 4}}],
                         "outputs": [{"name": "channels"}]}).encode()
    sent = pictures.raw("POST", "/v2/models/colours/infer", header + struct.pack("<I", len(data)) + data,
                        [(b"inference-header-content-length", str(len(header)).encode())])
    assert sent[0]["status"] == 200, sent[1]["body"][:300]


# ---------------------------------------------------------------------------------------------
# audio

@pytest.fixture(scope="module")
def whisper(tmp_path_factory) -> Client:
    from tests import audio_project

    tmp = tmp_path_factory.mktemp("audio")
    return _client(_image_folder(tmp, audio_project.make(tmp / "project")))


def _seen(answer: dict) -> np.ndarray:
    out = {o["name"]: o for o in answer["outputs"]}["seen"]
    return np.array(out["data"], np.float32).reshape(out["shape"])


@pytest.mark.parametrize("rate, bits, float_, channels", [(16000, 16, False, 1), (44100, 16, False, 2),
                                                          (16000, 24, False, 1), (22050, 32, False, 1),
                                                          (16000, 8, False, 1), (48000, 32, True, 2)])
def test_wav_becomes_whisper_s_log_mel_within_1e4_of_librosa(whisper, rate, bits, float_, channels):
    from tests import audio_project

    samples = audio_project.tone(rate, 2.0, channels)
    data = audio_project.wav(samples, rate, bits, float_)
    want = audio_project.reference(audio_project.decoded(samples, bits, float_), rate)
    status, answer, _ = whisper.request("POST", "/v2/models/whisper-shaped/infer", {
        "inputs": [{"name": "audio", "datatype": "BYTES", "shape": [1], "data": [_b64(data)]},
                   {"name": "decoder_input_ids", "datatype": "INT64", "shape": [1, 1], "data": [50258]}],
        "outputs": [{"name": "seen"}]})
    assert status == 200, answer
    seen = _seen(answer)
    assert seen.shape == (1, 80, 3000)
    np.testing.assert_allclose(seen[0], want, atol=1e-4, rtol=0)


def test_gpux_s_audio_form_and_raw_bodies(whisper):
    from tests import audio_project

    samples = audio_project.tone(16000, 1.0)
    data = audio_project.wav(samples, 16000)
    want = audio_project.reference(audio_project.decoded(samples), 16000)
    status, answer, _ = whisper.request("POST", "/predict", {"audio": _b64(data), "sample_rate": 16000,
                                                            "format": "wav", "decoder_input_ids": [[50258]]})
    assert status == 200, answer
    np.testing.assert_allclose(np.array(answer["seen"], np.float32)[0], want, atol=1e-4, rtol=0)
    assert answer["tokens"] == [[50258]]
    # a raw body is the audio input: here the model also wants its decoder_input_ids
    sent = whisper.raw("POST", "/predict", data, [(b"content-type", b"audio/wav")])
    assert sent[0]["status"] == 400 and b"decoder_input_ids" in sent[1]["body"], sent[1]["body"]
    sent = whisper.raw("POST", "/predict", data, [(b"content-type", b"audio/mpeg")])
    assert sent[0]["status"] == 415 and b"this model takes audio/wav" in sent[1]["body"], sent[1]["body"]


@pytest.mark.parametrize("data, start", [
    (b"RIFF\x10\x00\x00\x00WAVEjunk", "input 'audio': a WAV file without a fmt chunk"),
    (b"not a wav at all", "input 'audio': not a WAV file (no RIFF/WAVE header)"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x80\x3e\x00\x00\x00\x7d\x00\x00\x02\x00\x0c\x00"
     b"data\x00\x00\x00\x00", "input 'audio': WAV format 1 with 12-bit samples"),
])
def test_a_corrupt_wav_is_one_400(whisper, data, start):
    status, answer, _ = whisper.request("POST", "/predict", {"audio": _b64(data), "decoder_input_ids": [[1]]})
    assert status == 400 and answer["error"].startswith(start), answer
    assert whisper.request("GET", "/v2/health/ready")[0] == 200


def test_frames_the_graph_cannot_take_are_refused_at_build(tmp_path):
    from tests import audio_project

    project = audio_project.make(tmp_path / "p")
    (project / "gpux.yml").write_text(audio_project.GPUX_YML.replace("chunk_length: 30", "chunk_length: 10"))
    with pytest.raises(ConfigError, match=r"10 s at 16000 Hz with hop_length 160 makes 1000 frames, but the model's "
                                          r"'mel' takes 3000"):
        load(project)


def test_predict_on_a_project_tokenizes_in_process(tmp_path, capsys):
    from gpux_pack.cli import main

    project = text_project.make(tmp_path / "p")
    with pytest.raises(SystemExit) as done:
        main(["predict", str(project), "--input", 'text=["I love it", "bad"]'])
    assert done.value.code == 0
    answer = json.loads(capsys.readouterr().out)
    np.testing.assert_array_equal(answer["input_ids_seen"],
                                  text_project.expected(["I love it", "bad"], None, 16)["input_ids"])


def test_a_uint8_nhwc_graph_takes_the_raw_pixels(tmp_path):
    from tests.image_project import picture, reference

    client = _image_client(tmp_path, preprocessing="  resize: [32, 32]", layout="NHWC", dtype="uint8")
    data = picture()
    status, answer, _ = client.request("POST", "/predict", {"image": _b64(data)})
    assert status == 200, answer
    pixels = np.round(reference(data, normalize=False) * 255).astype(np.uint8).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(np.array(answer["seen"]), pixels)


def test_token_inputs_named_otherwise_are_fed_by_their_role(tmp_path):
    import onnx

    project = text_project.make(tmp_path / "p", extra="  token_inputs: {input_ids: ids, attention_mask: mask}\n")
    model = onnx.load(str(project / "model.onnx"))
    renames = {"input_ids": "ids", "attention_mask": "mask"}
    for value in model.graph.input:
        value.name = renames.get(value.name, value.name)
    for node in model.graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
    onnx.save(model, str(project / "model.onnx"))
    plan = _plan(project)
    assert [(f.role, f.name) for f in plan.gpux_json.preprocessing.text.feeds] == \
        [("input_ids", "ids"), ("attention_mask", "mask"), ("token_type_ids", "token_type_ids")]
    client = _client(_image_folder(tmp_path, project))
    status, answer, _ = client.request("POST", "/predict", {"text": "I love it"})
    assert status == 200 and answer["logits"] == [[0.0, 2.0]], answer


def test_preprocessed_requests_batch_like_tensor_requests(tmp_path):
    from tests import image_project

    folder = _image_folder(tmp_path, image_project.make(tmp_path / "p", extra="serving:\n  batch_size: 8\n"))
    app = App(Model.load(settings(folder), warm_up=False))
    assert app.batchable  # the graph's input (fed by the image step) has a dynamic batch dimension


def test_a_long_text_is_cut_before_it_is_tokenized(served, tmp_path):
    """A 6.4 MB text held 780 MB for 5 s inside the tokenizer: each text is cut to 100 characters
    per token of max_length first (same tokens kept) and what tokenizing holds is charged."""
    import resource

    text = "I love this product, it is great! " * 200_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    status, answer, _ = served.request("POST", "/predict", {"text": text})
    assert status == 200, answer
    assert time.perf_counter() - started < 2.0 and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000
    want = text_project.expected([text[:2000]], None, 16)  # the first 16 tokens, as the whole text has them
    np.testing.assert_array_equal(answer["input_ids_seen"], want["input_ids"])
    strict = text_project.make(tmp_path / "strict", extra="  truncation: false\n")
    client = _client(_image_folder(tmp_path, strict))
    status, answer, _ = client.request("POST", "/predict", {"text": "a " * 1000})
    assert status == 413 and answer["error"] == ("input 'text'[0]: 2000 characters, more than 1600 (100 per token of "
                                                 "max_length 16; preprocessing.truncation is off)"), answer
    status, answer, _ = client.request("POST", "/predict", {"text": "a " * 20})
    assert status == 413 and answer["error"] == ("input 'text'[0]: 22 tokens, more than max_length 16 "
                                                 "(preprocessing.truncation is off)"), answer


_PEAK_PROBE = r"""
import json, sys
from gpux_pack.runtime.contract import ImageStep
from gpux_pack.runtime.preprocess import Picture
step = Picture(ImageStep("image", "x", "float32", "NCHW", (32, 32), (32, 32), None, False, 114, 1 / 255, None, None, None))
step.one(open(sys.argv[2], "rb").read(), "warm")  # the libraries' first use is not the image's
data = open(sys.argv[1], "rb").read()
charged = []
def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))
open("/proc/self/clear_refs", "w").write("5")  # the high-water mark starts again here
before = status("VmRSS")
step.one(data, "x", charged.append)
print(json.dumps([status("VmHWM") - before, sum(charged)]))
"""


@pytest.mark.parametrize("case", ["webp animated rgba", "jpeg progressive 4:4:4 rotated", "png palette",
                                  "tiff cmyk"])
def test_an_image_is_charged_at_least_what_decoding_it_holds(tmp_path, case):
    """The charge is made before a pixel is decoded, from the header; here it is compared with the
    decoding's real peak (the process's high-water mark, reset just before). It was 8 bytes a
    pixel for every format: a lossless RGBA WebP holds 24.5, a progressive 4:4:4 JPEG 10."""
    import subprocess
    import sys

    from PIL import Image as pil, ImageFile

    ImageFile.MAXBLOCK = 1 << 26
    rng = np.random.default_rng(0)
    side = 1024
    rgba = pil.fromarray(rng.integers(0, 256, (side, side, 4), dtype=np.uint8), "RGBA")
    path = tmp_path / "image"
    rotated = pil.Exif()
    rotated[0x0112] = 6
    if case == "webp animated rgba":
        rgba.save(path, "WEBP", lossless=True, save_all=True, duration=10,
                  append_images=[pil.new("RGBA", (side, side), (i, 0, 0, 255)) for i in (1, 2)])
    elif case.startswith("jpeg"):
        rgba.convert("RGB").save(path, "JPEG", quality=100, subsampling=0, progressive=True, exif=rotated)
    elif case == "png palette":
        rgba.convert("RGB").convert("P").save(path, "PNG", interlace=1)
    else:
        rgba.convert("CMYK").save(path, "TIFF")
    pil.new("RGB", (8, 8)).save(tmp_path / "small.png")
    out = subprocess.run([sys.executable, "-c", _PEAK_PROBE, str(path), str(tmp_path / "small.png")],
                         capture_output=True, text=True, check=True)
    peak, charged = json.loads(out.stdout)
    assert peak > side * side, (peak, charged)  # the probe sees the decode
    assert charged >= peak, f"{case}: charged {charged / side / side:.1f} bytes a pixel, holds {peak / side / side:.1f}"


def test_hostile_bytes_are_a_request_error_never_a_crash():
    """Random and mutated WAV and image bytes: read_wav and the image decoder answer a RequestError
    (a 400/413) or a result, never another exception."""
    from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

    from gpux_pack.runtime import preprocess
    from gpux_pack.runtime.tensors import RequestError
    from tests import audio_project
    from tests.image_project import picture

    wav = audio_project.wav(audio_project.tone(8000, 0.05), 8000, 24)
    png = picture(width=8, height=8)
    image = preprocess.Picture(ImageStep("image", "input", "float32", "NCHW", (8, 8), (8, 8), None, False, 114, 1 / 255,
                                       None, None, None), max_pixels=1 << 20)

    @hsettings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(st.binary(max_size=256), st.tuples(st.integers(0, 400), st.binary(min_size=1, max_size=8))))
    def check(mutation):
        for original in (wav, png):
            if isinstance(mutation, bytes):
                data = original[:12] + mutation if original is wav else mutation
            else:
                at, junk = mutation
                data = original[:at] + junk + original[at + len(junk):]
            try:
                if original is wav:
                    preprocess.read_wav(data, "input 'audio'")
                else:
                    image.one(data, "input 'image'")
            except RequestError as e:
                assert e.status in (400, 413) and "\n" not in str(e)

    check()
