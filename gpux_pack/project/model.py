"""The ONNX model: read its signature with `onnx`, check it, and reconcile gpux.yml's
inputs/outputs with it. Everything here runs before Docker is touched."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import re
import stat
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from gpux_pack.project.config import TensorSpec
from gpux_pack.project.load import Project
from gpux_pack.project.preprocess import AudioStep, ImageStep, TextStep, audio_step, image_step, text_step
from gpux_pack.project.skeleton import (FileChanged, Skeleton, Weight, WireError, fields, graph_digest, read_skeleton,
                                        tensor_at)
from gpux_pack.staging import cache_dir, touch, write_bytes
from gpux_pack.errors import ModelError
from gpux_pack.runtime.contract import ONNX_TO_NAME

# Domains whose operators every onnxruntime build implements (model-local functions add theirs).
ORT_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc"})
_DECIMAL = re.compile(r"[0-9]{1,19}", re.ASCII)


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    files: tuple[str, ...]  # model file name first, then external data files, relative to path.parent
    size_bytes: int
    sha256: str
    opset: int
    ir_version: int
    producer: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    opsets: dict[str, int]  # domain -> version the model imports
    custom_ops: tuple[str, ...]  # "domain:Op" of nodes no onnxruntime build implements
    nodes: int = 0  # in the main graph: the partition report's total
    # the intermediate tensors' peak bytes as terms: bytes x the product of the request's sizes
    # of the named input dimensions ((input, axis), ...); see working_memory
    working_memory: tuple[tuple[tuple[tuple[str, int], ...], int], ...] = ()
    inline_weights: int = 0  # bytes of the large initializers stored in the model file itself


def inspect_model(path: Path, display: str | None = None, checker: bool = True) -> ModelInfo:
    """Load the model's structure (not its weights) and check it; one clear ModelError if not.
    checker=False: ONNX Runtime wrote the model and ran it already (pack.optimize), which is the
    check that counts; ONNX's checker refuses the operators ORT's fusions write into the standard
    domain below the opset that made them standard (LayerNormalization before opset 17)."""
    shown = display or str(path)
    if not path.is_file():
        raise ModelError(shown, "no such file")
    if path.stat().st_size == 0:
        raise ModelError(shown, "is empty (0 bytes)")
    try:
        skeleton = read_skeleton(path)
        key = checked_key(skeleton)
        checked = checked_before(key)
        if checked is not None:
            digest, size = _digest(path.parent, (path.name,))
            return replace(checked.info, path=path.resolve(), files=(path.name,), sha256=digest, size_bytes=size,
                           producer=checked.producer)
        import onnx  # heavy (70 ms with NumPy): imported only when a model is checked
        from onnx import external_data_helper

        proto = onnx.ModelProto.FromString(skeleton.model)
    except FileChanged as e:  # a copy still being written: the same file may be whole later
        raise ModelError(shown, f"changed while it was read ({e}); try again once it is complete") from None
    except Exception as e:  # the wire walk or protobuf: several types for non-ONNX bytes
        raise ModelError(shown, f"is not an ONNX model ({_first_line(e)})") from None
    weights = skeleton.weights
    del skeleton  # parsed: its bytes need not stay while the checker reads the file
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.graph.output:
        raise ModelError(shown, "is not an ONNX model (no graph with outputs; truncated or another format?)")

    external = list(dict.fromkeys(_external_file(path, shown, t) for t in _all_tensors(proto.graph)
                                  if external_data_helper.uses_external_data(t)))

    initializers = {init.name for init in proto.graph.initializer}
    initializers |= {s.values.name for s in proto.graph.sparse_initializer}
    inputs = tuple(
        _tensor(v, shown, required=v.name not in initializers) for v in proto.graph.input
    )
    outputs = tuple(_tensor(v, shown) for v in proto.graph.output)
    for t in inputs:
        if t.type in ("sequence", "map", "optional"):
            raise ModelError(shown, f"input '{t.name}' is a {t.type}; only tensor inputs can be served")
    opsets = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    opset = opsets.get("ai.onnx", 0)
    local = {f.domain for f in proto.functions}
    custom = sorted({f"{n.domain}:{n.op_type}" for n in _all_nodes(proto.graph)
                     if n.domain not in ORT_DOMAINS and n.domain not in local})
    files = (path.name, *sorted(external))
    working = working_memory(proto, initializers)
    ir_version, nodes = proto.ir_version, len(proto.graph.node)
    producer = " ".join(p for p in (proto.producer_name, proto.producer_version) if p)
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
        raise ModelError(shown, f"fails the ONNX checker: {_first_line(e)}") from None
    digest, size = _digest(path.parent, files)
    info = ModelInfo(
        path=path.resolve(),
        files=files,
        size_bytes=size,
        sha256=digest,
        opset=opset,
        ir_version=ir_version,
        producer=producer,
        inputs=inputs,
        outputs=outputs,
        opsets=opsets,
        custom_ops=tuple(custom),
        nodes=nodes,
        working_memory=working,
        inline_weights=sum(w.length for w in weights),
    )
    if len(files) == 1 and checker:  # external data is checked where it lies, each time
        keep_checked(key, info)
    return info


# ---------------------------------------------------------------------------------------------
# what the checks found, kept by what they read

CHECKED_FORMAT = 1  # of the entries under the cache's models/ (a change makes every one of them unused)
# ModelProto's fields no check reads (producer_name, producer_version, domain, model_version,
# doc_string, metadata_props): a retrained model's new ones do not make it a model to check again
_METADATA = {2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 14: 2}  # field -> its wire type


@dataclass(frozen=True)
class Checked:
    info: ModelInfo  # its path, files, digest, size and producer are this file's, put in by the caller
    producer: str


def checked_before(key: tuple[str, str] | None) -> Checked | None:
    """What an earlier inspect_model found for a model of this checked_key."""
    if key is None:
        return None
    kept = cache_dir() / "models" / f"{key[0]}.json"
    try:
        doc = json.loads(kept.read_bytes())
        info = ModelInfo(path=Path(), files=(), size_bytes=0, sha256="", producer="", opset=doc["opset"],
                         ir_version=doc["ir_version"], inputs=_specs(doc["inputs"]), outputs=_specs(doc["outputs"]),
                         opsets=doc["opsets"], custom_ops=tuple(doc["custom_ops"]), nodes=doc["nodes"],
                         working_memory=tuple((tuple((name, axis) for name, axis in dims), size)
                                              for dims, size in doc["working_memory"]),
                         inline_weights=doc["inline_weights"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    touch(kept)
    return Checked(info, key[1])


def keep_checked(key: tuple[str, str] | None, info: ModelInfo) -> None:
    """Keep what the checks found (never their failures: a refused model is checked again)."""
    if key is None:
        return
    doc = {"opset": info.opset, "ir_version": info.ir_version, "opsets": info.opsets,
           "inputs": [_spec_json(t) for t in info.inputs], "outputs": [_spec_json(t) for t in info.outputs],
           "custom_ops": list(info.custom_ops), "nodes": info.nodes, "inline_weights": info.inline_weights,
           "working_memory": [[[list(d) for d in dims], size] for dims, size in info.working_memory]}
    try:
        write_bytes(cache_dir() / "models" / f"{key[0]}.json", json.dumps(doc, sort_keys=True).encode())
    except OSError:  # a cache that cannot be written costs the next build the checks, nothing else
        pass


def checked_key(skeleton: Skeleton) -> tuple[str, str] | None:
    """What the checks read, as a key, and the model's producer. The checks read the skeleton
    (the structure and small tensors the checker, shape inference and the rest read; the skipped
    weights' places and lengths) and no metadata but the producer, which is read here; the
    metadata is checked here as the full path would: text that is UTF-8, metadata_props keys
    that are unique (the checker's rule). None when it is not what this walk can vouch for: the
    model then goes through every check. GPUX_PACK_CHECK_CACHE=0 turns it off."""
    if os.environ.get("GPUX_PACK_CHECK_CACHE") == "0":
        return None
    data = skeleton.model
    h = hashlib.sha256(json.dumps([CHECKED_FORMAT, _checker_version(),
                                   [[list(w.path), w.length, w.typed_fields] for w in skeleton.weights]]).encode())
    text: dict[int, str] = {}
    keys: set[str] = set()
    try:
        for number, wire, tag_start, value_start, value_end in fields(data, 0, len(data)):
            if number == 7 and wire == 2:  # the graph
                h.update(data[tag_start:value_start])
                graph_digest(h, data, value_start, value_end)
            elif number not in _METADATA:
                h.update(data[tag_start:value_end])
            elif wire != _METADATA[number]:
                return None
            elif number == 14:
                entry = _string_pair(data, value_start, value_end)
                if entry is None or entry[0] in keys:
                    return None  # malformed, or a key twice: the checker refuses it
                keys.add(entry[0])
            elif number != 5:
                text[number] = data[value_start:value_end].decode("utf-8")  # the last one counts, as in protobuf
    except (WireError, UnicodeDecodeError):
        return None
    producer = " ".join(t for t in (text.get(2, ""), text.get(3, "")) if t)
    return h.hexdigest()[:40], producer


def _string_pair(data: bytes, start: int, end: int) -> tuple[str, str] | None:
    """A StringStringEntryProto (key 1, value 2, both UTF-8), or None for anything else."""
    pair = {1: "", 2: ""}
    for number, wire, _, value_start, value_end in fields(data, start, end):
        if number not in pair or wire != 2:
            return None
        pair[number] = data[value_start:value_end].decode("utf-8")
    return pair[1], pair[2]


def _checker_version() -> str:
    """The installed onnx, whose checker and shape inference made what is kept: its
    dist-info's name, found without importing it (onnx and NumPy take 70 ms to import)."""
    spec = importlib.util.find_spec("onnx")
    if spec is None or not spec.origin:
        return ""
    return ",".join(sorted(p.name for p in Path(spec.origin).parent.parent.glob("onnx-*.dist-info")))


def _spec_json(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "type": spec.type, "shape": None if spec.shape is None else list(spec.shape),
            "required": spec.required}


def _specs(docs: list[dict[str, Any]]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec.model_construct(name=d["name"], type=d["type"], required=d["required"],
                                            shape=None if d["shape"] is None else tuple(d["shape"]),
                                            max_length=None, labels=None, description=None) for d in docs)


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


def _tensor(value: Any, shown: str, required: bool = True) -> TensorSpec:
    """A graph input/output as the model has it (trusted data: built without re-validation)."""
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        names = {"sequence_type": "sequence", "map_type": "map", "optional_type": "optional"}
        return TensorSpec.model_construct(name=value.name, type=names.get(kind or "", "unknown"), shape=None,
                                          required=required, max_length=None, labels=None, description=None)
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
    shape: tuple[int | str, ...] | None = None
    if tt.HasField("shape"):
        shape = tuple(
            (d.dim_value if d.dim_value >= 0 else -1) if d.HasField("dim_value") else (d.dim_param or -1)
            for d in tt.shape.dim
        )
    return TensorSpec.model_construct(name=value.name, type=dtype, shape=shape, required=required,
                                      max_length=None, labels=None, description=None)


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
    inputs: tuple[TensorSpec, ...]  # what clients send: listed in /info and KServe v2 metadata
    outputs: tuple[TensorSpec, ...]
    overridable: tuple[TensorSpec, ...] = ()  # initializers the graph also lists as inputs
    # inputs whose gpux.yml shape fixes a size the graph leaves dynamic: that shape (warmup runs it)
    declared: tuple[tuple[str, tuple[int | str, ...]], ...] = ()
    notes: tuple[str, ...] = ()  # what the build should tell: the graph decided, a flag was not honoured
    text: TextStep | None = None  # requests may send text, tokenized into the graph's token inputs
    image: ImageStep | None = None  # requests may send encoded images, decoded into the graph's image input
    audio: AudioStep | None = None  # requests may send WAV, turned into the graph's log-mel spectrogram


def reconcile(project: Project, model: ModelInfo) -> Signature:
    """Inputs/outputs to serve: the config's when given (checked against the model: names,
    types, ranks, fixed dims), else the model's own. Initializers that a graph lists as
    inputs (IR-3 model-zoo graphs list hundreds) stay accepted but are not listed, unless
    gpux.yml lists them."""
    cfg = project.config
    notes: list[str] = []
    declared: list[tuple[str, tuple[int | str, ...]]] = []
    model = _untied(model, notes)
    text, served = text_step(project, model.inputs, notes)
    image, served_image = image_step(project, model.inputs, notes, {text.input} if text else set())
    audio, served_audio = audio_step(project, model.inputs, notes, {s.input for s in (text, image) if s})
    _not_applied(project, text, notes)
    fed = {name for _, name, _ in text.feeds} if text else set()
    inputs = _merge(project, "inputs", cfg.inputs, model.inputs, True, notes, declared,
                    skip=text.input if text else None, fed=fed)
    if cfg.inputs is None:
        inputs = tuple(t for t in inputs if t.required)
    if cfg.inputs is not None and fed:  # the tokenizer feeds them: listed whether gpux.yml lists them or not
        inputs = (*inputs, *(t for t in model.inputs if t.name in fed and t.name not in {i.name for i in inputs}))
    inputs = (*(t for t in (served, served_image, served_audio) if t is not None), *inputs)
    listed = {t.name for t in inputs}
    overridable = tuple(t for t in model.inputs if not t.required and t.name not in listed)
    outputs = _merge(project, "outputs", cfg.outputs, model.outputs, False, notes, [])
    outputs = tuple(_check_labels(project, index, t, notes) for index, t in enumerate(outputs))
    return Signature(inputs, outputs, overridable, tuple(declared), tuple(notes), text, image, audio)


def _untied(model: ModelInfo, notes: list[str]) -> ModelInfo:
    """A dimension the graph names with what is not an identifier (paddle2onnx's `?`, an
    exporter's formula such as `floor(h/32)*2`) is a size of its own: ONNX Runtime ties no
    symbolic dimensions together at run time, and a `?` in two places does not say they are the
    same. Served as -1; identifiers (`batch`, `seq`) still tie what they name."""
    def untie(t: TensorSpec) -> TensorSpec:
        if not t.shape or not any(isinstance(d, str) and not d.isidentifier() for d in t.shape):
            return t
        return t.model_copy(update={"shape": tuple(-1 if isinstance(d, str) and not d.isidentifier() else d
                                                   for d in t.shape)})

    inputs, outputs = tuple(untie(t) for t in model.inputs), tuple(untie(t) for t in model.outputs)
    changed = [t.name for t, u in zip((*model.inputs, *model.outputs), (*inputs, *outputs)) if t is not u]
    if changed:
        names = sorted({_dim_text(d) for t in (*model.inputs, *model.outputs) for d in (t.shape or ())
                        if isinstance(d, str) and not d.isidentifier()})
        shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
        tensors = ", ".join(changed[:4]) + (", ..." if len(changed) > 4 else "")
        notes.append(f"the model names dimensions {shown} ({tensors}): not identifiers, so each takes any size of "
                     "its own (-1)")
    return replace(model, inputs=inputs, outputs=outputs)


def _dim_text(dim: int | str, most: int = 32) -> str:
    """A dimension as a note shows it: an exporter's shape formula can run to 400 characters."""
    text = str(dim)
    return text if len(text) <= most else text[:most - 3] + "..."


def _not_applied(project: Project, text: TextStep | None, notes: list[str]) -> None:
    """A note for each input max_length that no tokenizer reads."""
    cfg = project.config
    for index, t in enumerate(cfg.inputs or ()):
        if t.max_length is not None and (text is None or t.name != text.input):
            notes.append(project.note((*_where(project, "inputs", index, t.name), "max_length"),
                                      "not applied: it bounds the text a tokenizer reads, and this input is the "
                                      "model's own"))


def _check_labels(project: Project, index: int, output: TensorSpec, notes: list[str]) -> TensorSpec:
    """An output's labels name the entries of its last dimension: as many as it has. GPUX's docs
    abbreviate a long list with a last `...`: a note, and no labels in the answers."""
    if not output.labels:
        return output
    where = (*_where(project, "outputs", index, output.name), "labels")
    if output.labels[-1] in ("...", "\u2026"):
        notes.append(project.note(where, "ends with '...', an abbreviated list: answers carry no labels (list "
                                         "every label to have them)"))
        return output.model_copy(update={"labels": None})
    last = output.shape[-1] if output.shape else None
    if isinstance(last, int) and last >= 0:
        if last != len(output.labels):
            raise project.error(where, f"{len(output.labels)} labels, but the model's '{output.name}' has {last} "
                                       f"entries in its last dimension (shape {list(output.shape)})")
    else:
        notes.append(project.note(where, f"the model's '{output.name}' does not fix its last dimension: answers "
                                         f"whose last dimension is not {len(output.labels)} carry no labels"))
    return output


def _merge(
    project: Project,
    section: str,
    declared: list[TensorSpec] | None,
    actual: tuple[TensorSpec, ...],
    all_required: bool,
    notes: list[str],
    declared_shapes: list[tuple[str, tuple[int | str, ...]]],
    skip: str | None = None,
    fed: set[str] = frozenset(),  # type: ignore[assignment]
) -> tuple[TensorSpec, ...]:
    """skip: the declared text input, which the graph lacks; fed: inputs the tokenizer feeds."""
    if declared is None:
        return actual
    by_name = {t.name: t for t in actual}
    names = ", ".join(by_name) if len(by_name) <= 20 else ", ".join(list(by_name)[:20]) + ", ..."
    out: list[TensorSpec] = []
    for index, spec in enumerate(declared):
        if spec.name == skip:
            continue
        where = _where(project, section, index, spec.name)
        model_t = by_name.get(spec.name)
        if model_t is None:
            kind = section[:-1]
            raise project.error(where, f"the model has no {kind} '{spec.name}' (it has: {names})")
        if spec.type is not None and model_t.type not in ("sequence", "map", "optional"):
            if spec.type != model_t.type:
                raise project.error(
                    (*where, "type"), f"{spec.type} does not match the model's {model_t.type}"
                )
        shape = model_t.shape
        if spec.shape is not None:
            noted = len(notes)
            shape = _merge_shape(project, (*where, "shape"), spec.shape, model_t.shape, notes)
            if len(notes) > noted:  # it fixed sizes the graph leaves open: warmup runs them
                declared_shapes.append((spec.name, tuple(spec.shape)))
        if section == "inputs" and not spec.required and model_t.required:
            problem = f"'{spec.name}' has no default in the model (not an initializer), so it is required"
            if project.strict:
                raise project.error((*where, "required"), problem)
            notes.append(project.note((*where, "required"), f"false, but {problem}: requests must send it"))
        out.append(spec.model_copy(update={"type": model_t.type, "shape": shape,
                                           "required": model_t.required}))
    if all_required:
        listed = {t.name for t in out}
        missing = [t.name for t in actual if t.required and t.name not in listed and t.name not in fed]
        if missing:
            raise project.error(
                (section,), f"the model's input '{missing[0]}' is not listed (list every input, or none)"
            )
    return tuple(out)


def _where(project: Project, section: str, index: int, name: str) -> tuple[Any, ...]:
    return (section, name) if (section, name) in project.lines else (section, index)


def _merge_shape(
    project: Project, where: tuple[Any, ...], declared: tuple[int | str, ...], actual: tuple[int | str, ...] | None,
    notes: list[str],
) -> tuple[int | str, ...]:
    """The graph decides what the server accepts: a declared size on a dimension the graph
    leaves dynamic is a note (GPUX's docs write [1, N] for batch models and GPUX never enforced
    it), not a narrowing that would refuse two-row requests and turn batching off."""
    if actual is None:
        return tuple(declared)
    if len(declared) != len(actual):
        raise project.error(
            where, f"rank {len(declared)} {list(declared)} does not match the model's rank {len(actual)} {list(actual)}"
        )
    merged: list[int | str] = []
    narrow = project.config.pack.shapes == "declared"
    for i, (d, a) in enumerate(zip(declared, actual)):
        shown = f"'{_dim_text(a)}'" if isinstance(a, str) else "-1"
        if isinstance(a, int) and a >= 0:
            if isinstance(d, int) and d >= 0 and d != a:
                raise project.error(
                    (*where, i), f"dimension {i} is {d} but the model fixes it at {a}"
                )
            merged.append(a)
        elif isinstance(d, int) and d >= 0 and narrow:
            merged.append(d)
            notes.append(project.note((*where, i), f"{d}: the graph leaves it dynamic ({shown}); pack.shapes: declared "
                                                    "narrows it, so the image takes only this size"))
        elif isinstance(d, int) and d >= 0:
            merged.append(a)
            batch = " and batches requests" if i == 0 else ""
            notes.append(project.note((*where, i), f"{d}, where the graph's dimension is dynamic ({shown}): the graph "
                                                    f"decides, so the image takes any size there{batch} (pack.shapes: "
                                                    "declared narrows it)"))
        else:  # the file's own name (what it names alike is one size; other names untie the graph's), else the graph's
            merged.append(d if isinstance(d, str) and d.isidentifier() else a)
    return tuple(merged)
