"""The build context: Dockerfile, installed packages, runtime, model and gpux.json.

One folder per layer, each a tree placed from / (`COPY packages/ /`), so every folder a layer
holds comes from the context with fixed metadata: deterministic entries (sorted, fixed mtimes,
root owner, normalised modes) give the same layer diff ids on every build, whether sent by
`build` or written by `render --output` for a plain `docker build`.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpux_pack.errors import PackError, UsageError
from gpux_pack.image import layer_tar
from gpux_pack.image.layout import LAYERS
from gpux_pack.plan import UID, Plan
from gpux_pack.sources import runtime_files
from gpux_pack.wheels import Installed, bytecode

MTIME = layer_tar.MTIME
MARKER = ".gpux-context"


@dataclass(frozen=True)
class Entry:
    name: str  # path inside the context, with /
    source: Path | None = None
    data: bytes | None = None
    mode: int = 0o644  # 0o755 for executables (shared libraries keep it, as pip installs them)

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else self.source.stat().st_size  # type: ignore[union-attr]


@dataclass(frozen=True)
class Context:
    entries: tuple[Entry, ...]

    @property
    def size_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def dirs(self) -> list[str]:
        out = set()
        for e in self.entries:
            parts = e.name.split("/")[:-1]
            out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        return sorted(out)


def model_context(plan: Plan, installed: Installed | None, dockerfile: str) -> Context:
    """A model image's context; without installed packages it builds on a runtime base image."""
    entries = [
        Entry("Dockerfile", data=dockerfile.encode()),
        Entry(MARKER, data=f"{plan.name} {plan.version} {plan.provider.name}\n".encode()),
        Entry(LAYERS["config"].root, data=_strict_json(plan.gpux_json)),
    ]
    if installed is not None:
        entries += _runtime_base_entries(installed)
    folder = plan.model.path.parent
    entries += [Entry(f"{LAYERS['model'].root}/{name}", source=folder / name) for name in plan.model.files]
    return Context(tuple(sorted(entries, key=lambda e: e.name)))


def _strict_json(value: dict) -> bytes:
    """gpux.json is strict JSON, always (no NaN or Infinity, which the runtime's parser and
    most clients reject); config validation makes a failure here a bug, reported as one line."""
    try:
        return (json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    except (ValueError, TypeError) as e:
        raise PackError(f"gpux.json: cannot write {e}") from None


def runtime_base_context(installed: Installed, dockerfile: str) -> Context:
    """A runtime base image's context: the installed packages and the runtime, no model."""
    entries = [Entry("Dockerfile", data=dockerfile.encode()), Entry(MARKER, data=b"runtime\n")]
    entries += _runtime_base_entries(installed)
    return Context(tuple(sorted(entries, key=lambda e: e.name)))


def _runtime_base_entries(installed: Installed) -> list[Entry]:
    packages, runtime = LAYERS["packages"].root, LAYERS["runtime"].root
    entries = []
    for path in sorted(installed.path.rglob("*")):
        if path.is_file() and not path.is_symlink():
            mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            entries.append(Entry(f"{packages}/{path.relative_to(installed.path).as_posix()}", source=path, mode=mode))
    entries += [Entry(f"{runtime}/{src.name}", source=src) for src in runtime_files()]
    if installed.compiled:
        entries += [Entry(f"{runtime}/{name}", data=data)
                    for name, data in bytecode(runtime_files(), LAYERS["runtime"].lands)]  # fmt: skip
    entries.append(Entry(LAYERS["cache"].source, data=cache_tar()))
    return entries


def cache_members(uid: int = UID) -> list[layer_tar.Member]:
    """/opt/gpux/cache owned by the image's user, its parents as the COPY layers make them:
    COPY cannot own a folder without also owning its parents, ADD of a tar can."""
    cache = LAYERS["cache"].lands.strip("/")
    parts = cache.split("/")
    members = [layer_tar.Member("/".join(parts[: i + 1]), 0o755, MTIME) for i in range(len(parts) - 1)]
    return [*members, layer_tar.Member(cache, 0o755, MTIME, uid=uid, gid=uid)]


def cache_tar() -> bytes:
    out = io.BytesIO()
    layer_tar.write(out, cache_members(), b"")
    return out.getvalue()


def temporary_tar(ctx: Context) -> IO[bytes]:
    """The context as a tar in a temporary file (CUDA packages are too big for memory)."""
    out = tempfile.TemporaryFile()
    _write_tar(ctx, out)
    out.seek(0)
    return out


class Stream:
    """The context's tar as chunks, written by a thread into a pipe while the engine reads it:
    no temporary copy of a 2 GB CUDA context, and the tar is made while it is sent. `error`
    holds what stopped the writer (a file that vanished), raised by the caller after the build."""

    def __init__(self, ctx: Context, chunk: int = 1 << 20):
        self._ctx, self._chunk = ctx, chunk
        self.error: BaseException | None = None
        read, write = os.pipe()
        self._read = os.fdopen(read, "rb", buffering=0)
        self._thread = threading.Thread(target=self._writer, args=(os.fdopen(write, "wb"),), daemon=True)
        self._thread.start()

    def _writer(self, out: IO[bytes]) -> None:
        try:
            with out:
                _write_tar(self._ctx, out)
        except BrokenPipeError:  # the reader stopped (the build failed or was interrupted)
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self.error = e

    def __iter__(self):
        while True:
            data = self._read.read(self._chunk)
            if not data:
                break
            yield data

    def close(self) -> None:
        self._read.close()
        self._thread.join(timeout=30)


def _write_tar(ctx: Context, out: IO[bytes]) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        for name in ctx.dirs():
            info = _info(name, tarfile.DIRTYPE, 0o755)
            archive.addfile(info)
        for entry in ctx.entries:
            info = _info(entry.name, tarfile.REGTYPE, entry.mode)
            info.size = entry.size
            if entry.data is not None:
                archive.addfile(info, io.BytesIO(entry.data))
            else:
                with open(entry.source, "rb") as f:  # type: ignore[arg-type]
                    archive.addfile(info, f)


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def write(ctx: Context, out: Path) -> None:
    """Write the context to a folder: empty, missing, or an earlier gpux-pack context."""
    if out.exists() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise UsageError(f"--output {out}: folder is not empty and was not written by gpux-pack")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in ctx.dirs():
        (out / name).mkdir(exist_ok=True)
    for entry in ctx.entries:
        target = out / entry.name
        if entry.data is not None:
            target.write_bytes(entry.data)
        else:
            shutil.copyfile(entry.source, target)  # type: ignore[arg-type]
        os.chmod(target, entry.mode)
        os.utime(target, (MTIME, MTIME))
    for name in [*reversed(ctx.dirs()), ""]:
        os.chmod(out / name, 0o755)
        os.utime(out / name, (MTIME, MTIME))
