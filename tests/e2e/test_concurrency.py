"""Builds side by side on one cache (CI runners with parallel jobs), and builds interrupted
mid-install: real `gpux-pack build` processes, a cold cache holding only the shared wheels."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import BASE_IMAGE, EXAMPLES, run_cli, serve

pytestmark = pytest.mark.e2e

SAME_TIME = {"SOURCE_DATE_EPOCH": "1767225600"}


def cold_cache(dest: Path) -> Path:
    """A cache with only the shared cache's wheels (hard-linked: nothing is downloaded again)
    and their hash index; no lock, no install, no rootfs, no engine record."""
    from gpux_pack.staging import cache_dir

    shared = cache_dir() / "wheels"
    (dest / "wheels").mkdir(parents=True)
    for wheel in shared.glob("*.whl"):
        try:
            os.link(wheel, dest / "wheels" / wheel.name)
        except OSError:
            shutil.copy2(wheel, dest / "wheels" / wheel.name)
    if (shared / ".sha256.json").is_file():
        shutil.copy2(shared / ".sha256.json", dest / "wheels" / ".sha256.json")
    return dest


def runtime_tag(tmp_path: Path) -> str:
    cache = cold_cache(tmp_path / "plan-cache")
    proc = run_cli("plan", str(EXAMPLES / "mlp"), "--base-image", BASE_IMAGE, "--json",
                   env={"GPUX_PACK_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)["plans"][0]["runtime_base"]["tag"]


def remove_image(client, ref: str) -> None:
    import docker

    try:
        client.images.remove(ref, force=True)
    except docker.errors.ImageNotFound:
        pass


def start_build(tag: str, cache: Path) -> subprocess.Popen:
    env = {**os.environ, **SAME_TIME, "GPUX_PACK_CACHE_DIR": str(cache)}
    return subprocess.Popen(
        [sys.executable, "-m", "gpux_pack", "build", str(EXAMPLES / "mlp"), "--base-image", BASE_IMAGE,
         "--tag", tag, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def temporaries(cache: Path) -> list[Path]:
    return list(cache.rglob(".*.tmp"))


def test_two_cold_builds_at_once_both_succeed_five_times(tmp_path, docker_client, tags):
    """Two builds of one project, same tag and cache, no install and no runtime base image yet:
    both exit 0 with no traceback, every round; the tag serves."""
    tag = tags("concurrent:cpu")
    runtime = runtime_tag(tmp_path)
    for round_ in range(5):
        remove_image(docker_client, tag)
        remove_image(docker_client, runtime)
        cache = cold_cache(tmp_path / f"cache-{round_}")
        procs = [start_build(tag, cache) for _ in range(2)]
        outs = [p.communicate(timeout=600) for p in procs]
        for proc, (out, err) in zip(procs, outs):
            assert proc.returncode == 0, f"round {round_}: exit {proc.returncode}\n{err[-3000:]}"
            assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
        both = "".join(err for _, err in outs)
        assert both.count(" on the host\n") == 1, both  # one install: the other build waited and reused it
        assert both.count("the runtime base image gpux-pack/") == 1, both  # made once, used by both
        images = [json.loads(out)["images"][0] for out, _ in outs]
        assert {i["runtime_base"] for i in images} == {runtime}
        model_layers = {tuple(docker_client.images.get(i["id"]).attrs["RootFS"]["Layers"][-1:]) for i in images}
        assert len(model_layers) == 1, f"round {round_}: the two builds made different model layers"
        assert not temporaries(cache), temporaries(cache)
        assert len([p for p in (cache / "installs").iterdir() if not p.name.startswith(".")]) == 1  # installed once
    with serve(tag) as server:
        r = server.post("/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_build_interrupted_during_the_install_leaves_nothing_behind(tmp_path, docker_client, tags, sig, code, word):
    tag = tags("interrupted:cpu")
    remove_image(docker_client, runtime_tag(tmp_path))  # the build must install
    cache = cold_cache(tmp_path / "cache")
    proc = start_build(tag, cache)
    installs = cache / "installs"
    deadline = time.monotonic() + 300
    while not (installs.is_dir() and any(p.name.endswith(".tmp") for p in installs.iterdir())):
        assert proc.poll() is None, f"the build ended before installing:\n{proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "no install began within 300 s"
        time.sleep(0.02)  # polling the filesystem for the install's temporary folder
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err[-3000:]
    assert err.strip().splitlines()[-1] == word and "Traceback" not in err, err[-3000:]
    assert not temporaries(cache), temporaries(cache)
    assert not [p for p in installs.iterdir() if not p.name.endswith(".lock")], list(installs.iterdir())
