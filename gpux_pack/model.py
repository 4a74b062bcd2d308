"""The ONNX model: read its signature with `onnx`, check it, and reconcile gpux.yml's
inputs/outputs with it. Everything here runs before Docker is touched."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpux_pack.config import Project, TensorSpec
from gpux_pack.errors import ModelError
from gpux_pack.runtime.dtypes import ONNX_TO_NAME

Dim = int | str  # >= 0 fixed; -1 dynamic without a name; str dynamic with a name


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # canonical dtype (float32, int64, ...) or "sequence"/"map"/"optional" for non-tensors
    shape: tuple[Dim, ...] | None  # None: rank unknown
    required: bool = True
    labels: tuple[str, ...] | None = None
    description: str | None = None
    max_length: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.dtype,
                               "shape": list(self.shape) if self.shape is not None else None}
        if not self.required:
            out["required"] = False
        for key in ("labels", "description", "max_length"):
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if key == "labels" else value
        return out


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    files: tuple[str, ...]  # model file name first, then external data files, relative to path.parent
    size_bytes: int
    sha256: str
    opset: int
    ir_version: int
    producer: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


def inspect_model(path: Path, display: str | None = None) -> ModelInfo:
    """Load the model's structure (not its weights) and check it; one clear ModelError if not."""
    import onnx  # heavy: imported only when a model is read
    from onnx import external_data_helper

    shown = display or str(path)
    if not path.is_file():
        raise ModelError(shown, "no such file")
    if path.stat().st_size == 0:
        raise ModelError(shown, "is empty (0 bytes)")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises several types for non-ONNX bytes
        raise ModelError(shown, f"is not an ONNX model ({_first_line(e)})") from None
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.graph.output:
        raise ModelError(shown, "is not an ONNX model (no graph with outputs; truncated or another format?)")

    external: list[str] = []
    for tensor in _all_tensors(proto.graph):
        if external_data_helper.uses_external_data(tensor):
            info = {e.key: e.value for e in tensor.external_data}
            location = info.get("location", "")
            target = (path.parent / location).resolve()
            if os.path.isabs(location) or path.parent.resolve() not in target.parents:
                raise ModelError(shown, f"external data '{location}' is outside the model's folder")
            if not target.is_file():
                raise ModelError(shown, f"external data file '{location}' is missing (tensor {tensor.name})")
            end = int(info.get("offset", 0)) + int(info.get("length", 0))
            if end > target.stat().st_size:
                raise ModelError(shown, f"external data file '{location}' is truncated (tensor {tensor.name})")
            if location not in external:
                external.append(location)

    try:
        onnx.checker.check_model(str(path))
    except Exception as e:
        raise ModelError(shown, f"fails the ONNX checker: {_first_line(e)}") from None

    initializers = {init.name for init in proto.graph.initializer}
    inputs = tuple(
        _tensor(v, shown, required=v.name not in initializers) for v in proto.graph.input
    )
    outputs = tuple(_tensor(v, shown) for v in proto.graph.output)
    for t in inputs:
        if t.dtype in ("sequence", "map", "optional"):
            raise ModelError(shown, f"input '{t.name}' is a {t.dtype}; only tensor inputs can be served")
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    files = (path.name, *sorted(external))
    digest, size = _digest(path.parent, files)
    return ModelInfo(
        path=path.resolve(),
        files=files,
        size_bytes=size,
        sha256=digest,
        opset=opset,
        ir_version=proto.ir_version,
        producer=" ".join(p for p in (proto.producer_name, proto.producer_version) if p),
        inputs=inputs,
        outputs=outputs,
    )


