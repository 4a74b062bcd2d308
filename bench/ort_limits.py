"""What each pinned ONNX Runtime release loads: its newest IR version, ai.onnx opset and
ai.onnx.ml opset (the `onnx_ir`, `onnx_opset` and `onnx_ml_opset` fields of gpux_pack/providers.py).

For every distinct release the provider table pins (and the CUDA 12 rows), the script installs
a wheel of that release into a throwaway folder under /tmp (`uv pip install --target`, for this
interpreter) and, in a separate process, loads small models with `InferenceSession` on the CPU
execution provider: one per IR version (an `Add`, opset 13), one per ai.onnx opset (IR 10), one
per ai.onnx.ml opset (a `Binarizer`, IR 10). A model loads or the release refuses it; the
newest that loads in each series is the limit.

Which wheel: onnxruntime and onnxruntime-openvino are measured as themselves (both import and
run on a CPU). onnxruntime-gpu, -rocm and -migraphx are measured with the CPU `onnxruntime`
wheel of the same release number (model loading is the same code; their own wheels need their
GPU libraries), or, where PyPI has no CPU wheel of that exact number (rocm 1.22.2.post3,
migraphx 1.27.1), the newest CPU patch release of the same minor below it (1.22.1, 1.27.0):
patch releases do not change which ONNX versions a release loads.

    python bench/ort_limits.py [--extra onnxruntime==1.32.0] [--json bench/results-ort-limits.json]

Needs `onnx` (the project's test dependencies) and network to PyPI for the wheels.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IR_VERSIONS = range(3, 16)
OPSETS = range(7, 31)
ML_OPSETS = range(1, 9)
MEASURED_AS_ITSELF = ("onnxruntime", "onnxruntime-openvino")

# Runs inside the release's folder: loads every model, prints {file: true|error}.
_LOADER = r"""
import json, re, sys
import onnxruntime as ort
ort.set_default_logger_severity(4)
out = {"version": ort.__version__}
for path in sys.argv[1:]:
    try:
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        out[path] = True
    except Exception as e:
        text = " ".join(str(e).split())
        known = re.search(r"(Unsupported model IR version.*|Current official support.*)$", text)
        out[path] = known.group(1) if known else text[-200:]
print(json.dumps(out))
"""


def _models(folder: Path) -> dict[tuple[str, int], Path]:
    import onnx
    from onnx import TensorProto, helper

    def add(ir: int, opset: int, ml: int | None = None) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
        nodes = [helper.make_node("Add", ["x", "x"], ["y"])]
        outputs, imports = [y], [helper.make_opsetid("", opset)]
        if ml is not None:
            b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])
            nodes.append(helper.make_node("Binarizer", ["x"], ["b"], domain="ai.onnx.ml", threshold=0.5))
            outputs.append(b)
            imports.append(helper.make_opsetid("ai.onnx.ml", ml))
        graph = helper.make_graph(nodes, "limits", [x], outputs)
        return helper.make_model(graph, opset_imports=imports, ir_version=ir)

    out = {}
    for kind, series in (("ir", IR_VERSIONS), ("opset", OPSETS), ("ml", ML_OPSETS)):
        for n in series:
            model = {"ir": lambda: add(n, 13), "opset": lambda: add(10, n), "ml": lambda: add(10, 13, n)}[kind]()
            path = folder / f"{kind}-{n}.onnx"
            path.write_bytes(model.SerializeToString())
            out[(kind, n)] = path
    return out


def releases() -> list[tuple[str, str, str]]:
    """(row names, dist==version the table pins, wheel measured) for each distinct pin."""
    from gpux_pack import providers

    pins: dict[str, list[str]] = {}
    for name in providers.PROVIDERS:
        for cuda in ("13", "12"):
            row = providers.get(name, cuda)
            label = name if cuda == "13" or name not in providers.CUDA12 else f"{name} (CUDA 12)"
            pins.setdefault(f"{row.ort}=={row.version}", [])
            if label not in pins[f"{row.ort}=={row.version}"]:
                pins[f"{row.ort}=={row.version}"].append(label)
    return [(", ".join(rows), pin, _measured_wheel(pin)) for pin, rows in pins.items()]


def _measured_wheel(pin: str) -> str:
    dist, version = pin.split("==")
    if dist in MEASURED_AS_ITSELF:
        return pin
    return f"onnxruntime=={_cpu_release(version)}"


def _cpu_release(version: str) -> str:
    """The CPU onnxruntime release of this number, else the newest patch of its minor below it."""
    from packaging.version import Version

    want = Version(version)
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "onnxruntime",
                           "--disable-pip-version-check"], capture_output=True, text=True, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("Available versions:"))
    known = [Version(v.strip()) for v in line.split(":", 1)[1].split(",")]
    same = [v for v in known if v.release[:2] == want.release[:2] and v <= want]
    if not same:
        raise SystemExit(f"no CPU onnxruntime release of {want.major}.{want.minor} on the index")
    return str(max(same))


def _uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except ImportError:
        return shutil.which("uv") or sys.exit("needs uv (pip install uv)")


def measure(wheel: str, models: dict[tuple[str, int], Path], work: Path) -> dict:
    target = work / wheel.replace("==", "-")
    if not (target / ".done").is_file():
        shutil.rmtree(target, ignore_errors=True)
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        subprocess.run([_uv(), "pip", "install", "--quiet", "--target", str(target), "--python-version", py,
                        "--only-binary", ":all:", wheel], check=True)
        (target / ".done").write_text("")
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run([sys.executable, "-c", _LOADER, *map(str, models.values())],
                          capture_output=True, text=True, env=env, cwd=work)
    if proc.returncode != 0:
        raise SystemExit(f"{wheel}: the loader failed: {proc.stderr.strip()[-800:]}")
    loaded = json.loads(proc.stdout)
    out: dict = {"onnxruntime": loaded["version"]}
    for kind, key in (("ir", "onnx_ir"), ("opset", "onnx_opset"), ("ml", "onnx_ml_opset")):
        ok = [n for (k, n), path in models.items() if k == kind and loaded[str(path)] is True]
        out[key] = max(ok) if ok else None
        refused = [(n, loaded[str(path)]) for (k, n), path in models.items() if k == kind and loaded[str(path)] is not True
                   and n > (out[key] or 0)]
        out[f"{key}_refusal"] = refused[0][1] if refused else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extra", action="append", default=[], help="another wheel to measure, e.g. onnxruntime==1.32.0")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "gpux-ort-limits"),
                    help="where the throwaway installs go (default: /tmp/gpux-ort-limits)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    models = _models(Path(tempfile.mkdtemp(prefix="models-", dir=work)))
    rows = releases() + [("(extra)", w, w) for w in args.extra]
    results = []
    print(f"{'rows':<34} {'pinned':<36} {'measured with':<28} IR  opset  ml")
    for label, pin, wheel in rows:
        r = measure(wheel, models, work)
        results.append({"rows": label, "pinned": pin, "measured_with": wheel, **r})
        print(f"{label:<34} {pin:<36} {wheel:<28} {r['onnx_ir']!s:<3} {r['onnx_opset']!s:<6} {r['onnx_ml_opset']}",
              flush=True)
    for r in results:
        print(f"{r['measured_with']}: first refused IR: {r['onnx_ir_refusal']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
