"""`gpux-pack base build|render`: a provider's runtime base image on its own (its wheels and the
runtime, no model); `build` then adds only the model on top of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpux_pack import engine, providers
from gpux_pack.errors import UsageError
from gpux_pack.image.context import Context, write
from gpux_pack.pipeline.build import make_runtime_base, prepare_runtime_base
from gpux_pack.plan import RuntimeBase
from gpux_pack.ui import Reporter


def prepare(provider: str, cuda: str, base_image: str | None, platform: str | None, nvidia_libs: str | None,
            link_check: bool, client: Any, ui: Reporter, refresh: bool) -> tuple[RuntimeBase, Context]:
    names = providers.parse_provider_list(provider)
    if len(names) != 1 or names[0] == "auto":
        raise UsageError("--provider: a runtime base image is for one provider: name one (not auto)")
    if cuda not in ("12", "13"):
        raise UsageError(f"--cuda {cuda!r}: expected 13 or 12")
    if nvidia_libs not in (None, "wheels", "base"):
        raise UsageError(f"--nvidia-libs {nvidia_libs!r}: expected wheels or base")
    return prepare_runtime_base(names[0], cuda, base_image, platform, nvidia_libs, link_check, client, ui,
                                pull=client is not None, refresh=refresh)


def build_runtime_base(provider: str, cuda: str, base_image: str | None, platform: str | None, nvidia_libs: str | None,
          link_check: bool, ui: Reporter, refresh: bool, no_cache: bool) -> dict[str, Any]:
    """The runtime base image built: `base build --json`'s document."""
    client = engine.connect()
    runtime_base, context = prepare(provider, cuda, base_image, platform, nvidia_libs, link_check, client, ui, refresh)
    built = make_runtime_base(client, runtime_base, context, ui, no_cache=no_cache)
    return {"tag": built.tag, "id": built.id, "size_bytes": built.size_bytes, "provider": runtime_base.provider.name,
            "seconds": round(built.seconds, 2)}


def line(built: dict[str, Any]) -> str:
    return (f"built {built['tag']}  {built['id'][7:19]}  {built['size_bytes'] / 1e6:.0f} MB  "
            f"{built['seconds']:.1f}s")


def render_runtime_base(provider: str, cuda: str, base_image: str | None, platform: str | None, nvidia_libs: str | None,
           link_check: bool, ui: Reporter, refresh: bool, output: Path) -> str:
    """Write the runtime base image's Dockerfile and context into output; the line to print."""
    runtime_base, context = prepare(provider, cuda, base_image, platform, nvidia_libs, link_check,
                                    engine.try_connect(), ui, refresh)
    write(context, output)
    return f"wrote {output}/Dockerfile; build it with: docker build -t {runtime_base.tag} {output}"
