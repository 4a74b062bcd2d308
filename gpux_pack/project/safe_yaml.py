"""Reading gpux.yml without trusting it: a regular file of bounded size, bounded nesting and
aliases (no "billion laughs", no self-referencing structures), and only values that JSON can
hold, because everything in gpux.yml may end up in the image's gpux.json.

Limits are checked while the document is composed, before anything is expanded."""

from __future__ import annotations

import math
import os
import stat
from datetime import date, datetime
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # a gpux.yml is a few KB; 1 MiB is generous
MAX_DEPTH = 64  # nesting of mappings and lists
MAX_ALIASES = 100  # merge keys and shared blocks are fine; a bomb is not
MAX_NODES = 100_000  # scalars + collections once aliases are expanded


class YAMLLimitError(yaml.MarkedYAMLError):
    """A document over one of the limits; carries the position like PyYAML's own errors."""


def read_text(path: Path) -> str:
    """The file's text; a FIFO, a device or an oversized file is refused before reading it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise OSError(e.strerror or str(e)) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError("not a regular file (a FIFO, device or socket cannot be a gpux.yml)")
        if info.st_size > MAX_BYTES:
            raise OSError(f"{info.st_size} bytes; a gpux.yml may have at most {MAX_BYTES}")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise OSError(f"more than {MAX_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise OSError(f"not UTF-8 text (byte {e.start})") from None


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts while it composes: depth, aliases, and the size of the document
    with every alias expanded (which is what any consumer will walk)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._nodes = 0
        self._sizes: dict[int, int] = {}  # id(node) -> expanded size
        self._open: set[str] = set()  # anchors whose node is still being composed

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YAMLLimitError(None, None, f"more than {MAX_ALIASES} aliases", event.start_mark)
            if event.anchor in self._open:
                raise YAMLLimitError(None, None, f"alias *{event.anchor} refers to itself", event.start_mark)
            node = super().compose_node(parent, index)
            self._count(self._sizes.get(id(node), 1), event.start_mark)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YAMLLimitError(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        anchor = getattr(event, "anchor", None)
        if anchor:
            self._open.add(anchor)
        before = self._nodes
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._sizes[id(node)] = self._nodes - before
        if anchor:
            self._open.discard(anchor)
        self._depth -= 1
        return node

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise YAMLLimitError(None, None, f"more than {MAX_NODES} values once aliases are expanded", mark)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        """PyYAML's constructors raise plain Python errors for odd explicit tags
        (`!!timestamp ''`, `!!int x`): made YAML errors with the node's position."""
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError) as e:
            problem = f"cannot read this {node.tag.rsplit(':', 1)[-1]} value ({type(e).__name__})"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None

    def construct_yaml_int(self, node: Any) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # Python refuses to convert integers of thousands of digits
            raise yaml.constructor.ConstructorError(None, None, "integer too large", node.start_mark) from None

    def construct_yaml_timestamp(self, node: Any) -> str:
        """Dates become ISO 8601 text: JSON has no date type, and YAML makes `2024-01-01` one."""
        value = super().construct_yaml_timestamp(node)
        return value.isoformat()


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", BoundedLoader.construct_yaml_timestamp)


def compose_and_construct(text: str) -> tuple[Any, Any]:
    """(node tree with positions, Python data) from one pass over the text."""
    loader = BoundedLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    return node, data


def non_json(value: Any, path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], str] | None:
    """The first value JSON cannot hold, as (path, problem); None when all is JSON.
    Integer keys become text (ONNX names such as `0` are common); other keys must be text."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**64:
        return (path, "integer too large (JSON clients read at most 64-bit integers)")
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"{value} is not a finite number (gpux.json is strict JSON)")
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = non_json(item, (*path, i))
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                return (path, f"key {key!r} must be text; quote it")
        if not all(isinstance(key, str) for key in value):  # rebuilt in place: order matters
            items = list(value.items())
            value.clear()
            value.update((str(k), v) for k, v in items)
        for key, item in value.items():
            found = non_json(item, (*path, key))
            if found:
                return found
        return None
    kinds = {bytes: "!!binary data", set: "a !!set", tuple: "!!pairs", datetime: "a timestamp", date: "a date"}
    kind = next((v for k, v in kinds.items() if isinstance(value, k)), type(value).__name__)
    return (path, f"{kind} is not allowed here (gpux.json holds JSON values only)")
