"""pack.optimize (gpux_pack/optimize.py): what is decided for each provider, what ONNX Runtime's
tools make of a real graph, and the check against the original model that refuses a result over
its tolerance. ONNX Runtime runs here, in process; no Docker."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from gpux_pack import optimize, providers
from gpux_pack.cli.flags import optimize_steps
from gpux_pack.errors import ConfigError, UsageError
from gpux_pack.pipeline.build import load, optimized, plan_for
from gpux_pack.plan import Options, label_value, optimization
from gpux_pack.ui import Reporter


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUX_PACK_CACHE_DIR", str(tmp_path / "cache"))


def encoder(path: Path, vocab: int = 50, width: int = 64, seq: str = "seq") -> None:
    """A token embedding, two dense layers with a GELU-like tanh between them and a mean: the
    MatMul-heavy shape dynamic int8 is for; inputs input_ids and attention_mask [1, seq]."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (vocab, width)).astype(np.float32), "table"),
             numpy_helper.from_array(rng.normal(0, 0.2, (width, width)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.2, (width, 8)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
             helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["maskf", "axis_last"], ["mask3"]),
             helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
             helper.make_node("MatMul", ["masked", "w1"], ["h"]),
             helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("MatMul", ["t", "w2"], ["o"]),
             helper.make_node("ReduceMean", ["o"], ["pooled"], axes=[1], keepdims=0)]
    inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axis_last"))
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def project(tmp_path: Path, pack: dict | None = None) -> Path:
    folder = tmp_path / "project"
    folder.mkdir(exist_ok=True)
    encoder(folder / "model.onnx")
    doc = {"name": "encoder", "version": "1.0.0", "model": {"source": "./model.onnx"}}
    if pack is not None:
        doc["pack"] = pack
    (folder / "gpux.yml").write_text(yaml.safe_dump(doc))
    return folder


def quiet() -> Reporter:
    return Reporter(quiet=True)


def test_each_provider_gets_the_steps_it_can_run_and_a_line_for_each_it_cannot():
    cpu, cuda, trt = (providers.get(n) for n in ("cpu", "cuda", "tensorrt"))
    d = optimize.decide(("graph", "int8"), cpu, samples=False)
    assert [(s.mode, s.how) for s in d.steps] == [("int8", "dynamic"), ("graph", "extended")] and not d.skipped
    assert [(s.mode, s.how) for s in optimize.decide(("int8",), cpu, samples=True).steps] == [("int8", "static")]
    d = optimize.decide(("graph", "int8"), cuda, samples=False)
    assert [(s.mode, s.how) for s in d.steps] == [("graph", "basic")]
    assert any(line.startswith("optimize int8:") and "cuda" in line for line in d.skipped)
    assert any(line.startswith("optimize graph:") for line in d.skipped)
    assert "pack.tensorrt.int8" in optimize.decide(("int8",), trt, samples=False).skipped[0]
    d = optimize.decide(("fp16",), cpu, samples=False)
    assert not d.steps and d.skipped[0].startswith("optimize fp16:")
    assert [(s.mode, s.how) for s in optimize.decide(("fp16", "graph"), cuda, samples=False).steps] == [
        ("fp16", "float16"), ("graph", "basic")]
    assert optimize.decide((), cpu, samples=False) == optimize.Decision()


def test_the_flag_and_the_gpux_yml_key_read_steps_alike(tmp_path):
    assert optimize_steps("int8, graph") == ("graph", "int8") and optimize_steps("none") == ()
    assert optimize_steps(None) is None
    for bad, said in (("int9", "'int9' is not a step"), ("int8,fp16", "exclude each other")):
        with pytest.raises(UsageError, match=said):
            optimize_steps(bad)
    loaded = load(project(tmp_path, {"optimize": "int8,graph"}))
    assert loaded.project.config.pack.optimize.steps == ["graph", "int8"]
    cpu = providers.get("cpu")
    assert [s.mode for s in optimization(loaded.project, cpu, Options()).steps] == ["int8", "graph"]
    assert optimization(loaded.project, cpu, Options(optimize=())).steps == ()
    with pytest.raises(ConfigError, match=r"gpux.yml:\d+: pack.optimize.steps: .*exclude each other"):
        load(project(tmp_path, {"optimize": ["int8", "fp16"]}))


