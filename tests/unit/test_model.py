import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpux_pack.project.load import load_project
from gpux_pack.errors import ConfigError, ModelError
from gpux_pack.project.model import inspect_model, reconcile

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp" / "model.onnx"


def test_reads_signature_and_digest():
    info = inspect_model(MLP)
    assert [(t.name, t.type, t.shape) for t in info.inputs] == [("features", "float32", ("batch", 4))]
    assert [t.name for t in info.outputs] == ["logits", "probs"]
    assert info.opset == 17 and info.files == ("model.onnx",)
    assert len(info.sha256) == 64 and info.size_bytes == MLP.stat().st_size


def test_initializer_inputs_are_optional(tmp_path):
    w = numpy_helper.from_array(np.ones((2,), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [w],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    info = inspect_model(path)
    assert {t.name: t.required for t in info.inputs} == {"x": True, "w": False}


def _external(tmp_path: Path) -> Path:
    big = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])],
        [big],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.weights", size_threshold=0)
    return path


def test_external_data_is_part_of_the_model(tmp_path):
    info = inspect_model(_external(tmp_path))
    assert info.files == ("m.onnx", "m.weights")
    assert info.size_bytes == (tmp_path / "m.onnx").stat().st_size + (tmp_path / "m.weights").stat().st_size


def test_missing_and_truncated_external_data(tmp_path):
    path = _external(tmp_path)
    weights = tmp_path / "m.weights"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelError, match="'m.weights' is truncated"):
        inspect_model(path)
    weights.unlink()
    with pytest.raises(ModelError, match="'m.weights' is missing"):
        inspect_model(path)


def test_external_data_beside_a_large_inline_weight(tmp_path):
    """The checker reads the skeleton in memory, where it looked for the external file in the
    working directory: refused unless run from the model's folder."""
    path = _external(tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    model.graph.initializer.append(numpy_helper.from_array(np.ones((64, 64), np.float32), "v"))
    model.graph.node.append(helper.make_node("MatMul", ["y", "v"], ["z"]))
    model.graph.output[0].name = "z"
    onnx.save(model, str(path))
    assert Path.cwd() != tmp_path
    info = inspect_model(path, "m.onnx")
    assert info.files == ("m.onnx", "m.weights") and info.inline_weights == 16384


def test_hard_linked_external_data_is_one_line_saying_what_to_do(tmp_path):
    """ONNX's checker refuses it as a "potential hardlink attack"; the build says why and how."""
    path = _external(tmp_path)
    os.link(tmp_path / "m.weights", tmp_path / "elsewhere.weights")
    with pytest.raises(ModelError) as e:
        inspect_model(path, "m.onnx")
    assert str(e.value) == ("m.onnx: external data file 'm.weights' has 2 hard links: ONNX refuses hard-linked data "
                            "(another name could change it unseen); make it a file of its own: "
                            "cp m.weights tmp && mv tmp m.weights")
    (tmp_path / "elsewhere.weights").unlink()
    assert inspect_model(path).files == ("m.onnx", "m.weights")


def _two_tensors(tmp_path: Path, locations: tuple[str, str]) -> Path:
    """y = x + a + b, a and b external at `locations` (offsets 0 and 16 of the file they name)."""
    from onnx import TensorProto as T

    inits = []
    for name, location, offset in zip("ab", locations, ("0", "16")):
        t = helper.make_tensor(name, T.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
        t.ClearField("float_data")
        t.data_location = T.EXTERNAL
        for key, value in (("location", location), ("offset", offset), ("length", "16")):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        inits.append(t)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "a"], ["s"]), helper.make_node("Add", ["s", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [4])], [helper.make_tensor_value_info("y", T.FLOAT, [4])], inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    (tmp_path / "sub").mkdir()
    for file in ("w.bin", "sub/w.bin"):
        (tmp_path / file).write_bytes(np.arange(8, dtype=np.float32).tobytes())
    return path


