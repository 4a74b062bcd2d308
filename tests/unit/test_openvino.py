"""OpenVINO through Intel's plugin execution provider, in process: the library registered and a
device asked for by kind; on a CPU the plugin offers nothing for (any non-Intel one), one line
and the CPU provider; compiled once with ONNX Runtime's compile API into an EP context model
that later starts load. On a non-Intel host the Intel path runs under qemu-x86_64 with an Intel
CPU model (tests only); on an Intel host natively, and the refusal under an AMD model."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from gpux_pack import providers
from gpux_pack.runtime import caches, contract
from gpux_pack.runtime.session import Model, StartupError
from tests.conftest import INTEL_CPU_MODEL, QEMU, ROOT, intel_cpu
from tests.in_process import settings, spec_dir

SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from gpux_pack.runtime import warmup
from gpux_pack.runtime.session import Model
from tests.in_process import settings
from pathlib import Path
out = []
for _ in range(int(sys.argv[2])):
    m = Model.load(settings(Path(sys.argv[1])))
    state = warmup.run(m, strict=True)
    out.append({"active": m.active, "cache": m.cache.source, "file": m.path.name, "partition": state["partition"],
                "accuracy": state["accuracy"], "load": m.load_seconds, "refusal": ""})
print(json.dumps(out))
"""


def _emulated(cpu: str, folder, starts: int) -> subprocess.CompletedProcess:
    if not QEMU.is_file():
        pytest.fail(f"{QEMU} is missing (run `bash scripts/dev test`)")
    return subprocess.run([str(QEMU), "-cpu", cpu, sys.executable, "-c", SCRIPT, str(folder), str(starts)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


def _intel(folder, starts: int) -> list[dict]:
    """Starts of the runtime on an Intel CPU: this one, or qemu's Intel model."""
    if intel_cpu():
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), str(starts)], capture_output=True,
                              text=True, cwd=ROOT, timeout=600)
    else:
        proc = _emulated(INTEL_CPU_MODEL, folder, starts)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_compiled_once_then_the_context_model_loads(tmp_path):
    folder = spec_dir(tmp_path, "mlp", "openvino")
    first, second = _intel(folder, 2)
    for start in (first, second):
        assert start["active"][0] == "OpenVINOExecutionProvider", start
        assert start["file"] == contract.CONTEXT_MODEL and start["partition"] == {"OpenVINOExecutionProvider": 4}
        assert all(e["max_abs"] < 1e-5 for e in start["accuracy"].values()), start["accuracy"]
    assert (first["cache"], second["cache"]) == ("compiled", "volume")
    [key] = [p for p in (folder / "cache").iterdir() if not p.name.startswith(".")]
    record = caches.check(key, caches.read_record(key)["parts"])
    assert {f["path"] for f in record["files"]} == {"model_ctx.onnx", "model_ctx_OpenVINOExecutionProvider.bin"}
    assert json.loads(record["parts"]["options"]["load_config"]) == {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}
    assert "onnxruntime-ep-openvino" in record["parts"]["libraries"]


def test_no_device_is_one_line_then_the_cpu_provider(tmp_path, caplog):
    """Natively on a non-Intel host; on an Intel one, under qemu's AMD model."""
    folder = spec_dir(tmp_path, "mlp", "openvino")
    if intel_cpu():
        proc = _emulated("EPYC", folder, 1)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1])[0]["active"] == ["CPUExecutionProvider"]
        assert "the OpenVINOExecutionProvider plugin offers no CPU device here" in proc.stderr
        return
    vendor, model = contract.cpu_vendor()
    line = f"the OpenVINOExecutionProvider plugin offers no CPU device here: this CPU is {vendor}, {model}; the " \
           "plugin offers devices on Intel's (vendor id 0x8086) only"
    with caplog.at_level(logging.WARNING, logger="gpux"):
        m = Model.load(settings(folder))
    assert m.active == ["CPUExecutionProvider"] and m.cache.source == "none"
    assert [r.getMessage() for r in caplog.records if line in r.getMessage()], caplog.text
    with pytest.raises(StartupError, match="GPUX_REQUIRE_PROVIDER=1: OpenVINOExecutionProvider is not active \\(" +
                       line.replace("(", "\\(").replace(")", "\\)")):
        Model.load(settings(folder, GPUX_REQUIRE_PROVIDER="1"))
    # before a build, plan and providers say the same words
    host = providers.HostInfo(cpu=(vendor, model))
    assert host.can_run(providers.get("openvino")) == (False, line)


def test_the_line_before_a_build_depends_on_the_cpu_vendor():
    row = providers.get("openvino")
    amd = providers.HostInfo(cpu=("AuthenticAMD", "AMD EPYC 7763 64-Core Processor"))
    assert amd.plugin_refusal(row) == ("the OpenVINOExecutionProvider plugin offers no CPU device here: this CPU is "
                                       "AuthenticAMD, AMD EPYC 7763 64-Core Processor; the plugin offers devices on "
                                       "Intel's (vendor id 0x8086) only")
    assert providers.HostInfo(cpu=("GenuineIntel", "Xeon")).plugin_refusal(row) == ""
    assert providers.HostInfo().plugin_refusal(row) == ""  # unknown (a remote engine): nothing claimed
    assert amd.plugin_refusal(providers.get("cpu")) == "" and amd.plugin_refusal(row, "GPU") == ""
    assert providers.HostInfo(cpu=("GenuineIntel", "Xeon")).can_run(row) == (True, "needs no accelerator")
