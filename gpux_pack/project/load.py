"""Loading gpux.yml: safe YAML with the line of every key, validated against the schema in
config.py, with pydantic's errors turned into `gpux.yml:12: inputs.image.type: problem` lines.

Before validation, as GPUX promises: `${VAR}` and `${VAR:-default}` in values are expanded from
this process's environment (never inside the image). What GPUX accepts and gpux-pack cannot act
on (an unknown key, a tensor type that is no element type, a backend for another OS) is one
warning each and left out, unless the build is strict (--strict or pack.strict: true): then it
is refused, as a typo should be."""

from __future__ import annotations

import os
import re
import typing
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, ValidationError

from gpux_pack.project import safe_yaml
from gpux_pack.project.config import BACKENDS, CONFIG_NAMES, GpuxConfig, TensorSpec, hint
from gpux_pack.errors import ConfigError, UsageError
from gpux_pack.providers import NOT_FOR_LINUX, provider_alias
from gpux_pack.runtime.contract import DTYPES, canonical

# Keys of the GPUX format that gpux-pack reads and does not act on: a warning each, never a refusal.
NOT_ACTED_ON: dict[tuple[str, ...], str] = {
    ("runtime", "timeout"): "not used: serving.timeout bounds each request",
}
MAX_EXPANDED_VALUE = 64 << 10  # characters one value may hold once its ${VAR}s are expanded
MAX_EXPANDED = safe_yaml.MAX_BYTES  # characters all expanded values may add to the file, together
_VARIABLE = re.compile(r"\$\$|\$\{([^}]*)\}|\$\{")
_VARIABLE_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)(.*))?", re.DOTALL)


@dataclass(frozen=True)
class Project:
    """A loaded gpux.yml: the config, where it lives, and the line of every key."""

    config_path: Path
    config: GpuxConfig
    lines: dict[tuple[Any, ...], int]
    notes: tuple[str, ...] = ()  # warnings: what was left out or not acted on, with file:line
    variables: tuple[tuple[str, str | None], ...] = ()  # ${VAR}s used and their values (None: unset)
    strict: bool = False

    @property
    def root(self) -> Path:
        return self.config_path.parent

    @property
    def display(self) -> str:
        return _display(self.config_path)

    @property
    def model_path(self) -> Path:
        # os.path.realpath, not Path.resolve: a symlink loop must not raise (pipeline.load
        # then reports the path as unreadable)
        return Path(os.path.realpath(self.root / self.config.model.source))

    def error(self, path: tuple[Any, ...], problem: str) -> ConfigError:
        """A ConfigError pointing at a field of this file."""
        return ConfigError(self.display, _dotted(path), problem, self.line(path))

    def note(self, path: tuple[Any, ...], text: str) -> str:
        """A warning about a field of this file, `gpux.yml:12: field: text`."""
        return f"{_where(self.display, self.lines, path)}: {text}"

    def line(self, path: tuple[Any, ...]) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def find_config(path: Path) -> Path:
    """PATH is a folder holding gpux.yml, or the file itself."""
    try:
        if path.is_dir():
            for name in CONFIG_NAMES:
                if (path / name).is_file():
                    return path / name
            raise UsageError(f"{_display(path)}: no gpux.yml in this folder")
        if not path.exists():
            raise UsageError(f"{_display(path)}: no such file or folder")
        os.stat(path)  # a symlink loop or an over-long name fails here, not later
    except OSError as e:  # ENAMETOOLONG, ELOOP: pathlib raises them on 3.11
        raise UsageError(f"{_display(path)}: cannot read: {e.strerror or e}") from None
    return path  # safe_yaml.read_text refuses FIFOs and devices


