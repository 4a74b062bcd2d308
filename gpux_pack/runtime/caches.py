"""Compiled-artefact caches (OpenVINO blobs, TensorRT engines and timing caches, MIGraphX
programs), keyed by everything that makes them valid, and verified before use.

A cache is one folder per key under a cache root, holding the provider's files and a
`warmup.json` record (key parts, shapes warmed, seconds, every file with its size and sha256).
At start the container computes its own key and looks for a folder of that key, first among
the caches baked into the image (BAKED_DIR, read in place), then in GPUX_CACHE_DIR (a volume,
shared by containers). A folder whose record names other key parts, or whose files do not
match their sha256, is never loaded: one warning line says what differs, and the provider
compiles into a fresh folder. Writers compile into a temporary folder and rename it into place
once its record is written, so containers warming one volume at once never read a half-written
file and all end with a valid folder.

Standard library only (numpy and onnxruntime are imported by the callers).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contract import BAKED_DIR, CACHE_PLACEHOLDER, FALLBACK_CACHE_DIR, RECORD, GpuxJson, device_of, open_regular

log = logging.getLogger("gpux")

MAX_RECORD = 4 << 20  # a record lists files: one this large was not written by a container
STALE_AGE = 6 * 3600  # a temporary compile folder untouched this long belongs to a container that died
FORMAT = 1

# The distributions whose versions change what a provider compiles.
LIBRARIES = re.compile(r"^(onnxruntime.*|openvino.*|tensorrt.*|nvidia-(cuda-runtime|cudnn|cublas).*)$")


class CacheError(Exception):
    """A cache folder that must not be used: the message says why, in one line."""


# ---------------------------------------------------------------------------------------------
# the key


def key_parts(model_sha256: str, provider: str, options: dict[str, Any], shapes: list[dict[str, list[int]]],
              onnxruntime: str, device: str | None = None, libraries: dict[str, str] | None = None) -> dict[str, Any]:
    """What a compiled artefact depends on. Options are the provider's session options without
    their cache paths (precision flags, profiles, workspace: everything that changes what is
    compiled)."""
    return {
        "format": FORMAT,
        "model_sha256": model_sha256,
        "provider": provider,
        "onnxruntime": onnxruntime,
        "libraries": libraries if libraries is not None else library_versions(),
        "device": device if device is not None else device_of(provider),
        "options": {k: str(v) for k, v in sorted(options.items()) if CACHE_PLACEHOLDER not in str(v)},
        "shapes": shapes,
    }


def digest(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:24]


def short(parts: dict[str, Any]) -> str:
    """A tag-friendly name of the key: the device's short name and 6 hex digits."""
    device = str(parts.get("device", ""))
    m = re.search(r"\bsm(\d+)\b", device)
    if m:
        name = f"sm{m.group(1)}"
    else:
        flags = device.rsplit("[", 1)[-1]
        best = next((f for f in ("amx_int8", "avx512_vnni", "avx512f", "avx2", "sve2", "sve", "asimd") if f in flags),
                    "cpu")
        name = best.replace("_", "")
    return f"{name}-{digest(parts)[:6]}"


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'device (recorded X, this container Y)' for each key part that differs."""
    out = []
    for name in sorted(set(recorded) | set(current)):
        if recorded.get(name) != current.get(name):
            out.append(f"{name} (recorded {_brief(recorded.get(name))}, this container {_brief(current.get(name))})")
    return out


def _brief(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def library_versions() -> dict[str, str]:
    """What importlib.metadata.distributions() gives for the LIBRARIES (name -> version, a later
    sys.path entry winning), with only their metadata read: the folder names pick them (reading
    every distribution's metadata, with the email parser importlib.metadata imports, cost 15 to
    30 ms of every start)."""
    out = {}
    for entry in sys.path:
        try:
            folders = sorted(os.listdir(entry or "."))
        except OSError:  # a zip, a missing folder
            continue
        for folder in folders:
            if not folder.endswith((".dist-info", ".egg-info")) or \
                    not re.sub(r"[-_.]+", "-", folder.lower()).startswith(LIBRARY_PREFIXES):
                continue
            name, version = _name_version(Path(entry or ".", folder))
            if LIBRARIES.match(name.lower()) and version:
                out[name.lower()] = version
    return dict(sorted(out.items()))


LIBRARY_PREFIXES = ("onnxruntime", "openvino", "tensorrt", "nvidia")  # of LIBRARIES, as folder names start


def _name_version(folder: Path) -> tuple[str, str]:
    """Name and Version from a .dist-info's METADATA (an .egg-info's PKG-INFO, or the file itself)."""
    name = version = ""
    for path in (folder / "METADATA", folder / "PKG-INFO", folder):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:  # absent, or a folder
            continue
        for line in text.splitlines():
            if not line.strip():
                break  # the headers end at the first blank line
            key, _, value = line.partition(":")
            if key.strip().lower() == "name" and not name:
                name = value.strip()
            elif key.strip().lower() == "version" and not version:
                version = value.strip()
        break
    return name, version


# ---------------------------------------------------------------------------------------------
# records and verification


def files_of(folder: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != RECORD):
        out.append({"path": path.relative_to(folder).as_posix(), "size": path.stat().st_size, "sha256": sha256(path)})
    return out


def sha256(path: Path, size: int | None = None) -> str:
    """The file's digest; with `size`, reading at most that much (a cache file that grows, or a
    link to /dev/zero, is not read for ever)."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        left = size if size is not None else sys.maxsize
        while left > 0 and (piece := f.read(min(1 << 20, left))):
            h.update(piece)
            left -= len(piece)
    return h.hexdigest()


