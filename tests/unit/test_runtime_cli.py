"""The image's entry point (`python -m gpux_runtime`): predict, info, exit codes, signals."""

from __future__ import annotations

import json



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
