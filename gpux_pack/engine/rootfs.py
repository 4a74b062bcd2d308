"""The base image's root filesystem on the host, and what it says of itself.

The base image's Python, glibc and architecture, and whether a provider's libraries resolve,
are read from its files on the host instead of by running Python in it: nothing runs in the
image, so a foreign architecture (an arm64 base on an x86_64 host) works, and the Dockerfile
needs no RUN. The container used for the export is created and never started.

Only what those checks read is kept (a CUDA base is gigabytes): shared libraries and every
symlink, ld.so.conf and its includes, and the names of the python3 interpreters. Large
libraries are kept as sparse files holding only their ELF headers, dynamic section and
dynamic strings, which is all the link check reads.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
import struct
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from gpux_pack import staging
from gpux_pack.engine import base_image, container_labels, remove_container, remove_leftovers, short_error
from gpux_pack.engine.interface import Engine, ImageNotFound
from gpux_pack.errors import DockerError, PackError, UsageError
from gpux_pack.linkcheck import MACHINES, TRIPLETS, ElfInfo, Tree, arch_of, system_dirs
from gpux_pack.providers import BaseImage
from gpux_pack.staging import cache_dir, touch

ARCHES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}
COMPACT_ABOVE = 8 << 20  # libraries larger than this keep only what the link check reads
SKIP_TOPS = ("proc", "sys", "dev")  # the engine's own mounts: nothing of the image's

_LIB = re.compile(r"\.so(\.[0-9][^/]*)?$")  # libfoo.so, libfoo.so.1, libfoo.so.1.2.3
_CONF = re.compile(r"^etc/ld\.so\.conf(\.d/[^/]+)?$")
_PYTHON = re.compile(r"^(usr/(local/)?)?bin/python3(\.\d+)?$")
_PYLIB = re.compile(r"^usr/(local/)?lib(64)?/python3\.\d+$")
# what the SBOM reads: the package databases (Debian's, Alpine's) and the OS's name and version
_PACKAGES = re.compile(r"^(var/lib/dpkg/status|lib/apk/db/installed|etc/os-release|usr/lib/os-release)$")
FORMAT = "2"  # what an export keeps; a new format exports each base once more


def inspect_base(client: Engine, base: BaseImage, platform: str | None, python: str | None, pull: bool,
                 log: Callable[[str], None], for_platform: bool = False) -> BaseImage | None:
    """Python, glibc and architecture of the base image, read on the host from its files
    (exported once per image id; nothing runs, so a foreign architecture works). None when it
    is absent and not to be pulled (the plan then assumes the table's facts). for_platform (one
    of several platforms): a base present for another platform is pulled for this one (one
    multi-platform base serves all); otherwise a mismatch is the user's to fix."""
    attrs = base_image(client, base.image, pull, log, platform if for_platform else None)
    if attrs is None:
        return None
    root = export(client, base.image, log)
    arch = "/".join(filter(None, [attrs.get("Architecture") or "amd64", attrs.get("Variant")]))
    found, glibc, machine = facts(root, arch, base.image, require_python=base.has_python)
    return replace(base, python=found or python or base.python, glibc=glibc, arch=machine, probed=True,
                   id=attrs["Id"], rootfs=str(root), ld_library_path=tuple(library_path(attrs)),
                   interpreter=python_path(root) or "",
                   workdir=(attrs.get("Config") or {}).get("WorkingDir") or "")


def export(client: Engine, image: str, log: Callable[[str], None] | None = None) -> Path:
    """The image's root filesystem (the parts the checks read) under the cache, by image id.
    Made once per image: a temporary folder renamed into place when complete, so a concurrent
    build sees the whole tree or none."""
    try:
        image_id = client.images.get(image).id
    except ImageNotFound:
        raise DockerError(
            f"base image {image} is not present; pull or load it, or pick another with --base-image"
        ) from None
    except Exception as e:
        raise DockerError(f"cannot inspect base image {image}: {short_error(e)}") from None
    key = f"{image_id.replace(':', '-')}-{FORMAT}"
    final = cache_dir() / "rootfs" / key
    if final.is_dir():
        touch(final)
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        with staging.locked(final):  # a second build of the same base waits, then reuses the tree
            if final.is_dir():
                touch(final)
                return final
            staging.remove_leftovers(final)
            if log is not None:
                log(f"reading base image {image} (its libraries, once per image)")
            with staging.staged(final) as tmp:
                tmp.mkdir()
                _export_to(client, image, tmp)
    except OSError as e:
        raise PackError(f"cannot write the base image's files under {final.parent}: {e.strerror or e}") from None
    return final


