"""User-facing errors. Raised anywhere, caught once in the CLI, printed as one line."""

from __future__ import annotations


class PackError(Exception):
    """A failure the user can act on; `str(err)` is the whole message."""

    exit_code = 1


class UsageError(PackError):
    """Bad command line, config or model: exit 2."""

    exit_code = 2


class ConfigError(UsageError):
    def __init__(self, file: object, field: str | None, problem: str, line: int | None = None):
        where = f"{file}:{line}" if line else f"{file}"
        self.file, self.field, self.problem, self.line = file, field, problem, line
        super().__init__(f"{where}: {field}: {problem}" if field else f"{where}: {problem}")


class ModelError(UsageError):
    def __init__(self, file: object, problem: str):
        self.file, self.problem = file, problem
        super().__init__(f"{file}: {problem}")


class DockerError(PackError):
    """The engine is unreachable or refused an operation: exit 1."""


class BuildError(PackError):
    """`docker build` failed; carries the failing step and the tail of its log."""

    def __init__(self, message: str, step: str | None = None, log_tail: list[str] | None = None):
        self.step, self.log_tail = step, log_tail or []
        super().__init__(message)


class WheelError(PackError):
    """Resolving or downloading the image's wheels failed (network, index, no wheel for the platform)."""
