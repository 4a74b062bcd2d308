"""`gpux-pack base build|render|ls|prune`: a provider's runtime base image on its own (its wheels
and the runtime, no model); `build` then adds only the model on top of it. Each lock, provider
and gpux-pack version has a runtime base of its own, so older ones stay behind: `ls` lists them
with when a build last used each, `prune` removes the unused."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpux_pack import engine, providers
from gpux_pack.engine.interface import Engine, EngineError, EngineGone
from gpux_pack.errors import DockerError, UsageError
from gpux_pack.image.context import Context, write
from gpux_pack.pipeline.build import make_runtime_base, prepare_runtime_base
from gpux_pack.plan import RUNTIME_BASES, RuntimeBase
from gpux_pack.ui import Reporter


def prepare(provider: str, cuda: str, base_image: str | None, platform: str | None, nvidia_libs: str | None,
            link_check: bool, client: Engine | None, ui: Reporter, refresh: bool) -> tuple[RuntimeBase, Context]:
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


def runtime_bases(client: Engine) -> list[dict[str, Any]]:
    """One row per runtime base image on this engine, most recently used first: its tags, id,
    size, when a build last used it (made it or built on it) and how many containers use it."""
    used_by: dict[str, int] = {}
    for container in client.api.containers(all=True):
        used_by[container.get("ImageID", "")] = used_by.get(container.get("ImageID", ""), 0) + 1
    rows = []
    for image in client.images.list(filters={"reference": f"{RUNTIME_BASES}*"}):
        tags = sorted(t for t in image.tags if t.startswith(RUNTIME_BASES))
        if tags:
            rows.append({"tags": tags, "id": image.id, "size_bytes": image.attrs.get("Size", 0),
                         "last_used": engine.last_tagged(image.attrs), "containers": used_by.get(image.id, 0)})
    return sorted(rows, key=lambda r: -r["last_used"])


def prune(client: Engine, older_than: float) -> list[dict[str, Any]]:
    """Remove the runtime base images no build used for older_than seconds and no container
    uses; their tags only (an image another name keeps stays). The rows removed."""
    cutoff = time.time() - older_than
    removed = []
    for row in runtime_bases(client):
        if row["last_used"] > cutoff or row["containers"]:
            continue
        try:
            for tag in row["tags"]:
                client.images.remove(tag)
        except EngineGone as e:
            raise DockerError(f"cannot remove {row['tags'][0]}: {engine.short_error(e)}") from None
        except EngineError:
            continue  # in use meanwhile (a container started, a build began on it): kept
        removed.append(row)
    return removed


def listing(rows: list[dict[str, Any]]) -> list[str]:
    """`base ls` without --json."""
    if not rows:
        return [f"no runtime base images ({RUNTIME_BASES}*) on this engine"]
    now, out = time.time(), []
    for r in rows:
        used = _ago(now - r["last_used"]) if r["last_used"] else "at an unknown time"
        held = f"  ({r['containers']} containers)" if r["containers"] else ""
        out.append(f"{', '.join(r['tags'])}  {r['id'][7:19]}  {r['size_bytes'] / 1e6:.0f} MB  used {used}{held}")
    return out


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return "just now"
