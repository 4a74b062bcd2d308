"""Text in, labelled answers out, from a built image: a BERT-shaped project whose gpux.yml names a
tokenizer (tokenizer.json beside the model, written with the `tokenizers` library) is served
read-only; the token ids the image fed the graph (its Identity outputs) equal the `tokenizers`
library's own, over /predict (a string and a list), KServe v2 JSON, tritonclient's binary REST
and gRPC; the tokenizer has its own layer before the model's; images without preprocessing
carry no tokenizers library."""

from __future__ import annotations

import numpy as np
import pytest

from tests import text_project
from tests.conftest import build_image, serve

pytestmark = pytest.mark.e2e

TEXTS = ["I love this product!", "I hate this bad movie, not great"]


@pytest.fixture(scope="module")
def text_image(docker_client, tags, tmp_path_factory) -> dict:
    project = text_project.make(tmp_path_factory.mktemp("text") / "p", extra="serving:\n  grpc_port: 8001\n")
    return build_image(project, tags("sentiment:cpu"), "--provider", "cpu")


def test_text_is_tokenized_in_the_image_as_the_tokenizers_library_does(text_image, docker_client):
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

    want = text_project.expected(TEXTS, None, 16)
    with serve(text_image["tag"], extra_ports=(8001,), read_only=True, tmpfs={"/tmp": ""}) as server:
        one = server.post("/predict", json={"text": TEXTS[0]}).json()
        assert one["labels"] == ["negative", "positive"] and one["predicted"] == [{"label": "positive", "score": 2.0}]
        np.testing.assert_array_equal(one["input_ids_seen"], text_project.expected(TEXTS[:1], None, 16)["input_ids"])
        batch = server.post("/predict", json={"text": TEXTS}).json()
        for name, value in want.items():
            np.testing.assert_array_equal(batch[f"{name}_seen"], value)
        assert [p["label"] for p in batch["predicted"]] == ["positive", "negative"]

        v2 = server.post("/v2/models/sentiment/infer", json={"inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [2], "data": TEXTS}]}).json()
        seen = {o["name"]: o for o in v2["outputs"]}["input_ids_seen"]
        np.testing.assert_array_equal(np.array(seen["data"]).reshape(seen["shape"]), want["input_ids"])

        texts = np.array([t.encode() for t in TEXTS], dtype=np.object_)
        http = thttp.InferenceServerClient(server.url.split("://", 1)[1])
        given = thttp.InferInput("text", [2], "BYTES")
        given.set_data_from_numpy(texts, binary_data=True)
        result = http.infer("sentiment", [given], outputs=[thttp.InferRequestedOutput("attention_mask_seen",
                                                                                        binary_data=True)])
        np.testing.assert_array_equal(result.as_numpy("attention_mask_seen"), want["attention_mask"])

        grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{server.container.get_exposed_port(8001)}")
        given = tgrpc.InferInput("text", [2, 1], "BYTES")
        given.set_data_from_numpy(texts.reshape(2, 1))
        result = grpc.infer("sentiment", [given])
        np.testing.assert_array_equal(result.as_numpy("input_ids_seen"), want["input_ids"])
        np.testing.assert_array_equal(result.as_numpy("logits"), [[0.0, 2.0], [4.0, 1.5]])

        bad = server.post("/predict", json={"text": "hi", "input_ids": [[1]]})
        assert bad.status_code == 400 and bad.json()["error"].startswith("input 'text' and input_ids: ")
        assert server.get("/v2/health/ready").status_code == 200

    history = [h["CreatedBy"] for h in docker_client.api.history(text_image["tag"])][::-1]
    adds = [line.rsplit(": ", 1)[-1] for line in history if ": ADD " in line or line.startswith("ADD ")]
    assert adds[-3:] == ["ADD assets.tar /", "ADD model.tar /", "ADD config.tar /"], history


def test_only_images_that_tokenize_carry_the_tokenizers_library(text_image, mlp_image, docker_client):
    probe = ["-c", "import importlib.util as u; print(bool(u.find_spec('tokenizers')))"]
    found = {name: docker_client.containers.run(image["tag"], probe, entrypoint=["python3"], remove=True,
                                                labels={"io.gpux.pack.role": "test"}).decode().strip()
             for name, image in (("text", text_image), ("plain", mlp_image))}
    assert found == {"text": "True", "plain": "False"}
