"""The image's Python wheels: resolved, downloaded and installed on the host.

Nothing is installed inside the image: the build sends (or assembles) the installed tree as a
layer, so `docker build` needs no network and runs no pip.

- resolve: `uv pip compile` for the image's Python and platform (pip evaluates environment
  markers against the host's interpreter, so it cannot lock for another Python; uv can).
- fetch: `pip download --no-deps --require-hashes` of exactly those pins (honours pip.conf,
  proxies and private indexes), into a cache shared by every build.
- install: `uv pip install` of the wheelhouse into a folder laid out as the image's
  site-packages, trimmed and byte-compiled when this host's Python is the image's.
Both are cached: an unchanged build needs no network at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from struct import error as struct_error

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from gpux_pack import staging
from gpux_pack.linkcheck import ElfInfo
from gpux_pack.runtime.contract import SITE
from gpux_pack.staging import cache_dir, remove, temp_path, touch
from gpux_pack.errors import WheelError

# uv knows these manylinux targets (uv 0.9-0.13): a newer glibc is served by the newest.
_UV_MANYLINUX = (17, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40)
_LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
ARCHES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64", "linux/arm64/v8": "aarch64"}


@dataclass(frozen=True)
class Target:
    """The image's interpreter and platform."""

    python: str  # "3.11"
    arch: str  # "x86_64" | "aarch64"
    glibc: tuple[int, int]  # (2, 36)

    @property
    def cp(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def uv_platform(self) -> str:
        minor = max((m for m in _UV_MANYLINUX if m <= self.glibc[1]), default=None)
        if self.glibc[0] != 2 or minor is None:
            raise WheelError(f"glibc {self.glibc[0]}.{self.glibc[1]} is too old for manylinux wheels")
        return f"{self.arch}-manylinux_2_{minor}"

    @property
    def platforms(self) -> list[str]:
        """Platform tags the image accepts, most specific first (as pip computes them)."""
        out = []
        for minor in range(self.glibc[1], 4, -1):
            out.append(f"manylinux_2_{minor}_{self.arch}")
            if minor in _LEGACY and (self.arch == "x86_64" or minor == 17):
                out.append(f"{_LEGACY[minor]}_{self.arch}")
        out.append(f"linux_{self.arch}")
        return out

    def tags(self) -> list[Tag]:
        version = tuple(int(p) for p in self.python.split("."))
        return [
            *cpython_tags(version, abis=[self.cp, "abi3", "none"], platforms=self.platforms),
            *compatible_tags(version, interpreter=self.cp, platforms=self.platforms),
        ]

    def describe(self) -> str:
        return f"{self.cp} {self.uv_platform}"


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    hashes: frozenset[str]  # sha256 of every file of this release (from the index)


@dataclass(frozen=True)
class Lock:
    target: Target
    requirements: tuple[str, ...]
    pins: tuple[Pin, ...]  # what the image's site-packages gets
    excludes: tuple[str, ...] = ()  # distributions left out of the resolution, with what only they need

    def version_of(self, dist: str) -> str | None:
        name = canonicalize_name(dist)
        return next((p.version for p in self.pins if p.name == name), None)


@dataclass(frozen=True)
class Wheel:
    pin: Pin
    path: Path
    sha256: str


@dataclass(frozen=True)
class Wheelhouse:
    lock: Lock
    wheels: tuple[Wheel, ...]

    @property
    def size_bytes(self) -> int:
        return sum(w.path.stat().st_size for w in self.wheels)

    def lock_text(self) -> str:
        """requirements.lock for the build: one exact file hash per package."""
        head = [
            f"# gpux-pack lock for {self.lock.target.describe()}",
            f"# from: {', '.join(self.lock.requirements)}",
        ]
        body = [f"{w.pin.name}=={w.pin.version} --hash=sha256:{w.sha256}" for w in self.wheels]
        return "\n".join(head + body) + "\n"


# ---------------------------------------------------------------------------------------------
# resolve


def lock_path(requirements: tuple[str, ...], target: Target, suffix: str = ".txt",
              excludes: tuple[str, ...] = ()) -> Path:
    """Where the lock of (requirements, target, excludes) is cached (a model-only rebuild checks it did not move)."""
    key = [sorted(requirements), target.python, target.uv_platform, *([sorted(excludes)] if excludes else [])]
    key_src = json.dumps(key)
    return cache_dir() / "locks" / f"{hashlib.sha256(key_src.encode()).hexdigest()[:24]}{suffix}"


def resolve(requirements: tuple[str, ...], target: Target, refresh: bool = False, offline: bool = False,
            excludes: tuple[str, ...] = ()) -> Lock:
    """Pinned, hashed versions for the target; cached by (requirements, target, excludes).
    excludes: distributions a requirement declares and the image never imports (uv --excludes:
    they and what only they need stay out). offline: the cached lock or an error, never the network."""
    path = lock_path(requirements, target, excludes=excludes)
    if refresh or not path.is_file():
        if offline:
            raise WheelError(f"no cached lock for {target.describe()} (resolve it once with network, e.g. "
                             "`gpux-pack plan` without --offline)")
        path.parent.mkdir(parents=True, exist_ok=True)
        with staging.locked(path):  # a second build resolving the same lock waits, then reuses it
            if refresh or not path.is_file():
                text = _uv_compile(list(requirements), target, excludes=excludes)
                _write_atomic(path, text)
    touch(path)
    pins = _parse_compiled(path.read_text())
    return Lock(target, tuple(requirements), tuple(pins), tuple(excludes))


def sizes(lock: Lock, offline: bool = False) -> dict[str, tuple[int | None, bool]]:
    """Per pin: (download size in bytes or None when unknown, whether its wheel is cached).
    Cached wheels give their size; the others come from the index's metadata (uv's pylock
    output, one resolution without downloading a wheel, cached next to the lock)."""
    folder = cache_dir() / "wheels"
    found = _find(folder, lock.pins, lock.target.tags()) if folder.is_dir() else {}
    out: dict[str, tuple[int | None, bool]] = {p.name: (found[p].path.stat().st_size, True) for p in found}
    missing = [p for p in lock.pins if p not in found]
    if missing:
        sidecar = lock_path(lock.requirements, lock.target, ".pylock.toml", lock.excludes)
        if not sidecar.is_file() and not offline:
            _write_atomic(sidecar, _uv_compile(list(lock.requirements), lock.target, pylock=True,
                                               excludes=lock.excludes))
        listed: dict[str, int] = {}
        if sidecar.is_file():
            import tomllib

            for pkg in tomllib.loads(sidecar.read_text()).get("packages", []):
                wheels_ = pkg.get("wheels") or []
                if wheels_ and "size" in wheels_[0]:
                    listed[canonicalize_name(pkg["name"])] = int(wheels_[0]["size"])
        for p in missing:
            out[p.name] = (listed.get(p.name), False)
    return out


def _uv_compile(requirements: list[str], target: Target, pylock: bool = False, excludes: tuple[str, ...] = ()) -> str:
    from uv import find_uv_bin

    excluded = None
    if excludes:  # uv reads them from a requirements file
        excluded = tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="gpux-excludes-", delete=False)
        excluded.write("\n".join(excludes) + "\n")
        excluded.close()
    cmd = [
        find_uv_bin(), "pip", "compile", "-",
        "--python-version", target.python,
        "--python-platform", target.uv_platform,
        "--only-binary", ":all:",
        "--generate-hashes", "--no-header", "--no-annotate", "--quiet",
        *(["--format", "pylock.toml"] if pylock else []),
        *(["--excludes", excluded.name] if excluded else []),
    ]
    env = dict(os.environ)
    # Let a pip-only configuration (proxy index, custom CA) reach uv as well.
    if "PIP_INDEX_URL" in env and not ({"UV_INDEX_URL", "UV_DEFAULT_INDEX"} & env.keys()):
        env["UV_DEFAULT_INDEX"] = env["PIP_INDEX_URL"]
    if "PIP_EXTRA_INDEX_URL" in env and "UV_INDEX" not in env and "UV_EXTRA_INDEX_URL" not in env:
        env["UV_INDEX"] = env["PIP_EXTRA_INDEX_URL"]
    if "PIP_CERT" in env and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = env["PIP_CERT"]
    try:
        proc = subprocess.run(cmd, input="\n".join(requirements) + "\n", capture_output=True, text=True, env=env)
    finally:
        if excluded:
            os.unlink(excluded.name)
    if proc.returncode != 0:
        reason = _index_failure(proc.stderr, requirements) or _uv_reason(proc.stderr)
        raise WheelError(f"cannot resolve the image's wheels for {target.describe()}: {reason}")
    return proc.stdout


