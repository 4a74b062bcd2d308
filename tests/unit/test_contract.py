"""gpux.json, the packager's and the runtime's contract: typed, versioned, checked once at start."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import jsonschema
import pytest

from gpux_pack.pipeline.build import load, plan_for
from gpux_pack.plan import Options
from gpux_pack.runtime import contract
from gpux_pack.runtime.settings import ConfigurationError, Settings
from gpux_pack.ui import Reporter
from tests import audio_project, image_project

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("mlp", "text-classifier", "strings", "image", "audio")


def _written(example: str, provider: str = "cpu", tmp: Path | None = None) -> dict:
    """gpux.json as a build writes it: an example's, or a generated image or audio project's."""
    folder = ROOT / "examples" / example
    if example in ("image", "audio"):
        assert tmp is not None
        folder = (image_project if example == "image" else audio_project).make(tmp / example)
    loaded = load(folder)
    plan = plan_for(loaded, provider, "test", Options(), None, Reporter(quiet=True), pull=False)
    return json.loads(json.dumps(plan.gpux_json.to_json(), allow_nan=False))


def test_the_committed_schema_is_current():
    committed = json.loads((ROOT / "gpux-json.schema.json").read_text())
    assert committed == contract.schema(), "regenerate: gpux-pack schema --of gpux.json > gpux-json.schema.json"


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize("provider", ["cpu", "cuda", "tensorrt", "openvino"])
def test_what_the_plan_writes_the_schema_takes_and_the_runtime_reads_back(example, provider, tmp_path):
    written = _written(example, provider, tmp_path)
    steps = {"text-classifier": "text", "image": "image", "audio": "audio"}
    assert (written["preprocessing"] or {}).get(steps.get(example, "none")) or example not in steps
    jsonschema.Draft202012Validator(contract.schema()).validate(written)
    assert contract.dump(contract.parse(written)) == written  # nothing lost or added on the way


@pytest.mark.parametrize(("change", "words"), [
    (lambda d: d.pop("format"), "format None is not this runtime's (2)"),
    (lambda d: d.update(format=1), "format 1 is not this runtime's (2)"),
    (lambda d: d["model"].pop("sha256"), "model.sha256: missing"),
    (lambda d: d["inputs"][0].update(shape=[1, True]), "inputs[0].shape: expected"),
    (lambda d: d["serving"].update(port="8080"), "serving.port: expected a whole number, got '8080'"),
    (lambda d: d.update(warmup="sometimes"), "warmup: expected 'none' or 'at-start' or 'baked'"),
    (lambda d: d["outputs"][0].update(colour="red"), "outputs[0].colour: not a field this runtime reads"),
    (lambda d: d.update(execution_providers=[["CPUExecutionProvider"]]), "execution_providers[0]: expected a list of 2"),
])
def test_a_gpux_json_this_runtime_cannot_read_is_one_line_naming_the_field(tmp_path, change, words):
    written = _written("mlp")
    change(written)
    path = tmp_path / "gpux.json"
    path.write_text(json.dumps(written))
    with pytest.raises(ConfigurationError) as caught:
        Settings.load({"GPUX_CONFIG": str(path)})
    message = str(caught.value)
    assert message.startswith(f"GPUX_CONFIG={path}: not this runtime's gpux.json: ") and words in message, message
    assert "\n" not in message


def test_no_module_reads_gpux_json_by_string_key():
    """The runtime reads attributes of the parsed GpuxJson: no `spec["..."]` or `spec.get("...")`
    anywhere (the parser is the one place that sees the keys)."""
    offenders = []
    for path in sorted((ROOT / "gpux_pack").rglob("*.py")):
        if path.name == "contract.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            target = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                target = node.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                target = node.func.value
            if target is not None and re.search(r"(^|\.)(spec|gpux_json)$", ast.unparse(target)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, "\n".join(offenders)
