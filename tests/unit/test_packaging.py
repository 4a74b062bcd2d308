"""A non-editable install renders: the wheel ships templates and the runtime."""

import os
import subprocess

import pytest
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.network  # pip fetches the build backend (hatchling)
def test_wheel_install_renders(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
                   check=True, capture_output=True)
    [wheel] = dist.glob("gpux_pack-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"gpux_pack/templates/base.Dockerfile.j2", "gpux_pack/templates/warm.Dockerfile.j2",
            "gpux_pack/runtime/server.py"} <= names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site), "DOCKER_HOST": "unix:///nonexistent.sock"}
    where = subprocess.run([sys.executable, "-c", "import gpux_pack, gpux_pack.image.dockerfile as r; print(gpux_pack.__file__); print(r.templates_dir())"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout.split()
    assert all(str(site) in line for line in where), where  # the wheel, not this checkout
    out = tmp_path / "ctx"
    proc = subprocess.run([sys.executable, "-m", "gpux_pack", "render", str(ROOT / "examples" / "mlp"),
                           "--provider", "cpu", "--output", str(out)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "\n# iris-mlp 1.0.0 for the cpu execution provider" in (out / "Dockerfile").read_text()
    with tarfile.open(out / "runtime.tar") as runtime:
        assert "opt/gpux/runtime/gpux_runtime/server.py" in runtime.getnames()