def _export_to(client: Engine, image: str, dest: Path) -> None:
    """Stream `docker export` of a created (never started) container through the filter."""

    container = None
    remove_leftovers(client, "export")  # a killed build's, which would block `docker rmi` of its base
    try:
        container = client.containers.create(
            image, entrypoint=["/nonexistent"], network_disabled=True, labels=container_labels("export")
        )
        stream = io.BufferedReader(_Chunks(container.export(chunk_size=1 << 20)), buffer_size=1 << 20)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            extract(tar, dest)
    except PackError:
        raise
    except tarfile.TarError as e:
        raise DockerError(f"cannot export base image {image}: unreadable archive ({short_error(e)})") from None
    except Exception as e:
        import requests

        if isinstance(e, OSError) and not isinstance(e, requests.RequestException):  # this host's disk
            raise DockerError(f"cannot write the base image's files under {dest.parent}: {e.strerror or e}") from None
        raise DockerError(f"cannot export base image {image}: {short_error(e)}") from None  # the engine
    finally:
        if container is not None:
            remove_container(container)


class _Chunks(io.RawIOBase):
    """The engine's chunk iterator as a file, for tarfile's stream mode."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks: Iterator[bytes] = iter(chunks)
        self._view = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._view:
            try:
                self._view = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._view))
        buffer[:n] = self._view[:n]
        self._view = self._view[n:]
        return n


# ---------------------------------------------------------------------------------------------
# the filter


def wanted(name: str, kind: str) -> bool:
    """Whether the checks read this archive member. kind: file | dir | symlink."""
    if kind == "symlink":
        return True  # tiny, and any of them may lead to a library folder (/lib -> usr/lib)
    if kind == "dir":
        return bool(_PYLIB.match(name)) or name == "etc/ld.so.conf.d"
    return bool(_LIB.search(name.rsplit("/", 1)[-1]) or _CONF.match(name) or _PYTHON.match(name)
                or _PACKAGES.match(name))


def extract(tar: tarfile.TarFile, dest: Path) -> dict[str, int]:
    """Write the wanted members of a stream-mode archive under dest, and nothing outside it:
    absolute names, '..', devices and hard links to anything not written here are refused, a
    name under a symlink is refused (the host would follow it), symlinks are written as they
    are and never followed. Counts of what was written and refused."""
    counts = {"files": 0, "symlinks": 0, "refused": 0, "bytes": 0}
    written: set[str] = set()
    folders: set[str] = set()
    for member in tar:
        name = _member_name(member.name)
        parts = name.split("/")
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            counts["refused"] += 1
            continue
        if parts[0] in SKIP_TOPS or member.isdev() or member.isfifo():
            continue
        kind = "dir" if member.isdir() else "symlink" if member.issym() else ""
        kind = "file" if member.isreg() or member.islnk() else kind
        if not kind or not wanted(name, kind):
            continue
        if kind == "dir":
            if _folder(dest, name, folders) is None:
                counts["refused"] += 1
            continue
        target = _slot(dest, name, folders)
        if target is None:
            counts["refused"] += 1
            continue
        if member.issym():
            os.symlink(member.linkname, target)
            counts["symlinks"] += 1
        elif member.islnk():
            source = _member_name(member.linkname)
            if source not in written:  # outside the archive, or a file not kept
                counts["refused"] += 1
                continue
            os.link(dest / source, target, follow_symlinks=False)
        elif _PYTHON.match(name):
            _create(target).close()  # the name is what counts: the interpreter is never run here
        else:
            with _create(target) as out:
                shutil.copyfileobj(tar.extractfile(member), out, 1 << 20)  # type: ignore[arg-type]
            size = member.size
            if size > COMPACT_ABOVE and not parts[-1].startswith(("libc.so", "libc-")):
                size = compact(target)
            counts["files"] += 1
            counts["bytes"] += size
        written.add(name)
    return counts


def _member_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _create(path: Path) -> io.BufferedWriter:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    return os.fdopen(fd, "wb")


def _folder(dest: Path, name: str, folders: set[str]) -> Path | None:
    """dest/name as a real folder, each part made here: None where a part is a symlink or a
    file (writing through it could leave dest)."""
    path = dest
    so_far = ""
    for part in name.split("/"):
        path = path / part
        so_far = f"{so_far}/{part}" if so_far else part
        if so_far in folders:
            continue
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            os.mkdir(path, 0o755)
            mode = stat.S_IFDIR
        if not stat.S_ISDIR(mode):
            return None
        folders.add(so_far)
    return path


def _slot(dest: Path, name: str, folders: set[str]) -> Path | None:
    """Where a file or symlink goes: its folder made, an earlier entry of that name removed."""
    parent, _, leaf = name.rpartition("/")
    folder = _folder(dest, parent, folders) if parent else dest
    if folder is None:
        return None
    path = folder / leaf
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if stat.S_ISDIR(mode):
        return None
    path.unlink()  # a later member of the same name wins, as in the image
    return path


def compact(path: Path) -> int:
    """Rewrite a large ELF library as a sparse file of the same size holding only the parts
    the link check reads (header, program headers, dynamic section, dynamic strings). Bytes
    kept on disk; a file that is not such an ELF library stays whole."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            ranges = _elf_ranges(f)
            pieces = []
            for offset, length in ranges:
                f.seek(offset)
                pieces.append((offset, f.read(length)))
    except (ValueError, struct.error):
        return size
    tmp = path.with_name(f".{path.name}.compact")
    with _create(tmp) as out:
        for offset, data in pieces:
            out.seek(offset)
            out.write(data)
        out.truncate(size)
    os.replace(tmp, path)
    return sum(len(data) for _, data in pieces)


