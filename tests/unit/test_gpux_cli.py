"""GPUX's command-line habits without Docker: `predict PATH --benchmark` (GPUX's `run --benchmark`),
inline JSON and @file inputs (`run -i`), `-f FILE`, and `inspect` of a project or a model file."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import EXAMPLES, ROOT, run_cli

MLP = EXAMPLES / "mlp"


def test_benchmark_prints_every_statistic_and_its_json_matches_the_table(tmp_path):
    proc = run_cli("predict", str(MLP), "--benchmark", "--runs", "30", "--warmup", "2", "--json", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    names = ("mean", "std", "min", "max", "median", "p95", "p99")
    assert all(result[f"{n}_time_ms"] >= 0 for n in names) and result["throughput_fps"] > 0
    assert result["min_time_ms"] <= result["median_time_ms"] <= result["p95_time_ms"] <= result["p99_time_ms"] <= \
           result["max_time_ms"] and result["runs"] == 30 and result["warmup"] == 2
    assert result["provider"] == "CPUExecutionProvider" and result["inputs"] == {"features": [1, 4]}
    table = run_cli("predict", str(MLP), "--benchmark", "--runs", "30", cwd=ROOT)
    assert table.returncode == 0, table.stderr
    rows = dict(re.findall(r"^  (\w+)\s+([\d.]+) (?:ms|runs/s)$", table.stdout, re.M))
    assert set(rows) == {*names, "throughput"}, table.stdout  # every statistic the JSON carries, by name


@pytest.mark.parametrize("form", ["inline", "name=inline", "@file", "-f"])
def test_inputs_as_gpux_run_takes_them(tmp_path, form):
    body = {"features": [[5.1, 3.5, 1.4, 0.2]]}
    (tmp_path / "in.json").write_text(json.dumps(body))
    args = {"inline": ["-i", json.dumps(body)], "name=inline": ["-i", "features=[[5.1, 3.5, 1.4, 0.2]]"],
            "@file": ["-i", f"@{tmp_path / 'in.json'}"], "-f": ["-f", str(tmp_path / "in.json")]}[form]
    proc = run_cli("predict", str(MLP), *args, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert set(answer) == {"logits", "probs", "labels", "predicted"} and abs(sum(answer["probs"][0]) - 1) < 1e-5


def test_inputs_that_are_neither_files_nor_json_are_one_line(tmp_path):
    proc = run_cli("predict", str(MLP), "-i", "features=oops", cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "inline JSON such as" in proc.stderr, proc.stderr


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.iterdir() if (p / "model.onnx").is_file()))
def test_inspect_reads_a_model_file_and_a_project_without_docker(example):
    env = {"DOCKER_HOST": "unix:///nonexistent.sock"}
    model = run_cli("inspect", str(EXAMPLES / example / "model.onnx"), "--json", env=env, cwd=ROOT)
    assert model.returncode == 0, model.stderr
    info = json.loads(model.stdout)
    assert info["model"]["size_bytes"] == (EXAMPLES / example / "model.onnx").stat().st_size
    assert info["inputs"] and info["outputs"] and info["model"]["opsets"]
    project = run_cli("inspect", str(EXAMPLES / example), env=env, cwd=ROOT)
    assert project.returncode == 0, project.stderr
    assert project.stdout.splitlines()[2] == "inputs:" and all(i["name"] in project.stdout for i in info["inputs"])
