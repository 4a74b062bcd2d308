"""Hostile projects: each case the hardening issue reproduced answers one line and exit 2 before
Docker is touched (DOCKER_HOST points nowhere, so a project that passes every check ends with
exit 1 at "cannot reach the Docker engine")."""

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpux_pack.cli import main

ROOT = Path(__file__).resolve().parents[2]
B = "model:\n  source: model.onnx\n"
NO_ENGINE = "cannot reach the Docker engine"


def cli(*args: str, capsys) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as done:
        main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return done.value.code, err.strip().splitlines()


@pytest.fixture(autouse=True)
def no_engine(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")


def project(tmp_path: Path, yml: str, model=None) -> Path:
    shutil.copy(ROOT / "examples" / "mlp" / "model.onnx", tmp_path / "model.onnx")
    if model:
        model(tmp_path)
    (tmp_path / "gpux.yml").write_text(yml)
    return tmp_path


def build(path: Path, capsys, *extra: str) -> tuple[int, list[str]]:
    return cli("build", str(path), "-p", "cpu", *extra, capsys=capsys)


def _bomb(levels: int = 9) -> str:
    text = "metadata:\n  a: &a [x, x, x, x, x, x, x, x, x]\n"
    for i in range(levels):
        prev, cur = chr(97 + i), chr(98 + i)
        text += f"  {cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]\n"
    return text


@pytest.mark.parametrize(
    "yml, words",
    [
        ('name: "x\\nRUN echo PWNED"\n' + B, "name: 'x\\nRUN echo PWNED' is not a name"),
        ('name: "x\\u2028RUN echo PWNED"\n' + B, "is not a name"),
        ('name: m\nversion: "1\\rRUN x"\n' + B, "is not a valid version"),
        ("name: m\n" + B + 'pack:\n  labels: {"a\\nRUN x": v}\n', "is not a valid label key"),
        ("name: m\n" + B + 'pack:\n  base_image: "python:3.11\\nRUN x"\n', "invalid tag"),
        ("name: m\n" + B + 'pack:\n  base_image: {cpu: "python:3.11 AS x"}\n', "invalid tag"),
        ("name: m\n" + B + "metadata: " + "[" * 500 + "]" * 500 + "\n", "nested deeper than 64 levels"),
        ("name: m\n" + B + "metadata: &a [*a]\n", "alias *a refers to itself"),
        ("name: m\n" + B + _bomb(), "once aliases are expanded"),
        ("name: m\n" + B + "metadata: {d: !!binary aGVsbG8=}\n", "metadata.d: !!binary data is not allowed"),
        ("name: m\n" + B + "metadata: !!set {a, b}\n", "metadata: a !!set is not allowed"),
        ("name: m\n" + B + "metadata: {x: .nan}\n", "metadata.x: nan is not a finite number"),
        ("name: m\n" + B + "serving: {timeout: .inf}\n", "serving.timeout: inf is not a finite number"),
        ("name: m\n" + B + "runtime: {timeout: 1e300}\n", "runtime.timeout: Input should be less than or equal to 86400"),
        ("name: m\n" + B + "serving: {host: 256.1.1.1}\n", "serving.host: '256.1.1.1' is not an IP address"),
        ("name: m\n" + B + "serving: {port: " + "9" * 5000 + "}\n", "integer too large"),
        ("name: m\n" + B + 'runtime: {gpu: {memory: "' + "9" * 400 + 'GB"}}\n', "is not a size"),
        ("name: m\n" + B + "pack: {device_id: 99999999999999999999}\n", "pack.device_id"),
        ("name: m\nmodel:\n  source: \"model\\0.onnx\"\n", "model.source"),
        ("name: m\n" + B + "pack: {providers: [cpu, tpu]}\n", "unknown provider 'tpu'"),
        ("name: m\n" + B + "metadata: {on: 1}\n", "key True must be text"),
    ],
)
def test_hostile_configs_give_one_line_and_exit_2(tmp_path, capsys, yml, words):
    code, lines = build(project(tmp_path, yml), capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and words in lines[0], lines


def test_dates_become_iso_text_and_odd_values_stay_json(tmp_path, capsys):
    from gpux_pack.project.load import load_project

    path = project(tmp_path, "name: m\n" + B + "metadata: {d: 2024-01-01, t: 2024-01-01 10:00:00, 0: zero}\n")
    assert load_project(path).config.metadata == {"d": "2024-01-01", "t": "2024-01-01T10:00:00", "0": "zero"}
    code, lines = build(path, capsys)
    assert code == 1 and NO_ENGINE in lines[0]


@pytest.mark.parametrize("target", ["fifo", "/dev/zero", "huge"])
def test_non_regular_or_huge_config_files_are_refused_without_reading(tmp_path, capsys, target):
    if target == "fifo":
        os.mkfifo(tmp_path / "gpux.yml")
        path = str(tmp_path / "gpux.yml")
    elif target == "huge":
        (tmp_path / "gpux.yml").write_text("name: m\n" + B + "# " + "x" * (1 << 21) + "\n")
        path = str(tmp_path)
    else:
        path = target
    code, lines = cli("build", path, capsys=capsys)
    assert code == 2 and len(lines) == 1 and "cannot read" in lines[0], lines


def test_base_render_with_two_providers_is_a_usage_error(tmp_path, capsys):
    code, lines = cli("base", "render", "-p", "cpu,openvino", "-o", str(tmp_path / "o"), capsys=capsys)
    assert code == 2 and len(lines) == 1 and "one provider" in lines[0]


def _external(offset: str | None = None, location: str = "w.bin", sparse: bool = False):
    def make(folder: Path) -> None:
        inputs = [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])]
        if sparse:
            dense = np.eye(4, dtype=np.float32)
            values = numpy_helper.from_array(np.ones(4, np.float32), "w")
            indices = numpy_helper.from_array(np.array([0, 5, 10, 15], np.int64), "w_idx")
            graph = helper.make_graph([helper.make_node("MatMul", ["features", "w"], ["logits"])], "g", inputs, outputs,
                                      sparse_initializer=[helper.make_sparse_tensor(values, indices, dense.shape)])
        else:
            w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
            graph = helper.make_graph([helper.make_node("MatMul", ["features", "w"], ["logits"])], "g", inputs, outputs, [w])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        tensors = [t.values for t in model.graph.sparse_initializer] if sparse else list(model.graph.initializer)
        for t in tensors:  # by hand: onnx's helpers skip sparse initializers
            (folder / "w.bin").write_bytes(t.raw_data or numpy_helper.to_array(t).tobytes())
            onnx.external_data_helper.set_external_data(t, "w.bin", offset=0, length=len((folder / "w.bin").read_bytes()))
            t.ClearField("raw_data")
            t.ClearField("float_data")
            t.data_location = TensorProto.EXTERNAL
        for t in tensors:
            for entry in t.external_data:
                if entry.key == "offset" and offset is not None:
                    entry.value = offset
                if entry.key == "location":
                    entry.value = location
        onnx.save_model(model, str(folder / "model.onnx"))

    return make


