"""A model's structure without its weights, read straight from the protobuf wire format.

`onnx.load` holds a model twice while parsing it (the file's bytes and the parsed message) and the
checker parses it again: a 1.5 GB model cost a build 4.4 GB. protobuf's Python API cannot parse a
message lazily, but its wire format is four kinds of field: so the file is memory-mapped and
walked, and the bytes of each large inline initializer are skipped, never read into memory. What
is left (nodes, inputs, outputs, small tensors, shapes) is a valid ModelProto of a few KB to a few
MB, and each skipped weight is remembered by where its bytes lie in the file, so a later stage can
copy them as they are (ModelProto.graph = field 7, GraphProto.initializer = 5, TensorProto.raw_data
= 9: onnx.proto's numbers, stable since IR version 1)."""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

_GRAPH = 7  # ModelProto.graph
_INITIALIZER = 5  # GraphProto.initializer
_RAW_DATA = 9  # TensorProto.raw_data
_TYPED_DATA = frozenset({4, 5, 6, 7, 10, 11})  # TensorProto's float/int32/string/int64/double/uint64_data
_SMALL = 4096  # initializers up to this size stay in the skeleton: shape inference may read them


class WireError(ValueError):
    """The bytes are not a protobuf message (truncated, or another format)."""


@dataclass(frozen=True)
class Weight:
    index: int  # its place in graph.initializer
    offset: int  # where its raw_data bytes start in the model file
    length: int  # how many bytes they are
    typed_fields: bool  # it also sets a typed data field (the checker refuses two value fields)


@dataclass(frozen=True)
class Skeleton:
    model: bytes  # a serialized ModelProto: the file's own, less the skipped weights' raw_data
    weights: tuple[Weight, ...]  # the skipped weights, in graph.initializer order


def read_skeleton(path: Path) -> Skeleton:
    """The model at `path` without its large inline weights, in memory about the size of its graph."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return _model(view)
        except WireError as e:  # leaving this block frees the traceback's slices of the map
            message = str(e)
        finally:
            view.release()
    raise WireError(message)


def _varint(data: Any, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError(f"a field is cut short at byte {pos}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(data: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """The fields of the message in data[start:end]: (field number, wire type, where the field
    starts, where its value starts, where it ends). WireError if they are not protobuf's."""
    pos = start
    while pos < end:
        first = pos
        key, pos = _varint(data, pos, end)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {first}")
        if kind == 0:
            _, value_end = _varint(data, pos, end)
        elif kind == 1:
            value_end = pos + 8
        elif kind == 2:
            length, pos = _varint(data, pos, end)
            value_end = pos + length
        elif kind == 5:
            value_end = pos + 4
        else:  # groups (3, 4) are not in onnx.proto; 6, 7 do not exist
            raise WireError(f"wire type {kind} at byte {first}")
        if value_end > end:
            raise WireError(f"a field runs past the end at byte {first}")
        yield number, kind, first, pos, value_end
        pos = value_end


def _tag(number: int, length: int) -> bytes:
    """A length-delimited field's key and length."""
    out = bytearray()
    for value in ((number << 3) | 2, length):
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)


def _model(data: memoryview) -> Skeleton:
    pieces: list[memoryview | bytes] = []
    weights: list[Weight] = []
    count = 0  # initializers seen (a message may repeat its graph field: protobuf merges them)
    for number, kind, first, start, end in fields(data, 0, len(data)):
        if number == _GRAPH and kind == 2:
            graph, found, count = _graph(data, start, end, count)
            if found:
                weights.extend(found)
                pieces.extend((_tag(_GRAPH, sum(len(p) for p in graph)), *graph))
                continue
        pieces.append(data[first:end])
    if not weights:  # nothing skipped: the file is its own skeleton
        return Skeleton(bytes(data), ())
    return Skeleton(b"".join(pieces), tuple(weights))


def _graph(data: memoryview, start: int, end: int, count: int) -> tuple[list, list[Weight], int]:
    pieces: list[memoryview | bytes] = []
    weights: list[Weight] = []
    for number, kind, first, value, stop in fields(data, start, end):
        if number == _INITIALIZER and kind == 2:
            index, count = count, count + 1
            if stop - value > _SMALL:
                tensor, weight = _tensor(data, value, stop, index)
                if weight is not None:
                    weights.append(weight)
                    pieces.extend((_tag(_INITIALIZER, sum(len(p) for p in tensor)), *tensor))
                    continue
        pieces.append(data[first:stop])
    return pieces, weights, count


def _tensor(data: memoryview, start: int, end: int, index: int) -> tuple[list, Weight | None]:
    kept: list[memoryview] = []
    raw = None
    typed = False
    for number, kind, first, value, stop in fields(data, start, end):
        if number == _RAW_DATA and kind == 2:
            if raw is not None:  # set twice (the last wins): rare enough to keep whole
                return [], None
            raw = (value, stop - value)
            continue
        typed = typed or number in _TYPED_DATA
        kept.append(data[first:stop])
    if raw is None or raw[1] <= _SMALL:
        return [], None  # its bytes are in typed fields, or small: kept as it is
    return kept, Weight(index=index, offset=raw[0], length=raw[1], typed_fields=typed)


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

    skeleton = read_skeleton(path)
    proto = onnx.ModelProto.FromString(skeleton.model)
    ranges = []
    at = 0
    for weight in skeleton.weights:
        tensor = proto.graph.initializer[weight.index]
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
