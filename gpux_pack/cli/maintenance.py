"""`gpux-pack cache` and `gpux-pack base`: the host's caches and the runtime base images."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from gpux_pack import providers
from gpux_pack.cli.flags import BaseOpt, JsonOpt, OlderThanOpt, PlatformOpt, QuietOpt, RefreshOpt, age, options
from gpux_pack.ui import Reporter

cache_app = typer.Typer(help="The wheel, lock, install and base-image caches (~/.cache/gpux-pack).",
                        no_args_is_help=True)


@cache_app.command("ls")
def cache_ls(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """What each cache holds: entries, bytes, the oldest and newest use, and what killed builds left."""
    from gpux_pack.commands import cache

    rows = [e.summary() for e in cache.kinds()]
    if json_out:
        print(json.dumps({"root": str(cache.root()), "caches": rows}, indent=2))
    else:
        print("\n".join(cache.lines(rows)))


@cache_app.command("prune")
def cache_prune(
    older_than: str = OlderThanOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Remove cache entries not used for --older-than (by their last modification), and whatever
    killed builds left, at any age."""
    from gpux_pack.commands import cache

    seconds = age(older_than)
    removed = cache.prune(seconds)
    total = sum(b for _, b in removed)
    if json_out:
        print(json.dumps({"removed": [{"path": str(p), "bytes": b} for p, b in removed], "bytes": total}, indent=2))
        return
    print(f"removed {len(removed)} entries, {total / 1e6:.1f} MB")


base_app = typer.Typer(help="Runtime base images: a provider's wheels and runtime, without a model.",
                       no_args_is_help=True, rich_markup_mode=None)
BaseProviderOpt = typer.Option(..., "--provider", "-p", help=f"{', '.join(providers.PROVIDERS)}.")
CudaOpt = typer.Option("13", "--cuda", help="CUDA major version for cuda/tensorrt: 13 or 12.")
NvidiaLibsOpt = typer.Option(None, "--nvidia-libs", help="wheels | base: where CUDA/cuDNN come from.")
LinkCheckOpt = typer.Option(True, "--link-check/--no-link-check", help="Check the provider's libraries at build time.")


@base_app.command("build")
def base_build(
    provider: str = BaseProviderOpt,
    base_image: Optional[str] = BaseOpt,
    platform: Optional[str] = PlatformOpt,
    cuda: str = CudaOpt,
    nvidia_libs: Optional[str] = NvidiaLibsOpt,
    link_check: bool = LinkCheckOpt,
    no_cache: bool = typer.Option(False, "--no-cache"),
    quiet: bool = QuietOpt,
    json_out: bool = JsonOpt,
    refresh: bool = RefreshOpt,
) -> None:
    """Build a provider's runtime base image; `build` then adds only the model on top of it."""
    from gpux_pack.commands import base

    options(None, base_image, platform, None)
    built = base.build_runtime_base(provider, cuda, base_image, platform, nvidia_libs, link_check,
                                    Reporter(quiet=quiet), refresh, no_cache)
    print(json.dumps(built, indent=2) if json_out else base.line(built))


@base_app.command("render")
def base_render(
    provider: str = BaseProviderOpt,
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write the Dockerfile and context to."),
    base_image: Optional[str] = BaseOpt,
    platform: Optional[str] = PlatformOpt,
    cuda: str = CudaOpt,
    nvidia_libs: Optional[str] = NvidiaLibsOpt,
    link_check: bool = LinkCheckOpt,
    quiet: bool = QuietOpt,
    refresh: bool = RefreshOpt,
) -> None:
    """Write a runtime base image's Dockerfile and context."""
    from gpux_pack.commands import base

    options(None, base_image, platform, None)
    print(base.render_runtime_base(provider, cuda, base_image, platform, nvidia_libs, link_check,
                                   Reporter(quiet=quiet), refresh, output))


@base_app.command("ls")
def base_ls(json_out: bool = JsonOpt) -> None:
    """The runtime base images on this engine: tags, size, when a build last used each."""
    from gpux_pack import engine
    from gpux_pack.commands import base

    rows = base.runtime_bases(engine.connect())
    print(json.dumps({"runtime_bases": rows}, indent=2) if json_out else "\n".join(base.listing(rows)))


@base_app.command("prune")
def base_prune(
    older_than: str = typer.Option("30d", "--older-than", help="Remove runtime bases no build used for this long: "
                                   "30d, 12h, 0s (all)."),
    json_out: bool = JsonOpt,
) -> None:
    """Remove the runtime base images no build used for --older-than and no container uses (a
    later build makes its own again when it needs it)."""
    from gpux_pack import engine
    from gpux_pack.commands import base

    seconds = age(older_than)
    removed = base.prune(engine.connect(), seconds)
    total = sum(r["size_bytes"] for r in removed)
    if json_out:
        print(json.dumps({"removed": removed, "bytes": total}, indent=2))
        return
    print(f"removed {len(removed)} runtime base images, {total / 1e6:.1f} MB")
