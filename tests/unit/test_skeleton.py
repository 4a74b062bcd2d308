"""The model's skeleton read from the wire format, and its external-data form."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpux_pack.errors import ModelError
from gpux_pack.project.graph import working_memory
from gpux_pack.project.model import inspect_model
from gpux_pack.project.skeleton import (ALIGN, FileBytes, FileChanged, WireError, copy_ranges, external_form, fields,
                                        read_skeleton, tensor_at)


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
    assert [w.path for w in skeleton.weights] == [(("graph", None), ("initializer", i)) for i in range(3)]  # "small" stays whole
    data = path.read_bytes()
    for weight in skeleton.weights:
        assert data[weight.offset:weight.offset + weight.length] == tensor_at(model, weight).raw_data
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


def _everywhere(path, n: int = 64):
    """A large weight in every place a tensor can sit: an initializer at the top, one in an If
    branch and one in an If inside it, a Constant's `value` in the other branch and in a
    model-local function, a sparse initializer's values. y = LocalF((If(c) ...) @ top + s)."""
    rng = np.random.default_rng(0)

    def arr(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    def vi(name, shape=(n, n), kind=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, kind, list(shape))

    inner_then = helper.make_graph([helper.make_node("MatMul", ["x", "d"], ["it"])], "ithen", [], [vi("it")],
                                   [numpy_helper.from_array(arr(n, n), "d")])
    inner_else = helper.make_graph([helper.make_node("Identity", ["x"], ["ie"])], "ielse", [], [vi("ie")])
    then = helper.make_graph([helper.make_node("MatMul", ["x", "a"], ["t0"]),
                              helper.make_node("If", ["c2"], ["t1"], then_branch=inner_then, else_branch=inner_else),
                              helper.make_node("Add", ["t0", "t1"], ["t"])], "then", [], [vi("t")],
                             [numpy_helper.from_array(arr(n, n), "a")])
    other = helper.make_graph([helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(arr(n, n), "b")),
                               helper.make_node("MatMul", ["x", "b"], ["e"])], "else", [], [vi("e")])
    indices = np.sort(rng.choice(n * n, 2000, replace=False)).astype(np.int64)
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(arr(2000), "s"),
                                       numpy_helper.from_array(indices, "s_indices"), [n, n])
    body = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(arr(n, n), "k")),
            helper.make_node("MatMul", ["i", "k"], ["o"])]
    function = helper.make_function("local", "LocalF", ["i"], ["o"], body, [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("If", ["c"], ["y0"], then_branch=then, else_branch=other),
             helper.make_node("MatMul", ["y0", "top"], ["y1"]),
             helper.make_node("Add", ["y1", "s"], ["y2"]),
             helper.make_node("LocalF", ["y2"], ["y"], domain="local")]
    graph = helper.make_graph(nodes, "g", [vi("x"), vi("c", (), TensorProto.BOOL), vi("c2", (), TensorProto.BOOL)],
                              [vi("y")], [numpy_helper.from_array(arr(n, n), "top")], sparse_initializer=[sparse])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[function])
    onnx.save(model, str(path))
    return model


def _refilled(path):
    """The skeleton parsed, each skipped weight's bytes put back from the file: equal to the file parsed."""
    skeleton = read_skeleton(path)
    data = path.read_bytes()
    proto = onnx.ModelProto.FromString(skeleton.model)
    for weight in skeleton.weights:
        tensor_at(proto, weight).raw_data = data[weight.offset:weight.offset + weight.length]
    assert proto == onnx.ModelProto.FromString(data)
    return skeleton


def test_weights_are_skipped_wherever_they_sit(tmp_path):
    """If/Loop/Scan bodies, a Constant's value, a function's nodes: their large tensors are
    skipped as the top-level initializers are (a 256 MB weight in an If branch cost `inspect`
    1.6 GB, read whole three times; now what the same weight costs at the top). A sparse
    tensor's indices stay: the checker reads them."""
    path = tmp_path / "m.onnx"
    model = _everywhere(path)
    skeleton = _refilled(path)
    g, then = ("graph", None), (("graph", None), ("node", 0), ("attribute", 1), ("g", None))
    assert {w.path: tensor_at(model, w).name for w in skeleton.weights} == {
        (*then, ("initializer", 0)): "a",
        (*then, ("node", 1), ("attribute", 1), ("g", None), ("initializer", 0)): "d",
        (g, ("node", 0), ("attribute", 0), ("g", None), ("node", 0), ("attribute", 0), ("t", None)): "b",
        (g, ("initializer", 0)): "top",
        (g, ("sparse_initializer", 0), ("values", None)): "s",
        (("functions", 0), ("node", 0), ("attribute", 0), ("t", None)): "k",
    }
    assert len(skeleton.model) < 17_000 < path.stat().st_size // 6  # the indices' 16,000 bytes
    info = inspect_model(path, "m.onnx")
    assert info.inline_weights == sum(w.length for w in skeleton.weights) == 5 * 16384 + 8000
    assert [t.name for t in info.inputs] == ["x", "c", "c2"] and info.nodes == 4
    assert info.working_memory == working_memory(model, {"top", "s"}) == (((), 32768),)  # shapes need no bytes


