"""`gpux-pack` and `python -m gpux_pack`: `--version` answers, and a model-only rebuild runs
(pipeline/rebuild.py), before the CLI's libraries load."""

import os
import sys


def run() -> None:
    # ONNX Runtime loads in this process for `serve`'s provider check and `predict PATH`: no
    # telemetry from it either (see gpux_pack/runtime/__main__.py)
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    if sys.argv[1:] == ["--version"]:
        from gpux_pack import __version__

        print(f"gpux-pack {__version__}")
        return
    if sys.argv[1:2] == ["build"]:  # only the model's weights changed since the same build: replay it
        from gpux_pack.pipeline import rebuild

        if rebuild.replay(sys.argv[1:], quiet=bool({"-q", "--quiet"} & set(sys.argv))):
            return
    from gpux_pack.cli import main

    main()


if __name__ == "__main__":
    run()
