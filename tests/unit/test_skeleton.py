"""The model's skeleton read from the wire format, and its external-data form."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpux_pack.errors import ModelError
from gpux_pack.project.model import inspect_model
from gpux_pack.project.skeleton import ALIGN, WireError, copy_ranges, external_form, read_skeleton


def _model(path, weights: int = 3, width: int = 96, extra=()):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((width, width), dtype=np.float32), f"w{i}")
             for i in range(weights)]
    inits.append(numpy_helper.from_array(np.array([1.5], np.float32), "small"))
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [f"h{i}"]) for i in range(weights)]
    nodes.append(helper.make_node("Mul", [f"h{weights - 1}", "small"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], [*inits, *extra])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="test")
    onnx.save(model, str(path))
    return model


def test_skeleton_skips_large_weights_and_knows_where_they_lie(tmp_path):
    path = tmp_path / "m.onnx"
    model = _model(path)
    skeleton = read_skeleton(path)
    assert len(skeleton.model) < 2000 < path.stat().st_size // 10
    assert [w.index for w in skeleton.weights] == [0, 1, 2]  # "small" stays whole
    data = path.read_bytes()
    for weight in skeleton.weights:
        assert data[weight.offset:weight.offset + weight.length] == model.graph.initializer[weight.index].raw_data
    proto = onnx.ModelProto.FromString(skeleton.model)
    assert [t.name for t in proto.graph.initializer] == ["w0", "w1", "w2", "small"]
    assert list(proto.graph.initializer[0].dims) == [96, 96] and not proto.graph.initializer[0].raw_data
    assert numpy_helper.to_array(proto.graph.initializer[3]).tolist() == [1.5]
    assert proto.producer_name == "test" and len(proto.graph.node) == 4


def test_a_model_without_large_weights_is_its_own_skeleton(tmp_path):
    path = tmp_path / "m.onnx"
    _model(path, width=8)
    assert read_skeleton(path).model == path.read_bytes() and read_skeleton(path).weights == ()


@pytest.mark.parametrize("cut", [1, 100, 5000, -7])
def test_cut_files_are_not_models(tmp_path, cut):
    path = tmp_path / "m.onnx"
    _model(path)
    path.write_bytes(path.read_bytes()[:cut])
    if cut == 5000:  # inside the first weight: the walk itself finds the field that runs past the end
        with pytest.raises(WireError, match="runs past the end"):
            read_skeleton(path)
    with pytest.raises(ModelError, match="is not an ONNX model"):
        inspect_model(path, "m.onnx")


def test_skipped_weights_are_still_checked(tmp_path):
    """The checker never sees a skipped weight's bytes: their size is checked against the shape here."""
    path = tmp_path / "m.onnx"
    model = _model(path)
    model.graph.initializer[1].raw_data = model.graph.initializer[1].raw_data[:-8]
    onnx.save(model, str(path))
    with pytest.raises(ModelError) as e:
        inspect_model(path, "m.onnx")
    assert str(e.value) == ("m.onnx: fails the ONNX checker: TensorProto (tensor name: w1) raw_data size (36856 bytes) "
                            "is too small for the declared shape and type (36864 bytes required)")
    model.graph.initializer[1].raw_data += b"\0" * 8
    model.graph.initializer[1].float_data.append(1.0)
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match="w1.*one and only one value field"):
        inspect_model(path, "m.onnx")


def test_the_checker_still_sees_the_graph(tmp_path):
    """A node reading a name nothing defines fails as before, weights skipped or not."""
    path = tmp_path / "m.onnx"
    model = _model(path)
    model.graph.node[1].input[0] = "nowhere"
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match="fails the ONNX checker: .*nowhere"):
        inspect_model(path, "m.onnx")


def test_external_form_runs_the_same(tmp_path):
    """The external form is the same graph with the same bytes: ONNX Runtime's outputs are equal,
    and every weight sits at a page-aligned offset of the data file."""
    path = tmp_path / "m.onnx"
    _model(path)
    form = external_form(path, "m.onnx.data")
    out = tmp_path / "ext"
    out.mkdir()
    (out / "m.onnx").write_bytes(form.model)
    with open(out / "m.onnx.data", "wb") as f:
        for piece in copy_ranges(path, form.ranges, chunk=1000):
            assert len(piece) <= 1000 or not piece.strip(b"\0")
            f.write(piece)
    assert (out / "m.onnx.data").stat().st_size == form.data_size
    assert all(at % ALIGN == 0 for _, _, at in form.ranges)
    x = np.random.default_rng(1).standard_normal((3, 96), dtype=np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(out / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.array_equal(want, got)
    assert inspect_model(out / "m.onnx").files == ("m.onnx", "m.onnx.data")


def test_which_models_the_image_keeps_with_external_data():
    """pack.weights: auto moves 64 MiB of inline weights and more, external any large inline weight;
    a model with external data of its own, or inline, is baked as given."""
    from dataclasses import replace
    from pathlib import Path

    from gpux_pack.plan import EXTERNALIZE_FROM, externalize

    info = inspect_model(Path(__file__).resolve().parents[2] / "examples" / "mlp" / "model.onnx")
    assert info.inline_weights == 0 and not externalize("external", info)  # no weight over 4 KiB
    big = replace(info, inline_weights=EXTERNALIZE_FROM)
    assert externalize("auto", big) and externalize("external", big) and not externalize("inline", big)
    small = replace(info, inline_weights=EXTERNALIZE_FROM - 1)
    assert not externalize("auto", small) and externalize("external", small)
    assert not externalize("external", replace(big, files=("model.onnx", "weights.bin")))