def test_a_nodes_tensor_lists_and_sparse_attributes_are_skipped(tmp_path):
    """A custom operator's `tensors` list and `sparse_tensor` attribute: each large tensor in them
    skipped by its place in the list; a small one stays."""
    rng = np.random.default_rng(0)
    big = [numpy_helper.from_array(rng.standard_normal((32, 64), dtype=np.float32), f"t{i}") for i in range(2)]
    small = numpy_helper.from_array(np.ones(4, np.float32), "small")
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(rng.standard_normal(1500, dtype=np.float32), "v"),
                                       numpy_helper.from_array(np.arange(1500, dtype=np.int64), "i"), [4096])
    node = helper.make_node("Pack", ["x"], ["y"], domain="custom", tables=[big[0], small, big[1]], extra=sparse)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)]),
              str(path))
    skeleton = _refilled(path)
    at = (("graph", None), ("node", 0))
    assert [w.path for w in skeleton.weights] == [(*at, ("attribute", 0), ("sparse_tensor", None), ("values", None)),
                                                  (*at, ("attribute", 1), ("tensors", 0)),
                                                  (*at, ("attribute", 1), ("tensors", 2))]
    info = inspect_model(path, "m.onnx")
    assert info.custom_ops == ("custom:Pack",) and info.inline_weights == 6000 + 2 * 8192


def test_skipped_weights_in_subgraphs_are_still_checked(tmp_path):
    """The checker still sees the graph around a skipped weight, and the weight's size against its
    shape is checked here, in a branch as at the top."""
    path = tmp_path / "m.onnx"
    model = _everywhere(path)
    branch = model.graph.node[0].attribute[1].g
    branch.node[0].input[0] = "nowhere"
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match="fails the ONNX checker: .*nowhere"):
        inspect_model(path, "m.onnx")
    model = _everywhere(path)
    constant = model.graph.node[0].attribute[0].g.node[0].attribute[0].t
    constant.raw_data = constant.raw_data[:-4]
    onnx.save(model, str(path))
    with pytest.raises(ModelError) as e:
        inspect_model(path, "m.onnx")
    assert str(e.value) == ("m.onnx: fails the ONNX checker: TensorProto (tensor name: b) raw_data size (16380 bytes) "
                            "is too small for the declared shape and type (16384 bytes required)")


def test_external_form_moves_nested_weights_and_runs_the_same(tmp_path):
    """Every skipped weight goes to the data file, in a branch, a Constant or a function too:
    ONNX Runtime loads them there and answers as the original does, on each branch."""
    path = tmp_path / "m.onnx"
    _everywhere(path)
    form = external_form(path, "m.onnx.data")
    out = tmp_path / "ext"
    out.mkdir()
    (out / "m.onnx").write_bytes(form.model)
    with open(out / "m.onnx.data", "wb") as f:
        for piece in copy_ranges(path, form.ranges):
            f.write(piece)
    assert len(form.model) < 18_000 and len(form.ranges) == 6 and all(at % ALIGN == 0 for _, _, at in form.ranges)
    x = np.random.default_rng(1).standard_normal((64, 64), dtype=np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(out / "m.onnx"), providers=["CPUExecutionProvider"])
    for c, c2 in ((True, True), (True, False), (False, False)):
        feeds = {"x": x, "c": np.array(c), "c2": np.array(c2)}
        assert np.array_equal(want.run(None, feeds)[0], got.run(None, feeds)[0])
    assert inspect_model(out / "m.onnx").files == ("m.onnx", "m.onnx.data")


def _field(number: int, payload: bytes) -> bytes:
    key, length = bytearray(), bytearray()
    for out, value in ((key, (number << 3) | 2), (length, len(payload))):
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(key + length) + payload