@pytest.mark.parametrize("locations, baked", [
    (("./w.bin", "./w.bin"), "w.bin"),
    (("w.bin", "./w.bin"), "w.bin"),
    (("sub//w.bin", "sub/w.bin"), "sub/w.bin"),
    (("sub/./w.bin", ".//sub/w.bin"), "sub/w.bin"),
])
def test_external_data_spellings_are_one_file(tmp_path, locations, baked):
    """Every spelling of one path inside the folder is that file, baked once at its normal
    path (where ONNX Runtime opens it); two spellings in two tensors do not bake it twice."""
    path = _two_tensors(tmp_path, locations)
    info = inspect_model(path)
    assert info.files == ("m.onnx", baked)
    assert info.size_bytes == path.stat().st_size + 32


@pytest.mark.parametrize("location", ["m.onnx", "./m.onnx", "sub/../m.onnx"])
def test_external_data_naming_the_model_itself_is_refused(tmp_path, location):
    path = _two_tensors(tmp_path, ("w.bin", location))
    with pytest.raises(ModelError) as e:
        inspect_model(path, "models/m.onnx")
    assert str(e.value).startswith("models/m.onnx: ") and "\n" not in str(e.value)
    if ".." not in location:
        assert str(e.value) == f"models/m.onnx: external data location '{location}' of tensor b is the model file itself"


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", "is empty"),
        (b"name: not a model\n", "is not an ONNX model"),
        (MLP.read_bytes()[: len(MLP.read_bytes()) // 2], "is not an ONNX model"),
        (b"\x00\x01\x02garbage" * 10, "is not an ONNX model"),
    ],
)
def test_broken_files(tmp_path, content, words):
    path = tmp_path / "m.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=words):
        inspect_model(path)


def _project(tmp_path: Path, extra: str, strict: bool = True):
    (tmp_path / "model.onnx").write_bytes(MLP.read_bytes())
    (tmp_path / "gpux.yml").write_text("name: m\nmodel:\n  source: ./model.onnx\n" + extra)
    project = load_project(tmp_path, strict)
    return project, inspect_model(project.model_path)


@pytest.mark.parametrize(
    "extra, field, words",
    [
        ("inputs:\n  pixels: {type: float32}\n", "inputs.pixels", "has no input 'pixels' (it has: features)"),
        ("inputs:\n  features: {type: int64}\n", "inputs.features.type", "int64 does not match the model's float32"),
        ("inputs:\n  features: {shape: [1, 4, 4]}\n", "inputs.features.shape", "rank 3"),
        ("inputs:\n  features: {shape: [-1, 5]}\n", "inputs.features.shape[1]", "fixes it at 4"),
        ("inputs:\n  features: {required: false}\n", "inputs.features.required", "so it is required"),
        ("outputs:\n  - name: score\n", "outputs[0]", "has no output 'score'"),
    ],
)
def test_config_checked_against_model(tmp_path, extra, field, words):
    project, info = _project(tmp_path, extra)
    with pytest.raises(ConfigError) as err:
        reconcile(project, info)
    assert err.value.field == field and words in str(err.value)
    assert err.value.line is not None


def test_the_graph_decides_a_dynamic_dimension_and_outputs_can_be_selected(tmp_path):
    """GPUX's docs write [1, N] for batch models and GPUX never enforced it: a declared size where
    the graph is dynamic is a note; the image accepts what the graph does, warmup runs the
    declared shape."""
    project, info = _project(tmp_path, "inputs:\n  features: {shape: [8, 4]}\noutputs:\n  probs: {labels: [a, b, c]}\n")
    sig = reconcile(project, info)
    assert sig.inputs[0].shape == ("batch", 4) and sig.declared == (("features", (8, 4)),)
    assert [o.name for o in sig.outputs] == ["probs"] and sig.outputs[0].labels == ("a", "b", "c")
    assert len(sig.notes) == 1 and sig.notes[0].endswith(
        "gpux.yml:5: inputs.features.shape[0]: 8, where the graph's dimension is dynamic ('batch'): the graph decides, "
        "so the image takes any size there and batches requests (pack.shapes: declared narrows it)"), sig.notes


