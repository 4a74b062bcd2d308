"""Loading gpux.yml: safe YAML with the line of every key, validated against the schema in
config.py, with pydantic's errors turned into `gpux.yml:12: inputs.image.type: problem` lines."""

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
from gpux_pack.project.config import CONFIG_NAMES, GpuxConfig, hint
from gpux_pack.errors import ConfigError, UsageError

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
        # os.path.realpath, not Path.resolve: a symlink loop must not raise (pipeline.load
        # then reports the path as unreadable)
        return Path(os.path.realpath(self.root / self.config.model.source))

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


def load_project(path: Path) -> Project:
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
    _positions(node, (), lines, display)
    found = safe_yaml.non_json(data)
    if found:
        where, problem = found
        raise ConfigError(display, _dotted(where) or None, problem, _line(lines, where))
    try:
        config = GpuxConfig.model_validate(data)
    except ValidationError as e:
        raise _first_error(e, data, lines, display) from None
    return Project(config_path, config, lines)


def _line(lines: dict, path: tuple[Any, ...]) -> int | None:
    return lines.get(path) or _nearest(lines, path)


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
