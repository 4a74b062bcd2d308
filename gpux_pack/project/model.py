"""The ONNX model: its signature and checks (graph.py does them; kept in the cache by what they
read, or found by a build's second process, prechecks.py), and gpux.yml's inputs/outputs
reconciled with it. Everything here runs before Docker is touched."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpux_pack.project import prechecks
from gpux_pack.project.config import TensorSpec
from gpux_pack.project.graph import first_line, fingerprint, inspect_graph
from gpux_pack.project.load import Project
from gpux_pack.project.preprocess import AudioStep, ImageStep, TextStep, audio_step, image_step, text_step
from gpux_pack.project.skeleton import (FileChanged, Skeleton, WireError, fields, graph_digest, read_skeleton)
from gpux_pack.staging import cache_dir, touch, write_bytes
from gpux_pack.errors import ModelError

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
    domain below the opset that made them standard (LayerNormalization before opset 17). What the
    checks find is kept by what they read (checked_key); a build's second process may have found
    it already (prechecks.py)."""
    shown = display or str(path)
    if not path.is_file():
        raise ModelError(shown, "no such file")
    if path.stat().st_size == 0:
        raise ModelError(shown, "is empty (0 bytes)")
    try:
        skeleton = read_skeleton(path)
        key = checked_key(skeleton)
    except FileChanged as e:  # a copy still being written: the same file may be whole later
        raise ModelError(shown, f"changed while it was read ({e}); try again once it is complete") from None
    except Exception as e:  # the wire walk: several types for non-ONNX bytes
        raise ModelError(shown, f"is not an ONNX model ({first_line(e)})") from None
    checked = checked_before(key)
    if checked is not None:
        prechecks.cancel()  # nothing for a second process to do: its CPU goes back to the engine
        digest, size = _digest(path.parent, (path.name,))
        return replace(checked.info, path=path.resolve(), files=(path.name,), sha256=digest, size_bytes=size,
                       producer=checked.producer)
    answer = prechecks.answer(path, fingerprint(skeleton)) if checker else None
    if answer is None:  # no second process, or it could not say: checked here
        doc = inspect_graph(path, shown, skeleton, checker)
    elif "problem" in answer:
        raise ModelError(shown, answer["problem"])
    else:
        doc = answer["doc"]
    del skeleton
    files = tuple(doc["files"])
    digest, size = _digest(path.parent, files)
    info = replace(_info(doc), path=path.resolve(), files=files, sha256=digest, size_bytes=size,
                   producer=doc["producer"])
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
        info = _info(json.loads(kept.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    touch(kept)
    return Checked(info, key[1])


def _info(doc: dict[str, Any]) -> ModelInfo:
    """A ModelInfo of what the checks found (graph.inspect_graph's form, as the cache keeps it),
    less the file's own facts (path, files, digest, size, producer), which the caller puts in."""
    return ModelInfo(path=Path(), files=(), size_bytes=0, sha256="", producer="", opset=doc["opset"],
                     ir_version=doc["ir_version"], inputs=_specs(doc["inputs"]), outputs=_specs(doc["outputs"]),
                     opsets=doc["opsets"], custom_ops=tuple(doc["custom_ops"]), nodes=doc["nodes"],
                     working_memory=tuple((tuple((name, axis) for name, axis in dims), size)
                                          for dims, size in doc["working_memory"]),
                     inline_weights=doc["inline_weights"])


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


def _digest(folder: Path, files: tuple[str, ...]) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    for name in files:
        with open(folder / name, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    return h.hexdigest(), size


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