def read_record(folder: Path) -> dict[str, Any]:
    """The folder's record: a regular file of at most MAX_RECORD bytes holding a warmup record
    (a FIFO there never answered a read, and 50 MB of JSON took a 256 MiB container down)."""
    try:
        with open_regular(folder / RECORD) as f:
            if os.fstat(f.fileno()).st_size > MAX_RECORD:
                raise CacheError(f"its {RECORD} is over {MAX_RECORD >> 20} MiB")
            record = json.loads(f.read(MAX_RECORD + 1))
    except OSError as e:
        raise CacheError(f"cannot read its {RECORD}: {e.strerror or e}") from None
    except (ValueError, RecursionError):
        raise CacheError(f"its {RECORD} is not valid JSON") from None
    if not isinstance(record, dict) or not isinstance(record.get("parts"), dict) or not isinstance(
            record.get("files"), list):
        raise CacheError(f"its {RECORD} is not a warmup record")
    return record


def check(folder: Path, parts: dict[str, Any]) -> dict[str, Any]:
    """The folder's record, when its key parts are this container's and every file is intact."""
    record = read_record(folder)
    differ = differences(record["parts"], parts)
    if differ:
        raise CacheError("key mismatch: " + "; ".join(differ))
    for entry in record["files"]:
        rel = str(entry.get("path", ""))
        path = folder / rel
        if not rel or rel.startswith("/") or ".." in rel.split("/"):
            raise CacheError(f"its record names an unsafe path {rel!r}")
        try:
            if not path.is_file():
                raise CacheError(f"{rel} is missing")
            size = path.stat().st_size
            if size != entry.get("size") or sha256(path, size) != entry.get("sha256"):
                raise CacheError(f"{rel} is corrupt (sha256 differs from the record)")
        except OSError as e:
            raise CacheError(f"cannot read {rel}: {e.strerror or e}") from None
    return record


# ---------------------------------------------------------------------------------------------
# choosing a cache at start, and publishing one after warmup


@dataclass
class Cache:
    """Where this container's provider reads and writes its compiled artefacts."""

    key: str
    parts: dict[str, Any]
    folder: Path | None  # the folder the provider options point at (None: the provider caches nothing)
    source: str  # baked | volume | compiled | none
    final: Path | None = None  # compiled: where `publish` renames folder to
    record: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    refused: str | None = None  # baked | volume: a verified cache the provider itself would not load


def choose(parts: dict[str, Any], cache_root: Path, baked_root: Path = Path(BAKED_DIR),
           caches: bool = True) -> Cache:
    """A verified baked cache, else a verified one in cache_root, else a fresh folder to
    compile into (in cache_root when writable, else FALLBACK_CACHE_DIR)."""
    key = digest(parts)
    if not caches:
        return Cache(key, parts, None, "none")
    warnings: list[str] = []
    for root, source in ((baked_root, "baked"), (cache_root, "volume")):
        folder = root / key
        if os.path.lexists(folder):  # (lexists: an unreadable folder is there, and worth a warning)
            try:
                return Cache(key, parts, folder, source, record=check(folder, parts), warnings=warnings)
            except CacheError as e:
                warnings.append(f"not using the {source} cache {folder}: {e}")
    if not warnings and baked_root.is_dir():  # a cache baked for another device or version
        for other in sorted(p for p in baked_root.iterdir() if os.path.lexists(p / RECORD)):
            try:
                differ = differences(read_record(other)["parts"], parts)
            except CacheError as e:
                differ = [str(e)]
            warnings.append(f"not using the baked cache {other}: key mismatch: {'; '.join(differ)}")
            break
    return fresh(parts, cache_root, warnings)