def test_int8_and_graph_make_a_smaller_model_checked_against_the_original(tmp_path):
    loaded = load(project(tmp_path, {"optimize": ["graph", "int8"]}))
    done = optimized(loaded, "cpu", Options(), quiet())
    assert done is not None
    assert [(s.mode, s.how) for s in done.steps] == [("int8", "dynamic"), ("graph", "extended")]
    assert done.model.size_bytes < 0.6 * loaded.model.size_bytes  # float32 weights as int8
    assert done.original_sha256 == loaded.model.sha256 != done.model.sha256
    [(output, error)] = done.errors
    assert output == "pooled" and 0 < error < optimize.DEFAULT_TOLERANCE["int8"]
    # the error recorded is what the two models answer on the generated inputs
    feeds = optimize.generated(loaded.model, loaded.signature, None)
    want = [ort.InferenceSession(str(loaded.model.path)).run(None, f)[0] for f in feeds]
    got = [ort.InferenceSession(str(done.model.path)).run(None, f)[0] for f in feeds]
    measured = max(np.linalg.norm((g - w).astype(np.float64)) / np.linalg.norm(w.astype(np.float64))  # relative L2
                   for g, w in zip(got, want))
    assert measured == pytest.approx(error, rel=1e-6)
    # the plan carries it: the image's model, its labels
    plan = plan_for(loaded, "cpu", "test", Options(), None, quiet(), pull=False, optimized=done)
    assert plan.model == done.model and plan.optimized is done
    assert plan.labels["io.gpux.optimize"] == "int8:dynamic,graph:extended"
    assert plan.labels["io.gpux.model.original.sha256"] == loaded.model.sha256
    assert plan.labels["io.gpux.optimize.errors"] == label_value(f'{{"pooled":{error!r}}}')


def test_the_image_skips_at_start_the_graph_passes_the_build_ran(tmp_path):
    """graph ran ONNX Runtime's basic and extended passes at build: gpux.json names them and the
    image's sessions are made without them (by the same onnxruntime only), with the same answers;
    the names are those ORT itself logs, and none of them runs once disabled."""
    import subprocess
    import sys

    loaded = load(project(tmp_path, {"optimize": ["graph", "int8"]}))
    done = optimized(loaded, "cpu", Options(), quiet())
    plan = plan_for(loaded, "cpu", "test", Options(), None, quiet(), pull=False, optimized=done)
    assert plan.gpux_json.model.transformers_done == optimize.done_at_build(done, plan.ort_version)
    assert optimize.done_at_build(done, done.onnxruntime) == optimize.OFFLINE_TRANSFORMERS
    assert optimize.done_at_build(done, "0.0.1") == ()  # another onnxruntime may pass or fuse otherwise
    int8_only = optimized(load(project(tmp_path, {"optimize": "int8"})), "cpu", Options(), quiet())
    assert optimize.done_at_build(int8_only, int8_only.onnxruntime) == ()  # its fusions are the session's to do
    assert optimize.done_at_build(None, done.onnxruntime) == ()

    feeds = optimize.generated(loaded.model, loaded.signature, None)[0]
    every = ort.InferenceSession(str(done.model.path), providers=["CPUExecutionProvider"])
    skipping = ort.InferenceSession(str(done.model.path), providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(optimize.OFFLINE_TRANSFORMERS))
    assert np.array_equal(every.run(None, feeds)[0], skipping.run(None, feeds)[0])
    code = ("import sys, onnxruntime as ort\no = ort.SessionOptions(); o.log_severity_level = 0\n"
            "ort.InferenceSession(sys.argv[1], o, providers=['CPUExecutionProvider'], "
            "disabled_optimizers=sys.argv[2:] or None)")
    ran = subprocess.run([sys.executable, "-c", code, str(done.model.path)], capture_output=True, text=True).stderr
    assert {n for n in optimize.OFFLINE_TRANSFORMERS if f"graph transformer {n} on step" not in ran} == set()
    assert "graph transformer NchwcTransformer on step" in ran
    skipped = subprocess.run([sys.executable, "-c", code, str(done.model.path), *optimize.OFFLINE_TRANSFORMERS],
                             capture_output=True, text=True).stderr
    assert [n for n in optimize.OFFLINE_TRANSFORMERS if f"graph transformer {n} on step" in skipped] == []
    assert "graph transformer NchwcTransformer on step" in skipped  # the layout level, for this CPU, still runs


def test_a_rebuild_of_the_same_model_optimises_nothing_again(tmp_path):
    loaded = load(project(tmp_path, {"optimize": "int8"}))
    said: list[str] = []
    first = optimize.optimize(loaded.project, loaded.model, loaded.signature,
                              optimize.decide(("int8",), providers.get("cpu"), False), None, said.append, said.append)
    assert any(line.startswith("optimizing the model") for line in said)
    said.clear()
    again = optimize.optimize(loaded.project, loaded.model, loaded.signature,
                              optimize.decide(("int8",), providers.get("cpu"), False), None, said.append, said.append)
    assert not said and again.model.sha256 == first.model.sha256 and again.errors == first.errors


