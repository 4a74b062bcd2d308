"""A model's structure without its weights, read straight from the protobuf wire format.

`onnx.load` holds a model twice while parsing it (the file's bytes and the parsed message) and the
checker parses it again: a 1.5 GB model cost a build 4.4 GB. protobuf's Python API cannot parse a
message lazily, but its wire format is four kinds of field: so the file is walked, and the bytes of
each large inline tensor are skipped, never read into memory, wherever the tensor sits: a graph's
initializers (sparse ones' values too), a node's tensor attributes (a Constant's
`value`), the graphs of If, Loop and Scan bodies at any depth, and model-local functions' nodes.
What is left (nodes, inputs, outputs, small tensors, shapes) is a valid ModelProto of a few KB to a
few MB, and each skipped weight is remembered by where its bytes lie in the file and where its
tensor is in the parsed message, so a later stage can copy them as they are (field numbers are
onnx.proto's, stable since the IR version that introduced each message).

The file is read with os.pread, not memory-mapped: a file cut short while it is read (a copy
still being written) is a WireError here, where a map's page fault would kill the process with
SIGBUS."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from gpux_pack.errors import PackError

_RAW_DATA = 9  # TensorProto.raw_data
_TYPED_DATA = frozenset({4, 5, 6, 7, 10, 11})  # TensorProto's float/int32/string/int64/double/uint64_data
_SMALL = 4096  # tensors up to this size stay in the skeleton: shape inference may read them
_DEPTH = 100  # protobuf's own limit on nested messages: a deeper file does not parse anyway

# Where a tensor may sit: for each message, its fields that hold one or lead to one, as
# (the message they hold, the field's name in onnx's Python API, repeated or not).
_FIELDS: dict[str, dict[int, tuple[str, str, bool]]] = {
    "model": {7: ("graph", "graph", False), 25: ("function", "functions", True)},
    "graph": {1: ("node", "node", True), 5: ("tensor", "initializer", True),
              15: ("sparse", "sparse_initializer", True)},
    "function": {7: ("node", "node", True)},
    "node": {5: ("attribute", "attribute", True)},
    "attribute": {5: ("tensor", "t", False), 6: ("graph", "g", False), 10: ("tensor", "tensors", True),
                  11: ("graph", "graphs", True), 22: ("sparse", "sparse_tensor", False),
                  23: ("sparse", "sparse_tensors", True)},
    "sparse": {1: ("tensor", "values", False)},  # not its indices: the checker reads them (their order, bounds)
}


class WireError(ValueError):
    """The bytes are not a protobuf message (truncated, or another format)."""


class FileChanged(WireError):
    """The file is shorter than when it was opened: it changed (or is still being written) meanwhile."""


@dataclass(frozen=True)
class Weight:
    path: tuple[tuple[str, int | None], ...]  # where its tensor is in the parsed model: each field's name,
    # and the index in it where it is repeated (protobuf merges a singular field that repeats)
    offset: int  # where its raw_data bytes start in the model file
    length: int  # how many bytes they are
    typed_fields: bool  # it also sets a typed data field (the checker refuses two value fields)


@dataclass(frozen=True)
class Skeleton:
    model: bytes  # a serialized ModelProto: the file's own, less the skipped weights' raw_data
    weights: tuple[Weight, ...]  # the skipped weights, in the file's order


def tensor_at(proto: Any, weight: Weight) -> Any:
    """The TensorProto of a skipped weight in the parsed skeleton."""
    found = proto
    for name, index in weight.path:
        found = getattr(found, name) if index is None else getattr(found, name)[index]
    return found


class FileBytes:
    """A file's bytes by position, as `fields` walks them: read with os.pread in blocks, so that a
    file that shrinks meanwhile is a FileChanged error, not a SIGBUS (a memory map's fault), and
    the walk holds one block per message it is inside, not the file. `len` is the size at open."""

    BLOCK = 1 << 16

    def __init__(self, fd: int, size: int | None = None):
        self.fd = fd
        self.size = os.fstat(fd).st_size if size is None else size
        self._at, self._block = 0, b""  # the last block read, and where it starts

    def __len__(self) -> int:
        return self.size

    def read(self, offset: int, length: int) -> bytes:
        """Exactly `length` bytes from `offset`."""
        parts = []
        while length > 0:
            piece = os.pread(self.fd, min(length, 1 << 30), offset)
            if not piece:
                raise FileChanged(f"the file changed or is cut short at byte {offset}")
            parts.append(piece)
            offset += len(piece)
            length -= len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def window(self, pos: int, want: int = 20) -> tuple[bytes, int]:
        """A block of bytes holding pos and the `want` bytes after it (or up to the end), and where
        it starts: a walk indexes the block's bytes, cheaper than a __getitem__ call for each."""
        at, block = self._at, self._block
        if not (at <= pos and (pos + want <= at + len(block) or at + len(block) == self.size)):
            at, block = pos, self.read(pos, min(max(self.BLOCK, want), self.size - pos))
            self._at, self._block = at, block
        return block, at

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.size)
            if step != 1:
                raise ValueError("FileBytes slices have no step")
            if stop <= start:
                return b""
            if self._at <= start and stop <= self._at + len(self._block):
                return self._block[start - self._at:stop - self._at]
            return self.read(start, stop - start)
        if not 0 <= key < self.size:
            raise IndexError(key)
        block, at = self.window(key, 1)
        return block[key - at]


