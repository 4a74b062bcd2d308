"""What the CLI prints: lines and rich tables on stdout, one line per error on stderr."""

from __future__ import annotations

import sys
from typing import Any

from gpux_pack.errors import BuildError, PackError
from gpux_pack.ui import printable


def lines(before: list[str], table: Any = None, after: list[str] = ()) -> None:
    """Print lines, a table, then lines."""
    for line in before:
        print(line)
    if table is not None:
        console().print(table)
    for line in after:
        print(line)


def console():
    """stdout; as wide as the terminal, or 160 columns in logs and pipes."""
    from rich.console import Console

    console = Console(soft_wrap=True)
    return console if console.is_terminal else Console(width=160)


def error(e: PackError, prefix: str = "") -> None:
    """One line; a failed build adds the end of the failing step's output. A user's value with
    a line break in it never splits the line."""
    text = str(e) if isinstance(e, BuildError) else " ".join(str(e).splitlines())
    print("\n".join(printable(line) for line in f"error: {prefix}{text}".split("\n")), file=sys.stderr)
    if isinstance(e, BuildError) and e.log_tail:
        print("last lines of its output:", file=sys.stderr)
        for line in e.log_tail:
            print(f"  | {printable(line)}", file=sys.stderr)


def failed(name: str, e: PackError) -> None:
    """One failure of several (a platform, a provider), named."""
    error(e, prefix=f"{name}: ")
