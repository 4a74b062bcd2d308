"""gpux-pack's cache folder, and its entries made by several builds at once or by builds that
are interrupted.

An entry is made under a temporary name next to it (.NAME.PID-TOKEN.tmp) and renamed into
place when complete: a reader sees the whole entry or none, and an entry is never replaced
while another build may read it (a later writer drops its own copy; same key, same content).
Where two builds would make the same entry, a lock file next to it (.NAME.lock, fcntl.flock)
makes the second wait and then reuse the first's. The temporary entry is removed on every
exit path; one left by a process that was killed (its pid is gone) is garbage for
`gpux-pack cache ls|prune`, whatever its age.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# .NAME.PID.tmp, .NAME.PID-TOKEN.tmp, and the older .NAME.PID.TOKEN.tmp (tempfile.mkdtemp)
def cache_dir() -> Path:
    """GPUX_PACK_CACHE_DIR, else $XDG_CACHE_HOME/gpux-pack, else ~/.cache/gpux-pack."""
    if os.environ.get("GPUX_PACK_CACHE_DIR"):
        return Path(os.environ["GPUX_PACK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpux-pack"


def touch(path: Path) -> None:
    """Mark a cache entry as used now (`gpux-pack cache prune` removes the unused): a folder's
    modification time (listing it would move its access time), a file's access time (the
    wheel hash index keys on the modification time)."""
    try:
        os.utime(path) if path.is_dir() else os.utime(path, (time.time(), path.stat().st_mtime))
    except OSError:
        pass


_TMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)(?:[-.][0-9a-z_]+)?\.tmp$")


def temp_path(final: Path) -> Path:
    """A fresh temporary name next to final, naming this process as its owner."""
    return final.with_name(f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def owner(path: Path) -> int | None:
    """The pid in a temporary entry's name; None for anything else."""
    m = _TMP.match(path.name)
    return int(m.group("pid")) if m else None


def alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process we can ask about: never treated as gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def leftover(path: Path) -> bool:
    """A temporary entry whose owning process is gone."""
    pid = owner(path)
    return pid is not None and not alive(pid)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def remove_leftovers(final: Path) -> None:
    """Temporary copies of final left by killed builds."""
    for tmp in final.parent.glob(f".{final.name}.*.tmp"):
        m = _TMP.match(tmp.name)
        if m and m.group("name") == final.name and leftover(tmp):
            remove(tmp)


@contextmanager
def lock_file(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on path (created when missing); released when the block ends
    or the process dies. The file stays: removing it would let two holders in at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def locked(final: Path):
    """The lock of the entry final: .NAME.lock next to it."""
    return lock_file(final.with_name(f".{final.name}.lock"))


@contextmanager
def staged(final: Path, replace: bool = False) -> Iterator[Path]:
    """A temporary path next to final for the block to fill (nothing is made there yet). When
    the block ends normally it becomes final, atomically; when final exists already it stays
    (replace: a file is replaced, for an entry that is refreshed; readers keep the file they
    opened). The temporary path is removed on every exit path."""
    tmp = temp_path(final)
    try:
        yield tmp
        publish(tmp, final, replace)
    finally:
        remove(tmp)


def publish(tmp: Path, final: Path, replace: bool = False) -> None:
    if replace and not tmp.is_dir():
        os.replace(tmp, final)
        return
    try:
        if tmp.is_dir():
            os.rename(tmp, final)  # fails when final exists and is not empty
        else:
            os.link(tmp, final)  # fails when final exists
    except OSError:
        if not final.exists():
            raise


def write_text(final: Path, text: str, replace: bool = True) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    with staged(final, replace) as tmp:
        tmp.write_text(text)


def write_bytes(final: Path, data: bytes, replace: bool = True) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    with staged(final, replace) as tmp:
        tmp.write_bytes(data)
