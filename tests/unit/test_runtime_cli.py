"""The image's entry point (`python -m gpux_runtime`): predict, info, exit codes, signals."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort

from gpux_pack.runtime.tensors import float32_to_bf16, to_binary
from tests.in_process import ROOT, spec_dir, tiny_dir


def test_cli_predict_and_info(tmp_path, capsys, monkeypatch):
    from gpux_pack.runtime.__main__ import main

    folder = spec_dir(tmp_path, "mlp")
    monkeypatch.setenv("GPUX_CONFIG", str(folder / "gpux.json"))
    assert main(["predict", "--input", '{"features": [[1, 2, 3, 4]]}']) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"logits", "probs"}
    assert main(["predict", "--input", '{"features": [[1, 2]]}']) == 2
    assert "dimension 1 must be 4" in capsys.readouterr().err
    assert main(["info"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "iris-mlp"


def _request(folder: Path, **inputs: tuple[str, np.ndarray]) -> list[str]:
    """A v2 request, each input (datatype, values) as binary data and the outputs asked so (as
    `gpux-pack predict PATH` writes it): the CLI's arguments that name it."""
    items, blobs = [], []
    for name, (datatype, values) in inputs.items():
        blobs.append(to_binary(values, datatype))
        items.append({"name": name, "datatype": datatype, "shape": list(values.shape),
                      "parameters": {"binary_data_size": len(blobs[-1])}})
    head = json.dumps({"inputs": items, "parameters": {"binary_data_output": True}}).encode()
    (folder / "request.bin").write_bytes(head + b"".join(blobs))
    return ["--request", str(folder / "request.bin"), "--header-length", str(len(head))]


def test_cli_predict_request_answers_as_predict_does(tmp_path, capsys, monkeypatch):
    """A KServe v2 request (binary data, JSON data, or both) answered with what /predict answers:
    the outputs, gpux.yml's labels and each row's top one."""
    from gpux_pack.runtime.__main__ import main

    folder = spec_dir(tmp_path, "mlp")
    monkeypatch.setenv("GPUX_CONFIG", str(folder / "gpux.json"))
    x = np.random.default_rng(4).normal(size=(3, 4)).astype(np.float32)
    session = ort.InferenceSession(str(folder / "model" / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, probs = session.run(["logits", "probs"], {"features": x})
    assert main(["predict", *_request(folder, features=("FP32", x))]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert list(answer) == ["logits", "probs", "labels", "predicted"]
    np.testing.assert_allclose(answer["logits"], logits, atol=1e-5)
    np.testing.assert_allclose(answer["probs"], probs, atol=1e-6)
    assert answer["labels"] == ["setosa", "versicolor", "virginica"]
    assert [p["label"] for p in answer["predicted"]] == [answer["labels"][i] for i in probs.argmax(axis=1)]
    # JSON data, the whole file JSON (no --header-length): the same answer
    (folder / "plain.json").write_text(json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                                                "shape": [3, 4], "data": x.tolist()}]}))
    assert main(["predict", "--request", str(folder / "plain.json")]) == 0
    plain = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(plain["logits"], logits, atol=1e-5)
    assert plain["predicted"] == answer["predicted"]


def test_cli_predict_prints_bf16_outputs_as_their_values(tmp_path, capsys, monkeypatch):
    """BF16 in as bit patterns (binary data), out as the float32 values the bits hold: JSON carries those."""
    from gpux_pack.runtime.__main__ import main
    from tests.unit.test_bf16 import spec_folder

    folder = spec_folder(tmp_path)
    monkeypatch.setenv("GPUX_CONFIG", str(folder / "gpux.json"))
    x = [[1.5, -2.25, 3.0, 0.1], [0.0, 1.0, -7.5, 100.0]]
    assert main(["predict", *_request(folder, x=("BF16", float32_to_bf16(np.array(x, np.float32))))]) == 0
    answer = json.loads(capsys.readouterr().out)
    bf16 = np.array(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)  # what the model is given
    np.testing.assert_array_equal(np.array(answer["z"], np.float32), bf16 * 2 + 1)  # as float32 prints them
    np.testing.assert_array_equal(np.array(answer["y"], np.float32), (bf16 * 2 + 1).astype(ml_dtypes.bfloat16).astype(np.float32))