def load_project(path: Path, strict: bool = False) -> Project:
    """strict: refuse what is otherwise a warning (pack.strict: true in the file does the same)."""
    config_path = Path(os.path.realpath(find_config(Path(path))))
    display = _display(config_path)
    try:
        text = safe_yaml.read_text(config_path)
    except OSError as e:
        raise ConfigError(display, None, f"cannot read: {e}") from None
    try:
        node, data = safe_yaml.compose_and_construct(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(display, None, f"invalid YAML: {problem}", mark.line + 1 if mark else None) from None
    if data is None:
        raise ConfigError(display, None, "is empty; it needs at least `name` and `model.source`")
    if not isinstance(data, dict):
        raise ConfigError(display, None, f"must be a mapping of fields, not a {type(data).__name__}", 1)
    lines: dict[tuple[Any, ...], int] = {}
    repeated: list[tuple[tuple[Any, ...], int]] = []
    _positions(node, (), lines, repeated)
    found = safe_yaml.non_json(data)
    if found:
        where, problem = found
        raise ConfigError(display, _dotted(where) or None, problem, _line(lines, where))
    variables: dict[str, str | None] = {}
    data = _expand(data, (), variables, lines, display, [0])  # a copy: a YAML alias's places no longer share objects
    pack = data.get("pack")
    strict = strict or (isinstance(pack, dict) and pack.get("strict") is True)
    if repeated and strict:
        raise ConfigError(display, _dotted(repeated[0][0]), "duplicate key", repeated[0][1])
    notes = [f"{display}:{line}: {_dotted(path)}: duplicate key; the last one counts, as YAML readers take it"
             for path, line in repeated]
    notes += [] if strict else _leave_out(data, lines, display)
    notes += [f"{_where(display, lines, p)}: {why}" for p, why in _not_acted_on(data)]
    try:
        config = GpuxConfig.model_validate(data)
    except ValidationError as e:
        raise _first_error(e, data, lines, display) from None
    return Project(config_path, config, lines, tuple(notes), tuple(sorted(variables.items())), strict)


def _expand(value: Any, path: tuple[Any, ...], used: dict[str, str | None], lines: dict, display: str,
            added: list[int]) -> Any:
    """`${VAR}`, `${VAR:-default}` (unset or empty), `${VAR-default}` (unset) in every text value,
    from this process's environment; `$$` is a `$`. A missing variable without a default is an
    error naming it and the field. Bounded as the file is: a value may grow to
    MAX_EXPANDED_VALUE characters and the whole file by MAX_EXPANDED (`added`: what the values
    expanded so far added), checked before the text is joined (a short file repeating a long
    variable would otherwise hold hundreds of MB)."""
    if isinstance(value, dict):
        return {k: _expand(v, (*path, k), used, lines, display, added) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, (*path, i), used, lines, display, added) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value
    size = [len(value)]

    def one(m: re.Match[str]) -> str:
        text = _substitute(m, path, used, lines, display)
        size[0] += len(text) - len(m.group(0))
        added[0] += max(len(text) - len(m.group(0)), 0)
        if size[0] > MAX_EXPANDED_VALUE or added[0] > MAX_EXPANDED:
            limit = (f"past {MAX_EXPANDED_VALUE} characters" if size[0] > MAX_EXPANDED_VALUE
                     else f"the file past {MAX_EXPANDED} expanded characters")
            raise ConfigError(display, _dotted(path), f"{_cut(m.group(0))[1:-1]} ({len(text)} characters) expands this value "
                                                      f"{limit}; a gpux.yml value is a name, a path or a setting",
                              _line(lines, path))
        return text

    return _VARIABLE.sub(one, value)


def _substitute(m: re.Match[str], path: tuple[Any, ...], used: dict[str, str | None], lines: dict,
                display: str) -> str:
    """The text one `${...}` (or `$$`) stands for."""
    if m.group(0) == "$$":
        return "$"
    inner = _VARIABLE_NAME.fullmatch(m.group(1) or "")
    if m.group(1) is None or inner is None:
        raise ConfigError(display, _dotted(path), f"{_cut(m.group(0))} is not a variable: write ${{NAME}}, "
                                                  "${NAME:-default}, or $$ for a $", _line(lines, path))
    name, how, default = inner.groups()
    found = os.environ.get(name)
    used[name] = found
    if found is None or (how == ":-" and found == ""):
        if how is None:
            raise ConfigError(display, _dotted(path), f"${{{name}}} is not set in the environment (give it a "
                                                      f"value, or a default: ${{{name}:-...}})", _line(lines, path))
        return default
    return found


def _where(display: str, lines: dict, path: tuple[Any, ...]) -> str:
    line = _line(lines, path)
    return f"{display}:{line}: {_dotted(path)}" if line else f"{display}: {_dotted(path)}"


def _cut(text: str) -> str:
    return ascii(text if len(text) <= 40 else text[:30] + "...")


def _leave_out(data: dict, lines: dict, display: str) -> list[str]:
    """Drop what GPUX accepts and gpux-pack cannot act on, saying so once each."""
    notes = []
    for path, why in _unknown(data, GpuxConfig, ()):
        notes.append(f"{_where(display, lines, path)}: {why}; left out (--strict refuses it)")
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        del parent[path[-1]]
    return notes


def _unknown(data: Any, t: Any, path: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], str]]:
    """(path, why) of each key the schema does not know, each tensor type that is no element
    type, each backend for another OS, walking the data along the schema's types."""
    t = _unwrap(t)
    if isinstance(t, type) and issubclass(t, BaseModel):
        if not isinstance(data, dict):
            return []
        found = []
        for key, value in data.items():
            field = t.model_fields.get(key) if isinstance(key, str) else None
            where = (*path, key)
            if field is None:
                found.append((where, f"unknown key{hint(str(key), t.model_fields)}"))
            elif key == "type" and t is TensorSpec and value is not None and canonical(str(value)) is None:
                found.append((where, f"'{_cut(str(value))[1:-1]}' is not a tensor element type{hint(str(value), DTYPES)}; "
                                     "the model's is used"))
            elif path == ("runtime", "gpu") and key == "backend" and provider_alias(value) in NOT_FOR_LINUX:
                found.append((where, f"{NOT_FOR_LINUX[str(provider_alias(value))]} and the image is for Linux; "
                                     "auto decides instead"))
            elif path == ("runtime", "gpu") and key == "backend" and provider_alias(value) not in BACKENDS:
                found.append((where, f"'{_cut(str(value))[1:-1]}' is not a backend gpux-pack knows"
                                     f"{hint(str(provider_alias(value)), BACKENDS)}; auto decides instead"))
            else:
                found += _unknown(value, field.annotation, where)
        return found
    origin = typing.get_origin(t)
    if origin in (list, tuple) and path in (("inputs",), ("outputs",)) and isinstance(data, dict):  # name: spec
        return [u for k, v in data.items() if isinstance(v, dict) for u in _unknown(v, typing.get_args(t)[0], (*path, k))]
    if origin in (list, tuple) and isinstance(data, list):
        return [u for i, v in enumerate(data) for u in _unknown(v, typing.get_args(t)[0], (*path, i))]
    if origin is dict and isinstance(data, dict):
        return [u for k, v in data.items() for u in _unknown(v, typing.get_args(t)[1], (*path, k))]
    return []


