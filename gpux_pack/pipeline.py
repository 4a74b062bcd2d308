"""The stages in order: load (config, model) -> plan (every decision, the lock included) ->
install (on the host, then the link check) -> render -> context -> build.
`build` and `render` share everything up to the context."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpux_pack import context as contexts
from gpux_pack import engine, providers, render, rootfs, wheels
from gpux_pack.errors import BuildError
from gpux_pack.project import Project, load_project
from gpux_pack.model import ModelInfo, Signature, inspect_model, reconcile
from gpux_pack.plan import (SITE, Options, Plan, assumed_base, check_model_for, choose_base, link_check_mode,
                            make_plan, runtime_base_tag, runtime_config, tensorrt_profiles, with_lock)
from gpux_pack.runtime import linkcheck
from gpux_pack.providers import BaseImage
from gpux_pack.ui import Reporter


@dataclass(frozen=True)
class Loaded:
    project: Project
    model: ModelInfo
    signature: Signature


@dataclass(frozen=True)
class PreparedRuntime:
    """A provider's runtime base image, ready to build: base -> installed packages -> runtime."""

    provider: providers.Provider
    base: BaseImage
    link_check: str
    tag: str
    lock: wheels.Lock
    installed: wheels.Installed
    dockerfile: str
    context: contexts.Context

    @property
    def assemblable(self) -> bool:
        """Its Dockerfile runs nothing (no apt step, no link check in the image), so it can be
        assembled on the host instead of built."""
        return not self.base.packages() and self.link_check != "image"


@dataclass(frozen=True)
class Prepared:
    """A model image, ready to build. `runtime`: its runtime base image, when the engine lacks
    it (built first); None when present, or when the context is self-contained (render)."""

    plan: Plan
    runtime: PreparedRuntime | None
    dockerfile: str
    context: contexts.Context

    @property
    def lock(self) -> wheels.Lock:
        return self.plan.lock  # type: ignore[return-value]


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
    """The plan for one provider, before its wheels are resolved (see locked). With an engine,
    the base image's facts are read from its files; without one, the table's are assumed."""
    project = loaded.project
    provider = providers.get(provider_name, cuda=project.config.pack.cuda)
    base = base_facts(choose_base(project, provider, options), options.platform, project.config.pack.python,
                      client, ui, pull, for_platform=options.multi_platform)
    return make_plan(project, loaded.model, loaded.signature, provider, reason, base, options)


def locked(plan: Plan, ui: Reporter, refresh: bool = False) -> Plan:
    """The plan with its wheels resolved for its target (cached by requirements and target)."""
    ui.info(f"resolving wheels for {plan.target.describe()}")
    return with_lock(plan, wheels.resolve(plan.requirements, plan.target, refresh=refresh))


def base_facts(
    base: BaseImage, platform: str | None, python: str | None, client: Any | None, ui: Reporter, pull: bool,
    for_platform: bool = False,
) -> BaseImage:
    """Python, glibc and architecture of the base image, read on the host from its files
    (exported once per image id; nothing runs, so a foreign architecture works). Without an
    engine, the provider table's facts (with pack.python, when given). for_platform (one of
    several platforms): a base present for another platform is pulled for this one (one
    multi-platform base serves all); otherwise a mismatch is the user's to fix."""
    wanted = platform if for_platform else None
    attrs = engine.base_image(client, base.image, pull, ui.info, wanted) if client is not None else None
    if attrs is None:
        assumed = assumed_base(base, platform, python)
        ui.info(f"base image {base.image} not inspected: assuming Python {assumed.python}, "
                f"glibc {assumed.glibc[0]}.{assumed.glibc[1]}")
        return assumed
    root = rootfs.export(client, base.image, ui.info)
    arch = "/".join(filter(None, [attrs.get("Architecture") or "amd64", attrs.get("Variant")]))
    found, glibc, machine = rootfs.facts(root, arch, base.image, require_python=base.has_python)
    return replace(base, python=found or python or base.python, glibc=glibc, arch=machine, probed=True,
                   id=attrs["Id"], rootfs=str(root), ld_library_path=tuple(rootfs.library_path(attrs)))


