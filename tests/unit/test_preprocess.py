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
    (folder / "gpux.json").write_text(json.dumps(plan.gpux_json))
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
    spec = plan.gpux_json
    text = spec["preprocessing"]["text"]
    assert text["input"] == "text" and text["file"] == "assets/tokenizer.json" and text["max_length"] == 16
    assert [f["name"] for f in text["feeds"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert spec["inputs"][0] == {"name": "text", "type": "string", "shape": None, "required": False,
                                 "max_length": 16}
    assert "tokenizers>=0.15" in plan.requirements
    assert plan.assets == (("tokenizer.json", (project / "tokenizer.json").resolve()),)
    assert spec["outputs"][0]["labels"] == ["negative", "positive"]
    # an image without preprocessing carries neither the library nor the layer
    plain = plan_for(load(ROOT / "examples" / "mlp"), "cpu", "test", Options(), None, Reporter(quiet=True), pull=False)
    assert not plain.assets and not any(r.startswith("tokenizers") for r in plain.requirements)
    assert plain.gpux_json["preprocessing"] is None


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
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    loaded = load(project)
    assert loaded.signature.text.tokenizer.source == "download"
    with pytest.raises(UsageError) as e:
        preprocess.download(loaded.signature.text, tmp_path / "hf")
    line = str(e.value)
    assert "\n" not in line and line.startswith("preprocessing.tokenizer: cannot download tokenizer.json of "
                                                "'bert-base-uncased' from the Hugging Face Hub (")
    assert line.endswith("put it beside the model, or set preprocessing.tokenizer to its path")