@pytest.mark.parametrize(
    "model, words",
    [
        (_external(offset="abc"), "external data offset 'abc' of tensor w is not a non-negative integer"),
        (_external(offset="-1"), "external data offset '-1'"),
        (_external(location="sub/../w.bin"), "must be a relative path inside the model's folder"),
        (_external(location="/etc/passwd"), "must be a relative path inside the model's folder"),
    ],
)
def test_bad_external_data_is_named(tmp_path, capsys, model, words):
    code, lines = build(project(tmp_path, "name: m\n" + B, model), capsys)
    assert code == 2 and len(lines) == 1 and words in lines[0], lines


def test_external_data_of_a_sparse_initializer_is_baked(tmp_path):
    from gpux_pack.project.model import inspect_model

    project(tmp_path, "name: m\n" + B, _external(sparse=True))
    assert inspect_model(tmp_path / "model.onnx").files == ("model.onnx", "w.bin")


def _opset(version: int = 17, domain: str = "", ml: int | None = None):
    def make(folder: Path) -> None:
        model = onnx.load(str(folder / "model.onnx"))
        if domain:
            model.graph.node[0].domain = domain
            model.opset_import.append(helper.make_opsetid(domain, 1))
        else:
            model.opset_import[0].version = version
        if ml:
            model.opset_import.append(helper.make_opsetid("ai.onnx.ml", ml))
        onnx.save(model, str(folder / "model.onnx"))

    return make


@pytest.mark.parametrize(
    "model, provider, words",
    [
        (_opset(99), "cpu", "imports opset 99 of ai.onnx; onnxruntime 1.32.0 loads opsets up to 28"),
        (_opset(29), "openvino", "onnxruntime 1.32.0 loads opsets up to 28"),
        (_opset(ml=9), "cpu", "opset 9 of ai.onnx.ml"),
        (_opset(domain="my.ops"), "cpu", "uses the custom operator my.ops:Gemm"),
    ],
)
def test_models_the_image_cannot_load_fail_before_docker(tmp_path, capsys, model, provider, words):
    code, lines = cli("build", str(project(tmp_path, "name: m\n" + B, model)), "-p", provider, capsys=capsys)
    assert code == 2 and len(lines) == 1 and words in lines[0], lines


def test_cpu_accepts_its_newest_opset(tmp_path, capsys):
    code, lines = build(project(tmp_path, "name: m\n" + B, _opset(28)), capsys)
    assert code == 1 and NO_ENGINE in lines[0], lines


def _ir(version: int):
    def make(folder: Path) -> None:
        model = onnx.load(str(folder / "model.onnx"))
        model.ir_version = version
        onnx.save(model, str(folder / "model.onnx"))

    return make


@pytest.mark.parametrize(
    "provider, line",
    [
        ("cuda", "error: model.onnx: IR version 14; onnxruntime-gpu 1.31.1 loads IR versions up to 13 (save it with "
                 "an older IR version, e.g. onnx.helper.make_model(..., ir_version=13))"),
    ],
)
def test_an_ir_version_the_image_cannot_load_fails_before_docker(tmp_path, capsys, provider, line):
    code, lines = cli("build", str(project(tmp_path, "name: m\n" + B, _ir(14))), "-p", provider, capsys=capsys)
    assert code == 2 and lines == [line]


