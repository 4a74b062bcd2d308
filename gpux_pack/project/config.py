"""gpux.yml's schema: the GPUX format plus the optional `pack:` section.

Every value that later reaches a Dockerfile, a path or gpux.json is constrained here (names,
versions, label keys, image references, hosts, finite bounded numbers); load.py loads the
file and turns pydantic's errors into `gpux.yml:12: field: problem` lines.

It reads what GPUX reads: durations with units (`5s`), sizes in bytes or with units, format,
backend and type names in any case, `key:` left empty as "not set". Unknown keys are load.py's
business (a warning each, or a refusal with --strict)."""

from __future__ import annotations

import hashlib
import ipaddress
import re
import string
import unicodedata
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    BaseModel,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gpux_pack.providers import EP_NAMES, NOT_FOR_LINUX, PROVIDERS, provider_alias, provider_name, provider_names
from gpux_pack.reference import parse_reference
from gpux_pack.runtime.contract import DTYPES, canonical

CONFIG_NAMES = ("gpux.yml", "gpux.yaml")
BACKENDS = ("auto", *EP_NAMES, *NOT_FOR_LINUX)
Backend = Literal[BACKENDS]  # type: ignore[valid-type]
MAX_SIZE = 2**31 - 1  # a tensor dimension, a profile size
MAX_SECONDS = 86_400.0


class _Section(BaseModel):
    # NaN and infinity are not JSON: gpux.json is strict, and a timeout of .inf crashes a server
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _unset(cls, data: Any) -> Any:
        """`serving:` or `timeout:` with nothing after it (YAML's null) means "not set", as GPUX
        reads it: the default, where the field has one other than null."""
        if isinstance(data, dict):
            fields = cls.model_fields
            return {k: v for k, v in data.items()
                    if not (v is None and k in fields and fields[k].default is not None)}
        return data


def _to_str(value: Any) -> Any:
    """YAML reads `version: 1.0` as a float; a version is text."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Text = Annotated[str, BeforeValidator(_to_str)]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", re.ASCII)
_LABEL_KEY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,254}[A-Za-z0-9])?", re.ASCII)


def _shown(value: str) -> str:
    """A user's value in a message: control characters and line breaks made visible, long
    values cut."""
    value = value if len(value) <= 80 else value[:60] + "..."
    return ascii(value) if not value.isprintable() else f"'{value}'"


def _matching(pattern: re.Pattern[str], what: str) -> Any:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{_shown(value)} is not a valid {what}")
        return value

    return AfterValidator(check)


def _display_name(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("is empty")
    if len(value) > 128 or any(unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp")
                               for c in value):
        raise ValueError(f"{_shown(value)} is not a name: at most 128 characters on one line, no control characters")
    return value


DisplayName = Annotated[
    Text,
    AfterValidator(_display_name),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 128}),
]


def model_name(name: str) -> str:
    """The name the image serves under (KServe v2 URLs, the io.gpux.model.name label, the default
    tag): gpux.yml's name when it is one (letters, digits, '.', '_', '-'), else made from it, the
    same every time: 'Sentiment Analysis' -> 'sentiment-analysis', 'Modèle' -> 'modele'. The name
    as written stays the title (/info, org.opencontainers.image.title)."""
    if _NAME.fullmatch(name):
        return name
    plain = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    made = re.sub(r"[^a-z0-9]+", "-", plain.lower()).strip("-")[:100].strip("-")
    return made or "model-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
Version = Annotated[
    Text,
    _matching(_VERSION, "version: letters, digits, '.', '_', '+' and '-', at most 128"),
    WithJsonSchema({"type": "string", "pattern": f"^{_VERSION.pattern}$"}),
]
LabelKey = Annotated[
    str,
    _matching(_LABEL_KEY, "label key: letters, digits, '.', '/', '_' and '-' (e.g. com.example.team)"),
    WithJsonSchema({"type": "string", "pattern": f"^{_LABEL_KEY.pattern}$"}),
]


def _image_reference(value: str) -> str:
    if value in ("default", "vendor"):
        return value
    parse_reference(value)  # ValueError says what is wrong
    return value


ImageRef = Annotated[str, AfterValidator(_image_reference)]

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", re.IGNORECASE)
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def parse_seconds(value: Any) -> Any:
    """GPUX writes timeouts as seconds (`5`) and its examples as `5s`: both, and ms, m, h."""
    if isinstance(value, str):
        try:
            return float(value)  # '30', '1e3': a number, checked against the bounds as one
        except ValueError:
            pass
        m = _DURATION.fullmatch(value) if len(value) <= 32 else None
        if not m:
            raise ValueError(f"{_shown(value)} is not a duration such as 5, 5s, 500ms or 2m")
        return float(m.group(1)) * _SECONDS[(m.group(2) or "s").lower()]
    return value


Seconds = Annotated[
    float,
    BeforeValidator(parse_seconds),
    Field(gt=0, le=MAX_SECONDS),
    WithJsonSchema({"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS},
                              {"type": "string", "pattern": f"^{_DURATION.pattern}$"}]}),
]


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_MAX_BYTES = 1024**5


def parse_memory(value: Any) -> int:
    """'2GB' -> bytes. GPU memory sizes are binary (2GB = 2 GiB), as GPUX reads them."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX_BYTES:
        return value
    m = _MEMORY.fullmatch(str(value)) if len(str(value)) <= 32 else None
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{_shown(str(value))} is not a size such as 512MB or 2GB")
    unit = (m.group(2) or "").upper()[:1]
    size = int(float(m.group(1)) * _UNITS[unit])
    if size > _MAX_BYTES:
        raise ValueError(f"{_shown(str(value))} is more than 1 PiB")
    return size