@pytest.mark.parametrize("shape, served", [("[-1, 4]", ("batch", 4)), ("[n, 4]", ("n", 4)), ("[batch, 4]", ("batch", 4))])
def test_a_dynamic_declaration_of_a_dynamic_dimension_is_no_note(tmp_path, shape, served):
    """The file's name replaces the graph's (names of its own untie what the graph ties); -1 is GPUX's
    "dynamic": the graph's name stays."""
    project, info = _project(tmp_path, f"inputs:\n  features: {{shape: {shape}}}\n")
    sig = reconcile(project, info)
    assert sig.inputs[0].shape == served and sig.notes == () and sig.declared == ()


def test_pack_shapes_declared_narrows_a_dynamic_dimension(tmp_path):
    project, info = _project(tmp_path, "inputs:\n  features: {shape: [8, 4]}\npack:\n  shapes: declared\n")
    sig = reconcile(project, info)
    assert sig.inputs[0].shape == (8, 4)
    assert len(sig.notes) == 1 and sig.notes[0].endswith(
        "gpux.yml:5: inputs.features.shape[0]: 8: the graph leaves it dynamic ('batch'); pack.shapes: declared "
        "narrows it, so the image takes only this size"), sig.notes


def _question_marks(path: Path) -> Path:
    """What paddle2onnx writes: every unknown dimension named `?`, an output's a long formula."""
    formula = "floor(" * 12 + "h" + "/2)" * 12
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["?", 3, "?", "?"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["?", 3, "?", formula])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_question_mark_dimensions_are_each_their_own_size(tmp_path):
    """`?` is no identifier: ONNX Runtime runs [1, 3, 48, 192], so the image takes it too."""
    _question_marks(tmp_path / "m.onnx")
    (tmp_path / "gpux.yml").write_text("name: m\nversion: 1.0.0\nmodel:\n  source: ./m.onnx\n")
    project = load_project(tmp_path)
    sig = reconcile(project, inspect_model(project.model_path))
    assert sig.inputs[0].shape == (-1, 3, -1, -1) and sig.outputs[0].shape == (-1, 3, -1, -1)
    assert len(sig.notes) == 1 and "'?'" in sig.notes[0] and len(sig.notes[0]) < 200, sig.notes
    (tmp_path / "gpux.yml").write_text("name: m\nversion: 1.0.0\nmodel:\n  source: ./m.onnx\n"
                                       "inputs:\n  x: {shape: [1, 3, 48, 192]}\n")
    project = load_project(tmp_path)
    sig = reconcile(project, inspect_model(project.model_path))
    assert sig.inputs[0].shape == (-1, 3, -1, -1) and all(len(n) < 250 for n in sig.notes), sig.notes


def test_required_false_for_an_input_the_graph_needs_is_a_note_unless_strict(tmp_path):
    project, info = _project(tmp_path, "inputs:\n  features: {required: false}\n", strict=False)
    sig = reconcile(project, info)
    assert sig.inputs[0].required and len(sig.notes) == 1
    assert "inputs.features.required: false, but 'features' has no default" in sig.notes[0]


def test_omitted_io_comes_from_model(tmp_path):
    project, info = _project(tmp_path, "")
    sig = reconcile(project, info)
    assert sig.inputs == info.inputs and sig.outputs == info.outputs


