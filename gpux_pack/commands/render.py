"""`gpux-pack render`: the Dockerfile and the whole build context in a folder; `docker build DIR`
(or BuildKit, podman, buildah) gives the image `build` makes."""

from __future__ import annotations

from pathlib import Path

from gpux_pack import engine
from gpux_pack.errors import UsageError
from gpux_pack.image.context import write
from gpux_pack.pipeline import build
from gpux_pack.plan import Options
from gpux_pack.ui import Reporter


def render(path: Path, output: Path, provider: str | None, tag: str | None, options: Options, ui: Reporter,
           refresh: bool, contained: bool, strict: bool) -> str:
    """Write it; the line to print."""
    loaded, decision, client = build.open_project(path, provider, tag, engine.try_connect, ui, contained, strict)
    if len(decision.providers) > 1:
        raise UsageError(f"--provider: render writes one context; give one provider ({decision.reason})")
    prepared = build.prepare(loaded, decision.providers[0], decision.reason, options, client, ui, pull=False,
                             refresh=refresh, self_contained=True)
    write(prepared.context, output)
    return (f"wrote {output}/Dockerfile and its context ({prepared.context.size_bytes / 1e6:.0f} MB); "
            f"build it with: docker build -t {prepared.plan.tag} {output}")