def test_cli_request_mistakes_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    from gpux_pack.runtime.__main__ import main

    folder = spec_dir(tmp_path, "mlp")
    monkeypatch.setenv("GPUX_CONFIG", str(folder / "gpux.json"))
    wide = _request(folder, features=("FP32", np.zeros((2, 5), np.float32)))
    (folder / "bad.json").write_text("{")
    cases = {
        ("predict", *wide): "gpux: input 'features': dimension 1 must be 4 [batch, 4], got shape [2, 5]",
        ("bench", *wide): "gpux: input 'features': dimension 1 must be 4 [batch, 4], got shape [2, 5]",
        ("predict", "--request", str(folder / "bad.json")): "gpux: malformed JSON: ",
        ("predict", "--request", str(folder / "none.bin")): f"gpux: --request {folder / 'none.bin'}: No such file",
        ("predict", *wide[:3], "99999"): "gpux: --header-length 99999: expected a byte count within the request's",
        ("predict", "-i", "{}", "--header-length", "3"): "gpux: --header-length: only with --request",
        ("bench", "--warmup", "-1"): "gpux: --warmup: expected 0 to 10000",
    }
    for args, start in cases.items():
        assert main(list(args)) == 2, args
        captured = capsys.readouterr()
        [line] = captured.err.splitlines()
        assert line.startswith(start) and captured.out == "", (args, line)