def test_fields_protobuf_merges_are_followed_or_kept_whole(tmp_path):
    """A singular message field written twice is merged by protobuf: a graph's repeated fields
    concatenate, so a weight's index counts across both (the model's graph, an If branch); a
    tensor merged from two (a Constant's value written twice) is kept whole, bytes and all."""
    rng = np.random.default_rng(0)
    w0, w1, w2, w3 = (numpy_helper.from_array(rng.standard_normal((64, 64), dtype=np.float32), f"w{i}")
                      for i in range(4))
    first = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w0"], ["h"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [w0]), opset_imports=[helper.make_opsetid("", 17)])
    then = helper.make_graph([helper.make_node("MatMul", ["h", "w2"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [64, 64])], [w2])
    more = helper.make_graph([helper.make_node("Identity", ["h"], ["u"])], "more", [], [], [w3])
    other = helper.make_graph([helper.make_node("Identity", ["h"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [64, 64])])
    branch = onnx.AttributeProto(name="then_branch", type=onnx.AttributeProto.GRAPH, g=then).SerializeToString()
    if_node = helper.make_node("If", ["c"], ["y"], else_branch=other).SerializeToString() + _field(5, branch + _field(6, more.SerializeToString()))
    value = onnx.AttributeProto(name="value", type=onnx.AttributeProto.TENSOR, t=w1).SerializeToString()
    constant = helper.make_node("Constant", [], ["k"]).SerializeToString() + _field(5, value + _field(5, w1.SerializeToString()))
    second = helper.make_graph([], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])], [], [w1])
    path = tmp_path / "m.onnx"
    path.write_bytes(first.SerializeToString() + _field(7, second.SerializeToString() + _field(1, constant) + _field(1, if_node)))
    skeleton = _refilled(path)
    then_path = (("graph", None), ("node", 2), ("attribute", 1), ("g", None))
    assert [w.path for w in skeleton.weights] == [(("graph", None), ("initializer", 0)), (("graph", None), ("initializer", 1)),
                                                  (*then_path, ("initializer", 0)), (*then_path, ("initializer", 1))]
    parsed = onnx.load(str(path))
    assert [t.name for t in parsed.graph.initializer] == ["w0", "w1"] and len(parsed.graph.node) == 3
    assert list(parsed.graph.node[1].attribute[0].t.dims) == [64, 64, 64, 64]  # what a merge makes of a tensor


def test_a_file_cut_short_while_it_is_read_is_one_line(tmp_path):
    """A model file that shrinks while it is read (a copy still being written): one line, not the
    SIGBUS a memory map's page fault killed the process with (exit 135, no message)."""
    import subprocess
    import sys

    path = tmp_path / "m.onnx"
    _model(path)
    child = ("import os, sys\n"
             "from pathlib import Path\n"
             "from gpux_pack.errors import ModelError\n"
             "from gpux_pack.project import skeleton\n"
             "from gpux_pack.project.model import inspect_model\n"
             "fields = skeleton.fields\n"
             "def cut(data, start, end):  # the file loses its end once the walk has begun\n"
             "    if start == 0:\n"
             "        os.truncate(sys.argv[1], 50000)\n"
             "    return fields(data, start, end)\n"
             "skeleton.fields = cut\n"
             "try:\n"
             "    inspect_model(Path(sys.argv[1]), 'm.onnx')\n"
             "except ModelError as e:\n"
             "    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout == ("m.onnx: changed while it was read (the file changed or is cut short at byte 50000); "
                           "try again once it is complete\n")
    assert path.stat().st_size == 50000


def test_file_bytes_reads_as_the_bytes_do(tmp_path):
    """FileBytes indexes and slices as the file's bytes, and `fields` walks it as it walks a
    memoryview (rebuild.py's), whatever its block size: a varint split across two blocks too."""
    path = tmp_path / "m.onnx"
    _everywhere(path)
    data = path.read_bytes()
    expected = list(fields(memoryview(data), 0, len(data)))
    with open(path, "rb") as f:
        for block in (1, 7, 21, 4096):
            view = FileBytes(f.fileno())
            view.BLOCK = block
            assert list(fields(view, 0, len(view))) == expected
            for i, j in ((0, 1), (5, 100), (4000, 9000), (len(data) - 3, len(data) + 10)):
                assert view[i] == data[i] and view[i:j] == data[i:j]
            with pytest.raises(IndexError):
                view[len(data)]
        os.truncate(path, 1000)
        with pytest.raises(FileChanged, match="cut short at byte 1000"):
            list(fields(view, 0, len(view)))
