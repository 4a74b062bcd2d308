"""A full disk during a build's wheel download (the cache on a small tmpfs): one line naming the
folder and "no space left on device", no partial wheel in the cache, and the next download with
space succeeds. Needs root to mount the tmpfs (scripts/dev test runs as root or with sudo)."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile

import pytest

from gpux_pack import wheels
from gpux_pack.pipeline.build import load, plan_for, resolver
from gpux_pack.errors import WheelError
from gpux_pack.plan import Options
from gpux_pack.staging import cache_dir
from gpux_pack.ui import Reporter
from tests.conftest import EXAMPLES, run_cli

pytestmark = pytest.mark.e2e


@pytest.fixture
def small_cache(tmp_path, monkeypatch):
    """A cache whose wheels folder is a 12 MB tmpfs (numpy alone is 17 MB); its locks are the
    shared cache's, so only the download runs."""
    cache = tmp_path / "cache"
    shutil.copytree(cache_dir() / "locks", cache / "locks")
    (cache / "wheels").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(cache / "wheels")], check=True)
    monkeypatch.setenv("GPUX_PACK_CACHE_DIR", str(cache))
    try:
        yield cache
    finally:
        subprocess.run(["umount", str(cache / "wheels")], check=False)


def test_a_full_disk_is_one_line_and_leaves_no_partial_wheel(small_cache):
    ui = Reporter(quiet=True)
    plan = plan_for(load(EXAMPLES / "mlp"), "cpu", "test", Options(), None, ui, pull=False, resolve=resolver(ui))
    with pytest.raises(WheelError) as e:
        wheels.fetch(plan.lock)
    assert str(e.value).startswith(f"downloading wheels failed: no space left on device in {small_cache / 'wheels'}")
    assert "\n" not in str(e.value)
    left = list((small_cache / "wheels").iterdir())
    assert all(p.name == ".sha256.json" or (p.suffix == ".whl" and zipfile.is_zipfile(p)) for p in left), left
    listed = run_cli("cache", "ls", "--json", env={"GPUX_PACK_CACHE_DIR": str(small_cache)})
    assert listed.returncode == 0, listed.stderr
    [row] = [r for r in json.loads(listed.stdout)["caches"] if r["name"] == "wheels"]
    assert row["leftovers"] == 0, row
    subprocess.run(["mount", "-o", "remount,size=200m", str(small_cache / "wheels")], check=True)
    house = wheels.fetch(plan.lock)  # with space: every pin, verified
    assert len(house.wheels) == len(plan.lock.pins) and all(zipfile.is_zipfile(w.path) for w in house.wheels)


def test_cache_ls_flags_and_prune_removes_an_incomplete_wheel_or_download(tmp_path):
    """What a process killed mid-download (an older gpux-pack wrote into the cache itself) leaves."""
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    good = next((cache_dir() / "wheels").glob("numpy-*.whl"))
    (cache / "wheels" / good.name).write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # truncated
    (cache / "wheels" / ".download.999999-dead.tmp").mkdir()  # a dead process's landing folder
    env = {"GPUX_PACK_CACHE_DIR": str(cache)}
    listed = run_cli("cache", "ls", env=env)
    assert listed.returncode == 0 and "(+2 left by killed builds" in listed.stdout, listed.stdout
    pruned = run_cli("cache", "prune", "--older-than", "3650d", env=env)
    assert pruned.returncode == 0, pruned.stderr
    assert not list((cache / "wheels").iterdir())


def _load_image(client, tag: str, created: str) -> None:
    """An image of one empty layer, created at `created`, loaded (so the engine never tagged it:
    its last use is its creation time)."""
    import hashlib
    import io
    import tarfile

    def add(archive, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w"):
        pass
    diff = "sha256:" + hashlib.sha256(layer.getvalue()).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "created": created, "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
    name = hashlib.sha256(config).hexdigest()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        add(archive, "layer.tar", layer.getvalue())
        add(archive, f"{name}.json", config)
        add(archive, "manifest.json", json.dumps([{"Config": f"{name}.json", "RepoTags": [tag],
                                                   "Layers": ["layer.tar"]}]).encode())
    client.images.load(out.getvalue())


def test_base_ls_and_prune_go_by_the_last_use_and_keep_what_a_container_holds(docker_client, mlp_image):
    """`base prune` removes the runtime base images no build used for --older-than (made by an
    older gpux-pack: their creation time), never one a container holds or a build just used."""
    from tests.conftest import RUN_ID

    stale, held = (f"gpux-pack/runtime-gpuxtest{RUN_ID}:{name}" for name in ("stale", "held"))
    for day, tag in ((1, stale), (2, held)):
        _load_image(docker_client, tag, f"2020-01-0{day}T00:00:00Z")
    holder = docker_client.containers.create(held, command=["none"])  # never started: it still holds the image
    try:
        listed = run_cli("base", "ls", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {t: r for r in json.loads(listed.stdout)["runtime_bases"] for t in r["tags"]}
        assert rows[stale]["last_used"] == 1577836800 and rows[stale]["containers"] == 0  # 2020-01-01
        assert rows[held]["containers"] == 1
        used = rows[mlp_image["runtime_base"]]  # the build marked the runtime base it built on
        assert used["last_used"] > __import__("time").time() - 6 * 3600
        pruned = run_cli("base", "prune", "--older-than", "30d", "--json")
        assert pruned.returncode == 0, pruned.stderr
        removed = [t for r in json.loads(pruned.stdout)["removed"] for t in r["tags"]]
        assert stale in removed and held not in removed and mlp_image["runtime_base"] not in removed
        assert not any(stale in image.tags for image in docker_client.images.list())
        docker_client.images.get(held)
        docker_client.images.get(mlp_image["runtime_base"])
        bad = run_cli("base", "prune", "--older-than", "later")
        assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --older-than 'later'"), bad.stderr
    finally:
        holder.remove(force=True)
        for tag in (stale, held):
            try:
                docker_client.images.remove(tag, force=True)
            except Exception:
                pass
