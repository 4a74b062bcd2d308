"""gpux.json, the contract between the packager and the image's runtime: frozen, typed and
versioned. The packager's plan builds a GpuxJson and writes it (dump); the runtime reads it once
at start (parse), which checks every field, and from then on reads attributes, never keys.
`gpux-pack schema --of gpux.json` and gpux-json.schema.json describe it (schema()).

Standard library only: the runtime's settings read it before anything heavy, and the packager
imports it without the runtime's libraries."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

FORMAT = 2  # gpux.json's version: a runtime reads its own format only (an image's runtime and gpux.json are built together)

Dim = Union[int, str]  # a fixed size (>= 0), -1 or a name: dynamic
Shape = tuple[Dim, ...]
Warmup = Literal["none", "at-start", "baked"]


class ContractError(ValueError):
    """gpux.json does not hold what this runtime reads: one line naming the field."""


@dataclass(frozen=True)
class Tensor:
    """An input or output as served: gpux.yml's declaration merged with the graph's."""

    name: str
    type: str  # canonical dtype (DTYPES), or sequence/map/optional for a non-tensor output
    shape: Shape | None
    required: bool = True  # an optional graph input (it has a default) may be left out
    labels: tuple[str, ...] | None = None  # class names of an output's last axis (gpux.yml)
    description: str | None = None
    max_length: int | None = None  # a string input's longest text (gpux.yml)
    declared_shape: Shape | None = None  # gpux.yml's sizes where the graph leaves them open: warmup runs them
    encoded: bool = False  # BYTES of encoded media (an image, a WAV): kept as bytes, not read as UTF-8

    def entry(self) -> dict[str, Any]:
        """GPUX's form of the declaration (/info): what was declared, nothing of the defaults."""
        out: dict[str, Any] = {"name": self.name, "type": self.type,
                               "shape": list(self.shape) if self.shape is not None else None}
        if not self.required:
            out["required"] = False
        for key in ("labels", "description", "max_length", "declared_shape"):
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
        if self.encoded:
            out["encoded"] = True
        return out


@dataclass(frozen=True)
class WorkingMemory:
    """One term of the graph's intermediate tensors' peak: bytes per product of these request
    dimensions ((input, axis), ...)."""

    dims: tuple[tuple[str, int], ...]
    bytes: int


@dataclass(frozen=True)
class ModelFiles:
    path: str  # the model file, from the app folder
    file: str
    files: tuple[str, ...]  # in the image: the model and its external data, if any
    weights_moved: bool  # the build moved its inline weights to external data
    sha256: str
    size_bytes: int
    opset: int
    nodes: int  # in the main graph: the partition report's total
    working_memory: tuple[WorkingMemory, ...] = ()


@dataclass(frozen=True)
class Feed:
    role: str  # input_ids, attention_mask, token_type_ids
    name: str  # the graph's input
    type: str


@dataclass(frozen=True)
class TextStep:
    input: str  # the request's string input
    file: str  # the tokenizer.json, from the app folder
    max_length: int
    padding: Literal["longest", "max_length", "none"]
    truncation: bool
    length: int | None  # the graph fixes the sequence length
    batch: int | None  # the graph fixes the batch dimension
    feeds: tuple[Feed, ...]


@dataclass(frozen=True)
class ImageStep:
    input: str  # the request's input that carries the encoded image
    feed: str  # the graph's input it becomes
    type: str
    layout: Literal["NCHW", "NHWC"]
    size: tuple[int, int]
    resize: tuple[int, int] | None
    crop: tuple[int, int] | None
    letterbox: bool
    pad: int
    scale: float
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None
    batch: int | None


@dataclass(frozen=True)
class AudioStep:
    input: str
    feed: str
    type: str
    sample_rate: int
    n_mels: int
    n_fft: int
    hop_length: int
    samples: int
    frames: int
    batch: int | None


@dataclass(frozen=True)
class Preprocessing:
    """What the image does to a request before the graph sees it, by modality."""

    text: TextStep | None = None
    image: ImageStep | None = None
    audio: AudioStep | None = None


@dataclass(frozen=True)
class ModelSignature:
    """OpenSSF model signing: the bundle and its public key under assets/."""

    bundle: str
    public_key: str
    verify: bool  # before loading, unless GPUX_VERIFY_MODEL says otherwise


@dataclass(frozen=True)
class Plugin:
    """A plugin EP: the module whose library the runtime registers, and the device it asks for."""

    ep: str
    module: str
    device: str


@dataclass(frozen=True)
class Libraries:
    """The provider's libraries, to say why it did not start."""

    libs: tuple[str, ...] = ()
    dlopen: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()
    driver: tuple[str, ...] = ()  # the GPU driver's, which the container toolkit mounts


@dataclass(frozen=True)
class Profile:
    """A TensorRT optimization profile's shapes for one input."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class Accuracy:
    """Warmup's limits: |a - b| <= atol + rtol * |b| against the CPU provider."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class RuntimeOptions:
    timeout: float
    batch_size: int
    enable_profiling: bool


@dataclass(frozen=True)
class Batching:
    max_batch_size: int
    max_delay_ms: float


@dataclass(frozen=True)
class Serving:
    port: int
    host: str
    max_workers: int
    timeout: float
    batching: Batching | None = None
    grpc_port: int | None = None


