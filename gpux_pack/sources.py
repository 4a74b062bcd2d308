"""What gpux-pack ships into every image besides packages: the runtime's sources, the link
check script and the Dockerfile templates. The plan hashes them into the runtime base image's
tag; the Dockerfile and the context read them from here."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"  # becomes gpux_runtime in the image
# The packager's link check, shipped beside gpux_runtime (not in it): a runtime base image whose
# libraries come from an apt step runs it as a script in its build (image/layout.LINKCHECK).
LINKCHECK_SCRIPT = Path(__file__).resolve().parent / "linkcheck.py"


def templates_dir() -> Path:
    """Inside the wheel: gpux_pack/templates. In a source checkout: <repo>/templates."""
    packaged = Path(str(resources.files("gpux_pack"))) / "templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "templates"


def runtime_files() -> list[Path]:
    return sorted(RUNTIME_DIR.glob("*.py"))


def shipped() -> list[tuple[str, bytes]]:
    """(name, bytes) of the runtime's sources, the link check script, then the templates, in a
    fixed order."""
    files = [*runtime_files(), LINKCHECK_SCRIPT, *sorted(templates_dir().glob("*.j2"))]
    return [(src.name, src.read_bytes()) for src in files]
