"""Check that an execution provider's shared libraries resolve, as the dynamic loader will.

The packager's check, not the runtime's: the install stage runs it on the build host against
the base image's exported root filesystem plus the packages installed for the image
(`check_tree`: nothing runs in the image, so it works for a foreign architecture too). Where the
libraries come from an apt step the host cannot see, the runtime base image's build runs this
file as a script (`python3 /opt/gpux/runtime/linkcheck.py`, beside gpux_runtime, never part of
it). It reads ELF files itself: no ldd, and no dlopen, which would need the GPU driver the
build host lacks. Libraries of the host's driver (libcuda.so.1, ...) are named and skipped:
they arrive at `docker run`. Standard library only, so it runs in any image's python3.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import mmap
import os
import re
import stat
import struct
import sys
from pathlib import Path
from typing import Callable

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 1, 5, 10, 15, 29
MACHINES = {"x86_64": 62, "aarch64": 183}  # ELF e_machine
TRIPLETS = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
MAX_LINKS = 40  # the kernel's limit on symlinks in one lookup


def arch_of(machine: int) -> str:
    return next((name for name, m in MACHINES.items() if m == machine), f"e_machine {machine}")


class ElfInfo:
    """DT_NEEDED, RPATH and RUNPATH of a 64-bit little-endian ELF shared object."""

    def __init__(self, path: Path, origin: str | None = None):
        """origin: what $ORIGIN means (the file's folder as the image sees it; default: its
        folder here). Mapped, not read: a CUDA library is hundreds of MB, its headers a few KB."""
        self.path = path
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < 64:
                raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                try:
                    self._parse(data, origin if origin is not None else str(path.parent))
                except (struct.error, IndexError) as e:  # truncated: offsets past the end
                    raise ValueError(f"{path} is not a readable ELF file ({e})") from None

    def _parse(self, data: mmap.mmap, origin: str) -> None:
        path = self.path
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
        self.machine = struct.unpack_from("<H", data, 18)[0]
        phoff, = struct.unpack_from("<Q", data, 32)
        phentsize, phnum = struct.unpack_from("<HH", data, 54)
        loads, dynamic = [], None
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
            if p_type == PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        self.needed: list[str] = []
        self.rpath: list[str] = []
        self.runpath: list[str] = []
        if dynamic is None:
            return
        entries, strtab = [], None
        for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, value = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            if tag == DT_STRTAB:
                strtab = value
            entries.append((tag, value))
        base = next((o + strtab - v for v, o, n in loads if strtab is not None and v <= strtab < v + n), None)
        if base is None:
            return

        def text(offset: int) -> str:
            end = data.find(b"\0", base + offset)
            if end < 0:
                raise ValueError(f"{path}: a dynamic string runs past the end of the file")
            return data[base + offset : end].decode()

        for tag, value in entries:
            if tag == DT_NEEDED:
                self.needed.append(text(value))
            elif tag in (DT_RPATH, DT_RUNPATH):
                dirs = [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for d in text(value).split(":") if d]
                (self.rpath if tag == DT_RPATH else self.runpath).extend(dirs)


class Tree:
    """Where the image's paths are read. root None: this system (the check runs in the image).
    Otherwise an image's root filesystem exported to the host, with host folders standing in
    for parts of the image (overlays: "/opt/gpux/site-packages" -> the packages installed on the
    host). Symlinks are followed the chroot way, never by the host: an absolute target starts
    again at the root, and one that climbs above it, or loops, resolves to nothing."""

    def __init__(self, root: Path | None = None, overlays: dict[str, Path] | None = None):
        self.root = Path(root) if root is not None else None
        self.overlays = sorted((("/" + p.strip("/"), Path(h)) for p, h in (overlays or {}).items()),
                               key=lambda item: -len(item[0]))
        # the folders above an overlay exist in the image (COPY makes them) whatever the root has
        self.above = {"/" + "/".join(p.strip("/").split("/")[:i]) for p, _ in self.overlays
                      for i in range(1, len(p.strip("/").split("/")))}

    def host(self, path: str) -> Path:
        """The host path of an image path with no symlink or '..' in it."""
        if self.root is None:
            return Path(path)
        path = "/" + "/".join(c for c in path.split("/") if c and c != ".")
        for prefix, target in self.overlays:
            if path == prefix or path.startswith(prefix + "/"):
                return target / path[len(prefix):].lstrip("/")
        return self.root / path.lstrip("/")

    def realpath(self, path: str) -> str | None:
        """The image path with every symlink followed; None when it does not exist, loops, or
        leads out of the root."""
        if self.root is None:
            try:
                return str(Path(path).resolve(strict=True))
            except (OSError, RuntimeError):
                return None
        todo = [c for c in path.split("/") if c][::-1]  # a stack: the next component last
        done: list[str] = []
        links = 0
        while todo:
            part = todo.pop()
            if part == ".":
                continue
            if part == "..":
                if not done:
                    return None  # above the root
                done.pop()
                continue
            here = "/" + "/".join([*done, part])
            if here in self.above:
                done.append(part)
                continue
            try:
                mode = os.lstat(self.host(here)).st_mode
            except OSError:
                return None
            if stat.S_ISLNK(mode):
                links += 1
                if links > MAX_LINKS:
                    return None
                target = os.readlink(self.host(here))
                if target.startswith("/"):
                    done = []
                todo.extend(c for c in reversed(target.split("/")) if c)
                continue
            if todo and not stat.S_ISDIR(mode):
                return None
            done.append(part)
        return "/" + "/".join(done)

    def file(self, path: str) -> Path | None:
        """The host path of the regular file an image path names, symlinks followed."""
        if self.root is None:
            return Path(path) if Path(path).is_file() else None
        real = self.realpath(path)
        host = self.host(real) if real is not None else None
        return host if host is not None and host.is_file() and not host.is_symlink() else None

    def is_dir(self, path: str) -> bool:
        if self.root is None:
            return os.path.isdir(path)
        real = self.realpath(path)
        return real is not None and (real in self.above or real == "/" or self.host(real).is_dir())

    def resolve(self, path: Path) -> Path:
        """A found library's real path, whose folder is its $ORIGIN."""
        if self.root is None:
            return path.resolve()
        return Path(self.realpath(str(path)) or path)

    def read_text(self, path: str) -> str | None:
        host = self.file(path)
        try:
            return host.read_text(errors="replace") if host is not None else None
        except OSError:
            return None

    def glob(self, pattern: str) -> list[str]:
        """Image paths matching an absolute pattern, sorted."""
        if self.root is None:
            return sorted(glob.glob(pattern))
        found = ["/"]
        for part in (c for c in pattern.split("/") if c):
            if not glob.has_magic(part):
                found = [os.path.join(base, part) for base in found]
                continue
            matches = []
            for base in found:
                for name in sorted(self._names(base)):
                    if fnmatch.fnmatchcase(name, part) and (part.startswith(".") or not name.startswith(".")):
                        matches.append(os.path.join(base, name))
            found = matches
        return sorted(p for p in found if self.realpath(p) is not None)

    def _names(self, folder: str) -> set[str]:
        real = self.realpath(folder)
        if real is None:
            return set()
        names = {p[len(real):].strip("/").split("/")[0] for p in (*self.above, *(o for o, _ in self.overlays))
                 if p.startswith(real.rstrip("/") + "/")}
        try:
            names.update(os.listdir(self.host(real)))
        except OSError:
            pass
        return names


