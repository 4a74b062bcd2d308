"""gpux.yml: the GPUX format plus the optional `pack:` section.

Loading keeps the YAML line of every key, so a bad field is reported as
`gpux.yml:12: inputs.image.type: unknown type 'flaot32' (did you mean 'float32'?)`.
"""

from __future__ import annotations

import difflib
import re
import string
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gpux_pack.errors import ConfigError, UsageError
from gpux_pack.providers import NOT_FOR_LINUX, PROVIDERS, SHORT_NAMES
from gpux_pack.runtime.dtypes import DTYPES, canonical

CONFIG_NAMES = ("gpux.yml", "gpux.yaml")
ProviderName = Literal["auto", "cpu", "cuda", "tensorrt", "rocm", "migraphx", "openvino"]
Backend = Literal[
    "auto", "cpu", "cuda", "tensorrt", "rocm", "migraphx", "openvino", "coreml", "directml", "metal",
    "dx12", "vulkan",
]  # fmt: skip


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _to_str(value: Any) -> Any:
    """YAML reads `version: 1.0` as a float; a version is text."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Text = Annotated[str, BeforeValidator(_to_str)]

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_memory(value: Any) -> int:
    """'2GB' -> bytes. GPU memory sizes are binary (2GB = 2 GiB), as GPUX reads them."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = _MEMORY.match(str(value))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"'{value}' is not a size such as 512MB or 2GB")
    unit = (m.group(2) or "").upper()[:1]
    return int(float(m.group(1)) * _UNITS[unit])


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
        return value
    if isinstance(value, str) and value.strip():
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
        raise ValueError(f"unknown type '{value}'{_hint(str(value), DTYPES)}")
    return name


DType = Annotated[
    str,
    BeforeValidator(_dtype),
    WithJsonSchema({"type": "string", "examples": sorted(DTYPES)}),
]


class TensorSpec(_Section):
    """One input or output, as GPUX writes it."""

    name: Text
    type: DType | None = None
    shape: list[Dim] | None = None
    required: bool = True
    max_length: int | None = None
    labels: list[Text] | None = None
    description: str | None = None


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
    format: Literal["onnx"] = "onnx"
    version: Text | None = None

    @field_validator("source")
    @classmethod
    def _local(cls, v: str) -> str:
        if re.match(r"^[a-z][a-z0-9+.-]*://", v, re.IGNORECASE):
            raise ValueError("only local files are packaged; download the model and point to it")
        if not v.strip():
            raise ValueError("is empty")
        return v


class GPUSection(_Section):
    memory: Memory | None = None
    backend: Backend = "auto"

    @field_validator("backend")
    @classmethod
    def _linux(cls, v: str) -> str:
        if v in NOT_FOR_LINUX:
            linux = ", ".join(["auto", *PROVIDERS])
            raise ValueError(f"{v}: {NOT_FOR_LINUX[v]} and gpux-pack builds Linux images ({linux})")
        return v


class RuntimeSection(_Section):
    gpu: GPUSection = GPUSection()
    timeout: float = Field(30, gt=0)
    batch_size: int = Field(1, ge=1)
    enable_profiling: bool = False


class ServingSection(_Section):
    port: int = Field(8080, ge=1, le=65535)
    host: str = "0.0.0.0"
    batch_size: int = Field(1, ge=1)
    timeout: float = Field(5, gt=0)
    max_workers: int = Field(4, ge=1, le=256)


class PreprocessingSection(_Section):
    """Accepted for GPUX compatibility; the image serves raw tensors and ignores it."""

    tokenizer: str | None = None
    max_length: int | None = None
    resize: list[int] | None = None
    normalize: str | None = None
    custom: dict[str, Any] | None = None


class TensorRTProfile(_Section):
    min: list[int]
    opt: list[int]
    max: list[int]

    @model_validator(mode="after")
    def _ordered(self) -> "TensorRTProfile":
        if not len(self.min) == len(self.opt) == len(self.max):
            raise ValueError("min, opt and max must have the same rank")
        if any(not (a <= b <= c) for a, b, c in zip(self.min, self.opt, self.max)):
            raise ValueError("each dimension needs min <= opt <= max")
        return self


