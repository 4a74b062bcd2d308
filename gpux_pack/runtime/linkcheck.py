"""Check that an execution provider's shared libraries resolve, as the dynamic loader will.

Runs at build time (so a missing cuDNN fails `docker build` instead of silently falling back to
CPU in production) and on demand in an image (`python -m gpux_runtime linkcheck`). It reads ELF
files itself: no ldd, and no dlopen, which would need the GPU driver the build host lacks.
Libraries of the host's driver (libcuda.so.1, ...) are named and skipped: they arrive at
`docker run`. Standard library only, so it also runs as a plain script.
"""

from __future__ import annotations

import argparse
import glob
import os
import struct
import sys
from pathlib import Path

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NEEDED, DT_STRTAB, DT_RPATH, DT_RUNPATH = 1, 5, 15, 29


class ElfInfo:
    """DT_NEEDED, RPATH and RUNPATH of a 64-bit little-endian ELF shared object."""

    def __init__(self, path: Path):
        self.path = path
        data = path.read_bytes()
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
            end = data.index(b"\0", base + offset)
            return data[base + offset : end].decode()

        origin = str(path.parent)
        for tag, value in entries:
            if tag == DT_NEEDED:
                self.needed.append(text(value))
            elif tag in (DT_RPATH, DT_RUNPATH):
                dirs = [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for d in text(value).split(":") if d]
                (self.rpath if tag == DT_RPATH else self.runpath).extend(dirs)


def system_dirs() -> list[str]:
    """ld.so.conf (with its includes), then the loader's defaults."""
    dirs: list[str] = []

    def read(conf: str) -> None:
        try:
            lines = Path(conf).read_text().splitlines()
        except OSError:
            return
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if line.startswith("include "):
                for inc in sorted(glob.glob(line.split(None, 1)[1])):
                    read(inc)
            elif line:
                dirs.append(line)

    read("/etc/ld.so.conf")
    machine = os.uname().machine
    triplet = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(machine, "")
    dirs += [f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    return dirs


class Resolver:
    def __init__(self, extra_dirs: list[str], skip: set[str]):
        env = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
        self.env, self.extra, self.system, self.skip = env, extra_dirs, system_dirs(), skip
        self.seen: dict[str, Path | None] = {}
        self.missing: list[tuple[str, str]] = []  # (soname, needed by)
        self.skipped: set[str] = set()

    def find(self, name: str, by: ElfInfo) -> Path | None:
        # glibc's order: RPATH (when there is no RUNPATH), LD_LIBRARY_PATH, RUNPATH, ld.so.cache,
        # defaults. Libraries the runtime preloads (NVIDIA wheels) count as already loaded.
        order = ([] if by.runpath else by.rpath) + self.env + by.runpath + self.extra + self.system
        for d in order:
            candidate = Path(d) / name
            if candidate.is_file():
                try:
                    if ElfInfo(candidate).machine == by.machine:
                        return candidate
                except ValueError:
                    continue
        return None

    def walk(self, path: Path) -> None:
        info = ElfInfo(path)
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
                self.walk(found.resolve())


def check(
    libs: list[str], dlopen: list[str], dirs: list[str], skip: list[str], provider: str, quiet: bool = False
) -> list[str]:
    """Problems found, as lines naming each missing library and who needs it."""
    import onnxruntime  # the package must import before anything else matters

    capi = Path(onnxruntime.__file__).parent / "capi"
    site = Path(onnxruntime.__file__).parent.parent
    extra = sorted({d for pattern in dirs for d in glob.glob(str(site / pattern)) if os.path.isdir(d)})
    resolver = Resolver([str(capi), *extra], set(skip))
    problems = []
    for lib in libs:
        path = capi / lib
        if not path.is_file():
            problems.append(f"{lib} is not in onnxruntime {onnxruntime.__version__}: this build has no {provider}")
            continue
        resolver.walk(path)
    for name in dlopen:  # opened by name at run time (cuDNN, TensorRT plugins)
        holder = ElfInfo(capi / libs[0]) if libs and (capi / libs[0]).is_file() else None
        if holder is not None and resolver.find(name, holder) is None and name not in resolver.seen:
            resolver.missing.append((name, f"{provider} at run time"))
    reported: set[str] = set()
    for name, by in resolver.missing:
        if name not in reported:
            reported.add(name)
            problems.append(f"{name} (needed by {by}) is not in the image")
    if not problems and not quiet:
        skipped = f"; left to the host's driver: {', '.join(sorted(resolver.skipped))}" if resolver.skipped else ""
        print(f"link check: {provider}: {len(resolver.seen)} libraries resolve{skipped}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="linkcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--provider", required=True, help="execution provider, for messages")
    parser.add_argument("--lib", action="append", default=[], help="provider library in onnxruntime/capi")
    parser.add_argument("--dlopen", action="append", default=[], help="soname loaded by name at run time")
    parser.add_argument("--dir", action="append", default=[], help="site-packages glob of preloaded libraries")
    parser.add_argument("--driver", action="append", default=[], help="soname the host's driver provides")
    parser.add_argument("--hint", default="use a base image that provides it", help="what to do about a failure")
    args = parser.parse_args(argv)
    problems = check(args.lib, args.dlopen, args.dir, args.driver, args.provider)
    if problems:
        for line in problems:
            print(f"link check: {line}", file=sys.stderr)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        print(f"link check failed: {args.provider} cannot load: {problems[0]}{more}; {args.hint}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
