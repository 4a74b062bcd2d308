"""The model checks a build starts ahead in a second process (gpux_pack/project/prechecks.py): a
model not checked before is checked by the worker, so the build's process never imports onnx;
what it finds and what it refuses are what the build's own checks find and refuse; no worker
outlives its use, whether it was asked, not needed, or the model was refused. Each case runs
in a fresh Python: this one imported onnx long ago."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from gpux_pack.errors import ModelError
from gpux_pack.project.model import inspect_model

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the worker runs only with a second CPU")

SCRIPT = """
import json, os, sys
from pathlib import Path
from gpux_pack.project import prechecks
from gpux_pack.project.model import inspect_model
from gpux_pack.errors import ModelError

def children():
    pid = os.getpid()
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()

answer = {}
prechecks.start()
answer["worker_started"] = len(children()) == 1
try:
    info = inspect_model(Path(sys.argv[1]), "model.onnx")
    answer["inputs"] = [[t.name, t.type, list(t.shape)] for t in info.inputs]
    answer["working_memory"] = [[[list(d) for d in dims], n] for dims, n in info.working_memory]
except ModelError as e:
    answer["error"] = str(e)
answer["onnx_imported_here"] = "onnx" in sys.modules
answer["children_left"] = children()  # asked, or not needed: gone either way
prechecks.cancel()
print(json.dumps(answer))
"""


def _model(path: Path, extra_node: bool = False, broken: bool = False) -> Path:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Tanh", ["r"], ["y"])]
    if extra_node:
        nodes.insert(1, helper.make_node("Identity", ["r"], ["r2"]))
        nodes[2].input[0] = "r2"
    if broken:
        nodes[-1].input[0] = "nowhere"  # read before anything makes it: the checker refuses the graph
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _inspect(path: Path, cache: Path) -> dict:
    env = {**os.environ, "GPUX_PACK_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_new_model_is_checked_by_the_worker_and_the_build_never_imports_onnx(tmp_path):
    model = _model(tmp_path / "model.onnx")
    answer = _inspect(model, tmp_path / "cache")
    assert answer["worker_started"] is True
    assert answer["onnx_imported_here"] is False  # the worker checked it; the build kept what it found
    assert answer["children_left"] == []
    assert answer["inputs"] == [["x", "float32", ["batch", 8]]]
    here = inspect_model(model)  # the same as the checks in this process find
    assert answer["working_memory"] == [[[list(d) for d in dims], n] for dims, n in here.working_memory]
    assert answer["working_memory"]  # the intermediate r: 32 bytes per row

    # a new graph: checked by a new worker; the same one again: from the cache, the worker stopped
    _model(model, extra_node=True)
    assert _inspect(model, tmp_path / "cache")["onnx_imported_here"] is False
    again = _inspect(model, tmp_path / "cache")
    assert again["onnx_imported_here"] is False and again["children_left"] == []  # killed once not needed


def test_a_refused_model_is_refused_with_the_build_s_own_words(tmp_path):
    model = _model(tmp_path / "model.onnx", broken=True)
    with pytest.raises(ModelError) as direct:
        inspect_model(model, "model.onnx")
    answer = _inspect(model, tmp_path / "cache")
    assert answer["error"] == str(direct.value)  # the worker's words, put as the build's own
    assert answer["error"].startswith("model.onnx: fails the ONNX checker")
    assert answer["onnx_imported_here"] is False
    assert answer["children_left"] == []


def test_where_the_os_has_no_affinity_call_the_machine_s_cpus_decide(monkeypatch):
    """macOS has no sched_getaffinity: the build must not fail on it; one CPU starts no worker."""
    from gpux_pack.project import prechecks

    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    prechecks.start()
    assert prechecks.answer(Path("model.onnx"), "any") is None  # no worker was started to answer