def prepare(
    loaded: Loaded,
    provider_name: str,
    reason: str,
    options: Options,
    client: Any | None,
    ui: Reporter,
    pull: bool,
    refresh: bool = False,
    self_contained: bool = False,
) -> Prepared:
    """build: a model context on the provider's runtime base image (prepared too when the engine
    lacks it). self_contained (render): one context with everything, which `docker build`
    turns into an image with the same layers."""
    plan = locked(plan_for(loaded, provider_name, reason, options, client, ui, pull), ui, refresh)
    lock = plan.lock
    assert lock is not None
    cfg = loaded.project.config
    profiles = tensorrt_profiles(cfg, plan.signature.inputs) if plan.provider.name == "tensorrt" else None
    spec = runtime_config(plan, providers.session_providers(plan.provider, cfg, profiles),
                          lock.version_of(plan.provider.ort) or "unknown")
    if self_contained:
        installed = install(plan.provider, plan.base, plan.link_check, lock, ui)
        dockerfile = render.dockerfile(plan, part="image")
        return Prepared(plan, None, dockerfile, contexts.assemble(plan, installed, dockerfile, spec))
    runtime = None
    if client is None or not engine.image_exists(client, plan.runtime_base):
        runtime = runtime_part(plan.provider, plan.base, plan.link_check, lock, plan.runtime_base, ui)
    else:
        ui.info(f"runtime base image {plan.runtime_base} is present: only the model is sent")
    dockerfile = render.dockerfile(plan, part="model")
    return Prepared(plan, runtime, dockerfile, contexts.assemble(plan, None, dockerfile, spec))


def install(
    provider: providers.Provider, base: BaseImage, link_check: str, lock: wheels.Lock, ui: Reporter
) -> wheels.Installed:
    """The locked wheels installed on the host, then the link check on base + installed tree."""
    installed = wheels.install(wheels.fetch(lock, log=ui.info), log=ui.info)
    if not installed.compiled:
        ui.info(f"no bytecode shipped: this host runs Python {sys.version_info[0]}.{sys.version_info[1]}, "
                f"the image {lock.target.python}")
    check_links(provider, base, link_check, installed, ui)
    return installed


def check_links(
    provider: providers.Provider, base: BaseImage, link_check: str, installed: wheels.Installed, ui: Reporter
) -> None:
    """The provider's libraries must resolve in base + installed packages, for the image's
    architecture, and its TensorRT must be no older than the one it was built with, or the build
    fails naming the problem before anything is built or tagged (instead of a silent CPU fallback
    in production)."""
    if link_check != "host":
        return
    if not base.rootfs:
        ui.info(f"link check not run: base image {base.image} was not inspected (no Docker engine)")
        return
    problems = linkcheck.check_tree(
        provider.execution_providers[0], list(provider.libraries), list(provider.dlopen),
        list(provider.library_dirs), list(provider.driver_libs), Path(base.rootfs), {SITE: installed.path},
        SITE, base.arch, list(base.ld_library_path), ui.info, provider.tensorrt,
    )  # fmt: skip
    if problems:
        hint = provider.link_hint or "use a base image that provides it"
        raise BuildError(linkcheck.failure(provider.execution_providers[0], problems, hint), "link check",
                         [f"link check: {line}" for line in problems])


def runtime_part(
    provider: providers.Provider, base: BaseImage, link_check: str, lock: wheels.Lock, tag: str, ui: Reporter
) -> PreparedRuntime:
    installed = install(provider, base, link_check, lock, ui)
    dockerfile = render.runtime_dockerfile(provider, base, link_check, tag=tag)
    return PreparedRuntime(provider, base, link_check, tag, lock, installed, dockerfile,
                           contexts.assemble_runtime(installed, dockerfile))


# ---------------------------------------------------------------------------------------------
# runtime base images on their own (`gpux-pack base build|render`)


def prepare_runtime(
    provider_name: str, cuda: str, base_choice: str | None, platform: str | None, nvidia_libs: str | None,
    link_check: bool, client: Any | None, ui: Reporter, pull: bool, refresh: bool = False,
) -> PreparedRuntime:
    provider = providers.get(provider_name, cuda=cuda)
    base = providers.base_for(provider, base_choice)
    if nvidia_libs:
        base = replace(base, nvidia_libs=nvidia_libs)
    base = base_facts(base, platform, None, client, ui, pull)
    mode = link_check_mode(link_check, base)
    target = wheels.Target(base.python, base.arch, base.glibc)
    ui.info(f"resolving wheels for {target.describe()}")
    lock = wheels.resolve(provider.requirements(base.nvidia_libs), target, refresh=refresh)
    return runtime_part(provider, base, mode, lock, runtime_base_tag(provider, base, mode, lock), ui)
