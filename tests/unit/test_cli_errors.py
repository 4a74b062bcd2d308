"""Broken projects end in one line and exit 2, before Docker is touched.

DOCKER_HOST points at nothing: had any of these reached Docker, the exit code would be 1."""

from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, run_cli

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
MLP_MODEL = (EXAMPLES / "mlp" / "model.onnx").read_bytes()
GOOD = "name: m\nmodel:\n  source: ./model.onnx\n"


def project(tmp_path: Path, config: str | None, model: bytes | None = MLP_MODEL) -> Path:
    if config is not None:
        (tmp_path / "gpux.yml").write_text(config)
    if model is not None:
        (tmp_path / "model.onnx").write_bytes(model)
    return tmp_path


CASES = {
    "no gpux.yml": (None, MLP_MODEL, "no gpux.yml in this folder"),
    "empty gpux.yml": ("", MLP_MODEL, "is empty"),
    "invalid YAML": ("name: [x\n", MLP_MODEL, "invalid YAML"),
    "unknown key": (GOOD + "servng: {}\n", MLP_MODEL, "unknown key 'servng' (did you mean 'serving'?)"),
    "missing name": ("model:\n  source: ./model.onnx\n", MLP_MODEL, "name: is required"),
    "bad type": (GOOD + "inputs:\n  features: {type: floa32}\n", MLP_MODEL, "did you mean 'float32'"),
    "windows backend": (GOOD + "runtime:\n  gpu: {backend: directml}\n", MLP_MODEL, "Windows-only"),
    "model file missing": (GOOD, None, "model.source: file not found"),
    "empty model": (GOOD, b"", "is empty (0 bytes)"),
    "truncated model": (GOOD, MLP_MODEL[:300], "is not an ONNX model"),
    "text as model": (GOOD, b"this is not onnx\n", "is not an ONNX model"),
    "unknown input": (GOOD + "inputs:\n  image: {type: float32}\n", MLP_MODEL, "has no input 'image'"),
    "shape mismatch": (GOOD + "inputs:\n  features: {shape: [-1, 3]}\n", MLP_MODEL, "fixes it at 4"),
    "bad tag": (GOOD + "pack:\n  tag: 'Not A Tag'\n", MLP_MODEL, "not a valid image reference"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_broken_project_is_one_line_and_exit_2(tmp_path, case):
    config, model, words = CASES[case]
    proc = run_cli("build", "--strict", str(project(tmp_path, config, model)), env=NO_DOCKER)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert words in lines[0]
    assert lines[0].startswith("error: ")


@pytest.mark.parametrize("case", ["unknown key", "bad type", "windows backend"])
def test_what_strict_refuses_is_otherwise_one_warning_line(tmp_path, case):
    """GPUX accepts these: without --strict the build goes on (here to the missing engine)."""
    config, model, words = CASES[case]
    proc = run_cli("build", str(project(tmp_path, config, model)), env=NO_DOCKER)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("warning: ") and lines[0].endswith("left out (--strict refuses it)"), lines
    assert lines[1].startswith("error: cannot reach the Docker engine"), lines
    hint = {"unknown key": "(did you mean 'serving'?)", "bad type": "(did you mean 'float32'?)",
            "windows backend": "Windows-only"}[case]
    assert hint in lines[0], lines



@pytest.mark.parametrize(
    "args, words",
    [
        (["build", "--provider", "tpu"], "unknown provider 'tpu'"),
        (["build", "--warmup", "sometimes"], "--warmup"),
        (["build", "--platform", "linux/s390x"], "--platform"),
        (["build", "--no-such-flag"], "No such option"),
        (["render"], "--output"),
    ],
)
def test_usage_errors_exit_2(tmp_path, args, words):
    project(tmp_path, GOOD)
    proc = run_cli(*args, *([] if args[0] == "render" and len(args) == 1 else [str(tmp_path)]), env=NO_DOCKER)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr


def test_unreachable_engine_is_one_line_exit_1():
    proc = run_cli("build", str(EXAMPLES / "mlp"), env=NO_DOCKER)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: cannot reach the Docker engine at unix:///nonexistent/docker.sock")
    assert "DOCKER_HOST" in lines[-1] and "Traceback" not in proc.stderr


def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("gpux-pack ")


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink", "symlinked gpux.yml"])
def test_contained_builds_read_nothing_outside_the_project(tmp_path, where):
    """GPUX documents absolute model paths, so a build reads them; a CI building projects it does
    not trust passes --contained (or the project sets pack.contained): then `..`, an absolute
    path or a link out of the folder is one line, exit 2, before anything is read or sent."""
    outside, folder = tmp_path / "outside", tmp_path / "project"
    outside.mkdir()
    folder.mkdir()
    (outside / "model.onnx").write_bytes(MLP_MODEL)
    source = {"parent": "../outside/model.onnx", "absolute": str(outside / "model.onnx")}.get(where, "./model.onnx")
    if where == "symlink":
        (folder / "model.onnx").symlink_to(outside / "model.onnx")
    if where == "symlinked gpux.yml":
        (outside / "gpux.yml").write_text(GOOD)
        (folder / "gpux.yml").symlink_to(outside / "gpux.yml")
    else:
        (folder / "gpux.yml").write_text(f"name: m\nmodel:\n  source: {source}\n")
    loose = run_cli("build", str(folder), env=NO_DOCKER)
    assert loose.returncode == 1 and "cannot reach the Docker engine" in loose.stderr  # read, then Docker
    for args in (["--contained"], []):
        if not args:  # the project's own switch
            if where == "symlinked gpux.yml":
                continue
            (folder / "gpux.yml").write_text(f"name: m\nmodel:\n  source: {source}\npack:\n  contained: true\n")
        proc = run_cli("build", str(folder), *args, env=NO_DOCKER)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert "outside" in lines[0] and "Traceback" not in proc.stderr, lines
    inside = tmp_path / "inside"
    inside.mkdir()
    (inside / "model.onnx").write_bytes(MLP_MODEL)
    (inside / "gpux.yml").write_text(GOOD)
    ok = run_cli("build", str(inside), "--contained", env=NO_DOCKER)
    assert ok.returncode == 1 and "cannot reach the Docker engine" in ok.stderr