Memory = Annotated[
    int,
    BeforeValidator(parse_memory),
    WithJsonSchema({"anyOf": [{"type": "string", "pattern": _MEMORY.pattern}, {"type": "integer"}]}),
]


def _dim(value: Any) -> int | str:
    if value is None:
        return -1
    if isinstance(value, bool):
        raise ValueError("a dimension is a size, -1 or a name, not a boolean")
    if isinstance(value, int):
        if value < -1:
            raise ValueError(f"dimension {value} is negative; use -1 or a name for a dynamic one")
        if value > MAX_SIZE:
            raise ValueError(f"dimension {value} is larger than {MAX_SIZE}")
        return value
    if isinstance(value, str) and value.strip():
        if not value.strip().isprintable() or len(value) > 128:
            raise ValueError(f"dimension name {_shown(value)} must be printable text of at most 128 characters")
        return value.strip()
    raise ValueError(f"dimension {value!r} must be a size, -1 or a name such as 'batch'")


Dim = Annotated[
    Union[int, str],
    BeforeValidator(_dim),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": -1}, {"type": "string"}]}),
]


def _dtype(value: Any) -> str:
    name = canonical(str(value))
    if name is None:
        raise ValueError(f"unknown type '{value}'{hint(str(value), DTYPES)}")
    return name


DType = Annotated[
    str,
    BeforeValidator(_dtype),
    WithJsonSchema({"type": "string", "examples": sorted(DTYPES)}),
]