def _all_tensors(graph: Any):
    """Every TensorProto of a graph: initializers and tensor attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for sub in attr.graphs:
                yield from _all_tensors(sub)


def _tensor(value: Any, shown: str, required: bool = True) -> Tensor:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        names = {"sequence_type": "sequence", "map_type": "map", "optional_type": "optional"}
        return Tensor(value.name, names.get(kind or "", "unknown"), None, required)
    tt = value.type.tensor_type
    dtype = ONNX_TO_NAME.get(tt.elem_type)
    if dtype is None:
        import onnx

        raise ModelError(
            shown,
            f"'{value.name}' has element type {onnx.TensorProto.DataType.Name(tt.elem_type)},"
            " which JSON requests cannot carry",
        )
    shape: tuple[Dim, ...] | None = None
    if tt.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or -1) for d in tt.shape.dim
        )
    return Tensor(value.name, dtype, shape, required)


def _digest(folder: Path, files: tuple[str, ...]) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    for name in files:
        with open(folder / name, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    return h.hexdigest(), size


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


# ---------------------------------------------------------------------------------------------
# gpux.yml's inputs/outputs against the model


@dataclass(frozen=True)
class Signature:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


def reconcile(project: Project, model: ModelInfo) -> Signature:
    """Inputs/outputs to serve: the config's when given (checked against the model: names,
    types, ranks, fixed dims), else the model's own."""
    cfg = project.config
    inputs = _merge(project, "inputs", cfg.inputs, model.inputs, all_required=True)
    outputs = _merge(project, "outputs", cfg.outputs, model.outputs, all_required=False)
    return Signature(inputs, outputs)


def _merge(
    project: Project,
    section: str,
    declared: list[TensorSpec] | None,
    actual: tuple[Tensor, ...],
    all_required: bool,
) -> tuple[Tensor, ...]:
    if declared is None:
        return actual
    by_name = {t.name: t for t in actual}
    names = ", ".join(by_name)
    out: list[Tensor] = []
    for index, spec in enumerate(declared):
        where = _where(project, section, index, spec.name)
        model_t = by_name.get(spec.name)
        if model_t is None:
            kind = section[:-1]
            raise project.error(where, f"the model has no {kind} '{spec.name}' (it has: {names})")
        if spec.type is not None and model_t.dtype not in ("sequence", "map", "optional"):
            if spec.type != model_t.dtype:
                raise project.error(
                    (*where, "type"), f"{spec.type} does not match the model's {model_t.dtype}"
                )
        shape = model_t.shape
        if spec.shape is not None:
            shape = _merge_shape(project, (*where, "shape"), spec.shape, model_t.shape)
        required = model_t.required
        if section == "inputs" and not spec.required and model_t.required:
            raise project.error(
                (*where, "required"),
                f"'{spec.name}' has no default in the model (not an initializer), so it is required",
            )
        out.append(
            Tensor(
                spec.name,
                model_t.dtype,
                shape,
                required and spec.required,
                tuple(spec.labels) if spec.labels is not None else None,
                spec.description,
                spec.max_length,
            )
        )
    if all_required:
        listed = {t.name for t in out}
        missing = [t.name for t in actual if t.required and t.name not in listed]
        if missing:
            raise project.error(
                (section,), f"the model's input '{missing[0]}' is not listed (list every input, or none)"
            )
    return tuple(out)


def _where(project: Project, section: str, index: int, name: str) -> tuple[Any, ...]:
    return (section, name) if (section, name) in project.lines else (section, index)


def _merge_shape(
    project: Project, where: tuple[Any, ...], declared: list[Dim], actual: tuple[Dim, ...] | None
) -> tuple[Dim, ...]:
    if actual is None:
        return tuple(declared)
    if len(declared) != len(actual):
        raise project.error(
            where, f"rank {len(declared)} {list(declared)} does not match the model's rank {len(actual)} {list(actual)}"
        )
    merged: list[Dim] = []
    for i, (d, a) in enumerate(zip(declared, actual)):
        if isinstance(a, int) and a >= 0:
            if isinstance(d, int) and d >= 0 and d != a:
                raise project.error(
                    (*where, i), f"dimension {i} is {d} but the model fixes it at {a}"
                )
            merged.append(a)
        elif isinstance(d, int) and d >= 0:
            merged.append(d)  # the config narrows a dynamic dimension
        else:
            merged.append(a if isinstance(a, str) else d)
    return tuple(merged)
