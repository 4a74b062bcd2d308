"""`gpux-pack providers`: the execution providers, their packages and base images, and what this
Docker host can run."""

from __future__ import annotations

from typing import Any

from gpux_pack import engine, providers
from gpux_pack.ui import escape


def rows() -> tuple[Any, list[dict[str, Any]]]:
    """(the Docker host's facts or None, one row per provider)."""
    client = engine.try_connect()
    host = engine.host_info(client) if client is not None else None
    out = []
    for p in providers.PROVIDERS.values():
        ok, why = (None, "Docker engine not reachable") if host is None else host.can_run(p)
        out.append({
            "name": p.name, "title": p.title, "base_image": p.base_image,
            "package": p.pip_requirement + (f" + {p.extra_requirements[0]}" if p.plugin else ""),  # the plugin EP's
            "vendor_base_image": p.bases["vendor"].image if "vendor" in p.bases else None,
            "python": p.bases["default"].python, "execution_providers": list(p.execution_providers),
            "platforms": list(p.platforms), "docker_run": p.run_flags,
            "cuda12": providers.get(p.name, cuda="12").pip_requirement if p.name in providers.CUDA12 else None,
            "host_can_run": ok, "why": why,
        })
    return host, out


def table(host: Any, rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    out = Table(title=f"Docker host: {host.details if host else 'not reachable'}")
    for col in ("provider", "ONNX Runtime package", "default base image", "runs here", "why"):
        out.add_column(col)
    for r in rows:
        runs = "?" if r["host_can_run"] is None else ("yes" if r["host_can_run"] else "no")
        out.add_row(*(escape(str(c)) for c in (r["name"], r["package"], r["base_image"], runs, r["why"])))
    return out