def _uv_reason(stderr: str) -> str:
    lines = [re.sub(r"^[\s×╰─▶│]+", "", line).strip() for line in stderr.splitlines()]
    lines = [line for line in lines if line and not line.startswith(("hint:", "help:"))]
    return redact(" ".join(lines)[:600]) or "uv failed without a message"


# How uv and pip (its --log) say that an index refused the credentials or could not be reached.
# Either would otherwise report "not found" / "no version satisfies", as if the package were missing.
_AUTH = [
    re.compile(r"An index URL \((?P<url>[^)\s]+)\) could not be queried due to a lack of valid authentication "
               r"credentials \((?P<why>[^)]*)\)"),  # uv
    re.compile(r"Could not fetch URL (?P<url>\S+): (?P<why>40[13] Client Error: \w+)"),  # pip --log
    re.compile(r"(?P<why>40[13] (?:Client Error: )?(?:Unauthorized|Forbidden))\)? for url:? \(?(?P<url>[^)\s]+)"),
    re.compile(r"(?P<why>40[13] Error), Credentials not correct for (?P<url>\S+)"),  # pip
]
_DOWN = [
    re.compile(r"Could not fetch URL (?P<url>\S+): (?P<why>connection error: .*?|timed out|5\d\d Server Error: [\w ]+?|"
               r"HTTPS?ConnectionPool\(.*?)(?: - skipping|$)", re.M),  # pip --log
    re.compile(r"Failed to fetch: `?(?P<url>[^`\s]+?)`?\s*$(?P<why>(?:.|\n)*?(?:Connection refused|tcp connect error|"
               r"dns error|failed to lookup address|timed out|Network is unreachable|No route to host|"
               r"Connection reset|5\d\d [A-Z][\w ]+))", re.M),  # uv
    re.compile(r"error sending request for url \((?P<url>[^)\s]+)\)(?P<why>(?:.|\n)*?(?:Connection refused|"
               r"tcp connect error|dns error|failed to lookup address|timed out|Network is unreachable|No route to host))"),
]
_WHY = re.compile(r"Connection refused|dns error|failed to lookup address|timed out|Network is unreachable|"
                  r"No route to host|Connection reset|5\d\d [A-Z][\w ]*[a-z]|too many 5\d\d error responses|"
                  r"Name or service not known")


