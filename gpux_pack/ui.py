"""What the user sees: progress on a terminal, plain lines elsewhere, nothing with --quiet.
Logs go to stderr; stdout is for the result (a summary, or JSON with --json)."""

from __future__ import annotations

import os
import sys
from typing import Any


class Reporter:
    """Plain lines unless stderr is a terminal: rich (tens of milliseconds to import) is loaded
    only for a terminal's progress bar and colours."""

    def __init__(self, quiet: bool = False, plain: bool | None = None):
        self.quiet = quiet
        self.plain = (not _terminal()) if plain is None else plain
        self._console: Any = None
        self._progress: Any = None
        self._task: Any = None

    @property
    def err(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False, soft_wrap=True)
        return self._console

    def info(self, message: str) -> None:
        if self.quiet:
            return
        if self._progress is not None:
            self._progress.console.print(message, markup=False, highlight=False)
        elif self.plain:
            print(message, file=sys.stderr, flush=True)
        else:
            self.err.print(message, markup=False, highlight=False)

    def warn(self, message: str) -> None:
        if self.plain:
            print(f"warning: {message}", file=sys.stderr, flush=True)
        else:
            self.err.print(f"warning: {message}", markup=False, style="yellow")

    # -- a build's steps ---------------------------------------------------------------------

    def start(self, title: str) -> None:
        if self.quiet:
            return
        if self.plain:
            print(title, file=sys.stderr, flush=True)
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn)

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.err,
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(title, total=None)

    def step(self, number: int, total: int, text: str) -> None:
        if self.quiet:
            return
        line = f"step {number}/{total}: {' '.join(text.split())}"
        if self._progress is not None:
            short = line if len(line) <= 56 else line[:55] + "…"
            self._progress.update(self._task, description=short, completed=number - 1, total=total)
        else:
            print(line, file=sys.stderr, flush=True)

    def output(self, text: str) -> None:
        """A line of build output: shown only in plain mode (logs), kept for errors anyway."""
        if not self.quiet and self.plain:
            print(f"  {text}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _terminal() -> bool:
    """What rich would decide, without importing it: a tty, or FORCE_COLOR/TTY_COMPATIBLE set."""
    if os.environ.get("TTY_COMPATIBLE") == "0":
        return False
    if os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE") == "1":
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def built_line(tag: str, image_id: str, size_bytes: int, provider: str, seconds: float, how: str) -> str:
    """The one line a build of one image ends with (a model-only rebuild prints it too)."""
    return f"built {tag}  {image_id[7:19]}  {size_bytes / 1e6:.0f} MB  {provider}  {seconds:.1f}s ({how})"


def escape(text: str) -> str:
    """A value shown in a rich table: its markup characters taken literally."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def printable(line: str) -> str:
    """Control characters (a NUL in a user's value, a terminal escape) shown escaped."""
    return line if line.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in line)