def test_cli_bench_times_a_request_or_the_warmup_inputs(tmp_path, capsys, monkeypatch):
    """GPUX's statistics, and the keys `gpux-pack bench` reads."""
    from gpux_pack.runtime.__main__ import main

    folder = spec_dir(tmp_path, "mlp")
    monkeypatch.setenv("GPUX_CONFIG", str(folder / "gpux.json"))
    x = np.ones((5, 4), np.float32)
    assert main(["bench", *_request(folder, features=("FP32", x)),
                 "--runs", "7", "--warmup", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    names = ("mean", "std", "min", "max", "median", "p95", "p99")
    assert result["min_time_ms"] <= result["median_time_ms"] <= result["p99_time_ms"] <= result["max_time_ms"]
    assert all(result[f"{n}_time_ms"] > 0 for n in names) and result["throughput_fps"] > 0
    assert (result["runs"], result["warmup"], result["provider"]) == (7, 2, "CPUExecutionProvider")
    assert result["inputs"] == result["shapes"] == {"features": [5, 4]}
    assert 0 < result["p50_ms"] <= result["p99_ms"] and result["providers"] == ["CPUExecutionProvider"]
    assert main(["bench", "--runs", "3"]) == 0  # the warmup's generated inputs, --runs warmup runs at most
    result = json.loads(capsys.readouterr().out)
    assert result["shapes"] == {"features": [1, 4]} and (result["runs"], result["warmup"]) == (3, 3)


def test_cli_predict_runs_items_one_by_one_as_the_server_does(tmp_path, capsys, monkeypatch):
    """Texts for a model that takes one per run: one run each, answered as one batch with labels;
    bench times one run, so it takes one item."""
    from gpux_pack.pipeline import local
    from gpux_pack.runtime.__main__ import main
    from gpux_pack.ui import Reporter
    from tests import text_project

    texts = ["I love this product!", "terrible", "fine"]
    answers = []
    for batch in (1, "batch"):
        staged = local.stage(text_project.make(tmp_path / f"p{batch}", batch=batch), "cpu", tmp_path / f"s{batch}",
                             Reporter(quiet=True))
        monkeypatch.setenv("GPUX_CONFIG", str(staged.folder / "gpux.json"))
        monkeypatch.setenv("GPUX_CACHE_DIR", str(staged.folder / "cache"))
        args = _request(staged.folder, text=("BYTES", np.array(texts, dtype=object)))
        assert main(["predict", *args]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    one, batched = answers
    assert np.array(one["logits"]).shape == (3, 2) and len(one["predicted"]) == 3
    np.testing.assert_allclose(one["logits"], batched["logits"], atol=1e-5)
    assert one["predicted"] == batched["predicted"] and one["labels"] == batched["labels"]
    monkeypatch.setenv("GPUX_CONFIG", str(tmp_path / "s1" / "gpux.json"))
    assert main(["bench", *args[:1], str(tmp_path / "s1" / "request.bin"), *args[2:]]) == 2
    assert "3 items for a model that takes one per run" in capsys.readouterr().err


def test_cli_exit_codes(tmp_path, capsys, monkeypatch):
    """A bad variable: exit 2 and one stderr line; any other start-up failure stays exit 1."""
    from gpux_pack.runtime.__main__ import main

    folder = tiny_dir(tmp_path)
    monkeypatch.setenv("GPUX_CONFIG", str(folder / "gpux.json"))
    monkeypatch.setenv("GPUX_TIMEOUT", "abc")
    assert main(["info"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gpux: GPUX_TIMEOUT=abc: expected a number of seconds, more than 0 and at most 86400"]
    monkeypatch.delenv("GPUX_TIMEOUT")
    (folder / "model" / "tiny.onnx").unlink()
    assert main(["info"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("gpux: cannot start CPUExecutionProvider")


def test_signal_handler_by_stage(monkeypatch, capsys):
    """Before the load: exit 0. Loading: one line, 128+signal. Serving: the server stops itself."""
    import signal

    from gpux_pack.runtime import __main__ as entry

    exits: list[int] = []
    monkeypatch.setattr(entry.os, "_exit", exits.append)
    monkeypatch.setattr(entry, "_STATE", {"doing": None, "server": None})
    entry._on_signal(signal.SIGTERM, None)
    assert exits == [0] and capsys.readouterr().err == ""
    entry._STATE["doing"] = "loading the model"
    entry._on_signal(signal.SIGTERM, None)
    entry._on_signal(signal.SIGINT, None)
    assert exits == [0, 143, 130]
    assert capsys.readouterr().err.splitlines() == [
        "gpux: stopped by SIGTERM while loading the model", "gpux: stopped by SIGINT while loading the model"]

    class Server:
        should_exit = False

    entry._STATE["server"] = server = Server()
    entry._on_signal(signal.SIGTERM, None)  # before uvicorn's handler, or re-raised after its drain
    assert server.should_exit and exits == [0, 143, 130]


def test_sigterm_mid_load_exits_143_at_once(tmp_path):
    """The real process, its model a FIFO: ONNX Runtime blocks reading it, as on a slow disk."""
    import os
    import signal
    import subprocess
    import sys
    import time

    folder = tiny_dir(tmp_path)
    fifo = folder / "model" / "slow.onnx"
    os.mkfifo(fifo)
    spec = json.loads((folder / "gpux.json").read_text())
    spec["model"]["path"] = "model/slow.onnx"
    (folder / "gpux.json").write_text(json.dumps(spec))
    env = {**os.environ, "GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "gpux_pack.runtime", "info"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    writer = None
    try:
        deadline = time.monotonic() + 60
        while writer is None:  # opening the FIFO's other end succeeds once ONNX Runtime reads it
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the model load never started"
                time.sleep(0.01)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        assert time.monotonic() - started < 2
        assert proc.returncode == 143
        assert err.decode().splitlines() == ["gpux: stopped by SIGTERM while loading the model"]
    finally:
        proc.kill()
        proc.wait()
        if writer is not None:
            os.close(writer)
