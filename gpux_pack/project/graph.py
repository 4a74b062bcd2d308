"""The model's graph, checked: what ONNX's checker, shape inference and the model's own fields
say of it, as plain data (the check cache's form: model.py keeps it and makes a ModelInfo of
it). onnx, imported only when a graph is checked, is its one heavy import, and gpux-pack's
config models are none of its imports: prechecks.py's second process runs it alone."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from gpux_pack.errors import ModelError
from gpux_pack.project.skeleton import Skeleton, Weight, tensor_at
from gpux_pack.runtime.contract import ONNX_TO_NAME

# Domains whose operators every onnxruntime build implements (model-local functions add theirs).
ORT_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc"})
_DECIMAL = re.compile(r"[0-9]{1,19}", re.ASCII)


def inspect_graph(path: Path, shown: str, skeleton: Skeleton, checker: bool = True) -> dict[str, Any]:
    """The model's structure, checked (ModelError if not): opsets, inputs and outputs, custom
    operators, the working memory, the files (the model's, then its external data). The skeleton
    is the model read without its large weights; checker=False: see model.inspect_model."""
    import onnx  # heavy (70 ms with NumPy): imported only when a model is checked
    from onnx import external_data_helper

    try:
        proto = onnx.ModelProto.FromString(skeleton.model)
    except Exception as e:  # protobuf: several types for non-ONNX bytes
        raise ModelError(shown, f"is not an ONNX model ({first_line(e)})") from None
    weights = skeleton.weights
    del skeleton  # parsed: its bytes need not stay while the checker reads the file
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.graph.output:
        raise ModelError(shown, "is not an ONNX model (no graph with outputs; truncated or another format?)")

    external = list(dict.fromkeys(_external_file(path, shown, t) for t in _all_tensors(proto.graph)
                                  if external_data_helper.uses_external_data(t)))

    initializers = {init.name for init in proto.graph.initializer}
    initializers |= {s.values.name for s in proto.graph.sparse_initializer}
    inputs = [_tensor(v, shown, required=v.name not in initializers) for v in proto.graph.input]
    outputs = [_tensor(v, shown) for v in proto.graph.output]
    for t in inputs:
        if t["type"] in ("sequence", "map", "optional"):
            raise ModelError(shown, f"input '{t['name']}' is a {t['type']}; only tensor inputs can be served")
    opsets = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    local = {f.domain for f in proto.functions}
    custom = sorted({f"{n.domain}:{n.op_type}" for n in _all_nodes(proto.graph)
                     if n.domain not in ORT_DOMAINS and n.domain not in local})
    doc = {"opset": opsets.get("ai.onnx", 0), "ir_version": proto.ir_version, "opsets": opsets,
           "inputs": inputs, "outputs": outputs, "custom_ops": custom, "nodes": len(proto.graph.node),
           "inline_weights": sum(w.length for w in weights),
           "working_memory": [[[list(d) for d in dims], n] for dims, n in working_memory(proto, initializers)],
           "producer": " ".join(p for p in (proto.producer_name, proto.producer_version) if p),
           "files": [path.name, *sorted(external)]}
    try:
        if not checker:
            _check_weights(proto, weights)
        elif weights:  # the checker sees the graph, the skipped weights' bytes are checked here
            _check_weights(proto, weights)
            onnx.checker.check_model(_weights_as_external(proto, weights))
        else:  # nothing skipped: no raw_data over 4 KB anywhere (but in the odd tensors kept whole), so the
            # file is about its graph's size: the checker reads it (external data by its paths), no copy held here
            del proto
            onnx.checker.check_model(str(path))
    except Exception as e:
        raise ModelError(shown, f"fails the ONNX checker: {first_line(e)}") from None
    return doc


def fingerprint(skeleton: Skeleton) -> str:
    """What inspect_graph read, as a digest: a second process's answer is for the same bytes."""
    h = hashlib.sha256(skeleton.model)
    h.update(repr([(w.path, w.length, w.typed_fields) for w in skeleton.weights]).encode())
    return h.hexdigest()


# Operators whose output ONNX Runtime may write over their first input when nothing reads it later
# (its kernels' MayInplace), and those whose output is a view of it: no new buffer either way.
_IN_PLACE = frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "HardSigmoid", "Softplus", "Softsign",
                       "ThresholdedRelu", "Add", "Sub", "Mul", "Div"})
