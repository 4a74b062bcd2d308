"""The build context: Dockerfile, and one tar per layer (installed packages, runtime, cache,
model, gpux.json).

Each layer is a tar of fixed metadata (sorted, fixed mtimes, root owner, normalised modes),
ADDed at /, so every builder commits the same layer diff ids on every build, whether the
context is sent by `build` or written by `render --output` for a plain `docker build`,
BuildKit, `podman build` or `buildah bud`. The tars are written from their members when the
context is sent or written, never held in memory.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

from gpux_pack.errors import PackError, UsageError
from gpux_pack.image import layer_tar
from gpux_pack.image.layout import LAYERS, LINKCHECK, Layer
from gpux_pack.plan import UID, Plan
from gpux_pack.project.preprocess import read_tokenizer
from gpux_pack.project.skeleton import external_form
from gpux_pack.runtime.contract import APP_DIR
from gpux_pack.sources import LINKCHECK_SCRIPT, runtime_files
from gpux_pack.wheels import Installed, bytecode

MTIME = layer_tar.MTIME
MARKER = ".gpux-context"


@dataclass(frozen=True)
class Entry:
    name: str  # path inside the context, with /
    source: Path | None = None
    data: bytes | None = None
    mode: int = 0o644
    members: tuple[layer_tar.Member, ...] | None = None  # a layer's tar, written from these

    @property
    def size(self) -> int:
        if self.members is not None:
            return layer_tar.size_of(list(self.members))
        return len(self.data) if self.data is not None else self.source.stat().st_size  # type: ignore[union-attr]

    def chunks(self) -> Iterator[bytes]:
        """Its bytes, in pieces of at most about a MiB."""
        if self.members is not None:
            yield from layer_tar.chunks(list(self.members), b"")  # owner names: builders go by the ids
        elif self.data is not None:
            yield self.data
        else:
            with open(self.source, "rb") as f:  # type: ignore[arg-type]
                while piece := f.read(layer_tar.CHUNK):
                    yield piece


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


def model_context(plan: Plan, installed: Installed | None, dockerfile: str,
                  signed: tuple[tuple[str, bytes], ...] = ()) -> Context:
    """A model image's context; without installed packages it builds on a runtime base image.
    signed: the model signature's bundle and public key, (name, bytes) under assets/, which a
    plan that signs the model needs (image/model_signature.py makes them from this plan's files)."""
    if (plan.sign_model is not None) != bool(signed):
        raise PackError("the model's signature files do not match the plan (--sign-model)")
    config = _file(LAYERS["config"].lands, data=config_file(plan))
    entries = [
        Entry("Dockerfile", data=dockerfile.encode()),
        Entry(MARKER, data=f"{plan.name} {plan.version} {plan.provider.name}\n".encode()),
    ]
    if installed is not None:
        entries += _runtime_base_entries(installed)
    if plan.carries_assets:  # the tokenizer.json (read, checked, once), the model's signature
        lands = LAYERS["assets"].lands
        files = [_file(f"{lands}/{name}", data=read_tokenizer(plan.signature.text)) for name, _ in plan.assets]
        files += [_file(f"{lands}/{name}", data=data) for name, data in signed]
        entries.append(layer(LAYERS["assets"], sorted(files, key=lambda m: m.name)))
    if plan.one_layer:  # a small model: it and gpux.json in one layer
        entries.append(layer(LAYERS["app"], [*model_members(plan), config]))
    else:
        entries += [layer(LAYERS["model"], model_members(plan)), layer(LAYERS["config"], [config])]
    return Context(tuple(sorted(entries, key=lambda e: e.name)))


def config_file(plan: Plan) -> bytes:
    """gpux.json's bytes, as the image holds them (and as model signing signs them)."""
    return _strict_json(plan.gpux_json.to_json())


def answer_files(plan: Plan) -> list[tuple[str, bytes | Path]]:
    """Every file that decides the image's answers, by its path under APP_DIR, as the image holds
    it: gpux.json, preprocessing's assets (the tokenizer.json), the model's files. Model signing
    signs exactly these (image/model_signature.py); what it leaves out is contract.UNSIGNED."""
    files: list[tuple[str, bytes | Path]] = [(_under_app(LAYERS["config"].lands), config_file(plan))]
    files += [(f"{_under_app(LAYERS['assets'].lands)}/{name}", read_tokenizer(plan.signature.text))
              for name, _ in plan.assets]
    files += [(f"{_under_app(LAYERS['model'].lands)}/{name}", plan.model.path.parent / name)
              for name in plan.model_files]
    return files


def _under_app(lands: str) -> str:
    return lands[len(APP_DIR) + 1:] if lands.startswith(f"{APP_DIR}/") else lands


def model_members(plan: Plan) -> list[layer_tar.Member]:
    """The model's files as the image keeps them: as given, or with the weights moved out."""
    folder, lands = plan.model.path.parent, LAYERS["model"].lands
    if not plan.externalize:
        return [_file(f"{lands}/{name}", source=folder / name) for name in plan.model.files]
    model, data = plan.model_files
    form = external_form(plan.model.path, data)
    if sum(length for _, length, _ in form.ranges) != plan.model.inline_weights:
        raise PackError(f"{plan.model.path}: the model changed while it was built; build again")
    return [_file(f"{lands}/{model}", data=form.model),
            layer_tar.Member(f"{lands}/{data}".strip("/"), 0o644, MTIME, source=plan.model.path, ranges=form.ranges)]


def layer(of: Layer, files: list[layer_tar.Member]) -> Entry:
    """A layer as a context entry: these members and every folder above them
    (root's, 0o755), in the order the engine writes them."""
    have = {m.name for m in files}
    folders = {"/".join(parts[:i]) for m in files for parts in [m.name.split("/")] for i in range(1, len(parts))}
    members = [layer_tar.Member(d, 0o755, MTIME) for d in sorted(folders - have)] + files
    return Entry(of.source, members=tuple(layer_tar.walk_order(members)))


def _file(path: str, source: Path | None = None, data: bytes | None = None, mode: int = 0o644) -> layer_tar.Member:
    return layer_tar.Member(path.strip("/"), mode, MTIME, source=source, data=data)


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
    """The packages (executables keep 0o755: shared libraries, as pip installs them), the
    runtime (and its bytecode) with the link check script beside it, and the cache folder."""
    site, runtime = LAYERS["packages"].lands, LAYERS["runtime"].lands
    packages = [_file(f"{site}/{path.relative_to(installed.path).as_posix()}", source=path,
                      mode=0o755 if path.stat().st_mode & 0o111 else 0o644)
                for path in sorted(installed.path.rglob("*")) if path.is_file() and not path.is_symlink()]
    code = [_file(f"{runtime}/{src.name}", source=src) for src in runtime_files()]
    if installed.compiled:
        code += [_file(f"{runtime}/{name}", data=data) for name, data in bytecode(runtime_files(), runtime)]
    code.append(_file(LINKCHECK, source=LINKCHECK_SCRIPT))  # run as a script by the build: no bytecode
    cache = LAYERS["cache"]
    return [layer(LAYERS["packages"], packages), layer(LAYERS["runtime"], code),
            Entry(cache.source, members=tuple(cache_members()))]


def cache_members(uid: int = UID) -> list[layer_tar.Member]:
    """/opt/gpux/cache owned by the image's user, its parents root's as in the other layers."""
    cache = LAYERS["cache"].lands.strip("/")
    parts = cache.split("/")
    members = [layer_tar.Member("/".join(parts[: i + 1]), 0o755, MTIME) for i in range(len(parts) - 1)]
    return [*members, layer_tar.Member(cache, 0o755, MTIME, uid=uid, gid=uid)]


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
    """The context as the engine reads it: its folders, then its entries (each written whole,
    or the build fails naming the file that changed meanwhile)."""
    for name in ctx.dirs():
        out.write(_info(name, tarfile.DIRTYPE, 0o755).tobuf(tarfile.PAX_FORMAT))
    for entry in ctx.entries:
        info = _info(entry.name, tarfile.REGTYPE, entry.mode)
        info.size = entry.size
        out.write(info.tobuf(tarfile.PAX_FORMAT))
        written = 0
        for piece in entry.chunks():
            out.write(piece)
            written += len(piece)
        if written != info.size:
            raise PackError(f"{entry.source or entry.name}: changed while the build context was written")
        out.write(b"\0" * (-written % tarfile.BLOCKSIZE))
    out.write(b"\0" * (2 * tarfile.BLOCKSIZE))


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def write(ctx: Context, out: Path) -> None:
    """Write the context to a folder: empty, missing, or an earlier gpux-pack context (replaced
    whole). Never through a symbolic link: replacing its target would remove a folder elsewhere."""
    if out.is_symlink():
        raise UsageError(f"--output {out}: is a symbolic link; give the folder itself")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output {out}: is a file, not a folder")
    try:
        if out.exists() and any(out.iterdir()) and not (out / MARKER).is_file():
            raise UsageError(f"--output {out}: folder is not empty and was not written by gpux-pack")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        _write_into(ctx, out)
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise UsageError(f"--output {out}: writing the context failed: {e.strerror or e}{where}") from None


def _write_into(ctx: Context, out: Path) -> None:
    """Every entry with its mode and the fixed time, folders first."""
    for name in ctx.dirs():
        (out / name).mkdir(exist_ok=True)
    for entry in ctx.entries:
        target = out / entry.name
        with open(target, "wb") as f:
            for piece in entry.chunks():
                f.write(piece)
        os.chmod(target, entry.mode)
        os.utime(target, (MTIME, MTIME))
    for name in [*reversed(ctx.dirs()), ""]:
        os.chmod(out / name, 0o755)
        os.utime(out / name, (MTIME, MTIME))