def _index_failure(text: str, requirements: list[str]) -> str | None:
    """'package index authentication failed: URL (401 Unauthorized)' or 'package index
    unreachable: URL (Connection refused)' when uv's or pip's output says so; else None. The
    URL is the index's (the project page's path taken off), never with credentials."""
    names = {canonicalize_name(re.split(r"[\s\[=<>!~;@]", r.strip(), maxsplit=1)[0]) for r in requirements if r.strip()}
    for patterns, what, hint in ((_AUTH, "authentication failed", "check the index's user name and password "
                                  "(in PIP_INDEX_URL/UV_INDEX_URL, .netrc or the keyring)"),
                                 (_DOWN, "unreachable", "check the index URL, the network and the proxy")):
        for pattern in patterns:
            m = pattern.search(text)
            if m:
                why = m.group("why").strip()
                found = _WHY.search(text, m.start(), m.end() + 400) if what == "unreachable" else None
                why = re.sub(r"^connection error: |Client Error: ", "", found.group(0) if found else why)
                return f"package index {what}: {_index_url(m.group('url'), names)} ({why}); {hint}"
    return None


_INDEX_VARIABLES = ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_INDEX", "UV_EXTRA_INDEX_URL", "PIP_INDEX_URL",
                    "PIP_EXTRA_INDEX_URL")


def _index_url(url: str, names: set[str]) -> str:
    """The index a project page URL belongs to: a configured index it lies under, else the URL
    without the project's page (https://host/simple/click/ -> https://host/simple)."""
    url = redact(url).rstrip(".,;'\"`")
    for variable in _INDEX_VARIABLES:
        for index in os.environ.get(variable, "").split():
            index = redact(index.split("=", 1)[1] if re.match(r"^[\w-]+=\w+://", index) else index).rstrip("/")
            if index and (url.rstrip("/") == index or url.startswith(index + "/")):
                return index
    head, _, last = url.rstrip("/").rpartition("/")
    return head if head.count("/") > 2 and canonicalize_name(last) in names else url.rstrip("/")


