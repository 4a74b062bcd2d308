"""The image's runtime, in process: settings, providers, validation, every endpoint.

The same code runs in the containers (tests/e2e); here each case costs milliseconds."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from gpux_pack import providers
from gpux_pack.pipeline import load, plan_for
from gpux_pack.plan import Options, runtime_config
from gpux_pack.ui import Reporter
from gpux_pack.runtime.model import Model, Settings, StartupError
from gpux_pack.runtime.server import App

ROOT = Path(__file__).resolve().parents[2]


def spec_dir(tmp_path: Path, example: str, provider: str = "cpu", warmup: str | None = None) -> Path:
    """gpux.json + model as the image holds them, from the real planning code."""
    loaded = load(ROOT / "examples" / example)
    plan = plan_for(loaded, provider, "test", Options(warmup=warmup), None, Reporter(quiet=True), pull=False)
    prov = plan.provider
    spec = runtime_config(plan, providers.session_providers(prov, loaded.project.config), "test")
    (tmp_path / "model").mkdir()
    for name in loaded.model.files:
        shutil.copy(loaded.model.path.parent / name, tmp_path / "model" / name)
    (tmp_path / "gpux.json").write_text(json.dumps(spec))
    return tmp_path


def settings(folder: Path, **env: str) -> Settings:
    return Settings.load({"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache"), **env})


class Client:
    """Drives the ASGI app directly: no sockets, same code paths as uvicorn."""

    def __init__(self, app: App):
        self.app = app

    def request(self, method: str, path: str, body: bytes | str | object = b"", headers=None):
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        data = body.encode() if isinstance(body, str) else body
        scope = {"type": "http", "method": method, "path": path, "headers": headers or []}
        sent: list[dict] = []

        async def receive():
            return {"type": "http.request", "body": data, "more_body": False}

        async def send(message):
            sent.append(message)

        asyncio.run(self.app(scope, receive, send))
        status = sent[0]["status"]
        return status, json.loads(sent[1]["body"]), dict(sent[0]["headers"])


@pytest.fixture
def mlp(tmp_path):
    model = Model.load(settings(spec_dir(tmp_path, "mlp")))
    app = App(model, "test")
    app.start_warmup()
    assert app.ready.wait(10)
    return Client(app)


def reference(example: str, feeds: dict) -> list:
    return ort.InferenceSession(str(ROOT / "examples" / example / "model.onnx")).run(None, feeds)


def test_predict_and_v2_match_onnxruntime(mlp):
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    logits, probs = reference("mlp", {"features": x})
    status, body, _ = mlp.request("POST", "/predict", {"features": x.tolist()})
    assert status == 200
    np.testing.assert_allclose(body["probs"], probs, atol=1e-6)
    status, body, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", {
        "id": "r1", "inputs": [{"name": "features", "shape": [8, 4], "datatype": "FP32", "data": x.ravel().tolist()}],
        "outputs": [{"name": "logits"}]})  # fmt: skip
    assert status == 200 and body["id"] == "r1" and body["model_version"] == "1.0.0"
    [out] = body["outputs"]
    assert out["name"] == "logits" and out["shape"] == [8, 3] and out["datatype"] == "FP32"
    np.testing.assert_allclose(np.reshape(out["data"], (8, 3)), logits, atol=1e-6)


def test_metadata_health_info(mlp):
    assert mlp.request("GET", "/health")[:2] == (200, {"status": "ready"})
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
    ("POST", "/v2/models/iris-mlp/infer", {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4], "parameters": {"binary_data_size": 16}}]}, 400, "binary tensor extension"),
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
    assert client.request("GET", "/health")[:2] == (503, {"status": "warming up"})
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


def test_provider_override_and_fallback(tmp_path, caplog):
    folder = spec_dir(tmp_path, "mlp", provider="cuda")
    model = Model.load(settings(folder))  # no CUDA here: loud fallback to CPU
    assert model.requested[0] == "CUDAExecutionProvider"
    assert model.active == ["CPUExecutionProvider"]
    assert "FALLBACK" in caplog.text and "GPUX_REQUIRE_PROVIDER=1" in caplog.text
    with pytest.raises(StartupError, match="GPUX_REQUIRE_PROVIDER=1: CUDAExecutionProvider is not active"):
        Model.load(settings(folder, GPUX_REQUIRE_PROVIDER="1"))
    s = settings(folder, GPUX_PROVIDERS="cpu")
    assert [n for n, _ in s.providers] == ["CPUExecutionProvider"]
    with pytest.raises(StartupError, match="unknown provider 'tpu'"):
        settings(folder, GPUX_PROVIDERS="tpu")


def test_cache_dir_expands_into_provider_options(tmp_path):
    s = settings(spec_dir(tmp_path, "mlp", provider="openvino"))
    opts = dict(s.providers)["OpenVINOExecutionProvider"]
    assert opts == {"device_type": "CPU", "cache_dir": str(tmp_path / "cache" / "openvino")}
    assert (tmp_path / "cache" / "openvino").is_dir()


def test_warmup_never_is_ready_at_once(tmp_path):
    app = App(Model.load(settings(spec_dir(tmp_path, "mlp", warmup="never"))))
    app.start_warmup()
    assert app.ready.is_set() and app.model.warmup_state == {"state": "skipped"}


def test_cli_predict_and_info(tmp_path, capsys, monkeypatch):
    from gpux_pack.runtime.__main__ import main

    folder = spec_dir(tmp_path, "mlp")
    monkeypatch.setenv("GPUX_CONFIG", str(folder / "gpux.json"))
    assert main(["predict", "--input", '{"features": [[1, 2, 3, 4]]}']) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"logits", "probs"}
    assert main(["predict", "--input", '{"features": [[1, 2]]}']) == 2
    assert "dimension 1 must be 4" in capsys.readouterr().err
    assert main(["info"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "iris-mlp"


def test_runtime_imports_only_its_own_libraries():
    """The runtime folder is copied alone into images holding numpy, onnxruntime and uvicorn."""
    import ast
    import sys

    allowed = set(sys.stdlib_module_names) | {"numpy", "onnxruntime", "uvicorn"}
    for path in (ROOT / "gpux_pack" / "runtime").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
