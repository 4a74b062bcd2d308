"""bench/gpu_check.py without a GPU: its CPU dry run end to end on examples/mlp (the code path
a GPU run takes), and its refusals, so it never reports CPU numbers as GPU ones."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from gpux_pack import providers
from gpux_pack.runtime import contract as devices
from gpux_pack.runtime.tensors import ServedTensor

ROOT = Path(__file__).resolve().parents[2]
CUDA = "CUDAExecutionProvider"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = _module()


@pytest.fixture
def results(tmp_path, monkeypatch) -> Path:
    """Where a GPU run would write its results: never written by these tests."""
    path = tmp_path / "results-gpu.json"
    monkeypatch.setattr(gpu_check, "RESULTS", path)
    return path


def test_dry_run_reports_every_field(results, capsys):
    rc = gpu_check.main(["--allow-cpu", "--examples", "mlp,strings", "--runs", "20", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    report = json.loads(out)
    assert report["mode"] == "dry-run-cpu" and report["ok"] is True
    assert report["onnxruntime"] == ort.__version__ and report["pin"] == providers.get("cuda").version
    mlp, strings = report["examples"]
    assert strings["example"] == "strings" and "string tensors" in strings["skipped"]
    assert mlp["example"] == "mlp" and mlp["skipped"] is None and mlp["ok"] is True
    assert mlp["active"][0] == "CPUExecutionProvider" == mlp["provider"]
    part = mlp["partition"]
    assert part["all"] is True and part["total"] == part["on_provider"] > 0
    assert part["nodes"] == {"CPUExecutionProvider": part["total"]}
    assert mlp["warmup"]["state"] == "done" and mlp["warmup"]["partition"] == part["nodes"]
    assert mlp["accuracy"] is None and mlp["accuracy_max_abs"] is None  # the reference is CPU too
    lat = mlp["latency_ms"]
    assert lat["runs"] == 20 and lat["provider"]["p50"] > 0 and lat["cpu"]["p50"] > 0 and lat["cpu_over_provider"] > 0
    assert lat["shapes"] == {"features": [1, 4]}
    assert mlp["device"].startswith("cpu: ") and mlp["device_ok"] is None and report["device"] == mlp["device"]
    # the gpux.json is the cuda image's: the table's CUDA options asked, not checked on CPU
    table = providers.get("cuda").options[CUDA]
    opts = mlp["options"]
    assert opts["checked"] is False and opts["differ"] == []
    assert {k: v["asked"] for k, v in opts["options"].items()} == table
    assert {k: v["table"] for k, v in opts["options"].items()} == table
    assert not results.exists()  # a dry run writes no results
    text = gpu_check.markdown(report)
    assert "DRY RUN on CPUExecutionProvider" in text and "| mlp | CPU |" in text and "skipped: string tensors" in text


def _refusal(capsys, results) -> str:
    rc = gpu_check.main(["--examples", "mlp", "--runs", "5"])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == "" and not results.exists()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: ")
    return lines[0]


def test_refuses_without_onnxruntime_gpu(results, capsys, monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    line = _refusal(capsys, results)
    assert "onnxruntime-gpu is missing" in line and "pip install onnxruntime-gpu==1.31.1" in line


def test_refuses_without_a_cuda_device(results, capsys, monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, "CPUExecutionProvider"])
    monkeypatch.setattr(devices, "nvidia_device", lambda index=0: "gpu: none (libcuda.so.1 not found)")
    assert _refusal(capsys, results) == "gpu_check: no CUDA device: gpu: none (libcuda.so.1 not found)"


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_refuses_when_the_cuda_provider_is_not_active(results, capsys, monkeypatch):
    """onnxruntime lists CUDA and a GPU answers, but the session runs on CPU: refused, not
    reported (GPUX_REQUIRE_PROVIDER=1 in the runtime). Sessions are made without CUDA, so this
    holds on a machine with a real GPU too."""
    real, session = ort.get_available_providers(), ort.InferenceSession

    def without_cuda(path, opts=None, providers=None, provider_options=None, **kw):
        kept = [i for i, name in enumerate(providers or []) if name != CUDA]
        return session(path, opts, providers=[providers[i] for i in kept] or None,
                       provider_options=[provider_options[i] for i in kept] if provider_options else None, **kw)

    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, *[p for p in real if p != CUDA]])
    monkeypatch.setattr(ort, "InferenceSession", without_cuda)
    monkeypatch.setattr(devices, "nvidia_device", lambda index=0: "gpu: NVIDIA Test sm90 (driver 13000)")
    line = _refusal(capsys, results)
    assert line.startswith(f"gpu_check: mlp: GPUX_REQUIRE_PROVIDER=1: {CUDA} is not active")


def test_checks_flag_what_differs():
    table = providers.get("cuda").options[CUDA]
    effective = {**table, "cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "18446744073709551615"}
    report = gpu_check.options_report(dict(table), table, effective)
    assert report["checked"] is True and report["differ"] == ["cudnn_conv_algo_search"]
    assert report["options"]["cudnn_conv_algo_search"] == {"table": "EXHAUSTIVE", "asked": "EXHAUSTIVE",
                                                          "effective": "HEURISTIC"}
    assert gpu_check.options_report(dict(table), table, dict(table))["differ"] == []
    assert gpu_check.partition_summary({CUDA: 3, "CPUExecutionProvider": 1}, CUDA) == {
        "nodes": {CUDA: 3, "CPUExecutionProvider": 1}, "total": 4, "on_provider": 3, "all": False}
    assert gpu_check.partition_summary({}, CUDA)["all"] is False
    assert gpu_check.worst({"a": {"max_abs": 1e-7, "max_rel": 1.0}, "b": {"max_abs": 2e-6, "max_rel": 0.0}}) == 2e-6
    assert gpu_check.GPU_DEVICE.match("gpu: NVIDIA H100 80GB HBM3 sm90 (driver 13000)")
    assert not gpu_check.GPU_DEVICE.match("gpu: none (no CUDA device)")
    assert not gpu_check.GPU_DEVICE.match("cpu: AMD EPYC [avx2]")
    feeds = {"features": np.zeros((1, 4), np.float32)}
    spec = [ServedTensor("features", "float32", ("batch", 4))]
    assert gpu_check.batched(feeds, spec, 8)["features"].shape == (8, 4)
    assert gpu_check.batched(feeds, [ServedTensor("features", "float32", (1, 4))], 8)["features"].shape == (1, 4)