_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})


def _check_weights(proto: Any, weights: tuple[Weight, ...]) -> None:
    """What the checker would say of a weight whose bytes the skeleton skipped: one value field,
    a numeric type, and bytes enough for its shape (ONNX Runtime would fail on them at start)."""
    import onnx

    for weight in weights:
        tensor = tensor_at(proto, weight)
        name = tensor.name or "(unnamed)"
        if weight.typed_fields or tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise ValueError(f"TensorProto (tensor name: {name}) should contain one and only one value field.")
        if tensor.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
            kind = "UNDEFINED" if tensor.data_type == onnx.TensorProto.UNDEFINED else "STRING"
            raise ValueError(f"TensorProto (tensor name: {name}) has data type {kind}, which raw_data cannot hold")
        needed = _needed_bytes(tensor)
        if needed is None:
            raise ValueError(f"TensorProto (tensor name: {name}) has unknown data type {tensor.data_type}")
        if needed < 0 or weight.length < needed:
            raise ValueError(f"TensorProto (tensor name: {name}) raw_data size ({weight.length} bytes) is too small "
                             f"for the declared shape and type ({needed} bytes required)")


_BITS = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2}  # UINT4, INT4, FLOAT4E2M1, UINT2, INT2: packed


def _needed_bytes(tensor: Any) -> int | None:
    """The bytes a tensor's values take as raw bytes (raw_data, or external data), which ONNX
    Runtime checks before it runs: its element count times its type's size, 4-bit and 2-bit types
    packed. Negative where a dimension is; None for a type of no fixed size (STRING, UNDEFINED,
    unknown)."""
    import onnx

    if tensor.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        return None
    bits = _BITS.get(tensor.data_type)
    if bits is None:
        try:
            bits = 8 * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, ValueError, TypeError):
            return None
    count = 1
    for dim in tensor.dims:
        count *= dim
    return (count * bits + 7) // 8 if count >= 0 else -1


def _weights_as_external(proto: Any, weights: tuple[Weight, ...]) -> Any:
    """The skeleton as the checker can read it: each skipped weight's tensor marked as external
    data at a location starting with '#' instead of a tensor without a value. The checker looks
    for no file there (onnx's own in-memory large models are written so, since onnx 1.16) and
    checks all else as it would: the tensor stays where it is, in an If branch or a Constant
    node's attribute too, where it could not become a graph input. The model's own external data
    is so marked too: in memory the checker would look for it in the working directory, and
    _external_file has checked it in the model's folder."""
    import onnx
    from onnx import external_data_helper

    for tensor in _all_tensors(proto.graph):
        if external_data_helper.uses_external_data(tensor):
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = "#" + entry.value
    for weight in weights:
        tensor = tensor_at(proto, weight)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", "#skipped"
    return proto