def redact(text: str) -> str:
    """Every URL's credentials removed (user:password@ or pip's user:****@)."""
    return re.sub(r"(?<=://)[^/@\s]+@", "", text)


def _parse_compiled(text: str) -> list[Pin]:
    pins = []
    for entry in text.replace("\\\n", " ").splitlines():
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        spec, *rest = entry.split()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)", spec)
        if not m:
            raise WheelError(f"unexpected line in the resolved lock: {entry[:120]}")
        hashes = frozenset(h.split(":", 1)[1] for h in rest if h.startswith("--hash=sha256:"))
        pins.append(Pin(canonicalize_name(m.group(1)), m.group(2), hashes))
    return pins


# ---------------------------------------------------------------------------------------------
# fetch


def fetch(lock: Lock, log=lambda msg: None) -> Wheelhouse:
    """One verified wheel per pin, from the cache or downloaded into it."""
    folder = cache_dir() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    tags = lock.target.tags()
    pins = lock.pins
    found = _find(folder, pins, tags)
    missing = [p for p in pins if p not in found]
    if missing:
        log(f"downloading {len(missing)} wheel(s) for {lock.target.describe()}")
        _pip_download(missing, lock.target, folder)
        found = _find(folder, pins, tags)
        still = [p for p in pins if p not in found]
        if still:
            p = still[0]
            raise WheelError(f"no wheel of {p.name}=={p.version} fits {lock.target.describe()}")
    for wheel in found.values():
        touch(wheel.path)
    return Wheelhouse(
        lock,
        tuple(found[p] for p in lock.pins),
    )


def _find(folder: Path, pins: tuple[Pin, ...], tags: list[Tag]) -> dict[Pin, Wheel]:
    """The best cached wheel for each pin: right name, version, hash and platform tag."""
    rank = {tag: i for i, tag in enumerate(tags)}
    by_release: dict[tuple[str, str], list[tuple[int, Path]]] = {}
    for path in folder.glob("*.whl"):
        try:
            name, version, _, file_tags = parse_wheel_filename(path.name)
        except ValueError:
            continue
        best = min((rank[t] for t in file_tags if t in rank), default=None)
        if best is not None:
            by_release.setdefault((name, str(version)), []).append((best, path))
    hashes = _HashIndex(folder)
    found: dict[Pin, Wheel] = {}
    for pin in pins:
        for _, path in sorted(by_release.get((pin.name, _norm_version(pin.version)), [])):
            digest = hashes.get(path)
            if digest in pin.hashes:
                found[pin] = Wheel(pin, path, digest)
                break
    hashes.save()
    return found


def wheel_hashes(lock: Lock) -> dict[str, str]:
    """Per pin, the sha256 of the wheel this target installs, where the cache has it (the SBOM's
    hash of each package); a pin whose wheel is not cached is absent."""
    folder = cache_dir() / "wheels"
    if not folder.is_dir():
        return {}
    return {pin.name: wheel.sha256 for pin, wheel in _find(folder, lock.pins, lock.target.tags()).items()}


def _norm_version(version: str) -> str:
    from packaging.version import Version

    return str(Version(version))


def _pip_download(pins: list[Pin], target: Target, folder: Path) -> None:
    """pip downloads into a temporary folder beside the cache's (a dead process's is a leftover
    `cache prune` removes); only complete wheels, once pip has checked every hash, move in. A
    disk that fills up leaves no partial wheel, and says which folder was full."""
    landing = temp_path(folder / "download")
    landing.mkdir()
    try:
        _pip_download_into(pins, target, landing)
        for wheel in landing.glob("*.whl"):
            os.replace(wheel, folder / wheel.name)
    finally:
        remove(landing)


