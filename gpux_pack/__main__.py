"""`gpux-pack` and `python -m gpux_pack`: `--version` answers before the CLI's libraries load."""

import os
import sys


def run() -> None:
    # ONNX Runtime loads in this process for `serve`'s provider check and `predict PATH`: no
    # telemetry from it either (see gpux_pack/runtime/__main__.py)
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    # pydantic looks for plugins in every installed distribution's entry points at its first
    # model (4 ms with 150 packages): gpux-pack's models want none
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    if sys.argv[1:] == ["--version"]:
        from gpux_pack import __version__

        print(f"gpux-pack {__version__}")
        return
    try:
        from gpux_pack.cli import main

        main()
    except SystemExit as e:
        _exit(e.code)
    _exit(0)


def _exit(code: object) -> None:
    """End the process without tearing down every module the command imported: the interpreter's
    shutdown of ONNX's, NumPy's, pydantic's and the Docker SDK's objects took 70 ms of a 0.75 s
    build. What shutdown must still do is done first: the exit handlers (temporary folders'
    finalizers, logging's flush) and the standard streams' buffers. Only with no other thread
    running (a thread the command left is joined by the normal exit) and no profiler or tracer
    (they write what they found at the normal exit)."""
    import threading

    status = code if isinstance(code, int) else (0 if code is None else 1)
    if threading.active_count() != 1 or sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)  # a profiler or a coverage tracer writes its report at the normal exit
    if not isinstance(code, int) and code is not None:
        print(code, file=sys.stderr)  # what sys.exit("message") prints
    import atexit

    atexit._run_exitfuncs()  # the interpreter's own exit runs these; os._exit would skip them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): nothing more can be said on it
            status = status or 1
    os._exit(status)


if __name__ == "__main__":
    run()