class TensorSpec(_Section):
    """One input or output: as gpux.yml declares it, and (with every field set) as the model
    has it. The packager's only tensor type; the runtime has its own."""

    name: Text
    type: DType | None = None
    shape: tuple[Dim, ...] | None = None
    required: bool = True
    max_length: int | None = Field(None, ge=1, le=MAX_SIZE)
    labels: tuple[Text, ...] | None = None
    description: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The entry in gpux.json."""
        out: dict[str, Any] = {"name": self.name, "type": self.type,
                               "shape": list(self.shape) if self.shape is not None else None}
        if not self.required:
            out["required"] = False
        for key in ("labels", "description", "max_length"):
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if key == "labels" else value
        return out


def _tensor_list(value: Any) -> Any:
    """GPUX accepts both `- name: x` lists and `x: {...}` mappings (or `x: float32`)."""
    if isinstance(value, dict):
        items = []
        for name, spec in value.items():
            if isinstance(spec, dict):
                items.append({"name": name, **spec})
            elif spec is None:
                items.append({"name": name})
            else:
                items.append({"name": name, "type": spec})
        return items
    return value


TensorList = Annotated[list[TensorSpec], BeforeValidator(_tensor_list)]


class ModelSection(_Section):
    source: str
    format: Annotated[Literal["onnx"], BeforeValidator(_lower)] = "onnx"

    version: Version | None = None

    @field_validator("source")
    @classmethod
    def _local(cls, v: str) -> str:
        if re.match(r"^[a-z][a-z0-9+.-]*://", v, re.IGNORECASE):
            raise ValueError("only local files are packaged; download the model and point to it")
        if not v.strip():
            raise ValueError("is empty")
        if not v.isprintable():
            raise ValueError(f"{_shown(v)} is not a usable path (control characters or line breaks)")
        if len(v) > 4096:
            raise ValueError(f"{_shown(v)} is longer than 4096 characters")
        return v


class GPUSection(_Section):
    memory: Memory | None = None
    backend: Annotated[Backend, BeforeValidator(provider_alias)] = "auto"

    @field_validator("backend")
    @classmethod
    def _linux(cls, v: str) -> str:
        if v in NOT_FOR_LINUX:
            linux = ", ".join(["auto", *PROVIDERS])
            raise ValueError(f"{v}: {NOT_FOR_LINUX[v]} and gpux-pack builds Linux images ({linux})")
        return v


class RuntimeSection(_Section):
    gpu: GPUSection = GPUSection()
    timeout: Seconds = 30
    batch_size: int = Field(1, ge=1, le=65536)
    enable_profiling: bool = False


class BatchingSection(_Section):
    """Dynamic batching: concurrent requests merged into one session.run (models whose every
    input and output has a dynamic first dimension)."""

    max_batch_size: int = Field(8, ge=1, le=4096)
    max_delay_ms: float = Field(2.0, ge=0, le=1000, description="How long a run waits for more requests")


class ServingSection(_Section):
    port: int = Field(8080, ge=1, le=65535)
    host: str = Field("0.0.0.0", description="Address the server binds: an IPv4/IPv6 address or localhost")
    batch_size: int = Field(1, ge=1, le=65536, description="GPUX's: above 1, dynamic batching up to this many rows")
    batching: BatchingSection | None = None
    grpc_port: int | None = Field(None, ge=1, le=65535, description="Also serve KServe v2 over gRPC on this port "
                                                                     "(adds grpcio to the image)")
    timeout: Seconds = 5
    max_workers: int = Field(4, ge=1, le=256)

    @model_validator(mode="after")
    def _two_ports(self) -> "ServingSection":
        if self.grpc_port is not None and self.grpc_port == self.port:
            raise ValueError(f"grpc_port {self.grpc_port} is also the HTTP port; choose another")
        return self

    @field_validator("host")
    @classmethod
    def _address(cls, v: str) -> str:
        if v != "localhost":
            try:
                ipaddress.ip_address(v)
            except ValueError:
                raise ValueError(f"{_shown(v)} is not an IP address to bind (e.g. 0.0.0.0, ::, 127.0.0.1)") from None
        return v


TokenRole = Literal["input_ids", "attention_mask", "token_type_ids"]


class PreprocessingSection(_Section):
    """What the image does to a request before the graph sees it (project/preprocess.py): text
    tokenized, images decoded and resized, audio turned into a log-mel spectrogram."""

    tokenizer: Annotated[Text, Field(min_length=1, max_length=512)] | None = None
    max_length: int | None = Field(None, ge=1, le=1 << 20)
    padding: bool | Literal["longest", "max_length"] = True  # true: to the longest text of a request
    truncation: bool = True  # texts longer than max_length are cut (false: refused, 400)
    token_inputs: dict[TokenRole, Text] | None = None  # the graph's names for the token inputs
    # images: [width, height] each; normalize: imagenet | none (pixels / 255 only); custom: {mean, std, resize, crop}
    resize: Annotated[list[Annotated[int, Field(ge=1, le=16384)]], Field(min_length=2, max_length=2)] | None = None
    crop: Annotated[list[Annotated[int, Field(ge=1, le=16384)]], Field(min_length=2, max_length=2)] | None = None
    normalize: Text | None = None  # imagenet | none | custom (checked where an image step applies)
    custom: dict[str, Any] | None = None
    letterbox: bool = False  # keep the aspect ratio, pad to the size (YOLO's 114 gray, centred)
    # audio (Whisper's front end): a log-mel spectrogram of the declared shape
    sample_rate: int | None = Field(None, ge=1000, le=384000)
    n_mels: int | None = Field(None, ge=1, le=512)
    n_fft: int | None = Field(None, ge=16, le=65536)
    hop_length: int | None = Field(None, ge=1, le=65536)
    chunk_length: float | None = Field(None, gt=0, le=3600)


ProfileDims = list[Annotated[int, Field(ge=0, le=MAX_SIZE)]]


class TensorRTProfile(_Section):
    min: ProfileDims
    opt: ProfileDims
    max: ProfileDims

    @model_validator(mode="after")
    def _ordered(self) -> "TensorRTProfile":
        if not len(self.min) == len(self.opt) == len(self.max):
            raise ValueError("min, opt and max must have the same rank")
        if any(not (a <= b <= c) for a, b, c in zip(self.min, self.opt, self.max)):
            raise ValueError("each dimension needs min <= opt <= max")
        return self


class AccuracySection(_Section):
    """Warmup compares the provider's answers with the CPU provider's on its inputs; beyond
    |a - b| <= atol + rtol * |b| the warmup (and a build that bakes it) fails."""

    atol: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    rtol: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0


class TensorRTSection(_Section):
    fp16: bool = False
    int8: bool = False
    workspace: Memory | None = None
    profiles: dict[str, TensorRTProfile] = {}
    ep_context: bool = Field(False, description="Also write an EP context model (engine embedded) into the cache, "
                                                "so a later start skips TensorRT's builder")


class OpenVINOSection(_Section):
    device: Literal["CPU", "GPU", "NPU"] = Field("CPU", description="The OpenVINO device the plugin compiles for")
    precision: Literal["f32", "f16", "bf16", "auto"] = Field(
        "f32", description="INFERENCE_PRECISION_HINT; auto: the device's default (bf16 on CPUs with AMX, "
                           "which changes answers against the CPU provider)")


def _one_or_many(value: Any) -> Any:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _per_provider(value: Any) -> Any:
    return {"*": value} if isinstance(value, str) else value


_TAG_FIELDS = {"name", "version", "provider"}


def tag_template_parts(template: str) -> list[tuple[str, str | None]]:
    """A tag template as (literal text, placeholder or None) pairs; ValueError naming what is
    wrong. Only {name}, {version} and {provider}, without a conversion or a format spec: a
    width such as {name:>100000000} would make str.format allocate that many characters."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"bad template: {e}") from None
    parts = []
    for literal, field, spec, conversion in parsed:
        if field is not None and field not in _TAG_FIELDS:
            raise ValueError(f"unknown placeholder {{{ascii(field[:40])[1:-1]}}}; use {{name}}, {{version}}, {{provider}}")
        if spec or conversion:
            raise ValueError(f"{{{field}}} takes no format spec or conversion; write {{{field}}} alone")
        parts.append((literal, field))
    return parts