def working_memory(proto: Any, initializers: set[str]) -> tuple[tuple[tuple[tuple[str, int], ...], int], ...]:
    """What the graph's intermediate tensors hold at their peak, for the server to charge a
    request before it runs (400,000 rows through the mlp hold 26 MB of them, as much as their
    inputs and outputs together). ONNX's shape inference gives each tensor's shape; walking the
    nodes in order, a buffer lives from the node that makes it to the last that reads it (or a
    view of it), and an activation or arithmetic node writes over an input nothing reads later,
    as ONNX Runtime's planner does. Sizes are kept per product of input dimensions (a [batch, 16]
    float tensor is 64 bytes per unit of the input dimension `batch` names), each product's
    largest live total. A dimension inference cannot tie to an input's (a Reshape to -1) counts
    as 1, so the estimate errs low rather than refuse what fits; ONNX Runtime's scratch and its
    fusions are not modelled. Inference needs the initializers' shapes only: the caller passes
    the model's skeleton, its big weights left in the file."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(proto).graph
    except Exception:  # a graph inference cannot follow: nothing to charge beyond the outputs
        return ()
    axes = {}  # a named input dimension -> (input, axis)
    for value in inferred.input:
        if value.name not in initializers:
            for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                if dim.dim_param and dim.dim_param.isidentifier():  # `?` ties nothing (see _untied)
                    axes.setdefault(dim.dim_param, (value.name, axis))
    outside = {v.name for v in (*inferred.input, *inferred.output)} | initializers
    sizes = {}
    for value in inferred.value_info:
        tt = value.type.tensor_type
        if value.type.WhichOneof("value") != "tensor_type" or not tt.HasField("shape") or value.name in outside:
            continue
        try:
            itemsize = 8 if tt.elem_type == onnx.TensorProto.STRING else \
                onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).itemsize
        except (KeyError, ValueError, TypeError):
            continue
        fixed, named = itemsize, []
        for dim in tt.shape.dim:
            if dim.HasField("dim_value"):
                fixed *= max(dim.dim_value, 0)
            elif dim.dim_param in axes:
                named.append(axes[dim.dim_param])
        sizes[value.name] = (tuple(sorted(named)), fixed)
    last_read = {name: i for i, node in enumerate(inferred.node) for name in node.input}
    buffer_of: dict[str, int] = {}  # a tensor -> the buffer holding it (views share one)
    buffers: list[tuple[tuple, int]] = []  # a buffer's (input dimensions, bytes per unit of them)
    users: list[set[str]] = []  # the tensors on each buffer still to be read
    live: dict[tuple, int] = {}
    peak: dict[tuple, int] = {}
    for i, node in enumerate(inferred.node):
        first = node.input[0] if node.input else ""
        for name in node.output:
            if name not in sizes:
                continue
            shared = buffer_of.get(first)
            if node.op_type in _VIEWS and first in outside:
                continue  # a view of the request's own input or of a weight: no buffer
            if shared is not None and (node.op_type in _VIEWS or node.op_type in _IN_PLACE and users[shared] == {first}
                                       and last_read.get(first) == i and sizes[first] == sizes[name]):
                buffer_of[name] = shared  # ONNX Runtime writes it over its input, or views it
                users[shared].add(name)
                continue
            buffer_of[name] = len(buffers)
            buffers.append(sizes[name])
            users.append({name})
            key, n = sizes[name]
            live[key] = live.get(key, 0) + n
            peak[key] = max(peak.get(key, 0), live[key])
        for name in {*node.input, *node.output}:
            buffer = buffer_of.get(name)
            if buffer is not None and last_read.get(name, i) <= i and name in users[buffer]:
                users[buffer].discard(name)
                if not users[buffer]:
                    key, n = buffers[buffer]
                    live[key] -= n
    return tuple(sorted((key, n) for key, n in peak.items() if n))


def _external_file(path: Path, shown: str, tensor: Any) -> str:
    """The external data file of a tensor, checked: a plain relative path inside the model's
    folder (no '..', no absolute path), a regular file, and a non-negative offset and length
    that fit in it, and not the model file itself. Returns the location normalised (`./w.bin`
    and `sub//w.bin` -> `w.bin`, `sub/w.bin`): ONNX Runtime opens it relative to the model's
    folder, so every spelling is one file, baked once at that path."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    name = tensor.name or "(unnamed)"
    parts = PurePosixPath(location).parts
    if (not location or not location.isprintable() or "\\" in location or location.startswith("/")
            or any(p in ("..", ".") for p in parts) or os.path.isabs(location)):
        raise ModelError(shown, f"external data location {ascii(location)} of tensor {name} must be a "
                                "relative path inside the model's folder, without '..'")
    target = os.path.join(path.parent, location)  # as written: a trailing '/' must name a folder
    if not Path(os.path.realpath(target)).is_relative_to(os.path.realpath(path.parent)):
        raise ModelError(shown, f"external data '{location}' is outside the model's folder")
    try:
        info_stat = os.stat(target)
    except FileNotFoundError:
        raise ModelError(shown, f"external data file '{location}' is missing (tensor {name})") from None
    except OSError as e:  # a name too long, a symlink loop
        raise ModelError(shown, f"external data file {ascii(location[:80])} cannot be read: {e.strerror} (tensor {name})") from None
    if not stat.S_ISREG(info_stat.st_mode):
        raise ModelError(shown, f"external data file '{location}' is not a regular file (tensor {name})")
    if os.path.samestat(info_stat, os.stat(path)):
        raise ModelError(shown, f"external data location '{location}' of tensor {name} is the model file itself")
    if info_stat.st_nlink > 1:  # ONNX refuses it too ("potential hardlink attack"), without saying what to do
        raise ModelError(shown, f"external data file '{location}' has {info_stat.st_nlink} hard links: ONNX refuses "
                                "hard-linked data (another name could change it unseen); make it a file of its own: "
                                f"cp {shlex.quote(location)} tmp && mv tmp {shlex.quote(location)}")
    numbers = {}
    for key in ("offset", "length"):
        raw = info.get(key, "0")
        if not _DECIMAL.fullmatch(raw):
            raise ModelError(shown, f"external data {key} {ascii(raw)} of tensor {name} is not a non-negative integer")
        numbers[key] = int(raw)
    offset, length = numbers["offset"], numbers["length"]
    if offset + length > info_stat.st_size:
        raise ModelError(shown, f"external data file '{location}' is truncated (tensor {name})")
    needed = _needed_bytes(tensor)
    if needed is not None and needed >= 0:  # ONNX Runtime refuses what is not exactly that at start:
        if length and length != needed:  # a length (0 is none) other than it, or a file too short
            raise ModelError(shown, f"external data length of tensor {name} in '{location}' is {length} bytes, "
                                    f"but its shape and type need {needed} bytes")
        if not length and info_stat.st_size - offset < needed:
            raise ModelError(shown, f"external data file '{location}' has {info_stat.st_size - offset} bytes "
                                    f"from offset {offset} for tensor {name}, but its shape and type need {needed} bytes")
    return PurePosixPath(location).as_posix()


