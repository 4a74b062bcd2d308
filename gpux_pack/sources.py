"""What gpux-pack ships into every image besides packages: the runtime's sources and the
Dockerfile templates. The plan hashes them into the runtime base image's tag; the Dockerfile
and the context read them from here."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"  # becomes gpux_runtime in the image


def templates_dir() -> Path:
    """Inside the wheel: gpux_pack/templates. In a source checkout: <repo>/templates."""
    packaged = Path(str(resources.files("gpux_pack"))) / "templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "templates"


def runtime_files() -> list[Path]:
    return sorted(RUNTIME_DIR.glob("*.py"))


def shipped() -> list[tuple[str, bytes]]:
    """(name, bytes) of the runtime's sources, then of the templates, in a fixed order."""
    return [(src.name, src.read_bytes()) for src in [*runtime_files(), *sorted(templates_dir().glob("*.j2"))]]
