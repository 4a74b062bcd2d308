"""The contract between the packager and the image's runtime: what both sides must agree on,
spelled once. The packager imports nothing else of the runtime (the import contract says so);
the runtime builds on it.

- Paths: where things are in an image; the packager puts them there, the runtime finds them.
- Tensor element types: canonical names, numpy's, KServe v2's and ONNX's.
- The device: the CPU and NVIDIA's GPU, as a compiled cache's key and a plugin EP's refusal name them.
- gpux.json: frozen, typed and versioned. The packager's plan builds a GpuxJson and writes it
  (dump); the runtime reads it once at start (parse), which checks every field, and from then on
  reads attributes, never keys. `gpux-pack schema --of gpux.json` and gpux-json.schema.json
  describe it (schema()).

Standard library only: the runtime's settings read it before anything heavy, and the packager
imports it without the runtime's libraries."""


import os
import stat
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO, Literal, NamedTuple, Union


# ---------------------------------------------------------------------------------------------
# where things are in an image

APP_DIR = "/opt/gpux"
SITE = f"{APP_DIR}/site-packages"  # the locked wheels, installed on the build host
CACHE_DIR = f"{APP_DIR}/cache"  # GPUX_CACHE_DIR: owned by the image's user, so a volume mounted there is writable
BAKED_DIR = f"{APP_DIR}/warm"  # caches `gpux-pack warmup` bakes into the image (read in place)
FALLBACK_CACHE_DIR = "/tmp/gpux-cache"  # when GPUX_CACHE_DIR cannot be written (read-only root, no volume)
CACHE_PLACEHOLDER = "${GPUX_CACHE_DIR}"  # in provider options: this container's cache folder, put in at start
CONTEXT_MODEL = "model_ctx.onnx"  # an EP context model in a cache key folder: loaded instead of the original
RECORD = "warmup.json"  # a cache key folder's record: its key, its parts, its short name, its files
ASSETS = "assets"  # files preprocessing reads (a tokenizer.json), in APP_DIR: gpux.json names them from there
MODEL_SIGNATURE = "model.sig"  # in ASSETS: the model files' OpenSSF model-signing bundle (build --sign-model)
MODEL_PUBLIC_KEY = "model.pub"  # in ASSETS: the key that bundle verifies with
# What model signing leaves out of APP_DIR: the packages and the runtime (the SBOM lists them), the
# cache folders (caches.py checks a baked cache by its key) and the signature itself. Everything
# else there (gpux.json, the model's files, preprocessing's assets) decides the answers: signed.
UNSIGNED = ("site-packages", "runtime", "cache", "warm", f"{ASSETS}/{MODEL_SIGNATURE}", f"{ASSETS}/{MODEL_PUBLIC_KEY}")
DRAIN_SECONDS = 8.0  # GPUX_DRAIN_SECONDS's default (docker stop waits 10 s); deploy's grace follows it


class NotRegular(OSError):
    """What open_regular found is no regular file (a FIFO, a device, a folder)."""