def _all_nodes(graph: Any):
    """Every node of a graph, subgraphs (If, Loop, Scan bodies) included."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _all_nodes(attr.g)
            for sub in attr.graphs:
                yield from _all_nodes(sub)


def _all_tensors(graph: Any):
    """Every TensorProto of a graph: initializers (sparse ones too) and tensor attributes,
    subgraphs included: each may keep its data in an external file that must be baked."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield from (attr.sparse_tensor.values, attr.sparse_tensor.indices)
            for sparse in attr.sparse_tensors:
                yield from (sparse.values, sparse.indices)
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for sub in attr.graphs:
                yield from _all_tensors(sub)


def _tensor(value: Any, shown: str, required: bool = True) -> dict[str, Any]:
    """A graph input/output as the model has it, in the check cache's form (name, type, shape,
    required)."""
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        names = {"sequence_type": "sequence", "map_type": "map", "optional_type": "optional"}
        return {"name": value.name, "type": names.get(kind or "", "unknown"), "shape": None, "required": required}
    tt = value.type.tensor_type
    dtype = ONNX_TO_NAME.get(tt.elem_type)
    if dtype is None:
        import onnx

        try:
            kind = onnx.TensorProto.DataType.Name(tt.elem_type)
        except ValueError:
            kind = f"#{tt.elem_type} (unknown)"
        raise ModelError(shown, f"{ascii(value.name)} has element type {kind}, which no KServe v2 datatype "
                                "carries: gpux-pack cannot serve it")
    shape = None
    if tt.HasField("shape"):
        shape = [(d.dim_value if d.dim_value >= 0 else -1) if d.HasField("dim_value") else (d.dim_param or -1)
                 for d in tt.shape.dim]
    return {"name": value.name, "type": dtype, "shape": shape, "required": required}


def first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]