def test_reading_a_model_does_not_hold_its_weights(tmp_path):
    """inspect_model on 96 MiB of inline weights, in a child process: what it holds above its
    libraries. It held 2.95x (onnx.load's two copies, working_memory's, the checker's two), then
    2.33x; the skeleton read from the wire skips the weights: 9 MB, whatever the model's size."""
    import subprocess
    import sys

    from onnx import TensorProto as T, numpy_helper

    n = 2048
    inits = [numpy_helper.from_array(np.full((n, n * 2), 0.5, np.float32), f"w{i}") for i in range(3)]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", n])],
                              [helper.make_tensor_value_info("h0", T.FLOAT, ["batch", n * 2])], inits)
    path = tmp_path / "big.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    size = path.stat().st_size
    child = ("import sys, onnx, onnx.checker, onnx.shape_inference\n"
             "from pathlib import Path\n"
             "from gpux_pack.project.model import inspect_model\n"
             "def kb(key):\n"
             "    return int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]) * 1024\n"
             "base = kb('VmRSS')\n"
             "inspect_model(Path(sys.argv[1]))\n"
             "print(kb('VmHWM') - base)\n")
    proc = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    held = int(proc.stdout)
    assert held < 0.15 * size, f"held {held / size:.2f}x the model's {size} bytes"  # measured 0.09x; was 3.07x