class TensorRTSection(_Section):
    fp16: bool = False
    int8: bool = False
    workspace: Memory | None = None
    profiles: dict[str, TensorRTProfile] = {}


def _one_or_many(value: Any) -> Any:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _per_provider(value: Any) -> Any:
    return {"*": value} if isinstance(value, str) else value


_TAG_FIELDS = {"name", "version", "provider"}


class PackSection(_Section):
    """Packaging settings (gpux-pack's own; plain GPUX files need none)."""

    providers: Annotated[list[ProviderName], BeforeValidator(_one_or_many)] = []
    base_image: Annotated[
        dict[str, str],
        BeforeValidator(_per_provider),
        WithJsonSchema(
            {"anyOf": [{"type": "string"}, {"type": "object", "additionalProperties": {"type": "string"}}]}
        ),
    ] = {}
    python: Annotated[str | None, BeforeValidator(_to_str)] = Field(None, pattern=r"^3\.\d{1,2}$")
    tag: str | None = None
    requirements: list[str] = []
    warmup: Literal["auto", "always", "never"] = "auto"
    tensorrt: TensorRTSection = TensorRTSection()
    labels: dict[str, Text] = {}
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
    device_id: int = Field(0, ge=0, description="GPU the CUDA/TensorRT/ROCm/MIGraphX provider uses")
    provider_options: dict[str, dict[str, Union[str, int, float, bool]]] = Field(
        {}, description="Extra ONNX Runtime provider options, by provider (cuda: {cudnn_conv_algo_search: HEURISTIC})"
    )

    @field_validator("base_image")
    @classmethod
    def _known(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if key != "*" and key not in PROVIDERS:
                raise ValueError(f"unknown provider '{key}'{_hint(key, PROVIDERS)}")
        return v

    @field_validator("provider_options")
    @classmethod
    def _known_eps(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for key in v:
            if key not in SHORT_NAMES and key not in SHORT_NAMES.values():
                raise ValueError(f"unknown provider '{key}'{_hint(key, [*SHORT_NAMES, *SHORT_NAMES.values()])}")
        return v

    @field_validator("tag")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            used = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
        except ValueError as e:
            raise ValueError(f"bad template: {e}") from None
        unknown = used - _TAG_FIELDS
        if unknown:
            raise ValueError(
                f"unknown placeholder {{{sorted(unknown)[0]}}}; use {{name}}, {{version}}, {{provider}}"
            )
        return v

    @field_validator("requirements")
    @classmethod
    def _pep508(cls, v: list[str]) -> list[str]:
        for item in v:
            try:
                Requirement(item)
            except InvalidRequirement as e:
                raise ValueError(f"'{item}' is not a requirement: {e}") from None
        return v


class GpuxConfig(_Section):
    """A gpux.yml file."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="gpux.yml")

    name: Text = Field(min_length=1)
    version: Text = "1.0.0"
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


# ---------------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True)
class Project:
    """A loaded gpux.yml: the config, where it lives, and the line of every key."""

    config_path: Path
    config: GpuxConfig
    lines: dict[tuple[Any, ...], int]

    @property
    def root(self) -> Path:
        return self.config_path.parent

    @property
    def display(self) -> str:
        return _display(self.config_path)

    @property
    def model_path(self) -> Path:
        return (self.root / self.config.model.source).resolve()

    def error(self, path: tuple[Any, ...], problem: str) -> ConfigError:
        """A ConfigError pointing at a field of this file."""
        return ConfigError(self.display, _dotted(path), problem, self.line(path))

    def line(self, path: tuple[Any, ...]) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def find_config(path: Path) -> Path:
    """PATH is a folder holding gpux.yml, or the file itself."""
    if path.is_dir():
        for name in CONFIG_NAMES:
            if (path / name).is_file():
                return path / name
        raise UsageError(f"{_display(path)}: no gpux.yml in this folder")
    if not path.exists():
        raise UsageError(f"{_display(path)}: no such file or folder")
    return path


def load_project(path: Path) -> Project:
    config_path = find_config(Path(path)).resolve()
    display = _display(config_path)
    try:
        text = config_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(display, None, f"cannot read: {e}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(display, None, f"invalid YAML: {problem}", mark.line + 1 if mark else None) from None
    if data is None:
        raise ConfigError(display, None, "is empty; it needs at least `name` and `model.source`")
    if not isinstance(data, dict):
        raise ConfigError(display, None, f"must be a mapping of fields, not a {type(data).__name__}", 1)
    lines: dict[tuple[Any, ...], int] = {}
    _positions(node, (), lines, display)
    try:
        config = GpuxConfig.model_validate(data)
    except ValidationError as e:
        raise _first_error(e, data, lines, display) from None
    return Project(config_path, config, lines)


def _positions(node: yaml.Node, path: tuple[Any, ...], out: dict, display: str) -> None:
    """Record the 1-based line of every key and list item; reject duplicate keys (YAML keeps
    the last one silently, which hides mistakes)."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise ConfigError(display, _dotted((*path, key)), "duplicate key", key_node.start_mark.line + 1)
            seen.add(key)
            out[(*path, key)] = key_node.start_mark.line + 1
            _positions(value_node, (*path, key), out, display)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, i)] = item.start_mark.line + 1
            _positions(item, (*path, i), out, display)