def _elf_ranges(f: Any) -> list[tuple[int, int]]:
    def read(offset: int, length: int) -> bytes:
        f.seek(offset)
        data = f.read(length)
        if len(data) != length:
            raise ValueError("truncated")
        return data

    head = read(0, 64)
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    table = read(phoff, phentsize * phnum)
    ranges = [(0, 64), (phoff, phentsize * phnum)]
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        raise ValueError("no dynamic section")
    ranges.append(dynamic)
    strtab = strsz = None
    data = read(*dynamic)
    for off in range(0, len(data) - 15, 16):
        tag, value = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag == 5:
            strtab = value
        elif tag == 10:
            strsz = value
    if strtab is None or strsz is None:
        raise ValueError("no dynamic strings")
    offset = next((o + strtab - v for v, o, n in loads if v <= strtab < v + n), None)
    if offset is None:
        raise ValueError("dynamic strings outside the loaded segments")
    ranges.append((offset, strsz))
    return ranges


# ---------------------------------------------------------------------------------------------
# what the root says


def resolve_in(root: Path, image_path: str) -> Path | None:
    """The host path of an image path, its symlinks followed inside root (an absolute target
    starts again at root); None when it does not exist, loops, or leads out of root."""
    real = Tree(root).realpath(image_path)
    return root / real.lstrip("/") if real is not None else None


def facts(
    root: Path, image_arch: str, image: str = "the base image", require_python: bool = True
) -> tuple[str | None, tuple[int, int], str]:
    """(Python "3.11", glibc (2, 36), arch "x86_64" | "aarch64") read from the exported root:
    Python from the interpreter python3 names, glibc from libc.so.6's own banner, the
    architecture from the image's Architecture attribute, checked against libc.so.6's ELF
    machine. Python is None when absent and not required (a base where apt installs it)."""
    arch = ARCHES.get(image_arch.split("/")[0])
    if arch is None:
        raise UsageError(f"{image} is for {image_arch}; images can be built for amd64 and arm64")
    python = python_version(root)
    if python is None and require_python:
        raise UsageError(f"{image} has no python3; use a base with Python 3.11+ (e.g. python:3.11-slim)")
    libc = _find_libc(root, arch)
    if libc is None:
        raise UsageError(f"{image} has no glibc (musl/Alpine?); ONNX Runtime wheels need a glibc base")
    try:
        machine = ElfInfo(libc).machine
        data = libc.read_bytes()
    except (ValueError, OSError):
        raise UsageError(f"{image}: its libc.so.6 is not a readable ELF library") from None
    if machine != MACHINES[arch]:
        raise UsageError(f"{image} says it is {image_arch} but its libc.so.6 is built for {arch_of(machine)}")
    glibc = _glibc_version(data)
    if glibc is None:
        raise UsageError(f"{image}: cannot read the glibc version of its libc.so.6")
    return python, glibc, arch


PYTHON_DIRS = ("/usr/local/bin", "/usr/bin", "/bin")  # where python3 is looked for, in PATH's order