def read_skeleton(path: Path) -> Skeleton:
    """The model at `path` without its large inline weights, in memory about the size of its graph."""
    with open(path, "rb") as f:
        data = FileBytes(f.fileno())
        weights: list[Weight] = []
        pieces = _message(data, "model", 0, data.size, (), {}, weights, 0)
        if pieces is None:  # nothing skipped: the file is its own skeleton
            return Skeleton(data.read(0, data.size), ())
        return Skeleton(b"".join(p if isinstance(p, bytes) else data.read(p[0], p[1] - p[0]) for p in pieces),
                        tuple(weights))


def _varint(data: Any, pos: int, end: int, base: int = 0) -> tuple[int, int]:
    """The varint at data[pos], not past data[end]; `base`: where data starts in the file."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError(f"a field is cut short at byte {base + pos}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(data: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """The fields of the message in data[start:end]: (field number, wire type, where the field
    starts, where its value starts, where it ends). WireError if they are not protobuf's. `data`
    is bytes, a memoryview, or a FileBytes (read a block at a time: a file cut short meanwhile is
    a FileChanged error)."""
    window = getattr(data, "window", None)
    buf, base = (data, 0) if window is None else (b"", start)
    pos = start
    while pos < end:
        # a key and a varint after it are at most 20 bytes: the block must hold them, or reach the end
        if window is not None and pos + 20 > base + len(buf) and base + len(buf) < end:
            buf, base = window(pos)
        first, stop, at = pos, end - base, pos - base
        key = buf[at]  # a key or a length of one byte (most are) is read here, not by _varint
        key, at = (key, at + 1) if key < 0x80 else _varint(buf, at, stop, base)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {first}")
        if kind == 2:
            if at < stop and buf[at] < 0x80:
                length, at = buf[at], at + 1
            else:
                length, at = _varint(buf, at, stop, base)
            value_end = at + length
        elif kind == 0:
            _, value_end = _varint(buf, at, stop, base)
        elif kind == 1:
            value_end = at + 8
        elif kind == 5:
            value_end = at + 4
        else:  # groups (3, 4) are not in onnx.proto; 6, 7 do not exist
            raise WireError(f"wire type {kind} at byte {first}")
        if value_end > stop:
            raise WireError(f"a field runs past the end at byte {first}")
        pos = value_end + base
        yield number, kind, first, at + base, pos


_FLOATS = frozenset({1, 10, 11, 16, 17, 18, 19, 20, 23})  # TensorProto's floating-point data types
_VALUES = frozenset({4, 5, 6, 7, 9, 10, 11})  # TensorProto's value fields, raw_data (9) among them
# ONNX operators whose outputs' shapes follow from their inputs' shapes and attributes alone:
# the values of a weight they read decide no shape (Reshape's, Resize's, Range's, Tile's... do)
_SHAPE_BLIND = frozenset("""
Abs Acos Acosh Add And Asin Asinh Atan Atanh AveragePool BatchNormalization Ceil Celu Clip Concat Conv
ConvInteger ConvTranspose Cos Cosh DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Flatten Floor GRU
Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual
GroupNormalization HardSigmoid HardSwish Hardmax Identity InstanceNormalization LRN LSTM LayerNormalization
LeakyRelu Less LessOrEqual Log LogSoftmax LpNormalization MatMul MatMulInteger Max Mean Min Mish Mod Mul Neg
Not Or PRelu Pow QLinearConv QLinearMatMul QuantizeLinear RNN Reciprocal Relu Round Selu Shrink Sigmoid Sign
Sin Sinh Softmax Softplus Softsign Sqrt Sub Sum Tan Tanh ThresholdedRelu Transpose Where Xor""".split())


def graph_digest(h: Any, data: bytes, start: int, end: int) -> None:
    """Feed `h` the GraphProto in data[start:end] less its weights' values: a floating-point
    initializer that only ONNX operators of _SHAPE_BLIND read counts by its values' lengths
    (retrained weights leave the digest as it was); every other byte counts as it is, what
    shape inference may read among them (shapes, axes, scales). A graph with a subgraph or an
    operator of another domain (what it reads is not known here) counts whole."""
    blind: dict[str, bool] = {}  # a tensor name -> every node reading it is shape-blind
    for number, wire, _, value_start, value_end in fields(data, start, end):
        if number == 1 and wire == 2:  # a node
            op, inputs = _node(data, value_start, value_end)
            if op is None:
                blind.clear()
                break
            for name in inputs:
                blind[name] = blind.get(name, True) and op in _SHAPE_BLIND
        elif number == 1:
            break
    else:
        blind = {k: v for k, v in blind.items() if v}
    for number, wire, tag_start, value_start, value_end in fields(data, start, end):
        h.update(data[tag_start:value_start])
        if number == 5 and wire == 2 and _weight(data, value_start, value_end, blind):
            for field, _, at, inner_start, inner_end in fields(data, value_start, value_end):
                h.update(data[at:inner_start])
                h.update((inner_end - inner_start).to_bytes(8, "little") if field in _VALUES
                         else data[inner_start:inner_end])
        else:
            h.update(data[value_start:value_end])


def _node(data: bytes, start: int, end: int) -> tuple[str | None, list[str]]:
    """A NodeProto's operator (None: another domain's, or one with a subgraph) and inputs."""
    op, inputs = "", []
    for number, wire, _, value_start, value_end in fields(data, start, end):
        if wire != 2:
            continue
        if number == 1:
            inputs.append(bytes(data[value_start:value_end]).decode("utf-8", "replace"))
        elif number == 4:
            op = bytes(data[value_start:value_end]).decode("utf-8", "replace")
        elif number == 7 and value_end > value_start and data[value_start:value_end] != b"ai.onnx":
            return None, inputs
    return (None if op in ("If", "Loop", "Scan") else op), inputs


def _weight(data: bytes, start: int, end: int, blind: dict[str, bool]) -> bool:
    """A TensorProto of a floating-point type that only shape-blind operators read."""
    kind, name = 0, None
    for number, wire, _, value_start, value_end in fields(data, start, end):
        if number == 2 and wire == 0:
            kind = _varint(data, value_start, value_end)[0]
        elif number == 8 and wire == 2:
            name = bytes(data[value_start:value_end]).decode("utf-8", "replace")
    return kind in _FLOATS and name is not None and blind.get(name, False)


def _tag(number: int, length: int) -> bytes:
    """A length-delimited field's key and length."""
    out = bytearray()
    for value in ((number << 3) | 2, length):
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)