def _pip_download_into(pins: list[Pin], target: Target, folder: Path) -> None:
    lines = [f"{p.name}=={p.version} " + " ".join(f"--hash=sha256:{h}" for h in sorted(p.hashes)) for p in pins]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(lines) + "\n")
        req = f.name
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--require-hashes", "--dest", str(folder), "--progress-bar", "off",
        "--disable-pip-version-check", "--no-input",
        "--python-version", target.python, "--implementation", "cp",
        "--abi", target.cp, "--abi", "abi3", "--abi", "none",
        *[arg for plat in target.platforms for arg in ("--platform", plat)],
        "-r", req,
    ]
    log = req + ".log"  # pip's debug log says why an index page could not be fetched (401, refused)
    try:
        proc = subprocess.run([*cmd, "--log", log], capture_output=True, text=True)
        details = Path(log).read_text(errors="replace") if proc.returncode != 0 and os.path.exists(log) else ""
    finally:
        os.unlink(req)
        if os.path.exists(log):
            os.unlink(log)
    if proc.returncode != 0:
        full = _no_space(proc.stderr + "\n" + details, folder)
        if full:
            raise WheelError(f"downloading wheels failed: no space left on device in {full} (free some space, or "
                             "set GPUX_PACK_CACHE_DIR, or TMPDIR for pip's own files, to a larger disk)")
        found = _index_failure(proc.stderr + "\n" + details, [p.name for p in pins])
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
        reason = found or redact(" ".join(errors)[:600] or proc.stderr.strip()[-600:])
        raise WheelError(f"downloading wheels failed: {reason}")


def _no_space(text: str, landing: Path) -> str | None:
    """The folder a full disk stopped pip in (ENOSPC in its output), else None: the cache's or
    the temporary folder, whichever filesystem is full (the message may name pip's source)."""
    if "No space left on device" not in text and "[Errno 28]" not in text:
        return None
    for folder in (landing, Path(tempfile.gettempdir())):
        try:
            st = os.statvfs(folder)
        except OSError:
            continue
        if st.f_bavail * st.f_frsize < 1 << 20:
            return str(landing.parent if folder == landing else folder)
    return str(landing.parent)


class _HashIndex:
    """sha256 of cached wheels, remembered by (name, size, mtime) so a 2 GB CUDA wheelhouse
    is not re-hashed on every build."""

    def __init__(self, folder: Path):
        self.path = folder / ".sha256.json"
        try:
            self.data: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.dirty = False

    def get(self, path: Path) -> str:
        st = path.stat()
        known = self.data.get(path.name)
        if known and known[0] == st.st_size and known[1] == st.st_mtime_ns:
            return known[2]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        self.data[path.name] = [st.st_size, st.st_mtime_ns, h.hexdigest()]
        self.dirty = True
        return h.hexdigest()

    def save(self) -> None:
        if self.dirty:
            _write_atomic(self.path, json.dumps(self.data, sort_keys=True))


def _write_atomic(path: Path, text: str) -> None:
    staging.write_text(path, text, replace=True)  # readers keep the file they opened


# ---------------------------------------------------------------------------------------------
# install: the image's site-packages, made on the host


# What the runtime never imports, removed after installing (the link check proves the native
# side: a shared library is removed only when nothing in the tree links it).
TRIM_DIRS = ("bin", "onnxruntime/tools", "onnxruntime/transformers", "onnxruntime/quantization")
TRIM_NAMES = ("tests", "__pycache__")
TRIM_FILES = (".lock",)  # uv's lock file of the --target folder
# C, C++ and Cython sources and headers: what a wheel ships to compile against it, never imported
# (pysimdjson's sources are 7.6 MB of its 14.6, uvloop's and numpy's a few MB); NVIDIA's and
# TensorRT's headers stay: a runtime compiler (NVRTC) may read them
TRIM_SUFFIXES = (".pyx", ".pxd", ".pxi", ".c", ".cc", ".cpp", ".h", ".hpp")
KEEP_SOURCES = ("nvidia", "tensorrt", "tensorrt_libs")
UNLINKED = ("onnxruntime/capi/libonnxruntime.so.*",)  # the C API library: Python uses the pybind module
INSTALL_FORMAT = "8"  # bump when the trimming or layout changes: a new cache key (3: .pyc name the image's path,
# 4: the runtime's too, 5: no install-host facts in dist-info: the same lock installs the same bytes anywhere,
# 6: byte-code compiled in a Python of its own, 7: RECORD lists only what the image holds, 8: no sources)
HOST_FACTS = ("direct_url.json", "uv_cache.json")  # a dist-info's record of where this host's wheel and uv cache were


