"""What the user sees: progress on a terminal, plain lines elsewhere, nothing with --quiet.
Logs go to stderr; stdout is for the result (a summary, or JSON with --json)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class Reporter:
    def __init__(self, quiet: bool = False, plain: bool | None = None):
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        self.quiet = quiet
        self.plain = (not self.err.is_terminal) if plain is None else plain
        self._progress: Progress | None = None
        self._task: Any = None

    def info(self, message: str) -> None:
        if self.quiet:
            return
        if self._progress is not None:
            self._progress.console.print(message, markup=False, highlight=False)
        else:
            self.err.print(message, markup=False, highlight=False)

    def warn(self, message: str) -> None:
        self.err.print(f"warning: {message}", markup=False, style="yellow" if not self.plain else None)

    # -- a build's steps ---------------------------------------------------------------------

    def start(self, title: str) -> None:
        if self.quiet:
            return
        if self.plain:
            print(title, file=sys.stderr, flush=True)
            return
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
