"""A model of hundreds of megabytes: built in bounded memory, its weights moved to page-aligned
external data in the image (pack.weights: auto), served with the original model's answers, and
a weights-only rebuild replayed with them."""

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import BASE_IMAGE, serve

WIDTH, LAYERS = 2048, 18  # 18 float32 [2048, 2048] weights: 302 MB, over pack.weights' 64 MiB line
REPLAYED = "only the model's weights changed"


def _model(path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    for i in range(LAYERS):
        w = rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / np.float32(np.sqrt(WIDTH))
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [f"h{i}"]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
                              [helper.make_tensor_value_info(f"h{LAYERS - 1}", TensorProto.FLOAT, ["batch", WIDTH])],
                              inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _build(project, tag, tmp_path) -> tuple[int, int, str]:
    """`gpux-pack build`: (exit code, peak RSS in bytes of its largest process, stderr). Started
    from a small Python of its own: a child's peak counts what it shared with the process that
    forked it, and this one holds the model it wrote."""
    peak = tmp_path / "peak"
    starter = ("import resource, subprocess, sys\n"
               "code = subprocess.run(sys.argv[2:]).returncode\n"
               "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))\n"
               "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", starter, str(peak), sys.executable, "-m", "gpux_pack", "build",
                           str(project), "--base-image", BASE_IMAGE, "--tag", tag], capture_output=True, text=True)
    return proc.returncode, int(peak.read_text()), proc.stderr


def _answer(served, x) -> np.ndarray:
    r = served.post("/predict", json={"x": x.tolist()})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()[f"h{LAYERS - 1}"], np.float32)


def test_a_300_mb_model_builds_in_bounded_memory_and_serves_from_external_data(tmp_path, tags, docker_client):
    project = tmp_path / "large"
    project.mkdir()
    model = project / "model.onnx"
    _model(model, seed=0)
    (project / "gpux.yml").write_text("name: large\nversion: 1.0.0\nmodel:\n  source: ./model.onnx\n")
    size = model.stat().st_size
    tag = tags("large:cpu")
    code, peak, stderr = _build(project, tag, tmp_path)
    assert code == 0, stderr[-3000:]
    # the target is model + 250 MB; the weights are never read into memory at all (measured 120 MB)
    assert peak < 250e6, f"the build peaked at {peak / 1e6:.0f} MB for a {size / 1e6:.0f} MB model"
    assert "inline weights in an external data file beside it (model.onnx.data, page-aligned)" in stderr, stderr
    x = np.random.default_rng(1).standard_normal((2, WIDTH), dtype=np.float32)
    with serve(tag) as served:
        listing = served.container.exec(["python3", "-c", "import json, os; print(json.dumps({n: os.path.getsize("
                                         "'/opt/gpux/model/' + n) for n in sorted(os.listdir('/opt/gpux/model'))}))"])
        files = json.loads(listing.output)
        assert list(files) == ["model.onnx", "model.onnx.data"] and files["model.onnx"] < 10_000, files
        assert files["model.onnx.data"] >= size - 10_000
        want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(_answer(served, x), want, rtol=1e-4, atol=1e-5)

    # new weights, the same graph: the replay moves them to the data file as the full build does
    first = docker_client.images.get(tag).id
    _model(model, seed=2)
    code, _, stderr = _build(project, tag, tmp_path)
    try:
        assert code == 0 and REPLAYED in stderr, stderr[-3000:]
        with serve(tag) as served:
            want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
            np.testing.assert_allclose(_answer(served, x), want, rtol=1e-4, atol=1e-5)
    finally:  # the first build's image lost its tag to the second: 566 MB the engine would keep
        if not docker_client.images.get(first).tags:
            docker_client.images.remove(first, force=True)