def _one_weight(path: Path, mb: int, in_branch: bool) -> None:
    """x @ w, w a float weight of `mb` MiB: a top-level initializer, or one of an If's then branch."""
    from onnx import TensorProto as T

    n = 1024
    cols = mb * (1 << 20) // (4 * n)
    w = numpy_helper.from_array(np.full((n, cols), 0.5, np.float32), "w")
    x = helper.make_tensor_value_info("x", T.FLOAT, ["batch", n])
    y = helper.make_tensor_value_info("y", T.FLOAT, ["batch", cols])
    if in_branch:
        then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [],
                                 [helper.make_tensor_value_info("t", T.FLOAT, ["batch", cols])], [w])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                                  [helper.make_tensor_value_info("e", T.FLOAT, ["batch", n])])
        graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                                  [x, helper.make_tensor_value_info("c", T.BOOL, [])],
                                  [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "m"])])
    else:
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_weight_in_a_subgraph_costs_what_it_costs_at_the_top(tmp_path):
    """`gpux-pack inspect` of a model whose 64 MiB weight sits in an If branch, measured as users
    run it: it read the weight whole three times (the skeleton kept it, protobuf parsed it, the
    checker loaded the file again: 1.6 GB for 256 MB); now its peak is the top-level case's."""
    from tests.conftest import run_cli_measured

    peaks = {}
    for where in ("top", "branch"):
        path = tmp_path / f"{where}.onnx"
        _one_weight(path, 64, where == "branch")
        proc, peaks[where] = run_cli_measured("inspect", str(path), "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["model"]["size_bytes"] == path.stat().st_size > 64 << 20
        path.unlink()
    # measured 75 MB both (the libraries' 70 MB and the graph), with 256 MB weights too: the branch's
    # cost 1.6 GB then, above its size once read whole
    assert peaks["branch"] < min(peaks["top"] + (8 << 20), 128 << 20), peaks


@pytest.mark.parametrize("length, size, problem", [
    (None, 16380, "external data file 'm.weights' has 16380 bytes from offset 0 for tensor w, but its shape and type "
                  "need 16384 bytes"),
    ("16380", 16384, "external data length of tensor w in 'm.weights' is 16380 bytes, but its shape and type need "
                     "16384 bytes"),
    ("16388", 16388, "external data length of tensor w in 'm.weights' is 16388 bytes, but its shape and type need "
                     "16384 bytes"),
    (None, 20000, None),  # ONNX Runtime reads what it needs from the offset on
    ("0", 16384, None),  # a length of 0 is none
    ("16384", 20000, None),
])
def test_external_data_must_hold_what_the_tensor_needs(tmp_path, length, size, problem):
    """ONNX Runtime refuses at start a tensor whose external data is not what its shape and type
    need: a `length` other than that (larger too), or, without one, a file with fewer bytes
    after the offset. The build refuses the same, where it passed and the container exited 1."""
    path = _external(tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    tensor = model.graph.initializer[0]
    entries = [(e.key, e.value) for e in tensor.external_data if e.key != "length"]
    del tensor.external_data[:]
    for key, value in entries + ([("length", length)] if length is not None else []):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(path))
    weights = tmp_path / "m.weights"
    weights.write_bytes(weights.read_bytes()[:size].ljust(size, b"\0"))
    if problem is None:
        assert inspect_model(path, "m.onnx").files == ("m.onnx", "m.weights")
        return
    with pytest.raises(ModelError) as e:
        inspect_model(path, "m.onnx")
    assert str(e.value) == f"m.onnx: {problem}"


# ---------------------------------------------------------------------------------------------
# what the checks found is kept by what they read (issue 41: a retrained model is not checked again)


def _retrained(src: Path, dst: Path, step: float, **metadata) -> Path:
    """src with every weight moved by `step` and new metadata (doc_string, producer, metadata_props)."""
    model = onnx.load(str(src))
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(step), init.name))
    model.doc_string = metadata.get("doc", f"retrained by {step}")
    model.producer_name, model.producer_version = "trainer", metadata.get("version", str(step))
    del model.metadata_props[:]
    for key, value in metadata.get("props", [("run", str(step))]):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(dst))
    return dst


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUX_PACK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def _unchecked(monkeypatch):
    """From here on, a model that reaches ONNX's checker fails the test."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("checked again")

    monkeypatch.setattr(onnx.checker, "check_model", refuse)


def test_a_retrained_model_with_new_metadata_is_not_checked_again(tmp_path, fresh_cache, monkeypatch):
    first = inspect_model(_retrained(MLP, tmp_path / "a.onnx", 0.5))
    assert len(list(fresh_cache.iterdir())) == 1
    expected = inspect_model(_retrained(MLP, tmp_path / "b.onnx", 0.25, version="2.0"), "b.onnx")
    _unchecked(monkeypatch)
    kept = inspect_model(_retrained(MLP, tmp_path / "b.onnx", 0.25, version="2.0"), "b.onnx")
    assert kept == expected and kept.producer == "trainer 2.0" and kept.sha256 != first.sha256
    assert kept.path == (tmp_path / "b.onnx").resolve() and kept.files == ("b.onnx",)
    assert kept.size_bytes == (tmp_path / "b.onnx").stat().st_size


def _resize_model(path: Path, scale: float) -> Path:
    """A float initializer that decides a shape: Resize's scales."""
    scales = numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "scales")
    weight = numpy_helper.from_array(np.ones((1, 3, 1, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Resize", ["m", "", "scales"], ["r"]),
         helper.make_node("Relu", ["r"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "h", "w"])], [scales, weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_weights_that_decide_a_shape_are_part_of_what_the_checks_read(tmp_path, fresh_cache):
    small = inspect_model(_resize_model(tmp_path / "m.onnx", 2.0))
    large = inspect_model(_resize_model(tmp_path / "m.onnx", 4.0))
    assert len(list(fresh_cache.iterdir())) == 2  # the scales changed: checked again, kept apart
    assert small.working_memory != large.working_memory


def test_metadata_the_checker_refuses_is_checked_again_and_refused(tmp_path, fresh_cache, monkeypatch):
    inspect_model(_retrained(MLP, tmp_path / "m.onnx", 0.5))
    twice = _retrained(MLP, tmp_path / "m.onnx", 0.5, props=[("run", "1"), ("run", "2")])
    with pytest.raises(ModelError, match="duplicate keys in metadata_props"):
        inspect_model(twice)
    _unchecked(monkeypatch)
    data = bytearray(_retrained(MLP, tmp_path / "m.onnx", 0.5, doc="\u00e9t\u00e9").read_bytes())
    at = data.index("\u00e9t\u00e9".encode())
    data[at] = 0xFF  # not UTF-8 any more: the walk cannot vouch for it, the full path decides
    (tmp_path / "m.onnx").write_bytes(bytes(data))
    with pytest.raises((ModelError, AssertionError)):
        inspect_model(tmp_path / "m.onnx")


def test_the_check_cache_can_be_turned_off(tmp_path, fresh_cache, monkeypatch):
    monkeypatch.setenv("GPUX_PACK_CHECK_CACHE", "0")
    inspect_model(MLP)
    assert not fresh_cache.exists()
