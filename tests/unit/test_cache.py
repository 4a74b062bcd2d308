"""`gpux-pack cache ls|prune` on a real cache folder, and `plan` from cached locks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile

from tests.conftest import ROOT, run_cli


def test_cache_ls_and_prune_remove_only_entries_unused_for_long(tmp_path):
    env = {"GPUX_PACK_CACHE_DIR": str(tmp_path)}
    (tmp_path / "wheels").mkdir()
    old, new = tmp_path / "wheels" / "old-1.0-py3-none-any.whl", tmp_path / "wheels" / "new-1.0-py3-none-any.whl"
    for wheel, data in ((old, b"x" * 1000), (new, b"y" * 10)):  # whole wheels: zips (a cut one is a leftover)
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("m.py", data)
    sizes, old_size = old.stat().st_size + new.stat().st_size, old.stat().st_size
    (tmp_path / "wheels" / ".sha256.json").write_text("{}")
    install = tmp_path / "installs" / "abc" / "site-packages"
    install.mkdir(parents=True)
    (install / "m.py").write_bytes(b"z" * 500)
    for image in ("sha256-0ld", "sha256-new"):  # each image's recorded SBOM and provenance
        (tmp_path / "attestations" / image).mkdir(parents=True)
        (tmp_path / "attestations" / image / "sbom.cdx.json").write_bytes(b"{}" * 50)
    month = time.time() - 40 * 86400
    for path in (old, tmp_path / "installs" / "abc", tmp_path / "attestations" / "sha256-0ld"):
        os.utime(path, (month, month))
    listed = json.loads(run_cli("cache", "ls", "--json", env=env).stdout)
    by_name = {c["name"]: c for c in listed["caches"]}
    assert by_name["wheels"]["entries"] == 2 and by_name["wheels"]["bytes"] == sizes
    assert by_name["installs"]["entries"] == 1 and by_name["installs"]["bytes"] == 500
    assert by_name["attestations"]["entries"] == 2 and by_name["attestations"]["bytes"] == 200
    proc = run_cli("cache", "prune", "--older-than", "30d", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    removed = json.loads(proc.stdout)
    assert sorted(os.path.basename(r["path"]) for r in removed["removed"]) == ["abc", old.name, "sha256-0ld"]
    assert removed["bytes"] == old_size + 600 and new.exists() and (tmp_path / "attestations" / "sha256-new").exists()
    assert (tmp_path / "wheels" / ".sha256.json").exists()
    bad = run_cli("cache", "prune", "--older-than", "soon", env=env)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --older-than 'soon'")


def test_plan_lists_the_lock_without_downloading_and_works_offline(tmp_path):
    """cuda: 1.3 GB of NVIDIA wheels, and plan downloads none of them."""
    env = {"GPUX_PACK_CACHE_DIR": str(tmp_path)}
    first = run_cli("plan", str(ROOT / "examples" / "mlp"), "--provider", "cuda", "--json", env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    plan = json.loads(first.stdout)["plans"][0]
    names = {p["name"] for p in plan["lock"]}
    assert {"onnxruntime-gpu", "nvidia-cublas", "nvidia-cudnn-cu13"} <= names
    assert plan["provider"] == "cuda" and plan["tag"] == "iris-mlp:1.0.0-cuda"
    assert plan["runtime_base"]["tag"].startswith("gpux-pack/runtime-cuda:1.31.1-")
    assert plan["download_bytes"] > 1e9 and not plan["download_unknown"]
    assert not (tmp_path / "wheels").exists() or not list((tmp_path / "wheels").glob("*.whl"))
    offline = {**env, "UV_OFFLINE": "1", "PIP_NO_INDEX": "1", "HTTPS_PROXY": "http://127.0.0.1:9",
               "HTTP_PROXY": "http://127.0.0.1:9"}
    again = run_cli("plan", str(ROOT / "examples" / "mlp"), "--provider", "cuda", "--offline", "--json", env=offline)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["plans"][0]["lock"] == plan["lock"]
    missing = run_cli("plan", str(ROOT / "examples" / "text-classifier"), "--provider", "rocm", "--offline",
                      env=offline)
    assert missing.returncode != 0 and "no cached lock" in missing.stderr


def test_build_summary_schema_is_current():
    from gpux_pack.commands.build import json_schema as schema

    assert json.loads((ROOT / "build-summary.schema.json").read_text()) == schema(), \
        "regenerate: gpux-pack schema --of build-summary > build-summary.schema.json"


def test_the_ci_example_uses_commands_and_flags_that_exist():
    import re
    import shlex

    import yaml

    workflow = yaml.safe_load((ROOT / "examples" / "ci" / "github-actions.yml").read_text())
    runs = [step["run"] for step in workflow["jobs"]["images"]["steps"] if "run" in step]
    used = []
    for text in runs:
        for line in text.replace("\n", " ").split(";"):
            if "gpux-pack " in line:
                words = shlex.split(line[line.index("gpux-pack "):].split(">")[0])
                used.append((words[1], [w for w in words[2:] if w.startswith("--")]))
    assert {cmd for cmd, _ in used} == {"plan", "build", "deploy"}
    for cmd, flags in used:
        help_text = run_cli(cmd, "--help").stdout
        for flag in flags:
            assert re.search(rf"{re.escape(flag)}\b", help_text), (cmd, flag)
    build = next(flags for cmd, flags in used if cmd == "build")
    assert {"--push", "--json"} <= set(build)


def _dead_pid() -> int:
    """The pid of a process that was SIGKILLed (and reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.pid


def test_leftovers_of_killed_builds_are_listed_and_pruned_at_any_age_live_ones_kept(tmp_path):
    env = {"GPUX_PACK_CACHE_DIR": str(tmp_path)}
    installs = tmp_path / "installs"
    dead = installs / f".abc.{_dead_pid()}-1a2b3c4d.tmp" / "site-packages"
    dead.mkdir(parents=True)
    (dead / "m.py").write_bytes(b"x" * 700)
    lock = tmp_path / "locks" / f".def.txt.{_dead_pid()}-00ff00ff.tmp"
    lock.parent.mkdir()
    lock.write_text("y" * 30)
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        building = installs / f".abc.{live.pid}-5e6f7a8b.tmp"
        building.mkdir()
        (building / "n.py").write_bytes(b"z" * 300)
        (installs / ".abc.lock").touch()
        listed = json.loads(run_cli("cache", "ls", "--json", env=env).stdout)
        by_name = {c["name"]: c for c in listed["caches"]}
        assert (by_name["installs"]["leftovers"], by_name["installs"]["leftover_bytes"]) == (1, 700)
        assert (by_name["locks"]["leftovers"], by_name["locks"]["leftover_bytes"]) == (1, 30)
        assert by_name["installs"]["entries"] == 0 and by_name["wheels"]["leftovers"] == 0
        text = run_cli("cache", "ls", env=env).stdout
        assert "(+1 left by killed builds, 0.0 MB)" in text, text
        proc = run_cli("cache", "prune", "--older-than", "30d", "--json", env=env)  # age protects no garbage
        assert proc.returncode == 0, proc.stderr
        removed = json.loads(proc.stdout)
        assert sorted(r["path"] for r in removed["removed"]) == sorted([str(dead.parent), str(lock)])
        assert removed["bytes"] == 730 and not dead.parent.exists() and not lock.exists()
        assert (building / "n.py").is_file()  # a build in progress is never touched
        assert (installs / ".abc.lock").exists()
    finally:
        live.kill()
        live.wait()
    proc = run_cli("cache", "prune", "--older-than", "30d", "--json", env=env)  # its owner is gone now
    assert [r["path"] for r in json.loads(proc.stdout)["removed"]] == [str(building)]
