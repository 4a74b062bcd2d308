"""TensorRT's warmup inputs, exactly: provider options, optimization profiles (given or
derived), and the cache key, from gpux.yml files with dynamic inputs, through the code path a
build takes (plan_for, the lock, the plan's gpux.json). TensorRT itself cannot run here (no
GPU; its libraries are not on PyPI): these pin what the image hands it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpux_pack.pipeline.build import load, plan_for
from gpux_pack.plan import Options, tensorrt_profiles
from tests.locks import with_lock
from gpux_pack.runtime import caches, contract
from gpux_pack.ui import Reporter
from gpux_pack.wheels import Lock, Pin

ROOT = Path(__file__).resolve().parents[2]
H200 = "gpu: NVIDIA H200 sm90 (driver 13000)"


def trt_spec(tmp_path: Path, example: str = "mlp", pack: str = "") -> dict:
    project = tmp_path / example
    shutil.copytree(ROOT / "examples" / example, project)
    if pack:
        with open(project / "gpux.yml", "a") as f:
            f.write("\npack:\n" + pack)
    loaded = load(project)
    plan = plan_for(loaded, "tensorrt", "test", Options(), None, Reporter(quiet=True), pull=False)
    plan = with_lock(plan, Lock(plan.target, plan.requirements, (Pin("onnxruntime-gpu", "1.31.1", frozenset({"0" * 64})),)))
    assert plan.gpux_json.onnxruntime == "1.31.1"
    return contract.parse(json.loads(json.dumps(plan.gpux_json.to_json())))  # as the image reads it


def test_a_dynamic_batch_gets_a_derived_profile_and_exact_options(tmp_path):
    spec = trt_spec(tmp_path)
    name, opts = spec.execution_providers[0]
    assert name == "TensorrtExecutionProvider"
    assert opts == {
        "device_id": "0",
        "trt_engine_cache_enable": "true", "trt_engine_cache_path": "${GPUX_CACHE_DIR}/tensorrt",
        "trt_timing_cache_enable": "true", "trt_timing_cache_path": "${GPUX_CACHE_DIR}/tensorrt",
        "trt_fp16_enable": "false", "trt_int8_enable": "false",
        "trt_profile_min_shapes": "features:1x4", "trt_profile_opt_shapes": "features:1x4",
        "trt_profile_max_shapes": "features:32x4",
    }  # exactly these: no option more, none less
    assert contract.dump(spec.warmup_profiles) == {"features": {"min": [1, 4], "opt": [1, 4], "max": [32, 4]}}
    assert caches.warmup_shapes(spec) == [{"features": [1, 4]}, {"features": [1, 4]}, {"features": [1, 4]}, {"features": [32, 4]}]


def test_given_profiles_precision_and_ep_context(tmp_path):
    spec = trt_spec(tmp_path, pack="  tensorrt:\n    fp16: true\n    ep_context: true\n    profiles:\n"
                                   "      features: {min: [1, 4], opt: [8, 4], max: [64, 4]}\n")
    opts = dict(spec.execution_providers)["TensorrtExecutionProvider"]
    assert (opts["trt_profile_min_shapes"], opts["trt_profile_opt_shapes"], opts["trt_profile_max_shapes"]) == \
        ("features:1x4", "features:8x4", "features:64x4")
    assert opts["trt_fp16_enable"] == "true"
    assert opts["trt_dump_ep_context_model"] == "true" and opts["trt_ep_context_embed_mode"] == "1"
    assert opts["trt_ep_context_file_path"] == "${GPUX_CACHE_DIR}/model_ctx.onnx"
    folder = tmp_path / "key"
    expanded = caches.expand(opts, folder)
    assert expanded["trt_engine_cache_path"] == str(folder / "tensorrt") and (folder / "tensorrt").is_dir()
    assert expanded["trt_ep_context_file_path"] == str(folder / "model_ctx.onnx")
    assert not (folder / "model_ctx.onnx").exists()  # a file path, not made as a folder


def test_the_key_names_what_an_engine_depends_on(tmp_path):
    spec = trt_spec(tmp_path)
    opts = dict(spec.execution_providers)["TensorrtExecutionProvider"]
    libs = {"onnxruntime-gpu": "1.31.1", "tensorrt-cu13-libs": "10.14.1"}
    parts = caches.key_parts(spec.model.sha256, "TensorrtExecutionProvider", opts, caches.warmup_shapes(spec), "1.31.1", device=H200,
                           libraries=libs)
    assert parts["device"] == H200 and parts["libraries"] == libs
    assert parts["model_sha256"] == spec.model.sha256 and parts["onnxruntime"] == "1.31.1"
    assert parts["options"]["trt_profile_max_shapes"] == "features:32x4"
    assert "trt_engine_cache_path" not in parts["options"]  # where the cache lives is not what it holds
    assert parts["shapes"][-1] == {"features": [32, 4]}
    key = caches.digest(parts)
    assert caches.short(parts) == f"sm90-{key[:6]}"
    for change in (dict(device="gpu: NVIDIA A100-SXM4-80GB sm80 (driver 13000)"),
                   dict(libraries={**libs, "tensorrt-cu13-libs": "10.15.0"}),
                   dict(options={**parts["options"], "trt_fp16_enable": "true"})):
        assert caches.digest({**parts, **change}) != key, change


@pytest.mark.parametrize("shape, derived", [
    ("[batch, 4]", {"x": {"min": [1, 4], "opt": [1, 4], "max": [32, 4]}}),
    ("[batch, seq]", {}),  # a dynamic sequence length has no rule: TensorRT builds per shape
    ("[2, 4]", {}),
])
def test_the_derivation_rule(tmp_path, shape, derived):
    from gpux_pack.project.config import TensorSpec
    from gpux_pack.project.load import load_project

    (tmp_path / "gpux.yml").write_text("name: m\nmodel: {source: m.onnx}\n")
    cfg = load_project(tmp_path).config
    dims = tuple(d.strip() for d in shape.strip("[]").split(","))
    spec = TensorSpec(name="x", shape=tuple(int(d) if d.isdigit() else d for d in dims))
    assert tensorrt_profiles(cfg, [spec]) == derived
