import json
from pathlib import Path

import pytest

from gpux_pack.project.config import json_schema, parse_memory
from gpux_pack.project.load import load_project
from gpux_pack.errors import ConfigError, UsageError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpux.yml"
    path.write_text(text)
    return path


BASE = "name: m\nmodel:\n  source: ./model.onnx\n"


@pytest.mark.parametrize(
    "text, line, field, words",
    [
        (BASE + "inputs:\n  x:\n    type: flot32\n", 6, "inputs.x.type", "did you mean 'float32'"),
        (BASE + "serving:\n  prot: 8080\n", 5, "serving.prot", "did you mean 'port'"),
        (BASE + "serving:\n  port: 99999\n", 5, "serving.port", "less than or equal to 65535"),
        (BASE + "runtime:\n  gpu:\n    backend: coreml\n", 6, "runtime.gpu.backend", "Apple-only"),
        (BASE + "runtime:\n  gpu:\n    memory: lots\n", 6, "runtime.gpu.memory", "512MB or 2GB"),
        (BASE + "inputs:\n  - name: x\n    shape: [batch, -3]\n", 6, "inputs[0].shape[1]", "negative"),
        (BASE + "pack:\n  providers: [cpu, tpu]\n", 5, "pack.providers[1]", "unknown provider 'tpu'"),
        (BASE + "pack:\n  tag: 'x:{model}'\n", 5, "pack.tag", "unknown placeholder {model}"),
        (BASE + "pack:\n  requirements: ['num py==']\n", 5, "pack.requirements", "is not a requirement"),
        (BASE + "pack:\n  tensorrt:\n    profiles:\n      x: {min: [1], opt: [4], max: [2]}\n", 7, "pack.tensorrt.profiles.x", "min <= opt <= max"),
        ("model:\n  source: ./model.onnx\n", None, "name", "is required"),
        ("name: m\nmodel:\n  source: https://example.com/m.onnx\n", 3, "model.source", "only local files"),
        (BASE + "inputs:\n  - name: x\n  - name: x\n", 4, "inputs", "listed twice"),
        (BASE + "name: again\n", 4, "name", "duplicate key"),
        (BASE + "tags: [a]\n", 4, "tags", "unknown key 'tags'"),
    ],
)
def test_bad_fields_name_file_line_and_field(tmp_path, text, line, field, words):
    with pytest.raises(ConfigError) as err:
        load_project(write(tmp_path, text), strict=True)  # unknown keys and types: a warning unless strict
    e = err.value
    assert e.field == field
    assert e.line == line
    assert words in str(e)
    assert str(e).startswith(f"{tmp_path / 'gpux.yml'}{f':{line}' if line else ''}: {field}: ")


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "is empty"),
        ("- a\n- b\n", "must be a mapping"),
        ("name: [unclosed\n", "invalid YAML"),
    ],
)
def test_unreadable_files(tmp_path, text, words):
    with pytest.raises(ConfigError, match=words):
        load_project(write(tmp_path, text))


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(UsageError, match="no gpux.yml in this folder"):
        load_project(tmp_path)
    with pytest.raises(UsageError, match="no such file or folder"):
        load_project(tmp_path / "nope")


def test_both_input_forms_and_gpux_extras(tmp_path):
    mapping = load_project(write(tmp_path, BASE + "version: 2\ninputs:\n  a: float32\n  b:\n    type: int64\n    shape: [-1, seq]\n"))
    assert mapping.config.version == "2"
    assert [(i.name, i.type, i.shape) for i in mapping.config.inputs] == [("a", "float32", None), ("b", "int64", (-1, "seq"))]
    listed = load_project(write(tmp_path, BASE + "inputs:\n  - name: a\n    type: FP32\n    required: true\npreprocessing:\n  tokenizer: bert\nmetadata: {owner: me}\n"))
    assert listed.config.inputs[0].type == "float32"
    assert listed.config.metadata == {"owner": "me"}


def test_pack_section_shapes(tmp_path):
    p = load_project(write(tmp_path, BASE + "pack:\n  providers: cpu,openvino\n  base_image: img:1\n  python: 3.12\n  labels: {team: vision, n: 3}\n"))
    assert p.config.pack.providers == ["cpu", "openvino"]
    assert p.config.pack.base_image == {"*": "img:1"}
    assert p.config.pack.python == "3.12"
    assert p.config.pack.labels == {"team": "vision", "n": "3"}


@pytest.mark.parametrize("text, value", [("2GB", 2 * 1024**3), ("512MB", 512 * 1024**2), ("1.5GiB", int(1.5 * 1024**3)), (1024, 1024)])
def test_memory_sizes(text, value):
    assert parse_memory(text) == value


def test_examples_load():
    for name in ("mlp", "text-classifier"):
        assert load_project(ROOT / "examples" / name).config.name


def test_committed_schema_is_current():
    """gpux.schema.json is what `gpux-pack schema` prints (regenerate it when the model changes)."""
    committed = json.loads((ROOT / "gpux.schema.json").read_text())
    assert committed == json_schema(), "regenerate: gpux-pack schema > gpux.schema.json"


def test_schema_covers_examples():
    import yaml

    schema = json_schema()
    for name in ("mlp", "text-classifier"):
        data = yaml.safe_load((ROOT / "examples" / name / "gpux.yml").read_text())
        assert set(data) <= set(schema["properties"])