@dataclass(frozen=True)
class GpuxJson:
    """Everything the image's runtime needs, so it never reads YAML."""

    name: str  # the name KServe v2 URLs use
    title: str  # gpux.yml's name as written (GPUX's /info)
    version: str
    description: str | None
    model: ModelFiles
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    provider: str
    # [(EP, options), ...] in order of preference; options are the EP's own (strings, numbers, flags)
    execution_providers: tuple[tuple[str, dict[str, Any]], ...]
    pack_version: str
    onnxruntime: str
    warmup: Warmup = "at-start"
    overridable_inputs: tuple[Tensor, ...] = ()  # initializers the graph lists as inputs: accepted, not listed
    preprocessing: Preprocessing | None = None
    model_signature: ModelSignature | None = None
    provider_names: dict[str, str] = field(default_factory=lambda: {"cpu": "CPUExecutionProvider"})  # GPUX_PROVIDERS
    cpu_providers: tuple[str, ...] = ("CPUExecutionProvider",)  # the EPs that run on the CPU's cores
    plugin: Plugin | None = None
    ep_context: bool = False  # compile into an EP context model (caches.py)
    libraries: Libraries = Libraries()
    run_flags: str | None = None  # what `docker run` needs for the provider's device
    warmup_profiles: dict[str, Profile] = field(default_factory=dict)
    accuracy: Accuracy | None = None
    runtime: RuntimeOptions = RuntimeOptions(30.0, 1, False)
    serving: Serving = Serving(8080, "0.0.0.0", 4, 30.0)
    metadata: dict[str, Any] = field(default_factory=dict)  # gpux.yml's, JSON values
    format: int = FORMAT

    def to_json(self) -> dict[str, Any]:
        return dump(self)

    def tensor(self, name: str) -> Tensor | None:
        """An input, output or overridable input by name."""
        return next((t for t in (*self.inputs, *self.outputs, *self.overridable_inputs) if t.name == name), None)


def parse(data: Any) -> GpuxJson:
    """gpux.json's JSON value as a GpuxJson, every field checked; ContractError otherwise."""
    if not isinstance(data, dict):
        raise ContractError("not a gpux.json (expected a JSON object)")
    if data.get("format") != FORMAT:
        raise ContractError(f"format {_shown(data.get('format'))} is not this runtime's ({FORMAT}): rebuild the image "
                            "with the gpux-pack that made its runtime")
    return _value(GpuxJson, data, "")


def dump(value: Any) -> Any:
    """A contract value as JSON values (tuples as lists, every field written)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {k: dump(v) for k, v in value.items()}
    return value


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


_HINTS: dict[type, dict[str, Any]] = {}


def _value(kind: Any, value: Any, where: str) -> Any:
    """value checked against kind (a contract dataclass, a builtin, tuple[...], dict[str, ...],
    X | None, Literal[...], Any)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise _wrong(where, "an object", value)
        fields = {f.name: f for f in dataclasses.fields(kind)}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ContractError(f"{_at(where, unknown[0])}: not a field this runtime reads")
        hints, out = _hints(kind), {}
        for name, f in fields.items():
            if name in value:
                out[name] = _value(hints[name], value[name], _at(where, name))
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ContractError(f"{_at(where, name)}: missing")
        return kind(**out)
    if origin in (Union, types.UnionType):
        for option in args:
            try:
                return _value(option, value, where)
            except ContractError:
                continue
        raise _wrong(where, " or ".join(_name(a) for a in args), value)
    if origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
        raise _wrong(where, " or ".join(repr(a) for a in args), value)
    if origin is tuple:
        if not isinstance(value, list):
            raise _wrong(where, "a list", value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise _wrong(where, f"a list of {len(args)}", value)
        return tuple(_value(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise _wrong(where, "an object", value)
        return {k: _value(args[1], v, _at(where, k)) for k, v in value.items()}
    if kind is type(None):
        if value is None:
            return None
        raise _wrong(where, "null", value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise _wrong(where, "true or false", value)
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _wrong(where, "a whole number", value)
    if kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _wrong(where, "a number", value)
    if kind is str:
        if isinstance(value, str):
            return value
        raise _wrong(where, "a string", value)
    raise TypeError(f"gpux.json's contract has no rule for {kind!r}")  # a mistake in this module


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _name(kind: Any) -> str:
    return {int: "a whole number", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(kind, "an object" if dataclasses.is_dataclass(kind) else "a list")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _wrong(where: str, expected: str, value: Any) -> ContractError:
    return ContractError(f"{where or 'gpux.json'}: expected {expected}, got {_shown(value)}")


def schema() -> dict[str, Any]:
    """gpux.json's JSON Schema, from the same types parse() checks against."""
    defs: dict[str, Any] = {}
    _schema(GpuxJson, defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "gpux.json",
            "description": (GpuxJson.__doc__ or "").strip(), **defs.pop("GpuxJson"), "$defs": defs}


def _schema(kind: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return {}
    if dataclasses.is_dataclass(kind):
        name = kind.__name__
        if name not in defs:
            defs[name] = {}  # a placeholder while its fields are walked
            hints = _hints(kind)
            fields = dataclasses.fields(kind)
            body: dict[str, Any] = {
                "type": "object", "additionalProperties": False,
                "properties": {f.name: _schema(hints[f.name], defs) for f in fields},
                "required": [f.name for f in fields
                             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING],
            }
            if kind is GpuxJson:
                body["properties"]["format"] = {"const": FORMAT}
                body["required"].append("format")
            defs[name] = body
        return {"$ref": f"#/$defs/{name}"}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(a, defs) for a in args]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _schema(args[0], defs)}
        return {"type": "array", "prefixItems": [_schema(a, defs) for a in args], "minItems": len(args),
                "maxItems": len(args)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1], defs)}
    return {type(None): {"type": "null"}, bool: {"type": "boolean"}, int: {"type": "integer"},
            float: {"type": "number"}, str: {"type": "string"}}[kind]