def _first_error(err: ValidationError, data: dict, lines: dict, display: str) -> ConfigError:
    problems = []
    for item in err.errors():
        path = _yaml_path(data, item["loc"])
        problems.append((lines.get(path) or _nearest(lines, path) or 0, path, item))
    problems.sort(key=lambda p: p[0])
    line, path, item = problems[0]
    message = _message(item)
    if len(problems) > 1:
        message += f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
    return ConfigError(display, _dotted(path) or None, message, line or None)


def _yaml_path(data: Any, loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """pydantic's location -> the path in the YAML document. Mapping-form inputs/outputs are
    validated as lists, so list indexes are turned back into the mapping's keys."""
    path: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, int) and part < len(node):
            part = list(node)[part]
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            node = None
        path.append(part)
    return tuple(path)


def _nearest(lines: dict, path: tuple[Any, ...]) -> int | None:
    while path:
        path = path[:-1]
        if path in lines:
            return lines[path]
    return None


def _message(item: dict[str, Any]) -> str:
    kind, loc = item["type"], item["loc"]
    if kind == "extra_forbidden":
        allowed = _fields_at(loc[:-1])
        return f"unknown key '{loc[-1]}'{_hint(str(loc[-1]), allowed)}"
    if kind == "missing":
        return "is required"
    msg = item["msg"]
    msg = re.sub(r"^(Value|Assertion) error, ", "", msg)
    if kind == "literal_error":
        msg = f"'{item.get('input')}' is not one of {item['ctx']['expected']}"
    return msg


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at a location, for 'did you mean' hints."""
    t: Any = GpuxConfig
    for part in loc:
        t = _unwrap(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            field = t.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return []
            t = field.annotation
        elif typing.get_origin(t) in (list, tuple):
            t = typing.get_args(t)[0]
        elif typing.get_origin(t) is dict:
            t = typing.get_args(t)[1]
        else:
            return []
    t = _unwrap(t)
    if typing.get_origin(t) in (list, tuple):  # e.g. inputs: the item's fields
        t = _unwrap(typing.get_args(t)[0])
    return list(t.model_fields) if isinstance(t, type) and issubclass(t, BaseModel) else []


def _unwrap(t: Any) -> Any:
    while True:
        origin = typing.get_origin(t)
        if origin is Annotated:
            t = typing.get_args(t)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            t = args[0]
        else:
            return t


def _hint(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _display(path: Path) -> str:
    """Paths in messages are relative to the working folder when they are inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