def test_cpu_accepts_ir_version_14(tmp_path, capsys):
    code, lines = build(project(tmp_path, "name: m\n" + B, _ir(14)), capsys)
    assert code == 1 and NO_ENGINE in lines[0], lines


@pytest.mark.parametrize(
    "yml, line",
    [
        ("name: a..b\n" + B, "gpux.yml:1: name: 'a..b' cannot name an image: 'a..b' is not a valid repository "
                             "('.', '_', '__' or '-' only between letters or digits); rename it, or give --tag or pack.tag"),
        (B + "version: '1'\nname: My_-Model\n", "gpux.yml:4: name: 'My_-Model' cannot name an image: 'my_-model' "
                                               "is not a valid repository"),
        ("name: m\nversion: " + "v" * 125 + "\n" + B, "gpux.yml:2: version: '" + "v" * 125 + "' cannot tag an "
                                                     "image: 'm:" + "v" * 125 + "-cpu' is not a valid image reference"),
        ("name: m\n" + B + "pack:\n  tag: 'a..b:{provider}'\n", "gpux.yml:5: pack.tag: 'a..b:cpu' is not a "
                                                               "valid image reference"),
    ],
)
def test_a_name_that_cannot_make_the_default_tag_names_its_line(tmp_path, capsys, yml, line):
    code, lines = build(project(tmp_path, yml), capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {tmp_path}/{line}"), lines


def test_a_name_that_cannot_make_the_default_tag_builds_with_a_tag(tmp_path, capsys):
    code, lines = build(project(tmp_path, "name: a..b\n" + B), capsys, "--tag", "ab:1")
    assert code == 1 and NO_ENGINE in lines[0], lines


@pytest.mark.parametrize(
    "args, words",
    [
        (("--tag", "x:y\nRUN z"), "--tag"),
        (("--tag", "{name.__class__}"), "--tag"),
        (("--tag", "{name.foo}"), "unknown placeholder {name.foo}"),
        (("--tag", "{name:>100000000}"), "{name} takes no format spec or conversion"),
        (("--tag", "m:{version!r}"), "{version} takes no format spec or conversion"),
        (("--tag", "x" * 5000 + ":{provider}"), "...' (5004 characters) is longer than 255 characters"),
        (("--tag", "a@sha256:" + "0" * 64), "has a digest"),
        (("--base-image", "python:3.11\nRUN x"), "base-image"),
    ],
)
def test_hostile_command_line_values(tmp_path, capsys, args, words):
    code, lines = build(project(tmp_path, "name: m\n" + B), capsys, *args)
    assert code == 2 and len(lines) == 1 and words in lines[0], lines


def test_a_format_width_in_pack_tag_is_refused_within_100_mb(tmp_path):
    """str.format would allocate the width: 741 MB for {name:>100000000}, a MemoryError for 3e9."""
    from tests.conftest import run_cli_measured

    for width in ("100000000", "3000000000"):
        path = project(tmp_path, "name: m\n" + B + f"pack:\n  tag: 'r/{{name:>{width}}}:1'\n")
        proc, peak = run_cli_measured("plan", str(path), "-p", "cpu", "--offline")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
        assert lines[0] == f"error: {path}/gpux.yml:5: pack.tag: {{name}} takes no format spec or conversion; " \
                           "write {name} alone", lines
        assert peak < 100 << 20, peak


def test_expanded_variables_are_bounded_within_100_mb(tmp_path, monkeypatch):
    """An 8 KB gpux.yml repeating a 120,000-character variable expanded to 130 MB (531 MB used);
    each value may grow to 64 KiB and the file by 1 MiB, checked before the text is joined."""
    from tests.conftest import run_cli_measured

    many = "".join("  - ${BIG}\n" for _ in range(1100))
    path = project(tmp_path, "name: m\n" + B + "metadata:\n  notes:\n" + many)
    assert (path / "gpux.yml").stat().st_size < 13_000
    proc, peak = run_cli_measured("plan", str(path), "-p", "cpu", "--offline", env={"BIG": "x" * 120_000})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and peak < 100 << 20, (proc.stderr[-2000:], peak)
    assert lines[0] == f"error: {path}/gpux.yml:6: metadata.notes[0]: ${{BIG}} (120000 characters) expands this " \
                       "value past 65536 characters; a gpux.yml value is a name, a path or a setting", lines
    proc, peak = run_cli_measured("plan", str(path), "-p", "cpu", "--offline", env={"BIG": "x" * 60_000})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and peak < 100 << 20, (proc.stderr[-2000:], peak)
    assert "metadata.notes[17]: ${BIG} (60000 characters) expands this value the file past 1048576 expanded " \
           "characters" in lines[0], lines


def test_bad_source_date_epoch(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "99999999999999999")
    code, lines = cli("render", str(project(tmp_path, "name: m\n" + B)), "-p", "cpu", "-o", str(tmp_path / "o"),
                      capsys=capsys)
    assert code == 2 and lines[-1].startswith("error: SOURCE_DATE_EPOCH="), lines
