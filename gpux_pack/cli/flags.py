"""The flags several commands share, declared once, and the checks of their values."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from gpux_pack import engine, providers
from gpux_pack.errors import UsageError

PathArg = typer.Argument(Path("."), help="Folder holding gpux.yml, or the gpux.yml itself.")
ProviderOpt = typer.Option(None, "--provider", "-p", help=providers.names_help())
BaseOpt = typer.Option(None, "--base-image", help="Replace the provider's default base image.")
PlatformOpt = typer.Option(None, "--platform", help="The image's platform, e.g. linux/amd64.")
WarmupOpt = typer.Option(None, "--warmup", help="auto | always | never.")
RefreshOpt = typer.Option(False, "--refresh", help="Re-resolve the image's wheels instead of reusing the cached lock.")
ContainedOpt = typer.Option(False, "--contained", help="Read nothing outside the project folder (for projects "
                            "you do not trust): gpux.yml and the model must resolve inside it.")
OptimizeOpt = typer.Option(None, "--optimize", help="Replace gpux.yml's pack.optimize steps: graph, int8, fp16, "
                           "comma-separated, or none.")
PullOpt = typer.Option("missing", "--pull", help="Pull the image first: missing (when this engine lacks it), "
                       "always, or never, as docker run --pull.")


def pull(policy: str) -> str:
    if policy not in engine.PULL_POLICIES:
        raise typer.BadParameter(f"{policy!r}: expected missing, always or never", param_hint="--pull")
    return policy


OlderThanOpt = typer.Option("30d", "--older-than", help="Remove entries unused for this long: 30d, 12h, 0s (all).")


def age(text: str) -> float:
    """30d, 12h, 45m, 10s, or a number of days."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([dhms]?)\s*", text)
    if not m:
        raise UsageError(f"--older-than {text!r}: expected an age such as 30d, 12h, 45m or 0s")
    return float(m.group(1)) * {"d": 86400, "h": 3600, "m": 60, "s": 1, "": 86400}[m.group(2)]


JsonOpt = typer.Option(False, "--json", help="One JSON document on stdout; logs on stderr.")
QuietOpt = typer.Option(False, "--quiet", "-q", help="Print only the result and errors.")
StrictOpt = typer.Option(False, "--strict", help="Refuse gpux.yml keys and values gpux-pack cannot act on "
                         "(otherwise a warning each).")


def options(tag, base_image, platform, warmup):
    """The plan's checked options (a bad flag is a UsageError, exit 2)."""
    from gpux_pack.plan import options  # the commands that plan pay for pydantic, not --help or run

    return options(tag, base_image, platform, warmup)


def optimize_steps(text: str | None) -> tuple[str, ...] | None:
    """--optimize graph,int8 (in gpux.yml's order of steps), none: (); absent: gpux.yml's."""
    if text is None:
        return None
    from gpux_pack.project.config import OPTIMIZE_MODES  # the commands that plan pay for pydantic, not --help

    steps = [s.strip() for s in text.split(",") if s.strip()]
    if steps == ["none"]:
        return ()
    for step in steps:
        if step not in OPTIMIZE_MODES:
            raise UsageError(f"--optimize {text!r}: {step!r} is not a step; use graph, int8, fp16 or none")
    if "int8" in steps and "fp16" in steps:
        raise UsageError(f"--optimize {text!r}: int8 and fp16 exclude each other")
    return tuple(s for s in OPTIMIZE_MODES if s in steps)