def fresh(parts: dict[str, Any], cache_root: Path, warnings: list[str] | None = None) -> Cache:
    """A new private folder to compile into, published under the key by `publish`; when no
    folder can be written at all (a read-only root, no volume, no tmpfs at /tmp), none: the
    provider compiles without a cache, and one warning says so."""
    key = digest(parts)
    warnings = warnings or []
    root = writable_root(cache_root)
    if root is not None:
        remove_stale(root)
        tmp = root / f".{key}.tmp-{os.getpid()}-{_token()}"
        try:
            tmp.mkdir(parents=True)
            return Cache(key, parts, tmp, "compiled", final=root / key, warnings=warnings)
        except OSError as e:
            warnings.append(f"cannot compile into {root} ({e.strerror or e}); serving without a cache")
    else:
        warnings.append(f"neither GPUX_CACHE_DIR ({cache_root}) nor {FALLBACK_CACHE_DIR} can be written; serving "
                        "without a cache (mount a volume there, or a tmpfs at /tmp)")
    return Cache(key, parts, None, "none", warnings=warnings)


def remove_stale(root: Path) -> None:
    """What containers that died left in a cache root: folders set aside as corrupt (`.KEY.bad-*`)
    and compile folders untouched for STALE_AGE (`.KEY.tmp-*`). Only this user's; never raises."""
    import shutil

    now = time.time()
    try:
        entries = [p for p in root.iterdir() if p.name.startswith(".") and (".bad-" in p.name or ".tmp-" in p.name)]
    except OSError:
        return
    for entry in entries:
        try:
            info = entry.lstat()
            if info.st_uid != os.getuid():
                continue
            if ".tmp-" in entry.name and now - _newest(entry) < STALE_AGE:
                continue  # a container compiling now
            shutil.rmtree(entry) if stat.S_ISDIR(info.st_mode) else entry.unlink()
        except OSError:
            continue


def _newest(folder: Path) -> float:
    """The latest modification under a folder (a compile writes into subfolders for hours)."""
    newest = folder.lstat().st_mtime
    for path in folder.rglob("*"):
        try:
            newest = max(newest, path.lstat().st_mtime)
        except OSError:
            continue
    return newest


def _token() -> str:
    """8 random hex digits for a private name (os.urandom: the secrets module costs an import)."""
    return os.urandom(4).hex()


def writable_root(cache_root: Path) -> Path | None:
    """GPUX_CACHE_DIR when this user can write there, else FALLBACK_CACHE_DIR, else None."""
    for root in (cache_root, Path(FALLBACK_CACHE_DIR)):
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".probe-{os.getpid()}-{_token()}"
            probe.mkdir()
            probe.rmdir()
            return root
        except OSError as e:
            if root == cache_root:
                log.info("GPUX_CACHE_DIR %s is not writable (%s); compiling into %s", cache_root, e.strerror or e,
                         FALLBACK_CACHE_DIR)
    return None


def publish(cache: Cache, extra: dict[str, Any]) -> dict[str, Any]:
    """Write the record and rename the compiled folder into place. Another container that
    published the same key first wins when its folder is valid (ours is dropped); a corrupt
    one is replaced."""
    import shutil  # here: start-up without a cache to publish never needs it

    assert cache.folder is not None and cache.final is not None
    record = {"format": FORMAT, "key": cache.key, "short": short(cache.parts), "parts": cache.parts, **extra,
              "files": files_of(cache.folder)}
    staged = cache.folder / f".{RECORD}.tmp"
    staged.write_text(json.dumps(record, indent=2, sort_keys=True))
    staged.rename(cache.folder / RECORD)
    for attempt in range(3):
        try:
            os.rename(cache.folder, cache.final)  # atomic; fails when the target exists and is not empty
            cache.folder = cache.final
            return record
        except OSError:
            if not cache.final.exists():
                continue
            try:
                check(cache.final, cache.parts)
                shutil.rmtree(cache.folder, ignore_errors=True)
                cache.folder = cache.final
                return read_record(cache.final)
            except CacheError:
                aside = cache.final.with_name(f".{cache.key}.bad-{_token()}")
                try:
                    os.rename(cache.final, aside)
                    shutil.rmtree(aside, ignore_errors=True)
                except OSError:
                    pass
    raise CacheError(f"cannot publish the cache into {cache.final}")


def expand(options: dict[str, Any], folder: Path | None) -> dict[str, Any]:
    """Provider options with ${GPUX_CACHE_DIR} set to this container's cache folder (its
    subfolders created: providers expect them)."""
    out = {}
    for name, value in options.items():
        if isinstance(value, str) and CACHE_PLACEHOLDER in value:
            if folder is None:
                continue
            value = value.replace(CACHE_PLACEHOLDER, str(folder))
            if not name.endswith(("_file_path", "_file")):
                Path(value).mkdir(parents=True, exist_ok=True)
        out[name] = value
    return out