def test_a_result_past_its_tolerance_stops_the_build_naming_the_output_and_the_error(tmp_path):
    loaded = load(project(tmp_path, {"optimize": {"steps": ["int8"], "tolerance": {"pooled": 1e-9}}}))
    with pytest.raises(ConfigError) as caught:
        optimized(loaded, "cpu", Options(), quiet())
    message = str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in message
    assert "pack.optimize: int8 moved output 'pooled' by " in message and "over its tolerance 1e-09" in message
    # the measured result stays cached: a looser tolerance takes it without optimising again
    loose = load(project(tmp_path, {"optimize": {"steps": ["int8"], "tolerance": 0.5}}))
    done = optimized(loose, "cpu", Options(), quiet())
    assert done is not None and dict(done.measured[0].tolerance) == {"pooled": 0.5}


def test_generated_inputs_keep_token_ids_inside_the_vocabulary(tmp_path):
    loaded = load(project(tmp_path))
    feeds = optimize.generated(loaded.model, loaded.signature, None)
    assert len(feeds) == optimize.GENERATED
    for feed in feeds:
        ids, mask = feed["input_ids"], feed["attention_mask"]
        assert ids.dtype == np.int64 and ids.shape == (1, optimize.DYNAMIC_SIZE)
        assert ids.min() >= 0 and ids.max() < 50  # the embedding table's rows
        assert (mask == 1).all()
    again = optimize.generated(loaded.model, loaded.signature, None)
    assert all((a["input_ids"] == b["input_ids"]).all() for a, b in zip(feeds, again))  # seeded


def test_samples_given_are_the_inputs_checked_and_a_wrong_one_is_named(tmp_path):
    folder = project(tmp_path, {"optimize": {"steps": ["int8"], "samples": "samples"}})
    (folder / "samples").mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        np.savez(folder / "samples" / f"{i}.npz", input_ids=rng.integers(0, 50, (1, 7)),
                 attention_mask=np.ones((1, 7), np.int64))
    done = optimized(load(folder), "cpu", Options(), quiet())
    assert done is not None and done.samples == "samples" and [s.how for s in done.steps] == ["static"]
    np.savez(folder / "samples" / "3.npz", input_ids=rng.integers(0, 50, (1, 7)))
    with pytest.raises(ConfigError, match=r"pack.optimize.samples: 3.npz: no array for input 'attention_mask'"):
        optimized(load(folder), "cpu", Options(), quiet())
    # an archive that unpacks past the bound is refused before any array is read
    (folder / "samples" / "3.npz").unlink()
    np.savez_compressed(folder / "samples" / "4.npz", input_ids=np.zeros((1, 40 << 20), np.int64),
                        attention_mask=np.ones((1, 7), np.int64))
    with pytest.raises(ConfigError, match=r"4.npz: the samples unpack to more than 256 MiB"):
        optimized(load(folder), "cpu", Options(), quiet())


def test_a_contained_build_reads_no_samples_outside_the_project(tmp_path):
    outside = tmp_path / "elsewhere.npz"
    np.savez(outside, input_ids=np.zeros((1, 3), np.int64), attention_mask=np.ones((1, 3), np.int64))
    folder = project(tmp_path, {"optimize": {"steps": ["int8"], "samples": "../elsewhere.npz"}})
    with pytest.raises(ConfigError, match=r"pack.optimize.samples: resolves to .*elsewhere.npz, outside the project"):
        load(folder, contained=True)


def test_fp16_that_cannot_be_checked_here_is_left_out_with_a_line_saying_why(tmp_path):
    loaded = load(project(tmp_path, {"optimize": "fp16"}))
    said: list[str] = []
    done = optimize.optimize(loaded.project, loaded.model, loaded.signature,
                             optimize.decide(("fp16",), providers.get("cuda"), False), None, lambda _: None,
                             said.append)
    if done is None:  # this onnxruntime's CPU provider lacks a float16 kernel the model needs
        assert len(said) == 1 and said[0].startswith("optimize fp16: cannot run the result here to check it (")
        assert said[0].endswith("); left out")
    else:  # it runs them: checked like any step, inputs and outputs kept in their types
        assert [s.mode for s in done.steps] == ["fp16"] and done.errors[0][1] < optimize.DEFAULT_TOLERANCE["fp16"]
        session = ort.InferenceSession(str(done.model.path))
        assert [i.type for i in session.get_inputs()] == ["tensor(int64)", "tensor(int64)"]
        assert session.get_outputs()[0].type == "tensor(float)"


def test_serve_stages_the_model_the_image_would_serve(tmp_path):
    from gpux_pack.pipeline import local

    folder = project(tmp_path, {"optimize": "int8"})
    staged = local.stage(folder, "cpu", tmp_path / "staged", quiet())
    spec = json.loads((tmp_path / "staged" / "gpux.json").read_text())
    assert Path(spec["model"]["path"]).parent.parent.name == "optimized"  # the cache's, not the project's
    assert spec["model"]["sha256"] == staged.spec.model.sha256 != load(folder).model.sha256
    assert folder / "model.onnx" in staged.watched  # a new model is optimised again
