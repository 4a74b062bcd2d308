"""The image's entrypoint: `serve` (default), `warmup`, `info`, `predict`, `healthcheck`, `bench`."""

from __future__ import annotations

import gc
import os
import signal
import sys

# Python is PID 1 in the container, and the kernel drops SIGTERM for PID 1 unless it has a
# handler: without one, `docker stop` during start-up waits 10 s and kills. So the handler comes
# before every slow import (numpy, onnxruntime). What it does depends on how far start-up is.
_STATE: dict = {"doing": None, "server": None}


def _on_signal(signum: int, frame: object) -> None:
    """Before the model loads: exit 0, nothing was done. Loading or running a command: one line,
    exit 128+signal. Once uvicorn is handed the server, it drains and exits 0; this handler sees
    the signal only before uvicorn installs its own, or when uvicorn re-raises it after the
    drain, and then only asks the server to stop."""
    server = _STATE["server"]
    if server is not None:
        server.should_exit = True
        return
    code = 128 + signum if _STATE["doing"] else 0
    try:
        if code:
            print(f"gpux: stopped by {signal.Signals(signum).name} while {_STATE['doing']}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # a write the signal cut short (reentrant call, closed pipe): exiting matters more
        pass
    os._exit(code)  # the loading thread may sit in native code; SystemExit would wait for it


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    # Start-up allocates a few hundred thousand objects that live as long as the process (modules,
    # classes, functions): the cyclic collector would walk them again and again while numpy,
    # onnxruntime and uvicorn import (5 to 15 ms). Collection resumes once the model is loaded.
    gc.disable()
    # numpy's OpenBLAS starts a thread per CPU when it loads, and each spins for about 0.1 s: the
    # other CPU's whole share of start-up (70 to 100 ms of CPU here), which the server's own
    # threads need. The server does no BLAS work in numpy (ONNX Runtime has its own threads).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # ONNX Runtime's Linux wheels (1.2x and later) start a telemetry client as they load: a device
    # id and an offline event database under $HOME/.cache/Microsoft, a session file in /tmp, a
    # scan of /sys for GPUs, and events queued for upload to Microsoft. A served model does not
    # report on its host; ORT_DISABLE_TELEMETRY=0 turns it back on.
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import json  # noqa: E402
import logging  # noqa: E402
import threading  # noqa: E402

from .settings import Settings, StartupError  # noqa: E402  (standard library only)


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) in ([], ["serve"]):  # the image's CMD: no parser to import
        return _command("serve", None)
    import argparse

    parser = argparse.ArgumentParser(prog="gpux-runtime", description="Serve the model baked into this image.")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("serve", help="serve over HTTP (default)")
    sub.add_parser("warmup", help="run the model on generated inputs, filling the provider caches")
    sub.add_parser("info", help="print what /info would answer")
    predict = sub.add_parser("predict", help="one inference; prints the outputs as JSON")
    given = predict.add_mutually_exclusive_group(required=True)
    given.add_argument("--input", "-i", help="a /predict body (GPUX's JSON object): inline, @file, or - for stdin; "
                       "prints the outputs")
    given.add_argument("--request", metavar="FILE", help="a KServe v2 infer request (binary tensor extension "
                       "included), or - for stdin; prints what /predict answers for its inputs")
    _request_options(predict)
    health = sub.add_parser("healthcheck", help="exit 0 when the local server is ready (Docker HEALTHCHECK)")
    health.add_argument("--live", action="store_true",
                        help="exit 0 when it is alive, ready or not (a liveness probe: warmup may take minutes)")
    bench = sub.add_parser("bench", help="time session.run on generated inputs, or a request's; prints GPUX's "
                           "statistics (mean, std, min, max, median, p95, p99, throughput) as JSON")
    bench.add_argument("--request", metavar="FILE", help="time the inputs of this KServe v2 infer request "
                       "(- : stdin) instead of the warmup's generated ones")
    _request_options(bench)
    bench.add_argument("--runs", type=int, default=100, help="timed runs (1 to 100000)")
    bench.add_argument("--warmup", type=int, default=None, help="untimed runs first (0 to 10000; default: 10, "
                       "or --runs when fewer)")
    args = parser.parse_args(argv)
    command = args.command or "serve"
    if command == "healthcheck":
        return _healthcheck("/v2/health/live" if args.live else "/health")
    wrong = _wrong_options(command, args)
    if wrong:
        print(f"gpux: {wrong}", file=sys.stderr)
        return 2
    return _command(command, args)


def _request_options(parser) -> None:
    parser.add_argument("--header-length", type=int, metavar="N", help="with --request: its first N bytes are the "
                        "JSON header and the tensors' bytes follow (Inference-Header-Content-Length); without it "
                        "the whole request is JSON")


def _wrong_options(command: str, args) -> str | None:
    """Options that cannot work, said before the model loads."""
    if getattr(args, "header_length", None) is not None and args.request is None:
        return "--header-length: only with --request"
    if command == "bench":
        if not 1 <= args.runs <= 100000:
            return "--runs: expected 1 to 100000"
        if args.warmup is not None and not 0 <= args.warmup <= 10000:
            return "--warmup: expected 0 to 10000"
    return None