def python_path(root: Path) -> str | None:
    """The absolute path of the python3 the usual PATH finds (the one python_version reads),
    as the image names it: the image's entrypoint, so no runtime has to search a PATH."""
    return next((f"{folder}/python3" for folder in PYTHON_DIRS if resolve_in(root, f"{folder}/python3")), None)


def python_version(root: Path) -> str | None:
    """The "3.N" of the python3 on the usual PATH, from the name it leads to (python3 ->
    python3.11), else from the python3.N names or lib/python3.N folders next to it."""
    for folder in PYTHON_DIRS:
        real = resolve_in(root, f"{folder}/python3")
        if real is None:
            continue
        m = re.fullmatch(r"python3\.(\d+)", real.name)
        if m:
            return f"3.{m.group(1)}"
        prefix = "/usr/local" if folder == "/usr/local/bin" else "/usr"
        versions = _versions(root, [folder], r"python3\.(\d+)") or _versions(
            root, [f"{prefix}/lib", f"{prefix}/lib64"], r"python3\.(\d+)"
        )
        return f"3.{max(versions)}" if versions else None
    return None


def _versions(root: Path, folders: list[str], pattern: str) -> list[int]:
    found = []
    for folder in folders:
        real = resolve_in(root, folder)
        if real is not None and real.is_dir():
            found += [int(m.group(1)) for n in os.listdir(real) if (m := re.fullmatch(pattern, n))]
    return found


def _find_libc(root: Path, arch: str) -> Path | None:
    """libc.so.6 where the loader looks: ld.so.conf, then the defaults of every architecture
    (a mislabelled image is caught by the ELF machine check, not missed)."""
    tree = Tree(root)
    dirs = system_dirs(tree, arch) + [f"{p}/{t}" for t in TRIPLETS.values() for p in ("/lib", "/usr/lib")]
    for folder in dirs:
        host = tree.file(f"{folder}/libc.so.6")
        if host is not None:
            return host
    return None


def _glibc_version(data: bytes) -> tuple[int, int] | None:
    banner = re.search(rb"GNU C Library[^\n\0]*? version (\d+)\.(\d+)", data)
    if banner:
        return int(banner.group(1)), int(banner.group(2))
    versions = [(2, int(m.group(1))) for m in re.finditer(rb"GLIBC_2\.(\d+)", data)]
    return max(versions) if versions else None


def library_path(attrs: dict[str, Any]) -> list[str]:
    """The image's LD_LIBRARY_PATH (from `docker image inspect`), for the link check."""
    for item in (attrs.get("Config") or {}).get("Env") or []:
        if item.startswith("LD_LIBRARY_PATH="):
            return [d for d in item.split("=", 1)[1].split(":") if d]
    return []


@dataclass(frozen=True)
class OsPackage:
    """A package the base image's package manager installed."""

    name: str
    version: str
    arch: str
    manager: str  # deb | apk
    maintainer: str = ""  # who supplies it (dpkg's Maintainer, apk's m:)


def os_release(root: Path) -> dict[str, str]:
    """/etc/os-release's fields (ID, VERSION_ID, PRETTY_NAME ...); empty when the image has none."""
    for name in ("etc/os-release", "usr/lib/os-release"):
        path = resolve_in(root, name)
        if path is not None and path.is_file():
            out = {}
            for line in path.read_text(errors="replace").splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip().isidentifier():
                    out[key.strip()] = value.strip().strip('"\'')
            return out
    return {}


def os_packages(root: Path) -> list[OsPackage]:
    """The installed packages of dpkg's status file or apk's database, sorted by name."""
    out: list[OsPackage] = []
    dpkg = resolve_in(root, "var/lib/dpkg/status")
    if dpkg is not None and dpkg.is_file():
        for stanza in dpkg.read_text(errors="replace").split("\n\n"):
            fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", stanza, re.M))
            if fields.get("Package") and "installed" in fields.get("Status", "").split():
                out.append(OsPackage(fields["Package"], fields.get("Version", ""), fields.get("Architecture", ""),
                                     "deb", fields.get("Maintainer", "").strip()))
    apk = resolve_in(root, "lib/apk/db/installed")
    if apk is not None and apk.is_file():
        for stanza in apk.read_text(errors="replace").split("\n\n"):
            fields = dict(line.split(":", 1) for line in stanza.splitlines() if len(line) > 2 and line[1] == ":")
            if fields.get("P"):
                out.append(OsPackage(fields["P"], fields.get("V", ""), fields.get("A", ""), "apk", fields.get("m", "")))
    return sorted(out, key=lambda p: (p.name, p.version))
