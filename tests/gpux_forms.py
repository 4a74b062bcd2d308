"""GPUX's published gpux.yml forms (tests/data/gpux_forms, from GPUX's repository and docs) as
projects: the file as GPUX shows it, and an ONNX model made to match what it declares (inputs
the graph takes, outputs of the declared shapes filled with a constant)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

FORMS = Path(__file__).resolve().parent / "data" / "gpux_forms"
MANIFEST: list[dict[str, Any]] = json.loads((FORMS / "manifest.json").read_text())
# Forms refused, with the field each error names: the docs' schema sketches (`name: string`,
# `inputs: [InputSpec]`) and the v0.1.1 brainstorming notes' `runtime.gpu: auto` (GPUX refuses both)
REFUSED = {"53-historical-gpuxfile-gpu-scalar.yml": "runtime.gpu", "55-architecture-sketch.yml": "inputs[0]"}
BUILDABLE = [e for e in MANIFEST if e["model_file"] and e["file"] not in REFUSED]  # 54: a sketch, no file
_TYPES = {"float32": 1, "uint8": 2, "int32": 6, "int64": 7, "string": 8, "bool": 9, "float64": 11}


def model_for(entry: dict[str, Any], path: Path) -> None:
    """Every declared input as a graph input (symbolic sizes stay symbolic), every output a
    ConstantOfShape of its declared shape (symbolic sizes 1); an output that is also an input
    passes it through (GPUX's llm-chat example: past_key_values)."""
    import onnx
    from onnx import TensorProto, helper

    def dims(shape):
        return [d if isinstance(d, int) else str(d) for d in shape]

    inputs = [helper.make_tensor_value_info(i["name"], _TYPES[i["type"]], dims(i["shape"])) for i in entry["inputs"]]
    in_names = {i["name"] for i in entry["inputs"]}
    nodes, outputs = [], []
    for n, o in enumerate(entry["outputs"]):
        if o["name"] in in_names:  # the form declares it both ways: the graph hands the input back
            outputs.append(helper.make_tensor_value_info(o["name"], _TYPES[o["type"]], dims(o["shape"])))
            continue
        shape = [d if isinstance(d, int) else 1 for d in o["shape"]]
        const = helper.make_tensor(f"shape{n}", TensorProto.INT64, [len(shape)], shape)
        value = helper.make_tensor(f"value{n}", _TYPES[o["type"]], [1], [0.25] if o["type"].startswith("float") else [1])
        nodes += [helper.make_node("Constant", [], [f"s{n}"], value=const),
                  helper.make_node("ConstantOfShape", [f"s{n}"], [o["name"]], value=value)]
        outputs.append(helper.make_tensor_value_info(o["name"], _TYPES[o["type"]], dims(o["shape"])))
    graph = helper.make_graph(nodes, "form", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


def project(entry: dict[str, Any], folder: Path) -> Path:
    """The form's folder: its gpux.yml (verbatim) and its model."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FORMS / entry["file"], folder / "gpux.yml")
    model_for(entry, folder / entry["model_file"])
    if "input_ids" in {i["name"] for i in entry["inputs"]} and "tokenizer:" in (folder / "gpux.yml").read_text():
        from tests.text_project import tokenizer  # the Hub is out of reach: the tokenizer.json beside the model

        tokenizer().save(str((folder / entry["model_file"]).parent / "tokenizer.json"))
    return folder
