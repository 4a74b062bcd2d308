"""Cache entries written under a temporary name: nothing left on any exit path, and an entry
that exists is never replaced under a reader."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from gpux_pack import staging


def test_an_exception_inside_leaves_no_temporary_and_no_entry(tmp_path):
    final = tmp_path / "entry"
    with pytest.raises(KeyboardInterrupt):
        with staging.staged(final) as tmp:
            tmp.mkdir()
            (tmp / "half").write_text("x")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_later_writer_drops_its_copy_and_the_first_entry_stays(tmp_path):
    final = tmp_path / "entry"
    for text in ("first", "second"):
        with staging.staged(final) as tmp:
            tmp.mkdir()
            (tmp / "data").write_text(text)
    assert (final / "data").read_text() == "first" and [p.name for p in tmp_path.iterdir()] == ["entry"]
    staging.write_text(tmp_path / "f", "one", replace=False)
    staging.write_text(tmp_path / "f", "two", replace=False)
    assert (tmp_path / "f").read_text() == "one"


def test_the_lock_makes_a_second_process_wait(tmp_path):
    """A real second process blocks on the entry's lock until the first releases it."""
    final = tmp_path / "entry"
    code = ("import sys; from pathlib import Path; from gpux_pack import staging\n"
            "with staging.locked(Path(sys.argv[1])): print('got', flush=True)")
    with staging.locked(final):
        other = subprocess.Popen([sys.executable, "-c", code, str(final)], stdout=subprocess.PIPE, text=True)
        waited = threading.Event()
        threading.Thread(target=lambda: (other.stdout.readline(), waited.set()), daemon=True).start()
        assert not waited.wait(1.0), "the second process got the lock while the first held it"
    assert other.wait(30) == 0 and waited.wait(30)


def test_names_give_their_owner(tmp_path):
    final = tmp_path / "27.0.3-abc-2.json"
    tmp = staging.temp_path(final)
    assert staging.owner(tmp) == os.getpid() and not staging.leftover(tmp)
    assert staging.owner(tmp_path / ".key.999999999.x.tmp") == 999999999
    assert staging.owner(tmp_path / ".sha256.json") is None and staging.owner(tmp_path / ".key.lock") is None