def _command(command: str, args) -> int:
    """args: the parsed arguments, None for `serve` (it takes none)."""
    try:
        settings = Settings.load()
        _logging(settings)
        for line in settings.unknown:
            logging.getLogger("gpux").warning(line)
        from . import once, warmup
        from .session import Model, last_line
        from .tensors import RequestError, decode_predict, encode_predict, to_json
    except StartupError as e:
        print(f"gpux: {e}", file=sys.stderr)
        return e.exit_code

    try:
        _STATE["doing"] = "loading the model"
        warm_up = command == "warmup" or (command == "serve" and settings.spec.warmup != "none")
        model = _interruptible(Model.load, settings, warm_up)
        gc.enable()
        if command == "serve":
            from .server import serve

            return serve(model, settings.spec.pack_version, handoff=_handoff)
        if command == "warmup":
            _STATE["doing"] = "warming up"
            state = _interruptible(warmup.run, model, True)
            folder = str(model.cache.folder) if model.cache and model.cache.folder else None
            print(json.dumps(to_json({"warmup": state, "execution_providers": model.active, "folder": folder})))
            return 0
        if command == "bench":
            if args.request is not None:
                _STATE["doing"] = "reading the request"
                feeds = once.bench_feeds(model, *once.read(args.request, args.header_length))
            else:
                feeds = warmup.generated_inputs(model)[0]  # the first shape warmup runs
            _STATE["doing"] = "benchmarking"
            runs = args.runs
            print(json.dumps(_interruptible(once.bench, model, feeds, runs, min(10, runs) if args.warmup is None
                                            else args.warmup)))
            return 0
        if command == "info":
            model.warmup_state = {"state": "not run (info command)"}
            print(json.dumps(to_json(model.info()), indent=2))
            return 0
        if args.request is not None:
            _STATE["doing"] = "reading the request"
            header, blobs = once.read(args.request, args.header_length)
            _STATE["doing"] = "running the model"
            print(encode_predict(_interruptible(once.answer, model, header, blobs)).decode())
            return 0
        _STATE["doing"] = "reading the input"
        body = _read_input(args.input)
        _STATE["doing"] = "running the model"
        parsed = model.steps.gpux_form(body) if model.steps else body
        feeds, _ = model.preprocess(decode_predict(parsed, model.inputs, model.overridable, outputs=model.outputs))
        outputs = _interruptible(once.run, model, feeds)
        print(encode_predict(outputs).decode())
        return 0
    except StartupError as e:
        print(f"gpux: {e}", file=sys.stderr)
        return e.exit_code
    except RequestError as e:
        print(f"gpux: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a command's failure is one line for the program that ran it; the server logs its own
        if command not in ("predict", "bench"):
            raise
        print(f"gpux: {type(e).__name__}: {last_line(e)}", file=sys.stderr)
        return 1
    finally:
        _STATE["doing"] = None


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record comes (a test may swap it)."""

    @property  # type: ignore[override]
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _logging(settings: Settings) -> None:
    """Text lines, or one JSON object per line (GPUX_LOG_FORMAT=json, access logs included);
    uvicorn's loggers go through the same handler."""
    handler = _Stderr()
    if settings.log_format == "json":
        from .metrics import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, settings.log_level.upper(), logging.INFO))
    access_on = settings.log_format == "json" or settings.log_level == "debug"
    logging.getLogger("gpux.access").setLevel(logging.INFO if access_on else logging.WARNING)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def _handoff(server: object) -> None:
    """From here on a signal stops the server (drain, exit 0), never the process."""
    _STATE["server"] = server


def _interruptible(fn, *args):
    """fn in a worker thread while this one waits: ONNX Runtime loads and runs a model with the
    GIL released, so the signal handler (main thread only) runs at once instead of after a
    minutes-long load."""
    result: dict = {}

    def work() -> None:
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # re-raised in the main thread, where it is reported
            result["error"] = e

    worker = threading.Thread(target=work, name="gpux-main", daemon=True)
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _read_input(raw: str):
    from .tensors import RequestError, parse_json

    try:
        if raw == "-":
            data = sys.stdin.buffer.read()
        elif raw.startswith("@"):
            with open(raw[1:], "rb") as f:
                data = f.read()
        else:
            data = os.fsencode(raw)
    except OSError as e:
        raise RequestError(f"--input: {e}") from None
    return parse_json(data, "--input: malformed JSON")


def _healthcheck(path: str) -> int:
    import urllib.request  # here, not at the top: serving never needs it (25 ms of imports)

    port = os.environ.get("GPUX_PORT")
    if not port:
        try:
            port = str(Settings.load().port)
        except StartupError:
            port = "8080"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=4) as r:
            return 0 if r.status == 200 else 1
    except Exception:
        return 1


if __name__ == "__main__":
    sys.exit(main())