@dataclass(frozen=True)
class Installed:
    """The locked packages installed for the image's Python and platform, on the host."""

    lock: Lock
    path: Path  # goes to the image's site-packages as it is
    compiled: bool  # .pyc files included (only when the host's Python minor is the image's)
    removed: tuple[str, ...]  # what trimming took out, relative to path

    @property
    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file() and not f.is_symlink())


def unpack(wheelhouse: Wheelhouse, log=lambda msg: None) -> Installed:
    """`uv pip install --target` of exactly the locked wheels, for the image's Python and
    platform (no interpreter of the target runs), trimmed and byte-compiled; cached by the
    lock's digest, so a rebuild installs nothing."""
    target = wheelhouse.lock.target
    compiled = sys.version_info[:2] == tuple(int(p) for p in target.python.split("."))
    key_src = "\n".join([INSTALL_FORMAT, target.describe(), str(compiled), wheelhouse.lock_text()])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:24]
    root = cache_dir() / "installs" / key
    done = root / "installed.json"
    if not done.is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        with staging.locked(root):  # a second build of the same install waits, then reuses it
            if not done.is_file():
                staging.remove_leftovers(root)
                if root.exists():  # no installed.json: never complete, so nobody reads it
                    staging.remove(root)
                log(f"installing {len(wheelhouse.wheels)} wheel(s) for {target.describe()} on the host")
                with staging.staged(root) as tmp:
                    site = tmp / "site-packages"
                    _uv_install(wheelhouse, site)
                    removed = _trim(site)
                    if compiled:
                        _compile(site)
                    (tmp / "installed.json").write_text(json.dumps({"compiled": compiled, "removed": removed}))
    touch(root)
    record = json.loads(done.read_text())
    return Installed(wheelhouse.lock, root / "site-packages", record["compiled"], tuple(record["removed"]))


def _uv_install(wheelhouse: Wheelhouse, site: Path) -> None:
    from uv import find_uv_bin

    site.mkdir(parents=True)
    req = site.parent / "requirements.lock"
    uv_cache = site.parent / "uv-cache"
    # exact files by path, each with its hash: nothing is chosen here, the lock chose
    req.write_text("".join(f"{w.path} --hash=sha256:{w.sha256}\n" for w in wheelhouse.wheels))
    cmd = [
        find_uv_bin(), "pip", "install", "--target", str(site), "--requirement", str(req),
        "--python-version", wheelhouse.lock.target.python, "--python-platform", wheelhouse.lock.target.uv_platform,
        "--no-index", "--no-deps", "--require-hashes", "--no-compile-bytecode", "--no-config", "--quiet",
        # uv unpacks each wheel into its cache and links the files from there. A cache of this
        # install's own, beside it and removed after: a shared one would keep an unpacked copy of
        # every wheel, keyed by its path here, that no later install reads (the install is cached
        # by the lock: 35 GB of them on our build host); hard links, not copies, from it: every
        # byte is written once (--no-cache copies from a temporary cache: 0.1-0.25 s more of a
        # cold build's 150 MB)
        "--cache-dir", str(uv_cache), "--link-mode", "hardlink",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        shutil.rmtree(uv_cache, ignore_errors=True)
    if proc.returncode != 0:
        raise WheelError(f"installing the image's wheels failed: {_uv_reason(proc.stderr)}")
    req.unlink()


def _trim(site: Path) -> list[str]:
    removed: list[str] = []
    for rel in TRIM_DIRS:
        if (site / rel).is_dir():
            shutil.rmtree(site / rel)
            removed.append(rel)
    for rel in TRIM_FILES:
        if (site / rel).is_file():
            (site / rel).unlink()
            removed.append(rel)
    for info in sorted(site.glob("*.dist-info")):
        removed += _without_host_facts(site, info)
    for path in sorted(site.rglob("*"), reverse=True):
        if path.is_dir() and path.name in TRIM_NAMES:
            shutil.rmtree(path)
            removed.append(str(path.relative_to(site)))
        elif path.suffix in TRIM_SUFFIXES and path.is_file() and not path.is_symlink() and \
                path.relative_to(site).parts[0] not in KEEP_SOURCES:
            path.unlink()
            removed.append(str(path.relative_to(site)))
    removed += _unlinked_libraries(site)
    for info in sorted(site.glob("*.dist-info")):
        _record_what_is_there(site, info)
    return removed


def _record_what_is_there(site: Path, info: Path) -> None:
    """RECORD without the files trimming removed: console scripts in bin/ carry the install's
    interpreter path in their first line, so their hashes named the host's cache folder."""
    record = info / "RECORD"
    if not record.is_file():
        return
    lines = record.read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.strip() or (site / line.split(",", 1)[0]).exists()
            or line.split(",", 1)[0] == f"{info.name}/RECORD"]
    if kept != lines:
        record.write_text("".join(kept))


