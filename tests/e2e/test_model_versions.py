"""Models saved by today's exporters: onnx >= 1.23 writes IR version 14 by default. The cpu image
(onnxruntime 1.32.0) loads them; an image whose onnxruntime cannot is refused before the build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from gpux_pack.providers import PROVIDERS
from tests.conftest import BASE_IMAGE, build_image, run_cli, serve

W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
B = np.array([0.5, -1.0, 2.0], dtype=np.float32)


def ir14_project(folder: Path) -> Path:
    """y = x @ W + b, saved as onnx.helper makes models today (IR 14), at the cpu row's newest opset."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "affine", [x], [y], initializer=[numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "b")],
    )
    model = helper.make_model(graph, ir_version=14, opset_imports=[helper.make_opsetid("", PROVIDERS["cpu"].onnx_opset)])
    save(model, str(folder / "model.onnx"))
    (folder / "gpux.yml").write_text("name: affine\nversion: 1.0.0\nmodel:\n  source: model.onnx\n")
    return folder


def test_an_ir14_model_builds_for_cpu_and_serves(tmp_path, docker_client, tags):
    image = build_image(ir14_project(tmp_path), tags("affine-ir14:cpu"), "-p", "cpu")
    assert image["onnxruntime"] == PROVIDERS["cpu"].version
    x = np.array([[1.0, 2.0, 3.0, 4.0], [-0.5, 0.0, 0.25, 8.0]], dtype=np.float32)
    with serve(image["tag"]) as server:
        answer = server.post("/predict", json={"x": x.tolist()})
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json()["y"], x @ W + B, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("provider, ort", [("cuda", "onnxruntime-gpu 1.31.1")])
def test_an_ir14_model_is_refused_for_an_older_onnxruntime_before_any_build(tmp_path, docker_client, tags,
                                                                               provider, ort):
    import docker

    tag = tags(f"affine-ir14:{provider}")
    proc = run_cli("build", str(ir14_project(tmp_path)), "-p", provider, "--base-image", BASE_IMAGE, "--tag", tag)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        f"error: model.onnx: IR version 14; {ort} loads IR versions up to 13 (save it with an older IR version, "
        "e.g. onnx.helper.make_model(..., ir_version=13))"
    ]
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)