def _not_acted_on(data: dict) -> list[tuple[tuple[Any, ...], str]]:
    """(path, why) of each key present that gpux-pack reads and does not act on."""
    found = []
    for pattern, why in NOT_ACTED_ON.items():
        for path in _matches(data, pattern, ()):
            found.append((path, why))
    return sorted(found, key=lambda f: [str(p) for p in f[0]])


def _matches(node: Any, pattern: tuple[str, ...], path: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    if not pattern:
        return [path]
    head, rest = pattern[0], pattern[1:]
    if isinstance(node, list) and head == "*":
        return [m for i, v in enumerate(node) for m in _matches(v, rest, (*path, i))]
    if not isinstance(node, dict):
        return []
    keys = list(node) if head == "*" else [head] if head in node and node[head] is not None else []
    return [m for k in keys for m in _matches(node[k], rest, (*path, k))]


def _line(lines: dict, path: tuple[Any, ...]) -> int | None:
    return lines.get(path) or _nearest(lines, path)


def _positions(node: yaml.Node, path: tuple[Any, ...], out: dict, repeated: list) -> None:
    """Record the 1-based line of every key and list item, and each repeated key (YAML keeps the
    last one silently, which hides mistakes: a warning, refused when strict)."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                repeated.append(((*path, key), key_node.start_mark.line + 1))
            seen.add(key)
            out[(*path, key)] = key_node.start_mark.line + 1
            _positions(value_node, (*path, key), out, repeated)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, i)] = item.start_mark.line + 1
            _positions(item, (*path, i), out, repeated)


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
        if part == "[key]":  # pydantic's marker for "the key itself is invalid"
            break
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
        return f"unknown key '{loc[-1]}'{hint(str(loc[-1]), allowed)}"
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


def _dotted(path: tuple[Any, ...]) -> str:
    """('pack', 'labels', 'a b') -> pack.labels.a b; a key with line breaks or control
    characters is shown escaped, so an error stays one line."""
    out = ""
    for part in path:
        if not isinstance(part, int):
            part = str(part) if str(part).isprintable() else ascii(str(part))
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _display(path: Path) -> str:
    """Paths in messages are relative to the working folder when they are inside it."""
    try:
        return str(Path(os.path.realpath(path)).relative_to(Path.cwd()))
    except (ValueError, OSError):
        return str(path)