def _without_host_facts(site: Path, info: Path) -> list[str]:
    """Remove what an install records of this host (PEP 610's direct_url.json names the wheel's
    path here, uv_cache.json its cache's times) and their lines in RECORD: they made two
    installs of one lock differ, and leaked the build host's paths into the image."""
    removed = []
    for name in HOST_FACTS:
        if (info / name).is_file():
            (info / name).unlink()
            removed.append(str((info / name).relative_to(site)))
    record = info / "RECORD"
    if removed and record.is_file():
        gone = {f"{info.name}/{name}" for name in HOST_FACTS}
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(line for line in lines if line.split(",", 1)[0] not in gone))
    return removed


def _unlinked_libraries(site: Path) -> list[str]:
    """Remove UNLINKED libraries that no shared object in the tree names in DT_NEEDED."""
    needed: set[str] = set()
    for so in site.rglob("*.so*"):
        if so.is_file():
            try:
                needed.update(ElfInfo(so).needed)
            except (ValueError, OSError, struct_error):
                continue
    out = []
    for pattern in UNLINKED:
        for lib in site.glob(pattern):
            if lib.name not in needed and not any(n.startswith(lib.name.split(".so")[0] + ".so") for n in needed):
                lib.unlink()
                out.append(str(lib.relative_to(site)))
    return out


def bytecode(sources: list[Path], image_dir: str) -> list[tuple[str, bytes]]:
    """(__pycache__/NAME.cpython-XY.pyc, bytes) for sources that land in image_dir, compiled as
    site-packages are (_compile): without them a read-only image compiles every runtime module
    at each start (about 60 ms). Only valid where the host's Python minor is the image's."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpux-pyc-") as tmp:
        jobs = [(str(src), str(Path(tmp) / f"{src.stem}.pyc"), f"{image_dir}/{src.name}") for src in sources]
        _fresh_python(_COMPILE_FILES, json.dumps(jobs))
        return [(f"__pycache__/{src.stem}.{sys.implementation.cache_tag}.pyc", Path(cfile).read_bytes())
                for src, (_, cfile, _) in zip(sources, jobs)]


# Compiled in a Python of its own: marshal marks an object shared when its reference count is
# above one, so the same source compiled in a process that imported other modules (a build
# that ran the runtime, a test) gave other bytes: a runtime base image of the same tag, unlike.
_COMPILE_FILES = """
import json, py_compile, sys
for src, cfile, dfile in json.loads(sys.stdin.read()):
    py_compile.compile(src, cfile=cfile, dfile=dfile, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
"""
_COMPILE_TREE = """
import compileall, py_compile, sys
site, ddir = sys.stdin.read().split("\\n")
compileall.compile_dir(site, quiet=2, workers=0, ddir=ddir,  # every CPU: the same bytes, 0.3 s sooner on two
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
"""


def _fresh_python(script: str, stdin: str) -> None:
    """Run script in a Python of its own, in a process group of its own: compileall's worker
    processes are its children, and an interrupted build kills them all before it removes the
    folder they write into (killing the Python alone left them writing .pyc files into it)."""
    proc = subprocess.Popen([sys.executable, "-I", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(stdin)
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        raise WheelError(f"compiling byte-code failed: {(err.strip().splitlines() or ['?'])[-1][:300]}")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL proc's process group, and wait until no process of it is left (at most 1 s: an
    orphan that init has not reaped yet still answers, and writes nothing)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait()
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)  # a worker not yet gone
        except ProcessLookupError:
            return
        time.sleep(0.01)


def _compile(site: Path) -> None:
    """Bytecode with hash-based invalidation, compiled in a Python of its own: the same bytes on
    every host (a reproducible layer) and no source stat at import in a read-only image. A
    package's templates named .py simply stay uncompiled."""
    _fresh_python(_COMPILE_TREE, f"{site}\n{SITE}")  # ddir: the image's path, not the staging folder's
