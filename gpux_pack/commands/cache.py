"""`gpux-pack cache ls|prune`: the caches under GPUX_PACK_CACHE_DIR (~/.cache/gpux-pack), which
otherwise only grow (a CUDA wheelhouse is 2 GB, each install hundreds of MB).

An entry is what is reused as a whole: a wheel file, a lock, an install folder, a base image's
exported files. Every use marks its entry (its access time); pruning removes the entries last
used longer ago than the given age. Temporary entries (.NAME.PID-TOKEN.tmp) whose process is
gone are leftovers: listed apart and always pruned; a live process's are never touched.
"""

from __future__ import annotations

import os
import time
import zipfile
from typing import Any
from dataclasses import dataclass
from pathlib import Path

from gpux_pack import engine, staging
from gpux_pack.staging import cache_dir

KINDS = {
    "wheels": "downloaded wheel files (*.whl)",
    "locks": "resolved locks",
    "installs": "wheels installed for an image's platform",
    "rootfs": "base images' exported files",
    "probes": "base image facts",
    "engines": "engine layer-format checks",
    "attestations": "each image's SBOM and provenance (push attaches them)",
    "sboms": "SBOMs' base and lock parts, reused by the next build on them",
    "models": "what a model's checks found, by what they read (a retrained model is not checked again)",
    "rebuild": "what a weights-only rebuild replays",
    "templates": "the Dockerfile template, compiled",
    "optimized": "models pack.optimize made, with their measured errors (by model, steps and samples)",
}


@dataclass(frozen=True)
class Kind:
    name: str
    path: Path

    def leftovers(self) -> list[Path]:
        """Temporary entries of processes that are gone (killed mid-write), and wheels that are
        not whole (no zip directory at their end: a download cut short by an older gpux-pack,
        which wrote into the cache itself): garbage at any age. Those of a live process (a
        build in progress) are not listed."""
        if not self.path.is_dir():
            return []
        broken = [p for p in self.path.iterdir() if not p.name.startswith(".") and _cut_short(self.name, p)]
        return sorted([p for p in self.path.iterdir() if staging.leftover(p)] + broken)

    def entries(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        # not the dotted ones (.tmp, locks, the hash index), nor wheels cut short (leftovers)
        return sorted(p for p in self.path.iterdir() if not p.name.startswith(".") and not _cut_short(self.name, p))

    def summary(self) -> dict:
        entries = self.entries()
        times = [used(p) for p in entries]
        left = self.leftovers()
        return {"name": self.name, "what": KINDS[self.name], "path": str(self.path), "entries": len(entries),
                "bytes": sum(size(p) for p in entries), "oldest": min(times, default=None),
                "newest": max(times, default=None), "leftovers": len(left),
                "leftover_bytes": sum(size(p) for p in left)}


def _whole(wheel: Path) -> bool:
    """A zip directory at its end. Reading it must not mark the wheel used (its access time is
    what pruning goes by), so the times are put back."""
    try:
        st = wheel.stat()
    except OSError:
        return True  # gone meanwhile: nothing to flag
    whole = zipfile.is_zipfile(wheel)  # False when it cannot be read either
    try:
        os.utime(wheel, ns=(st.st_atime_ns, st.st_mtime_ns))
    except OSError:
        pass
    return whole


def _cut_short(kind: str, path: Path) -> bool:
    return kind == "wheels" and path.suffix == ".whl" and not _whole(path)


def root() -> Path:
    return cache_dir()


def kinds() -> list[Kind]:
    return [Kind(name, root() / name) for name in KINDS]


def used(path: Path) -> float:
    """When the entry was last used (see staging.touch)."""
    st = path.lstat()
    return st.st_mtime if path.is_dir() and not path.is_symlink() else max(st.st_atime, st.st_mtime)


def size(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def prune(older_than: float) -> list[tuple[Path, int]]:
    """Remove entries last modified more than older_than seconds ago, and every leftover of a
    killed process whatever its age, the base exports' containers on the engine included (when
    one answers); (path, bytes) of each file entry."""
    cutoff = time.time() - older_than
    removed = []
    for kind in kinds():
        for entry in [*(e for e in kind.entries() if used(e) <= cutoff), *kind.leftovers()]:
            bytes_ = size(entry)
            staging.remove(entry)
            removed.append((entry, bytes_))
    client = engine.try_connect()
    if client is not None:
        engine.remove_leftovers(client, "export")
    return removed


def lines(rows: list[dict[str, Any]]) -> list[str]:
    """`cache ls` without --json."""
    out = [str(root())]
    for r in rows:
        left = f"  (+{r['leftovers']} left by killed builds, {r['leftover_bytes'] / 1e6:.1f} MB)" if r["leftovers"] else ""
        out.append(f"  {r['name']:<12} {r['entries']:>6} entries  {r['bytes'] / 1e6:>10.1f} MB  {r['what']}{left}")
    return out
