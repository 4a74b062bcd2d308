"""`gpux-pack init MODEL.onnx`: a gpux.yml whose inputs and outputs are the graph's own.

The model is read and checked as a build reads it; the YAML is written by the YAML library
(names quoted as they need), never by pasting text, and an existing gpux.yml is kept unless
--force. What it writes builds as is; its comments say what to edit.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from gpux_pack.errors import UsageError
from gpux_pack.project.config import CONFIG_NAMES
from gpux_pack.project.model import inspect_model

HEADER = """\
# Written by `gpux-pack init` from {model}: the inputs and outputs are the graph's own.
# Edit names, description and serving; then: gpux-pack build {folder}
# Dimensions: a number is fixed, -1 is dynamic (the graph's own names, such as batch, still apply;
# GPUX itself reads only numbers, so this file is one GPUX reads too).
"""


class _Dumper(yaml.SafeDumper):
    """Block mappings, flow lists: `shape: [batch, 4]` on one line, as people write it."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def image_name(model: Path) -> str:
    """The model file's stem (its folder's name for a stem as generic as "model") as a gpux.yml
    name: letters, digits, '.', '_' and '-'."""
    stem = model.resolve().parent.name if model.stem.lower() in ("model", "model_quantized", "") else model.stem
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:128]
    return name if name and name[0].isalnum() else f"model-{name}".strip("-")[:128] or "model"


def document(model: Path, where: Path) -> dict[str, Any]:
    """The gpux.yml content for `model`, written into the folder `where`."""
    info = inspect_model(model)
    source = os.path.relpath(model.resolve(), where.resolve())
    if not source.startswith("."):
        source = f"./{source}"

    def tensor(t: Any) -> dict[str, Any]:
        if t.type in ("sequence", "map", "optional", "unknown"):  # no gpux.yml type: listed, the model's own
            return {}
        out: dict[str, Any] = {"type": t.type}
        if t.shape is not None:
            out["shape"] = [d if isinstance(d, int) and d >= 0 else -1 for d in t.shape]
        return out

    return {
        "name": image_name(model),
        "version": "1.0.0",
        "description": f"{model.name}" + (f", made by {info.producer}" if info.producer else ""),
        "model": {"source": source, "format": "onnx"},
        "inputs": {t.name: tensor(t) for t in info.inputs if t.required},
        "outputs": {t.name: tensor(t) for t in info.outputs},
        "runtime": {"gpu": {"backend": "auto"}},
        "serving": {"port": 8080},
    }


def init(model: Path, output: Path | None, force: bool) -> Path:
    """Write the gpux.yml (beside the model unless --output names a folder or a file)."""
    if model.suffix.lower() != ".onnx":
        raise UsageError(f"{model}: expected an .onnx model file")
    target = output or model.parent / CONFIG_NAMES[0]
    if target.is_dir() or target.suffix.lower() not in (".yml", ".yaml"):  # a folder, made if missing
        target = target / CONFIG_NAMES[0]
    if target.name not in CONFIG_NAMES:
        raise UsageError(f"--output {target}: a project's config is named {' or '.join(CONFIG_NAMES)}")
    if target.exists() and not force:
        raise UsageError(f"{target} exists; --force replaces it")
    doc = document(model, target.parent)
    shown = model.name if model.name.isprintable() else ascii(model.name)  # a comment line never breaks
    text = HEADER.format(model=shown, folder=_shown(target.parent))
    text += yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def _shown(folder: Path) -> str:
    try:
        shown = str(folder.resolve().relative_to(Path.cwd()))
    except ValueError:
        shown = str(folder)
    if shown == ".":
        return "."
    return shown if re.fullmatch(r"[A-Za-z0-9._/-]+", shown) else "FOLDER  (the folder holding this file)"