def open_regular(path: Path) -> BinaryIO:
    """The file, opened without waiting (a FIFO would block the open), not through a symbolic
    link (what the caller checked or recorded is the path, not where a link leads), and only if it
    is a regular file: a FIFO never answers a read and a link to /dev/zero never ends. NotRegular
    (an OSError, as a missing file's) otherwise. The packager's model-only rebuild and the
    runtime's cache checks read through it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(f"{path.name} is not a regular file")
    return os.fdopen(fd, "rb")


# ---------------------------------------------------------------------------------------------
# tensor element types

# canonical name: (numpy dtype name, KServe v2 datatype, ONNX TensorProto enum value)
# bfloat16: numpy has none, so it is carried as its uint16 bit patterns (2 bytes, little-endian,
# as KServe v2 binary data and gRPC raw contents hold it) and handed to ONNX Runtime as bfloat16.
# JSON cannot carry it: binary data and gRPC raw contents only (BINARY_ONLY).
DTYPES: dict[str, tuple[str, str, int]] = {
    "float32": ("float32", "FP32", 1),
    "uint8": ("uint8", "UINT8", 2),
    "int8": ("int8", "INT8", 3),
    "uint16": ("uint16", "UINT16", 4),
    "int16": ("int16", "INT16", 5),
    "int32": ("int32", "INT32", 6),
    "int64": ("int64", "INT64", 7),
    "string": ("object", "BYTES", 8),
    "bool": ("bool", "BOOL", 9),
    "float16": ("float16", "FP16", 10),
    "float64": ("float64", "FP64", 11),
    "uint32": ("uint32", "UINT32", 12),
    "uint64": ("uint64", "UINT64", 13),
    "bfloat16": ("uint16", "BF16", 16),
}

# Types a request or an answer carries only as binary data (a uint16 in JSON would be bits, not a number).
BINARY_ONLY: frozenset[str] = frozenset({"bfloat16"})

# What people write in gpux.yml besides the canonical names (GPUX, numpy, KServe and ONNX spellings).
ALIASES: dict[str, str] = {
    "float": "float32", "fp32": "float32", "tensor(float)": "float32",
    "double": "float64", "fp64": "float64", "tensor(double)": "float64",
    "half": "float16", "fp16": "float16", "tensor(float16)": "float16",
    "bf16": "bfloat16", "tensor(bfloat16)": "bfloat16",
    "long": "int64", "tensor(int64)": "int64", "tensor(int32)": "int32",
    "str": "string", "bytes": "string", "tensor(string)": "string",
    "boolean": "bool", "tensor(bool)": "bool", "tensor(uint8)": "uint8", "tensor(int8)": "int8",
}

ONNX_TO_NAME: dict[int, str] = {onnx_type: name for name, (_, _, onnx_type) in DTYPES.items()}
V2_TO_NAME: dict[str, str] = {v2: name for name, (_, v2, _) in DTYPES.items()}


def canonical(name: str) -> str | None:
    """The canonical dtype for a spelling, or None when it is not a tensor type we serve."""
    key = str(name).strip().lower()
    if key in DTYPES:
        return key
    if key in ALIASES:
        return ALIASES[key]
    return V2_TO_NAME.get(str(name).strip().upper())

# ---------------------------------------------------------------------------------------------
# the device

# CPU features compiled code may depend on (x86 flags, aarch64 Features); the rest of
# /proc/cpuinfo (bugs, power management) does not change what a compiler emits.
ISA = {
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "asimddp", "asimdhp", "fphp", "sve", "sve2", "bf16", "i8mm", "sme",
}

def device_of(provider: str) -> str:
    """The device a provider compiles for: the GPU (name and compute capability) for NVIDIA's
    providers, else the CPU (model name and the ISA features compiled code may use)."""
    if provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        return nvidia_device()
    return cpu_device()


def cpu_device() -> str:
    _, model, flags = _cpuinfo()
    return f"cpu: {model} [{' '.join(sorted(flags))}]"


def cpu_vendor() -> tuple[str, str]:
    """('AuthenticAMD', 'AMD EPYC 7763 64-Core Processor'): which plugin EPs offer a device
    depends on it (OpenVINO's matches Intel's vendor id only)."""
    vendor, model, _ = _cpuinfo()
    return vendor or "unknown vendor", model


def _cpuinfo() -> tuple[str, str, set[str]]:
    """The first CPU's vendor id, model name and ISA flags from /proc/cpuinfo."""
    vendor, model, flags = "", os.uname().machine, set()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "vendor_id" and not vendor:
            vendor = value.strip()
        elif name in ("model name", "cpu model") and model == os.uname().machine:
            model = " ".join(value.split())
        elif name in ("flags", "features") and not flags:
            flags = set(value.split()) & ISA
    return vendor, model, flags


def no_device(ep: str, device: str, offered: list[str], vendor: str, model: str) -> str:
    """The one line said when a plugin EP offers no device of the kind asked for: by the
    runtime at start, and by `plan` and `providers` before a build."""
    if device == "CPU" and vendor != "GenuineIntel":
        why = f"this CPU is {vendor}, {model}; the plugin offers devices on Intel's (vendor id 0x8086) only"
    else:
        why = f"it offers {', '.join(sorted(set(offered))) or 'none'}" + (
            "; start the container with --device /dev/dri" if device in ("GPU", "NPU") else "")
    return f"the {ep} plugin offers no {device} device here: {why}"


def nvidia_device(index: int = 0) -> str:
    """'gpu: NVIDIA H200 sm90 (driver 13000)' through the driver API (libcuda.so.1, mounted by
    the NVIDIA container toolkit); 'gpu: none (...)' without one."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "gpu: none (libcuda.so.1 not found)"
    device, major, minor, version = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    name = ctypes.create_string_buffer(256)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), index) != 0:
        return "gpu: none (no CUDA device)"
    cuda.cuDeviceGetName(name, 256, device)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)
    cuda.cuDriverGetVersion(ctypes.byref(version))
    return f"gpu: {name.value.decode(errors='replace')} sm{major.value}{minor.value} (driver {version.value})"

# ---------------------------------------------------------------------------------------------
# gpux.json

FORMAT = 2  # gpux.json's version: a runtime reads its own format only (an image's runtime and gpux.json are built together)

Dim = Union[int, str]  # a fixed size (>= 0), -1 or a name: dynamic
Shape = tuple[Dim, ...]
Warmup = Literal["none", "at-start", "baked"]


class ContractError(ValueError):
    """gpux.json does not hold what this runtime reads: one line naming the field."""


class Tensor(NamedTuple):
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


class WorkingMemory(NamedTuple):
    """One term of the graph's intermediate tensors' peak: bytes per product of these request
    dimensions ((input, axis), ...)."""

    dims: tuple[tuple[str, int], ...]
    bytes: int


class ModelFiles(NamedTuple):
    path: str  # the model file, from the app folder
    file: str
    files: tuple[str, ...]  # in the image: the model and its external data, if any
    weights_moved: bool  # the build moved its inline weights to external data
    sha256: str
    size_bytes: int
    opset: int
    nodes: int  # in the main graph: the partition report's total
    working_memory: tuple[WorkingMemory, ...] = ()
    # ONNX Runtime's graph transformers the build ran on this model (pack.optimize's graph, by this
    # image's onnxruntime): its sessions are created without them
    transformers_done: tuple[str, ...] = ()


class Feed(NamedTuple):
    role: str  # input_ids, attention_mask, token_type_ids
    name: str  # the graph's input
    type: str


class TextStep(NamedTuple):
    input: str  # the request's string input
    file: str  # the tokenizer.json, from the app folder
    max_length: int
    padding: Literal["longest", "max_length", "none"]
    truncation: bool
    length: int | None  # the graph fixes the sequence length
    batch: int | None  # the graph fixes the batch dimension
    feeds: tuple[Feed, ...]


class ImageStep(NamedTuple):
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


class AudioStep(NamedTuple):
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


class Preprocessing(NamedTuple):
    """What the image does to a request before the graph sees it, by modality."""

    text: TextStep | None = None
    image: ImageStep | None = None
    audio: AudioStep | None = None

    @property
    def fed(self) -> frozenset[str]:
        """The graph's inputs a step feeds: a request may send them instead, so none is required."""
        text = {f.name for f in self.text.feeds} if self.text else set()
        return frozenset(text | {step.feed for step in (self.image, self.audio) if step})