def system_dirs(tree: Tree | None = None, arch: str | None = None) -> list[str]:
    """ld.so.conf (with its includes, read from the image's /etc), then the loader's defaults
    for the image's architecture (default: this machine's)."""
    tree = tree or Tree()
    dirs: list[str] = []
    seen: set[str] = set()

    def read(conf: str) -> None:
        if conf in seen:  # an include loop
            return
        seen.add(conf)
        text = tree.read_text(conf)
        for line in (text or "").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("include "):
                pattern = line.split(None, 1)[1].strip()
                if not pattern.startswith("/"):  # ldconfig: relative to the including file
                    pattern = os.path.join(os.path.dirname(conf), pattern)
                for inc in tree.glob(pattern):
                    read(inc)
            elif line:
                dirs.append(line)

    read("/etc/ld.so.conf")
    triplet = TRIPLETS.get(arch or os.uname().machine, "")
    dirs += [f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    return dirs


class Resolver:
    """tree: where the image's files are read (default: this system). env: the image's
    LD_LIBRARY_PATH (default: this process's). arch: the image's, for the default folders."""

    def __init__(self, extra_dirs: list[str], skip: set[str], tree: Tree | None = None,
                 env: list[str] | None = None, arch: str | None = None):
        if env is None:
            env = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
        self.tree = tree or Tree()
        self.env, self.extra, self.system, self.skip = env, extra_dirs, system_dirs(self.tree, arch), skip
        self.seen: dict[str, Path | None] = {}
        self.missing: list[tuple[str, str]] = []  # (soname, needed by)
        self.skipped: set[str] = set()

    def elf(self, path: Path) -> ElfInfo:
        """The ELF file at an image path; $ORIGIN is the folder the image sees."""
        host = self.tree.file(str(path))
        if host is None:
            raise ValueError(f"{path} is not a file")
        return ElfInfo(host) if self.tree.root is None else ElfInfo(host, origin=str(path.parent))

    def find(self, name: str, by: ElfInfo) -> Path | None:
        # glibc's order: RPATH (when there is no RUNPATH), LD_LIBRARY_PATH, RUNPATH, ld.so.cache,
        # defaults. Libraries the runtime preloads (NVIDIA wheels) count as already loaded.
        order = ([] if by.runpath else by.rpath) + self.env + by.runpath + self.extra + self.system
        for d in order:
            candidate = Path(d) / name
            host = self.tree.file(str(candidate))
            if host is not None:
                try:
                    if ElfInfo(host).machine == by.machine:
                        return candidate
                except ValueError:
                    continue
        return None

    def walk(self, path: Path) -> None:
        info = self.elf(path)
        for name in info.needed:
            if name in self.skip:
                self.skipped.add(name)
                continue
            if name in self.seen:
                if self.seen[name] is None:
                    self.missing.append((name, path.name))
                continue
            found = self.find(name, info)
            self.seen[name] = found
            if found is None:
                self.missing.append((name, path.name))
            else:
                self.walk(self.tree.resolve(found))


def check(
    libs: list[str], dlopen: list[str], dirs: list[str], skip: list[str], provider: str, quiet: bool = False,
    root: Path | None = None, overlays: dict[str, Path] | None = None, site: str | None = None,
    arch: str | None = None, ld_library_path: list[str] | None = None, tensorrt: str = "",
) -> list[str]:
    """Problems found, as lines naming each missing library and who needs it. root None: in
    this system, with the onnxruntime this Python imports; else see check_tree. tensorrt: the
    TensorRT version the provider library was built for; an older libnvinfer is a problem too."""
    log = None if quiet else print
    if root is not None:
        if site is None or arch is None:
            raise ValueError("a root needs the image's site-packages path and architecture")
        return check_tree(provider, libs, dlopen, dirs, skip, root, overlays or {}, site, arch,
                          ld_library_path or [], log, tensorrt)
    import onnxruntime  # the package must import before anything else matters

    here = str(Path(onnxruntime.__file__).parent.parent)
    return _check(Tree(), here, onnxruntime.__version__, libs, dlopen, dirs, skip, provider, None, None, log,
                  tensorrt)


def check_tree(
    provider: str, libs: list[str], dlopen: list[str], dirs: list[str], driver: list[str], root: Path,
    overlays: dict[str, Path], site: str, arch: str, ld_library_path: list[str] = (),  # type: ignore[assignment]
    log: Callable[[str], None] | None = None, tensorrt: str = "",
) -> list[str]:
    """The link check on the build host: the image is `root` (its base's exported root
    filesystem) with `overlays` (image path -> host folder) on top; `site` is the image path of
    the site-packages holding onnxruntime (dirs are globs relative to it); arch the image's
    (x86_64 | aarch64): every library must be built for it. ld_library_path: the image's
    LD_LIBRARY_PATH. tensorrt: see check. Nothing runs in the image. Empty: every library
    resolves."""
    if arch not in MACHINES:
        raise ValueError(f"unknown architecture {arch!r}: x86_64 or aarch64")
    tree = Tree(root, overlays)
    init = tree.read_text(f"{site}/onnxruntime/__init__.py")
    if init is None:
        return [f"onnxruntime is not installed in {site}"]
    version = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", init, re.M)
    return _check(tree, site, version.group(1) if version else "(unknown version)", libs, dlopen, dirs,
                  driver, provider, arch, list(ld_library_path), log, tensorrt)


def _check(
    tree: Tree, site: str, version: str, libs: list[str], dlopen: list[str], dirs: list[str], skip: list[str],
    provider: str, arch: str | None, env: list[str] | None, log: Callable[[str], None] | None,
    tensorrt: str = "",
) -> list[str]:
    capi = f"{site}/onnxruntime/capi"
    extra = sorted({d for pattern in dirs for d in tree.glob(f"{site}/{pattern}") if tree.is_dir(d)})
    resolver = Resolver([capi, *extra], set(skip), tree, env, arch)
    problems = []
    holder = None
    for lib in libs:  # a name: in onnxruntime/capi; a relative path: in site-packages (plugin EPs)
        path = Path(site) / lib if "/" in lib else Path(capi) / lib
        if tree.file(str(path)) is None:
            where = f"onnxruntime {version}" if "/" not in lib else "the image's site-packages"
            problems.append(f"{lib} is not in {where}: this build has no {provider}")
            continue
        try:
            info = resolver.elf(path)
        except ValueError:
            problems.append(f"{lib} in onnxruntime {version} is not a 64-bit little-endian ELF library")
            continue
        if arch is not None and info.machine != MACHINES[arch]:
            problems.append(f"{lib} is built for {arch_of(info.machine)}, but the image is {arch}")
            continue
        holder = holder or info
        resolver.walk(path)
    for name in dlopen:  # opened by name at run time (cuDNN, TensorRT plugins)
        if holder is not None and resolver.find(name, holder) is None and name not in resolver.seen:
            resolver.missing.append((name, f"{provider} at run time"))
    reported: set[str] = set()
    for name, by in resolver.missing:
        if name not in reported:
            reported.add(name)
            problems.append(f"{name} (needed by {by}) is not in the image")
    trt = ""
    if tensorrt:  # the libnvinfer the provider library resolved, against the one it was built for
        found = resolver.seen.get(f"libnvinfer.so.{tensorrt.split('.')[0]}")
        real = tree.realpath(str(found)) if found is not None else None
        have = tensorrt_version(tree, real, site) if real is not None else None
        if have is not None and _numbers(have) < _numbers(tensorrt):
            problems.append(f"TensorRT {have} in the image ({real}) is older than {tensorrt}, which onnxruntime "
                            f"{version}'s TensorRT provider was built for")
        elif real is not None:
            trt = f"; TensorRT {have} (built for {tensorrt})" if have else f"; TensorRT of {real} unknown: not compared"
    if not problems and log is not None:
        skipped = f"; left to the host's driver: {', '.join(sorted(resolver.skipped))}" if resolver.skipped else ""
        log(f"link check: {provider}: {len(resolver.seen)} libraries resolve{skipped}{trt}")
    return problems


def tensorrt_version(tree: Tree, real: str, site: str) -> str | None:
    """The TensorRT version of the libnvinfer at an image path, symlinks followed. Its file name
    carries it: NVIDIA's .deb and tar packages install libnvinfer.so.10.13.3 with the soname
    linked to it, and the file name is the packaged version (the library's own, getInferLibVersion,
    is code: reading it would mean running it). A wheel has no symlinks: tensorrt_libs'
    libnvinfer.so.10 is the file itself, so there the version is its distribution's
    (tensorrt_cu13_libs-10.14.1.48.dist-info). None: neither says."""
    m = re.fullmatch(r"lib\w+\.so\.(\d+\.\d+\.\d+)(?:\.\d+)*", os.path.basename(real))
    if m:
        return m.group(1)
    if os.path.dirname(real) == f"{site.rstrip('/')}/tensorrt_libs":
        for info in tree.glob(f"{site}/tensorrt_cu*_libs-*.dist-info"):
            m = re.fullmatch(r"tensorrt_cu\d+_libs-(\d+\.\d+\.\d+)\S*\.dist-info", os.path.basename(info))
            if m:
                return m.group(1)
    return None


def _numbers(version: str) -> tuple[int, ...]:
    """'10.13.3' -> (10, 13, 3): compared as numbers (10.9 is older than 10.14)."""
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


def failure(provider: str, problems: list[str], hint: str) -> str:
    """The one line a failed check ends with (the build's error message)."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"link check failed: {provider} cannot load: {problems[0]}{more}; {hint}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="linkcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--provider", required=True, help="execution provider, for messages")
    parser.add_argument("--lib", action="append", default=[], help="provider library in onnxruntime/capi")
    parser.add_argument("--dlopen", action="append", default=[], help="soname loaded by name at run time")
    parser.add_argument("--dir", action="append", default=[], help="site-packages glob of preloaded libraries")
    parser.add_argument("--driver", action="append", default=[], help="soname the host's driver provides")
    parser.add_argument("--hint", default="use a base image that provides it", help="what to do about a failure")
    parser.add_argument("--tensorrt", default="", metavar="VERSION",
                        help="the TensorRT version the provider library was built for: an older libnvinfer fails")
    parser.add_argument("--root", type=Path, help="check an image's root filesystem exported here instead")
    parser.add_argument("--overlay", action="append", default=[], metavar="IMAGE_PATH=HOST_DIR",
                        help="with --root: a host folder standing in for an image path")
    parser.add_argument("--site", help="with --root: the image path of the site-packages holding onnxruntime")
    parser.add_argument("--arch", choices=sorted(MACHINES), help="with --root: the image's architecture")
    parser.add_argument("--ld-library-path", default="", help="with --root: the image's LD_LIBRARY_PATH")
    args = parser.parse_args(argv)
    if args.root is not None and (args.site is None or args.arch is None):
        parser.error("--root needs --site and --arch")
    overlays = {}
    for item in args.overlay:
        image_path, sep, host_dir = item.partition("=")
        if not sep or not image_path.startswith("/"):
            parser.error(f"--overlay {item}: expected /image/path=HOST_DIR")
        overlays[image_path] = Path(host_dir)
    problems = check(args.lib, args.dlopen, args.dir, args.driver, args.provider, root=args.root,
                     overlays=overlays, site=args.site, arch=args.arch,
                     ld_library_path=[d for d in args.ld_library_path.split(":") if d],
                     tensorrt=args.tensorrt)
    if problems:
        for line in problems:
            print(f"link check: {line}", file=sys.stderr)
        print(failure(args.provider, problems, args.hint), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
