"""`gpux-pack` and `python -m gpux_pack`: `--version` answers before the CLI's libraries load."""

import sys


def run() -> None:
    if sys.argv[1:] == ["--version"]:
        from gpux_pack import __version__

        print(f"gpux-pack {__version__}")
        return
    from gpux_pack.cli import main

    main()


if __name__ == "__main__":
    run()