class ModelSignature(NamedTuple):
    """OpenSSF model signing: the bundle and its public key under assets/."""

    bundle: str
    public_key: str
    verify: bool  # before loading, unless GPUX_VERIFY_MODEL says otherwise


class Plugin(NamedTuple):
    """A plugin EP: the module whose library the runtime registers, and the device it asks for."""

    ep: str
    module: str
    device: str


class Libraries(NamedTuple):
    """The provider's libraries, to say why it did not start."""

    libs: tuple[str, ...] = ()
    dlopen: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()
    driver: tuple[str, ...] = ()  # the GPU driver's, which the container toolkit mounts


class Profile(NamedTuple):
    """A TensorRT optimization profile's shapes for one input."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


class Accuracy(NamedTuple):
    """Warmup's limits: |a - b| <= atol + rtol * |b| against the CPU provider."""

    atol: float
    rtol: float


class RuntimeOptions(NamedTuple):
    timeout: float
    batch_size: int
    enable_profiling: bool


class Batching(NamedTuple):
    max_batch_size: int
    max_delay_ms: float


class Serving(NamedTuple):
    port: int
    host: str
    max_workers: int
    timeout: float
    batching: Batching | None = None
    grpc_port: int | None = None


class GpuxJson(NamedTuple):
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
    provider_names: Mapping[str, str] = MappingProxyType({"cpu": "CPUExecutionProvider"})  # GPUX_PROVIDERS
    cpu_providers: tuple[str, ...] = ("CPUExecutionProvider",)  # the EPs that run on the CPU's cores
    plugin: Plugin | None = None
    ep_context: bool = False  # compile into an EP context model (caches.py)
    libraries: Libraries = Libraries()
    run_flags: str | None = None  # what `docker run` needs for the provider's device
    warmup_profiles: Mapping[str, Profile] = MappingProxyType({})
    accuracy: Accuracy | None = None
    runtime: RuntimeOptions = RuntimeOptions(30.0, 1, False)
    serving: Serving = Serving(8080, "0.0.0.0", 4, 30.0)
    metadata: Mapping[str, Any] = MappingProxyType({})  # gpux.yml's, JSON values
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
    if _is_record(type(value)):
        return {name: dump(v) for name, v in zip(value._fields, value)}
    if isinstance(value, (tuple, list)):
        return [dump(v) for v in value]
    if isinstance(value, Mapping):
        return {k: dump(v) for k, v in value.items()}
    return value


def _is_record(kind: Any) -> bool:
    """One of gpux.json's records (typed named tuples: immutable, and made at import in a
    quarter of a frozen dataclass's time, which every start and CLI command pays)."""
    return isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields")


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
    if _is_record(kind):
        if not isinstance(value, dict):
            raise _wrong(where, "an object", value)
        unknown = sorted(set(value) - set(kind._fields))
        if unknown:
            raise ContractError(f"{_at(where, unknown[0])}: not a field this runtime reads")
        hints, out = _hints(kind), {}
        for name in kind._fields:
            if name in value:
                out[name] = _value(hints[name], value[name], _at(where, name))
            elif name not in kind._field_defaults:
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
    if origin in (dict, Mapping):
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
            type(None): "null"}.get(kind, "an object" if _is_record(kind) else "a list")


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
    if _is_record(kind):
        name = kind.__name__
        if name not in defs:
            defs[name] = {}  # a placeholder while its fields are walked
            hints = _hints(kind)
            body: dict[str, Any] = {
                "type": "object", "additionalProperties": False,
                "properties": {field: _schema(hints[field], defs) for field in kind._fields},
                "required": [field for field in kind._fields if field not in kind._field_defaults],
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
    if origin in (dict, Mapping):
        return {"type": "object", "additionalProperties": _schema(args[1], defs)}
    return {type(None): {"type": "null"}, bool: {"type": "boolean"}, int: {"type": "integer"},
            float: {"type": "number"}, str: {"type": "string"}}[kind]