OPTIMIZE_MODES = ("graph", "int8", "fp16")


def _optimize_steps(value: Any) -> Any:
    """`optimize: int8`, `optimize: [graph, int8]` or `optimize: graph,int8` are the steps alone."""
    if isinstance(value, (str, list)):
        return {"steps": value}
    return value


class OptimizeSection(_Section):
    """What the build does to the model before it ships, each step checked against the original
    model on sample inputs (gpux_pack/optimize.py)."""

    steps: Annotated[list[Literal["graph", "int8", "fp16"]], BeforeValidator(_one_or_many)] = Field(
        [], description="graph: ONNX Runtime's offline graph optimisation for the provider, saved into the image; "
        "int8: weights quantised to 8 bits (dynamic; static with samples), cpu images; fp16: float16 weights and "
        "arithmetic, inputs and outputs kept in their types, GPU images")
    tolerance: Union[Annotated[float, Field(ge=0, allow_inf_nan=False)],
                     dict[Text, Annotated[float, Field(ge=0, allow_inf_nan=False)]], None] = Field(
        None, description="The largest error allowed on each output: the relative L2 error against the original "
        "model's answer (the difference's root mean square over the answer's; for non-float outputs the share of "
        "elements that differ); one number for every output or one per output name; default per step: graph "
        "0.0001, int8 0.15, fp16 0.01")
    samples: str | None = Field(
        None, description="An .npz file (arrays named by the model's inputs) or a folder of them: the inputs the "
        "check runs, and int8's calibration (static quantisation); default: 4 inputs generated from the graph's "
        "types and shapes with a fixed seed")

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a step is named twice")
        if "int8" in v and "fp16" in v:
            raise ValueError("int8 and fp16 exclude each other: choose one")
        return [mode for mode in OPTIMIZE_MODES if mode in v]  # always run in this order


