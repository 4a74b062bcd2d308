"""Layer tars written on the host, byte for byte as the Docker engine writes the same files.

An image layer is identified by the sha256 of its uncompressed tar (its diff id). The engine
makes that tar itself when `docker build` commits a COPY step, with Go's archive/tar under
moby's rules: USTAR headers (a long name split at the last '/' that fits the 155-byte
prefix), the file type bits kept in the mode, times in whole seconds, entries in
filepath.Walk order (a folder, then its entries by name), two zero blocks at the end and no
padding to a record. Writing the same bytes here means a layer can be handed to the engine
ready-made (`docker load`) and still have the diff id a plain `docker build` of `render
--output` gives, which the tests check. What Go would write differently (non-ASCII or
over-long names, which need PAX records) raises Unsupported, and the caller falls back to
the engine's builder.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from gpux_pack.project.skeleton import copy_ranges

BLOCK = 512
MTIME = 315532800  # every file's time in the context and its layers: 1980-01-01, valid in every archive format
CHUNK = 1 << 20


class Unsupported(Exception):
    """An entry Go would write with PAX records: left to the engine's builder."""


@dataclass(frozen=True)
class Member:
    name: str  # path in the image, no leading '/'; folders without a trailing '/'
    mode: int  # permission bits (0o755, 0o644)
    mtime: int
    source: Path | None = None  # a regular file's content; None for a folder ...
    data: bytes | None = None  # ... or the content itself
    uid: int = 0  # 0: COPY without --chown; the image's user for a folder it owns (ADD of a tar)
    gid: int = 0
    # with source: the content is these pieces of it, (offset in source, length, offset here), zeros
    # between them (a model's weights moved to an external data file: skeleton.external_form)
    ranges: tuple[tuple[int, int, int], ...] | None = None

    @property
    def is_dir(self) -> bool:
        return self.source is None and self.data is None

    @property
    def size(self) -> int:
        if self.data is not None:
            return len(self.data)
        if self.ranges is not None:
            return max((at + length for _, length, at in self.ranges), default=0)
        return 0 if self.source is None else self.source.stat().st_size


def walk_order(members: Iterable[Member]) -> list[Member]:
    """filepath.Walk's order: by path components, so 'a/b' comes before 'a-b'."""
    return sorted(members, key=lambda m: m.name.split("/"))


def size_of(members: list[Member]) -> int:
    """The tar's size before writing it (the outer archive needs it first)."""
    total = 2 * BLOCK
    for m in members:
        total += BLOCK + (-(-m.size // BLOCK) * BLOCK)
    return total


def header(member: Member, uname: bytes) -> bytes:
    name = member.name + ("/" if member.is_dir else "")
    prefix, short = _split(name)
    kind, type_bits = (b"5", stat.S_IFDIR) if member.is_dir else (b"0", stat.S_IFREG)
    h = bytearray(BLOCK)
    h[0 : len(short)] = short
    h[100:108] = _octal(type_bits | member.mode, 8)
    h[108:116] = _octal(member.uid, 8)
    h[116:124] = _octal(member.gid, 8)
    h[124:136] = _octal(member.size, 12)
    h[136:148] = _octal(member.mtime, 12)
    h[148:156] = b" " * 8
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    if member.uid == 0:  # the engine names root as its Go version does; other ids it leaves unnamed
        h[265 : 265 + len(uname)] = uname
    if member.gid == 0:
        h[297 : 297 + len(uname)] = uname
    h[329:337] = _octal(0, 8)
    h[337:345] = _octal(0, 8)
    h[345 : 345 + len(prefix)] = prefix
    h[148:156] = format(sum(h), "o").rjust(6, "0").encode() + b"\0 "
    return bytes(h)


def _octal(value: int, width: int) -> bytes:
    text = format(value, "o")
    if len(text) > width - 1:
        raise Unsupported(f"{value} does not fit a tar header")
    return text.rjust(width - 1, "0").encode() + b"\0"


def _split(name: str) -> tuple[bytes, bytes]:
    """Go's splitUSTARPath: names over 100 bytes go to the prefix at the last '/' that fits."""
    if not name.isascii():
        raise Unsupported(f"{name!r} is not ASCII")
    raw = name.encode()
    if len(raw) <= 100:
        return b"", raw
    length = min(len(raw), 156)
    if length == len(raw) and raw.endswith(b"/"):
        length -= 1
    i = raw.rfind(b"/", 0, length)
    if i <= 0 or len(raw) - i - 1 > 100 or len(raw) - i - 1 == 0 or i > 155:
        raise Unsupported(f"{name!r} is too long for a USTAR header")
    return raw[:i], raw[i + 1 :]


def chunks(members: list[Member], uname: bytes) -> Iterator[bytes]:
    """The layer tar, in pieces of at most about CHUNK bytes."""
    for m in members:
        yield header(m, uname)
        if m.is_dir:
            continue
        if m.data is not None:
            yield m.data
        elif m.ranges is not None:
            yield from copy_ranges(m.source, m.ranges, CHUNK)  # type: ignore[arg-type]
        else:
            with open(m.source, "rb") as f:  # type: ignore[arg-type]
                while piece := f.read(CHUNK):
                    yield piece
        if m.size % BLOCK:
            yield b"\0" * (BLOCK - m.size % BLOCK)
    yield b"\0" * (2 * BLOCK)


def digest(members: list[Member], uname: bytes) -> str:
    h = hashlib.sha256()
    for piece in chunks(members, uname):
        h.update(piece)
    return "sha256:" + h.hexdigest()


def check(members: list[Member]) -> None:
    """Raise Unsupported before anything is sent, not halfway through a stream."""
    for m in members:
        _split(m.name + ("/" if m.is_dir else ""))
        _octal(m.size, 12)


def tree(root: Path, image_path: str, mtime: int) -> list[Member]:
    """Members for a host folder placed at image_path: every parent folder, then the tree,
    modes normalised as the build context normalises them (0o755 for executables)."""
    parts = image_path.strip("/").split("/")
    members = [Member("/".join(parts[: i + 1]), 0o755, mtime) for i in range(len(parts))]
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        base = image_path.strip("/") if rel == "." else f"{image_path.strip('/')}/{rel}"
        for d in dirs:
            if os.path.islink(os.path.join(folder, d)):
                raise Unsupported(f"{os.path.join(folder, d)} is a symlink")
            members.append(Member(f"{base}/{d}", 0o755, mtime))
        for f in files:
            path = Path(folder) / f
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode):
                raise Unsupported(f"{path} is not a regular file")
            members.append(Member(f"{base}/{f}", 0o755 if st.st_mode & 0o111 else 0o644, mtime, source=path))
    return walk_order(members)