def _size(pieces: list) -> int:
    return sum(len(p) if isinstance(p, bytes) else p[1] - p[0] for p in pieces)


def _message(data: Any, kind: str, start: int, end: int, path: tuple, counts: dict, weights: list[Weight],
             depth: int) -> list | None:
    """The message in data[start:end] as pieces (ranges of the file, and the new key and length of
    each field whose size changed) with its large tensors' raw_data left out, or None where nothing
    inside is skipped. A message is entered only when larger than _SMALL (a smaller one holds no
    skipped tensor), so 100,000 small nodes cost one look at each. `counts` numbers the entries of
    its repeated fields: protobuf merges the occurrences of a singular message field (a graph
    field written twice), their repeated fields concatenate, so these occurrences share one."""
    if depth > _DEPTH:
        raise WireError(f"messages nested more than {_DEPTH} deep at byte {start}")
    known = _FIELDS[kind]
    twice = _twice(data, start, end, known) if kind in ("attribute", "sparse") else ()
    pieces: list = []
    kept = start  # the file's bytes from here on are still to be added as they are
    for number, wire, first, value, stop in fields(data, start, end):
        entry = known.get(number) if wire == 2 else None
        inner = None
        if entry is not None:
            child, name, repeated = entry
            if repeated:
                index = counts[number] = counts.get(number, -1) + 1
                step, shared = (name, index), {}
            else:
                step, shared = (name, None), counts.setdefault((number,), {})
            if number in twice:  # a tensor merged from two occurrences: too odd to follow, kept whole
                pass
            elif child == "tensor":
                if stop - value > _SMALL:
                    inner = _tensor(data, value, stop, (*path, step), weights)
            elif stop - value > _SMALL or child == "graph" and not repeated:  # a merged graph counts all its parts
                inner = _message(data, child, value, stop, (*path, step), shared, weights, depth + 1)
        if inner is not None:
            if kept < first:
                pieces.append((kept, first))
            pieces.append(_tag(number, _size(inner)))
            pieces.extend(inner)
            kept = stop
    if not pieces:
        return None
    if kept < end:
        pieces.append((kept, end))
    return pieces