class PackSection(_Section):
    """Packaging settings (gpux-pack's own; plain GPUX files need none)."""

    providers: Annotated[
        list[Annotated[str, AfterValidator(provider_name)]],
        BeforeValidator(_one_or_many),
        AfterValidator(provider_names),
        WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"enum": ["auto", *EP_NAMES]}}]}),
    ] = []
    base_image: Annotated[
        dict[str, ImageRef],
        BeforeValidator(_per_provider),
        WithJsonSchema(
            {"anyOf": [{"type": "string"}, {"type": "object", "additionalProperties": {"type": "string"}}]}
        ),
    ] = {}
    python: Annotated[str | None, BeforeValidator(_to_str)] = Field(None, pattern=r"^3\.\d{1,2}$")
    tag: str | None = None
    requirements: list[str] = []
    warmup: Literal["auto", "always", "never"] = "auto"
    shapes: Literal["graph", "declared"] = Field(
        "graph", description="Whose sizes the image takes on a dimension the graph leaves dynamic: graph (any size, "
        "as GPUX, whose docs write fixed shapes it never enforces: a size in gpux.yml is a note) or declared (a size "
        "in gpux.yml narrows it to that size). A name in gpux.yml always replaces the graph's",
    )
    weights: Literal["auto", "inline", "external"] = Field(
        "auto", description="How the image stores a model's large inline weights: external moves them to a data file "
        "beside the model, each at a page-aligned offset (ONNX Runtime maps them: it starts the model faster); "
        "inline keeps the model file as given; auto: external from 64 MiB of inline weights",
    )
    tensorrt: TensorRTSection = TensorRTSection()
    openvino: OpenVINOSection = OpenVINOSection()
    accuracy: AccuracySection | None = None
    optimize: Annotated[OptimizeSection, BeforeValidator(_optimize_steps)] = Field(
        OptimizeSection(), description="Optimise the model at build, each step checked against the original "
        "(off by default): a step, a list of steps, or {steps, tolerance, samples}")
    labels: dict[LabelKey, Text] = {}
    cuda: Annotated[Literal["12", "13"], BeforeValidator(_to_str)] = Field(
        "13", description="CUDA major version of the cuda/tensorrt images (ONNX Runtime <= 1.26 for 12)"
    )
    nvidia_libs: Literal["wheels", "base"] | None = Field(
        None,
        description="Where CUDA/cuDNN come from: NVIDIA's PyPI wheels, or the base image (vendor bases, "
        "Jetson). Default: what the base image calls for.",
    )
    link_check: bool = Field(
        True, description="Check at build time that the provider's shared libraries resolve in the image"
    )
    contained: bool = Field(
        False, description="Read nothing outside the project's folder: gpux.yml, the model and its external data "
        "must resolve inside it (a CI that builds projects it does not trust passes --contained instead: a project "
        "cannot turn that off)",
    )
    strict: bool = Field(
        False, description="Refuse keys and values gpux-pack cannot act on (unknown keys, tensor types that are no "
        "element type, another OS's backend); by default each is a warning and left out, as GPUX accepts them",
    )
    verify_model: bool = Field(
        False, description="With a model signed at build (build --sign-model KEY): the image checks the signature "
        "and every model file's sha256 before loading, and refuses to start on any difference (GPUX_VERIFY_MODEL=1 "
        "asks the same of any image)",
    )
    device_id: int = Field(0, ge=0, le=1023, description="GPU the CUDA/TensorRT/ROCm/MIGraphX provider uses")
    provider_options: dict[str, dict[str, Union[str, int, float, bool]]] = Field(
        {}, description="Extra ONNX Runtime provider options, by provider (cuda: {cudnn_conv_algo_search: HEURISTIC})"
    )

    @field_validator("base_image")
    @classmethod
    def _known(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if key != "*" and key not in PROVIDERS:
                raise ValueError(f"unknown provider '{key}'{hint(key, PROVIDERS)}")
        return v

    @field_validator("provider_options")
    @classmethod
    def _known_eps(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for key in v:
            if key not in EP_NAMES and key not in EP_NAMES.values():
                raise ValueError(f"unknown provider '{key}'{hint(key, [*EP_NAMES, *EP_NAMES.values()])}")
        return v

    @field_validator("tag")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            tag_template_parts(v)
        return v

    @field_validator("requirements")
    @classmethod
    def _pep508(cls, v: list[str]) -> list[str]:
        # packaging's requirement parser is 14 ms of import: only gpux.yml files that list
        # requirements pay it, not every build
        from packaging.requirements import InvalidRequirement, Requirement

        for item in v:
            try:
                Requirement(item)
            except InvalidRequirement as e:
                raise ValueError(f"'{item}' is not a requirement: {e}") from None
        return v


class GpuxConfig(_Section):
    """A gpux.yml file."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="gpux.yml")

    name: DisplayName
    version: Version = "1.0.0"
    description: str | None = None
    model: ModelSection
    inputs: TensorList | None = None
    outputs: TensorList | None = None
    runtime: RuntimeSection = RuntimeSection()
    serving: ServingSection = ServingSection()
    preprocessing: PreprocessingSection | None = None
    metadata: dict[str, Any] = {}
    pack: PackSection = PackSection()

    @field_validator("inputs", "outputs")
    @classmethod
    def _unique(cls, v: list[TensorSpec] | None) -> list[TensorSpec] | None:
        seen: set[str] = set()
        for spec in v or []:
            if spec.name in seen:
                raise ValueError(f"'{spec.name}' is listed twice")
            seen.add(spec.name)
        return v


def json_schema() -> dict[str, Any]:
    """JSON Schema of gpux.yml, for editors (yaml-language-server) and CI linters."""
    schema = GpuxConfig.model_json_schema()
    # inputs/outputs validate as lists; in the file they may also be a mapping name -> spec.
    item = {"$ref": "#/$defs/TensorSpec"}
    by_name = {"anyOf": [{"$ref": "#/$defs/TensorSpec"}, {"type": "string"}, {"type": "null"}]}
    for key in ("inputs", "outputs"):
        schema["properties"][key] = {
            "anyOf": [{"type": "array", "items": item}, {"type": "object", "additionalProperties": by_name}, {"type": "null"}],
            "description": f"The model's {key}: a list of specs, or a mapping name -> spec. Omit to read them from the model.",
        }
    # in mapping form the name is the key
    schema["$defs"]["TensorSpec"]["required"] = []
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://github.com/gpux/gpux-pack/blob/main/gpux.schema.json"
    return schema


def hint(word: str, choices: Any) -> str:
    import difflib  # only a mistake pays for it

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