def uses_cache(options: dict[str, Any]) -> bool:
    return any(isinstance(v, str) and CACHE_PLACEHOLDER in v for v in options.values())


# ---------------------------------------------------------------------------------------------
# partition and accuracy


def partition(profile: list[dict[str, Any]], nodes: int | None) -> tuple[dict[str, int], list[str]]:
    """Nodes per execution provider from ONNX Runtime's profile, and the op types left on CPU.
    A provider that compiles subgraphs reports each as one fused node (a plugin's is named
    after the provider; an EP context model's runs as one): it is credited with the
    graph's nodes that did not run elsewhere (counts after ONNX Runtime's graph optimizations)."""
    seen: dict[str, tuple[str, str]] = {}
    for event in profile:
        args = event.get("args") or {}
        if event.get("cat") == "Node" and args.get("provider"):
            name = str(event.get("name", "")).removesuffix("_kernel_time")
            seen[name] = (str(args["provider"]), str(args.get("op_name", "")))
    counts: dict[str, int] = {}
    fused: dict[str, int] = {}
    cpu_ops: set[str] = set()
    for provider, op in seen.values():
        if "-EP-subgraph" in op or op.startswith(("TRTKernel", "MIGraphX", provider)) or op == "EPContext":
            fused[provider] = fused.get(provider, 0) + 1
        else:
            counts[provider] = counts.get(provider, 0) + 1
        if provider == "CPUExecutionProvider":
            cpu_ops.add(op)
    for provider in fused:
        rest = (nodes or 0) - sum(counts.values())
        counts[provider] = counts.get(provider, 0) + max(rest, fused[provider])
    return dict(sorted(counts.items())), sorted(cpu_ops)


def accuracy(ours: dict[str, Any], reference: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per output: max abs error and max rel error (|a - b| / max(|b|, 1e-6)) against the CPU
    provider's answer; non-numeric outputs count a mismatch as error 1."""
    import numpy as np

    out = {}
    for name, ref in reference.items():
        a, b = np.asarray(ours[name]), np.asarray(ref)
        if a.shape != b.shape:
            out[name] = {"max_abs": float("inf"), "max_rel": float("inf")}
            continue
        if a.dtype.kind in "fciub" and b.dtype.kind in "fciub" and a.size:
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            rel = diff / np.maximum(np.abs(b.astype(np.float64)), 1e-6)
            out[name] = {"max_abs": float(diff.max()), "max_rel": float(rel.max())}
        else:
            same = bool(a.size == 0 or np.array_equal(a, b))
            out[name] = {"max_abs": 0.0 if same else 1.0, "max_rel": 0.0 if same else 1.0}
    return out


def violation(errors: dict[str, dict[str, float]], ours: dict[str, Any], reference: dict[str, Any],
              atol: float, rtol: float) -> str | None:
    """The first output outside |a - b| <= atol + rtol * |b| (numpy.allclose's rule), named."""
    import numpy as np

    for name, ref in reference.items():
        a, b = np.asarray(ours[name]), np.asarray(ref)
        if a.shape != b.shape:
            return f"output '{name}' has shape {list(a.shape)}, the CPU provider's {list(b.shape)}"
        if a.dtype.kind in "fciub" and b.dtype.kind in "fciub":
            bad = np.abs(a.astype(np.float64) - b.astype(np.float64)) > atol + rtol * np.abs(b.astype(np.float64))
        else:
            bad = np.asarray(a != b)
        if bad.any():
            e = errors[name]
            return (f"output '{name}' differs from the CPU provider beyond pack.accuracy (atol {atol}, rtol {rtol}): "
                    f"max abs error {e['max_abs']:.3g}, max rel error {e['max_rel']:.3g}")
    return None


def warmup_shapes(spec: GpuxJson) -> list[dict[str, list[int]]]:
    """The input shapes warmup runs (part of the cache key): each required input's declared
    shape (where gpux.yml fixed sizes the graph leaves open, those) with dynamic dimensions at 1,
    then one run per profile point (min, opt, max)."""
    base = {}
    for t in spec.inputs:
        if t.required:
            shape = t.declared_shape or t.shape or ()
            base[t.name] = [d if isinstance(d, int) and d >= 0 else 1 for d in shape]
    runs = [base]
    profiles = spec.warmup_profiles
    for point in ("min", "opt", "max") if profiles else ():
        runs.append({**base, **{name: list(getattr(p, point)) for name, p in profiles.items() if name in base}})
    return runs
