"""pipeline/rebuild.py's model digest: equal when only trained weights change, different for
anything a model check looks at, and no fast path for external data or broken bytes."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from gpux_pack.pipeline import rebuild
from tests.conftest import EXAMPLES


def _model(tmp_path, name="m.onnx"):
    path = tmp_path / name
    shutil.copy(EXAMPLES / "mlp" / "model.onnx", path)
    return path


def _edit(path, change):
    model = onnx.load(str(path))
    change(model)
    onnx.save(model, str(path))


def _bump(model, by=0.5):
    init = model.graph.initializer[-1]
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(by), init.name))


def test_new_weights_keep_the_structure(tmp_path):
    path = _model(tmp_path)
    before, data = rebuild.structure(path), path.read_bytes()
    _edit(path, _bump)
    assert path.read_bytes() != data and rebuild.structure(path) == before


@pytest.mark.parametrize("change", [
    lambda m: setattr(m.graph.node[0], "name", "renamed"),
    lambda m: setattr(m.graph.input[0], "name", "other"),
    lambda m: setattr(m.graph.initializer[-1], "name", "w-renamed"),
    lambda m: m.metadata_props.add(key="k", value="v"),
    lambda m: setattr(m.opset_import[0], "version", 18),
], ids=["node-name", "input-name", "initializer-name", "metadata", "opset"])
def test_anything_but_the_weights_changes_it(tmp_path, change):
    path = _model(tmp_path)
    before = rebuild.structure(path)
    _edit(path, change)
    assert rebuild.structure(path) != before


def test_a_different_weight_length_or_shape_changes_it(tmp_path):
    path = _model(tmp_path)
    before = rebuild.structure(path)

    def grow(model):
        init = model.graph.initializer[-1]
        values = numpy_helper.to_array(init)
        init.CopyFrom(numpy_helper.from_array(np.concatenate([values, values]), init.name))

    _edit(path, grow)
    assert rebuild.structure(path) != before


def test_external_data_and_broken_bytes_take_the_full_build(tmp_path):
    path = _model(tmp_path)
    model = onnx.load(str(path))
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    with pytest.raises(rebuild.Miss):
        rebuild.structure(path)
    good = _model(tmp_path, "good.onnx").read_bytes()
    for broken in (good[:-7], b"", b"\xff" * 40, good[:3] + b"\x07" + good[4:]):
        (tmp_path / "bad.onnx").write_bytes(broken)
        try:
            rebuild.structure(tmp_path / "bad.onnx")
        except rebuild.Miss:
            continue
        # parsed anyway: then it must not look like the good model
        assert rebuild.structure(tmp_path / "bad.onnx") != rebuild.structure(tmp_path / "good.onnx")


def test_version_and_rebuild_paths_import_no_heavy_library():
    code = ("import sys; from gpux_pack.pipeline import rebuild; "
            "heavy = {'numpy', 'onnx', 'pydantic', 'docker', 'typer', 'jinja2', 'yaml', 'requests'} & set(sys.modules); "
            "print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("kind", ["fifo", "device", "longer"])
def test_the_replay_reads_only_a_regular_model_of_the_recorded_size(tmp_path, kind):
    """The model swapped for a FIFO or a link to /dev/zero hung the replay for ever (its digest read
    until the end); now it is a miss in no time, and the full build says what is wrong."""
    import os
    import threading

    path = _model(tmp_path)
    size = path.stat().st_size
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(b"\0" * (size + 1))
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(_miss(lambda: rebuild._sha256(path, size))), daemon=True)
    worker.start()
    worker.join(10)
    expected = {"fifo": f"{path.name} is not a regular file", "device": "a symbolic link", "longer": "the model's size changed"}
    assert outcome == [expected[kind]], outcome
    if kind != "longer":
        assert _miss(lambda: rebuild.structure(path)) == expected[kind]


def _miss(fn) -> str:
    """What stopped the replay: a Miss, or the link it would not follow (replay takes any
    OSError as a miss too)."""
    import errno

    try:
        fn()
    except rebuild.Miss as e:
        return str(e)
    except OSError as e:
        return "a symbolic link" if e.errno == errno.ELOOP else str(e)
    return "no miss"