def _twice(data: Any, start: int, end: int, known: dict[int, tuple[str, str, bool]]) -> set[int]:
    """The singular fields holding a tensor, or a message with one, that the message sets more than once."""
    seen: set[int] = set()
    twice: set[int] = set()
    for number, wire, *_ in fields(data, start, end):
        entry = known.get(number)
        if wire == 2 and entry is not None and not entry[2] and entry[0] != "graph":
            (twice if number in seen else seen).add(number)
    return twice


def _tensor(data: Any, start: int, end: int, path: tuple, weights: list[Weight]) -> list | None:
    """The tensor's pieces without its raw_data, where that is over _SMALL (remembered in weights)."""
    raw = None
    typed = False
    for number, kind, first, value, stop in fields(data, start, end):
        if number == _RAW_DATA and kind == 2:
            if raw is not None:  # set twice (the last wins): rare enough to keep whole
                return None
            raw = (first, value, stop)
        typed = typed or number in _TYPED_DATA
    if raw is None or raw[2] - raw[1] <= _SMALL:
        return None  # its bytes are in typed fields, or small: kept as it is
    first, value, stop = raw
    weights.append(Weight(path=path, offset=value, length=stop - value, typed_fields=typed))
    return [piece for piece in ((start, first), (stop, end)) if piece[0] < piece[1]]


ALIGN = 4096  # ONNX Runtime maps external data into memory when a tensor's offset is page-aligned


@dataclass(frozen=True)
class ExternalForm:
    """The same model with its large inline weights moved to one data file beside it: the model
    file's new bytes, and where each weight's bytes go in the data file (its offset there, taken
    from `offset` in the original file, `length` bytes; zeros between, to keep offsets aligned)."""

    model: bytes
    data_name: str
    ranges: tuple[tuple[int, int, int], ...]  # (offset in the original file, length, offset in the data file)

    @property
    def data_size(self) -> int:
        return max((at + length for _, length, at in self.ranges), default=0)


def external_form(path: Path, data_name: str) -> ExternalForm:
    """The model at `path` in external-data form, without reading its weights: the skeleton's
    weights point into `data_name` at page-aligned offsets, as ONNX Runtime's own saver aligns
    them, so its CPU provider can map them instead of copying them out of a parsed message."""
    import onnx

    try:
        skeleton = read_skeleton(path)
    except WireError as e:  # it was inspected whole before: it changed since
        raise PackError(f"{path}: the model changed while it was built ({e}); build again") from None
    proto = onnx.ModelProto.FromString(skeleton.model)
    ranges = []
    at = 0
    for weight in skeleton.weights:  # in a subgraph or an attribute too: ONNX Runtime reads them there
        tensor = tensor_at(proto, weight)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", data_name), ("offset", str(at)), ("length", str(weight.length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        ranges.append((weight.offset, weight.length, at))
        at += -(-weight.length // ALIGN) * ALIGN
    return ExternalForm(proto.SerializeToString(), data_name, tuple(ranges))


def copy_ranges(path: Path, ranges: tuple[tuple[int, int, int], ...], chunk: int = 1 << 20):
    """The external data file's bytes, in pieces of at most `chunk`: each range read from the
    original file in turn, zeros up to the next one's offset."""
    written = 0
    with open(path, "rb") as f:
        for offset, length, at in ranges:
            if at > written:
                yield bytes(at - written)
            f.seek(offset)
            left = length
            while left:
                piece = f.read(min(chunk, left))
                if not piece:
                    raise OSError(f"{path} changed while it was read (shorter than {offset + length} bytes)")
                left -= len(piece)
                yield piece
            written = at + length
