"""A BF16 model built into an image by `gpux-pack build`, served: tritonclient over HTTP (binary
data) and gRPC (raw contents) gets onnxruntime's in-process answer, bit for bit; JSON that would
need BF16 is a 400 naming the tensor. One image: HTTP and gRPC from the same container."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import build_image, serve
from tests.unit.test_bf16 import _ort_reference, bf16_model

pytestmark = pytest.mark.e2e

BF16 = ml_dtypes.bfloat16


def test_bf16_over_tritonclient_http_binary_and_grpc_equals_onnxruntime_and_json_is_a_400(tmp_path, tags):
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    from tritonclient.utils import InferenceServerException

    project = bf16_model(tmp_path / "bf16")
    (project / "gpux.yml").write_text((project / "gpux.yml").read_text() + "serving:\n  grpc_port: 8001\n")
    image = build_image(project, tags("bf16:cpu"))
    x = np.random.default_rng(5).normal(size=(6, 4)).astype(BF16)
    y, z = _ort_reference(project / "model.onnx", x)
    with serve(image["tag"], extra_ports=(8001,)) as server:
        # KServe v2 REST, binary tensor extension
        http = thttp.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30)
        meta = http.get_model_metadata("bf16")
        assert [(t["name"], t["datatype"]) for t in meta["inputs"] + meta["outputs"]] == [
            ("x", "BF16"), ("y", "BF16"), ("z", "FP32")]
        item = thttp.InferInput("x", list(x.shape), "BF16")
        item.set_data_from_numpy(x, binary_data=True)
        result = http.infer("bf16", [item])  # no outputs named: tritonclient asks for binary_data_output
        assert result.as_numpy("y").dtype == BF16
        np.testing.assert_array_equal(result.as_numpy("y").view(np.uint16), y.view(np.uint16))
        np.testing.assert_array_equal(result.as_numpy("z"), z)
        # y as JSON: refused by the server, naming it; z as JSON is fine
        with pytest.raises(InferenceServerException, match="output 'y' is BF16, which JSON cannot carry"):
            http.infer("bf16", [item], outputs=[thttp.InferRequestedOutput("y", binary_data=False)])
        picked = http.infer("bf16", [item], outputs=[thttp.InferRequestedOutput("z", binary_data=False)])
        np.testing.assert_array_equal(picked.as_numpy("z"), z)
        # JSON inputs (tritonclient itself refuses to send BF16 as JSON: a plain request does)
        answer = server.post("/v2/models/bf16/infer", json={"inputs": [
            {"name": "x", "shape": [1, 4], "datatype": "BF16", "data": [1, 2, 3, 4]}]})
        assert answer.status_code == 400 and answer.json()["error"] == (
            "input 'x' is BF16, which JSON cannot carry: send it as binary data (parameters.binary_data_size)")
        answer = server.post("/predict", json={"x": [[1, 2, 3, 4]]})
        assert answer.status_code == 400 and answer.json()["error"].startswith(
            "input 'x' is BF16, which JSON cannot carry")
        # gRPC, raw contents both ways
        grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{server.container.get_exposed_port(8001)}")
        assert [t["datatype"] for t in grpc.get_model_metadata("bf16", as_json=True)["outputs"]] == ["BF16", "FP32"]
        item = tgrpc.InferInput("x", list(x.shape), "BF16")
        item.set_data_from_numpy(x)
        result = grpc.infer("bf16", [item])
        np.testing.assert_array_equal(result.as_numpy("y").view(np.uint16), y.view(np.uint16))
        np.testing.assert_array_equal(result.as_numpy("z"), z)
        assert server.get("/v2/health/ready").status_code == 200
