"""The stages in order: config -> model -> plan -> wheels -> Dockerfile -> context -> image.
`build` and `render` share everything up to the context."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpux_pack import context as contexts
from gpux_pack import engine, providers, render, wheels
from gpux_pack.config import Project, load_project
from gpux_pack.model import ModelInfo, Signature, inspect_model, reconcile
from gpux_pack.plan import Options, Plan, assumed_base, base_image_for, make_plan, runtime_config
from gpux_pack.ui import Reporter


@dataclass(frozen=True)
class Loaded:
    project: Project
    model: ModelInfo
    signature: Signature


@dataclass(frozen=True)
class Prepared:
    plan: Plan
    wheelhouse: wheels.Wheelhouse
    dockerfile: str
    context: contexts.Context


def load(path: Path) -> Loaded:
    """Config and model, checked against each other. No Docker, no network."""
    project = load_project(path)
    model_path = project.model_path
    if not model_path.exists():
        raise project.error(("model", "source"), f"file not found: {model_path}")
    if model_path.is_dir():
        raise project.error(("model", "source"), f"is a folder, not an .onnx file: {model_path}")
    model = inspect_model(model_path, _shown(model_path))
    return Loaded(project, model, reconcile(project, model))


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def choose_providers(loaded: Loaded, cli: list[str], client: Any | None, ui: Reporter) -> providers.Decision:
    cfg = loaded.project.config
    pack = [p for p in cfg.pack.providers]
    needs_host = not [p for p in [*cli, *pack] if p != "auto"] and cfg.runtime.gpu.backend == "auto"
    host = engine.host_info(client) if (needs_host and client is not None) else None
    decision = providers.decide(cli, pack, cfg.runtime.gpu.backend, host)
    ui.info(f"provider: {', '.join(decision.providers)} ({decision.reason})")
    return decision


def prepare(
    loaded: Loaded,
    provider_name: str,
    reason: str,
    options: Options,
    client: Any | None,
    ui: Reporter,
    pull: bool,
    refresh: bool = False,
) -> Prepared:
    provider = providers.get(provider_name)
    image = base_image_for(loaded.project, provider, options)
    base = engine.probe_base(client, image, pull=pull, log=ui.info) if client is not None else None
    if base is None:
        base = assumed_base(loaded.project, provider, image, options.platform)
        ui.info(f"base image {image} not inspected: assuming Python {base.python}, glibc {base.glibc[0]}.{base.glibc[1]}")
    plan = make_plan(loaded.project, loaded.model, loaded.signature, provider, reason, base, options)
    ui.info(f"resolving wheels for {plan.target.describe()}")
    lock = wheels.resolve(plan.requirements, plan.target, refresh=refresh)
    wheelhouse = wheels.fetch(lock, log=ui.info)
    ort_version = lock.version_of(provider.ort_dist) or "unknown"
    dockerfile = render.dockerfile(plan, lock)
    spec = runtime_config(plan, providers.session_providers(provider, loaded.project.config), ort_version)
    ctx = contexts.assemble(plan, wheelhouse, dockerfile, spec)
    return Prepared(plan, wheelhouse, dockerfile, ctx)
