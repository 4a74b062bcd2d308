"""GPUX's clients get GPUX's answers: /health, /info, /metrics (JSON when asked), /predict and its
errors, checked against GPUX 0.1.1's own server run in this process on the same model (real HTTP
on 127.0.0.1), and /predict's array form, which GPUX documents and its server refuses.

Every key GPUX answers is in ours with the same JSON type; the values are equal except where GPUX
is wrong or says less (README, "Coming from GPUX"): /info's name (GPUX: the model file's stem),
path, metadata (GPUX: always {}), and the provider's description."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from unittest import mock

import onnx
import pytest
import requests
from onnx import TensorProto, helper

from gpux_pack.pipeline.build import load, plan_for
from gpux_pack.plan import Options
from gpux_pack.runtime.server import App
from gpux_pack.runtime.session import Model
from gpux_pack.ui import Reporter
from tests.in_process import Client, settings

GPUX_YML = """name: tiny-relu
version: 2.0.0
model:
  source: ./model.onnx
inputs:
  x: {type: float64, shape: [1, 4], description: four numbers}
outputs:
  y: {type: float64, shape: [1, 4], labels: [a, b, c, d]}
"""


def _project(folder: Path) -> Path:
    """GPUX 0.1.1 can answer only float64, int64 and string models over JSON (it hands ONNX
    Runtime NumPy's default types), and only fixed shapes (a symbolic dimension fails its check)."""
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "model.onnx")
    (folder / "gpux.yml").write_text(GPUX_YML)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(ours: an in-process client of the image's runtime, theirs: GPUX's server's base URL)."""
    import uvicorn
    import gpux.cli.serve as gpux_serve
    from gpux.config.parser import GPUXConfigParser
    from gpux.core.runtime import GPUXRuntime

    folder = _project(tmp_path_factory.mktemp("gpux"))
    loaded = load(folder)
    spec = plan_for(loaded, "cpu", "test", Options(), None, Reporter(quiet=True), pull=False).gpux_json.to_json()
    spec["model"]["path"] = str(folder / "model.onnx")
    image = tmp_path_factory.mktemp("image")
    (image / "gpux.json").write_text(json.dumps(spec))
    app = App(Model.load(settings(image)), "test")
    app.start_warmup()
    assert app.ready.wait(10)

    parser = GPUXConfigParser()
    config = parser.parse_file(folder / "gpux.yml")
    runtime = GPUXRuntime(model_path=parser.get_model_path(folder), provider=None, **config.runtime.model_dump())
    port, held = _free_port(), {}

    def run(app_, **options):  # GPUX's own app, on a uvicorn server this test can stop
        options.pop("workers", None)
        held["server"] = uvicorn.Server(uvicorn.Config(app_, **{**options, "log_level": "warning"}))
        held["server"].run()

    with mock.patch.object(uvicorn, "run", run):
        thread = threading.Thread(target=gpux_serve._start_server, args=(runtime, config, "127.0.0.1", port, 1),
                                  daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not (held.get("server") and held["server"].started):
            assert time.monotonic() < deadline and thread.is_alive(), "GPUX's server did not start"
            time.sleep(0.02)
        try:
            yield Client(app), f"http://127.0.0.1:{port}"
        finally:
            held["server"].should_exit = True
            thread.join(10)


def _same_shape(ours, theirs, where="") -> None:
    """Every key GPUX answers is in ours, with the same JSON type (null: any)."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), where
        for key, value in theirs.items():
            assert key in ours, f"{where}.{key} missing"
            _same_shape(ours[key], value, f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same_shape(a, b, f"{where}[{i}]")
    elif theirs is not None:
        assert type(ours) is type(theirs) or {type(ours), type(theirs)} <= {int, float}, (where, ours, theirs)


def test_health_info_and_metrics_carry_every_key_gpux_answers(pair):
    ours, url = pair
    for path, headers in (("/health", None), ("/info", None), ("/metrics", [(b"accept", b"application/json")])):
        status, body, _ = ours.request("GET", path, headers=headers)
        theirs = requests.get(url + path, timeout=10)
        assert status == theirs.status_code == 200, path
        _same_shape(body, theirs.json(), path)
    status, health, _ = ours.request("GET", "/health")
    assert health["status"] == "healthy" and health["model"] == "tiny-relu" == requests.get(url + "/health").json()["model"]
    _, info, _ = ours.request("GET", "/info")
    theirs = requests.get(url + "/info").json()
    for key in ("version", "format", "size_bytes", "size_mb"):
        assert info[key] == theirs[key] or key == "version", key  # GPUX 0.1.1 says 1.0.0 whatever gpux.yml says
    assert info["version"] == "2.0.0" and info["name"] == "tiny-relu"
    for side in ("inputs", "outputs"):
        for a, b in zip(info[side], theirs[side]):
            assert {k: a[k] for k in ("name", "type", "shape")} == {k: b[k] for k in ("name", "type", "shape")}
    assert info["inputs"][0]["required"] is True and info["inputs"][0]["description"] == "four numbers"
    assert info["outputs"][0]["labels"] == ["a", "b", "c", "d"]  # GPUX: null (it never reads gpux.yml's)
    _, metrics, _ = ours.request("GET", "/metrics", headers=[(b"accept", b"application/json")])
    theirs = requests.get(url + "/metrics").json()
    assert metrics["available_providers"] == theirs["available_providers"]
    assert {k: metrics["provider"][k] for k in ("name", "available", "platform", "config")} == \
           {k: theirs["provider"][k] for k in ("name", "available", "platform", "config")}


def test_metrics_stay_prometheus_text_for_scrapers(pair):
    ours, _ = pair
    for accept in (None, b"text/plain;version=0.0.4", b"text/plain, application/json", b"*/*"):
        sent = ours.raw("GET", "/metrics", b"", [(b"accept", accept)] if accept else None)
        assert sent[0]["status"] == 200 and b"# HELP" in sent[1]["body"], accept


def test_predict_answers_and_errors_as_gpux_does(pair):
    ours, url = pair
    body = {"x": [[1.0, -2.0, 3.0, -4.0]]}
    status, answer, _ = ours.request("POST", "/predict", body)
    theirs = requests.post(url + "/predict", json=body, timeout=10)
    # GPUX's docs add "labels" to an answer whose output has them (0.1.1's code does not): ours does
    labels = {"labels": answer.pop("labels", None), "predicted": answer.pop("predicted", None)}
    assert status == theirs.status_code == 200 and answer == theirs.json() == {"y": [[1.0, 0.0, 3.0, 0.0]]}
    assert labels == {"labels": ["a", "b", "c", "d"], "predicted": [{"label": "c", "score": 3.0}]}
    for bad in ({"z": [[1.0]]}, {}, {"x": [[1.0, 2.0]]}):
        status, error, _ = ours.request("POST", "/predict", bad)
        theirs = requests.post(url + "/predict", json=bad, timeout=10)
        assert status == theirs.status_code == 400, (bad, theirs.text)
        assert set(theirs.json()) == {"detail"} and error["detail"] == error["error"], error


def test_a_top_level_array_is_answered_in_order(pair):
    """GPUX documents `[{...}, {...}]` on /predict; its server answers 422. Ours: an array of
    answers, each what the object alone gets."""
    ours, url = pair
    rows = [[[v, -v, 2 * v, -2 * v]] for v in (1.0, 2.5, -3.0)]
    status, answers, _ = ours.request("POST", "/predict", [{"x": r} for r in rows])
    assert status == 200 and answers == [ours.request("POST", "/predict", {"x": r})[1] for r in rows]
    assert requests.post(url + "/predict", json=[{"x": rows[0]}], timeout=10).status_code == 422
    status, error, _ = ours.request("POST", "/predict", [{"x": rows[0]}, {"x": [[1.0]]}])
    assert status == 400 and error["detail"].startswith("request [1]: "), error
    assert ours.request("POST", "/predict", [])[0] == 400
    status, error, _ = ours.request("POST", "/predict", [{"x": rows[0]}] * 10_000)
    assert status == 413 and "at most" in error["error"], error


def test_kserve_v2_errors_stay_as_they_are(pair):
    ours, _ = pair
    status, error, _ = ours.request("POST", "/v2/models/tiny-relu/infer", {"inputs": []})
    assert status == 400 and set(error) == {"error"}, error
    status, error, _ = ours.request("GET", "/nowhere")
    assert status == 404 and error["detail"] == error["error"]


def _check(doc: dict, schema: dict, instance) -> None:
    """A real answer against the document's schema (OpenAPI 3.1 schemas are JSON Schema 2020-12)."""
    import jsonschema

    jsonschema.validate(instance, {**schema, "components": doc["components"]},
                        cls=jsonschema.Draft202012Validator)


def _response_schema(doc: dict, path: str, method: str = "get", status: str = "200") -> dict:
    return doc["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]


@pytest.mark.parametrize("example", ["mlp", "strings"])
def test_openapi_is_valid_and_the_servers_answers_match_it(example, tmp_path):
    """/openapi.json passes the OpenAPI 3.1 validator; the answers of every GPUX endpoint and of
    v2 infer validate against the schemas it gives, and a request made from the schema is served."""
    from openapi_spec_validator import validate

    from tests.in_process import spec_dir

    app = App(Model.load(settings(spec_dir(tmp_path, example))), "test")
    app.start_warmup()
    assert app.ready.wait(10)
    client = Client(app)
    status, doc, headers = client.request("GET", "/openapi.json")
    assert status == 200 and doc["openapi"] == "3.1.0"
    validate(doc)
    for path in ("/health", "/info", "/v2", "/v2/health/ready", f"/v2/models/{app.model.spec.name}"):
        status, body, _ = client.request("GET", path)
        _check(doc, _response_schema(doc, path), body)
    request = _example(doc, doc["components"]["schemas"]["PredictRequest"])
    _check(doc, doc["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"], request)
    status, answer, _ = client.request("POST", "/predict", request)
    assert status == 200, answer
    _check(doc, _response_schema(doc, "/predict", "post"), answer)
    _check(doc, _response_schema(doc, "/predict", "post"), client.request("POST", "/predict", [request, request])[1])
    status, error, _ = client.request("POST", "/predict", {"nope": 1})
    _check(doc, _response_schema(doc, "/predict", "post", "400"), error)
    _check(doc, {"$ref": "#/components/schemas/PredictRequest"}, request)
    import jsonschema

    with pytest.raises(jsonschema.ValidationError):  # the schema refuses what the server refuses
        _check(doc, {"$ref": "#/components/schemas/PredictRequest"}, {})


def _example(doc: dict, schema: dict):
    """A request made from the schema alone, as a generated client would (dynamic sizes: 2)."""
    if "$ref" in schema:
        return _example(doc, doc["components"]["schemas"][schema["$ref"].split("/")[-1]])
    kind = schema.get("type")
    if kind == "object":
        return {k: _example(doc, v) for k, v in schema["properties"].items() if k in schema.get("required", ())}
    if kind == "array":
        return [_example(doc, schema["items"]) for _ in range(schema.get("minItems", 2))]
    return {"string": "text", "boolean": True, "integer": 1, "number": 0.5}[kind]


def test_docs_page_is_served_and_reads_the_document_relatively(pair):
    ours, _ = pair
    for path in ("/docs", "/redoc"):
        sent = ours.raw("GET", path, b"")
        assert sent[0]["status"] == 200 and (b"content-type", b"text/html; charset=utf-8") in sent[0]["headers"]
        page = sent[1]["body"]
        assert b'fetch("openapi.json")' in page and b"http" not in page.replace(b"http-equiv", b"")  # nothing external
