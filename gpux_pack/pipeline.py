"""The stages in order: config -> model -> plan -> wheels -> Dockerfile -> context -> image.
`build` and `render` share everything up to the context."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpux_pack import context as contexts
from gpux_pack import engine, providers, render, wheels
from gpux_pack.project import Project, load_project
from gpux_pack.model import ModelInfo, Signature, inspect_model, reconcile
from gpux_pack.plan import Options, Plan, assumed_base, check_model_for, choose_base, make_plan, runtime_config
from gpux_pack.providers import BaseImage
from gpux_pack.ui import Reporter


@dataclass(frozen=True)
class Loaded:
    project: Project
    model: ModelInfo
    signature: Signature


@dataclass(frozen=True)
class Prepared:
    plan: Plan
    wheelhouse: wheels.Wheelhouse | None  # None: built on a runtime base image
    lock: wheels.Lock
    dockerfile: str
    context: contexts.Context


def load(path: Path) -> Loaded:
    """Config and model, checked against each other. No Docker, no network."""
    project = load_project(path)
    model_path = project.model_path
    try:
        os.stat(model_path)
    except FileNotFoundError:
        raise project.error(("model", "source"), f"file not found: {model_path}") from None
    except OSError as e:  # a symlink loop, a name too long
        raise project.error(("model", "source"), f"cannot read: {e.strerror or e}") from None
    if model_path.is_dir():
        raise project.error(("model", "source"), f"is a folder, not an .onnx file: {model_path}")
    if not model_path.is_file():
        raise project.error(("model", "source"), f"is not a regular file (a FIFO or device?): {model_path}")
    model = inspect_model(model_path, _shown(model_path))
    return Loaded(project, model, reconcile(project, model))


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def check_model(loaded: Loaded, cli: list[str]) -> None:
    """Before Docker: when the providers are known without asking the host, the model must
    load in each one's onnxruntime (opsets, operators). `auto` is checked once decided."""
    cfg = loaded.project.config
    decision = providers.decide(cli, list(cfg.pack.providers), cfg.runtime.gpu.backend, None)
    if not decision.from_host:
        for name in decision.providers:
            check_model_for(loaded.model, providers.get(name, cuda=cfg.pack.cuda))


def choose_providers(loaded: Loaded, cli: list[str], client: Any | None, ui: Reporter) -> providers.Decision:
    cfg = loaded.project.config
    decision = providers.decide(cli, list(cfg.pack.providers), cfg.runtime.gpu.backend, None)
    if decision.from_host and client is not None:
        decision = providers.decide(cli, list(cfg.pack.providers), cfg.runtime.gpu.backend, engine.host_info(client))
    ui.info(f"provider: {', '.join(decision.providers)} ({decision.reason})")
    return decision


def plan_for(
    loaded: Loaded, provider_name: str, reason: str, options: Options, client: Any | None, ui: Reporter, pull: bool
) -> Plan:
    """The plan for one provider. With an engine, the base image's facts are read from the
    image itself; without one (render, unit tests), the provider table's facts are assumed."""
    project = loaded.project
    provider = providers.get(provider_name, cuda=project.config.pack.cuda)
    base = base_facts(choose_base(project, provider, options), options.platform, project.config.pack.python,
                      client, ui, pull)
    return make_plan(project, loaded.model, loaded.signature, provider, reason, base, options)


def base_facts(
    base: BaseImage, platform: str | None, python: str | None, client: Any | None, ui: Reporter, pull: bool
) -> BaseImage:
    """Python, glibc and architecture of the base image: read from the image when an engine is
    there, else the provider table's facts (with pack.python, when given)."""
    probed = engine.probe_base(client, base, pull=pull, log=ui.info) if client is not None else None
    if probed is None:
        probed = assumed_base(base, platform, python)
        ui.info(f"base image {base.image} not inspected: assuming Python {probed.python}, "
                f"glibc {probed.glibc[0]}.{probed.glibc[1]}")
    return probed


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
    plan = plan_for(loaded, provider_name, reason, options, client, ui, pull)
    ui.info(f"resolving wheels for {plan.target.describe()}")
    lock = wheels.resolve(plan.requirements, plan.target, refresh=refresh)
    ort_version = lock.version_of(plan.provider.ort) or "unknown"
    spec = runtime_config(plan, providers.session_providers(plan.provider, loaded.project.config), ort_version)
    runtime_base = runtime_base_tag(plan.provider, plan.base, plan.link_check, lock)
    if client is not None and engine.image_exists(client, runtime_base):
        ui.info(f"building on the runtime base image {runtime_base}")
        dockerfile = render.dockerfile(plan, lock, runtime_base=runtime_base)
        return Prepared(plan, None, lock, dockerfile, contexts.assemble(plan, None, dockerfile, spec))
    wheelhouse = wheels.fetch(lock, log=ui.info)
    dockerfile = render.dockerfile(plan, lock)
    return Prepared(plan, wheelhouse, lock, dockerfile, contexts.assemble(plan, wheelhouse, dockerfile, spec))


# ---------------------------------------------------------------------------------------------
# runtime base images: a provider's wheels and runtime, without a model


def runtime_base_tag(provider: providers.Provider, base: BaseImage, link_check: bool, lock: wheels.Lock) -> str:
    """Tag of the runtime base image that fits this lock: a digest of everything inside it."""
    h = hashlib.sha256()
    h.update(render.runtime_dockerfile(provider, base, link_check).encode())
    h.update(lock.target.describe().encode())
    for pin in (*lock.pins, *lock.tools):
        h.update(f"{pin.name}=={pin.version}\n".encode())
    for src in sorted(contexts.RUNTIME_SRC.glob("*.py")):
        h.update(src.read_bytes())
    version = lock.version_of(provider.ort) or provider.version
    return f"gpux-pack/runtime-{provider.name}:{version}-{h.hexdigest()[:12]}"


@dataclass(frozen=True)
class PreparedRuntime:
    provider: providers.Provider
    tag: str
    wheelhouse: wheels.Wheelhouse
    dockerfile: str
    context: contexts.Context


def prepare_runtime(
    provider_name: str, cuda: str, base_choice: str | None, platform: str | None, nvidia_libs: str | None,
    link_check: bool, client: Any | None, ui: Reporter, pull: bool, refresh: bool = False,
) -> PreparedRuntime:
    provider = providers.get(provider_name, cuda=cuda)
    base = providers.base_for(provider, base_choice)
    if nvidia_libs:
        base = replace(base, nvidia_libs=nvidia_libs)
    base = base_facts(base, platform, None, client, ui, pull)
    target = wheels.Target(base.python, base.arch, base.glibc)
    ui.info(f"resolving wheels for {target.describe()}")
    lock = wheels.resolve(provider.requirements(base.nvidia_libs), target, refresh=refresh)
    wheelhouse = wheels.fetch(lock, log=ui.info)
    tag = runtime_base_tag(provider, base, link_check, lock)
    dockerfile = render.runtime_dockerfile(provider, base, link_check, tag=tag)
    return PreparedRuntime(provider, tag, wheelhouse, dockerfile, contexts.assemble_runtime(wheelhouse, dockerfile))
