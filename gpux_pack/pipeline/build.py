"""The build pipeline's stages in order, for `build`, `render`, `base build|render`, `plan`,
`bench` and `serve`.

load (config, model) -> plan (every decision; the lock) -> install (on the host, then the link
check) -> Dockerfile -> context -> image (image/maker.py). `build` and `render` share
everything up to the context; `plan` stops after the lock.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, TypeVar

from gpux_pack import engine, providers, wheels
from gpux_pack.engine.interface import Engine
from gpux_pack.pipeline import attest
from gpux_pack.pipeline.bake import bake_image, cache_of
from gpux_pack.engine import rootfs
from gpux_pack.errors import PackError, UsageError
from gpux_pack.image.context import Context, model_context, runtime_base_context
from gpux_pack.image.dockerfile import dockerfile, runtime_base_dockerfile
from gpux_pack.image import model_signature
from gpux_pack.image.maker import Maker, OncePerTag, choose, model_recipe, runtime_base_recipe
from gpux_pack.image.builder import BuiltImage
from gpux_pack.image.sbom import CompiledCache
from gpux_pack.install import install
from gpux_pack.optimize import Optimized, optimize, samples_path, summary_lines, vocabulary_size
from gpux_pack.plan import (Options, Plan, Resolve, RuntimeBase, assumed_base, check_model_for, choose_base,
                            image_tag, make_plan, notes, optimization, plan_runtime_base, weights_note)
from gpux_pack.project.load import Project, load_project
from gpux_pack.project.model import ModelInfo, Signature, inspect_model, reconcile
from gpux_pack.project.preprocess import download, locate
from gpux_pack.providers import BaseImage
from gpux_pack.registry import index
from gpux_pack.registry.push import Pushed, push
from gpux_pack.ui import Reporter


@dataclass(frozen=True)
class Loaded:
    project: Project
    model: ModelInfo
    signature: Signature


@dataclass(frozen=True)
class Prepared:
    """A model image, ready to make: its context, and its runtime base image's when the engine
    lacks it (made first). render: one self-contained context and no runtime base."""

    plan: Plan
    context: Context
    runtime_base_context: Context | None = None


@dataclass(frozen=True)
class Made:
    plan: Plan
    prepared: Prepared
    built: BuiltImage
    pushed: Pushed | None
    sbom: Path | None = None  # the SBOM this build recorded (pipeline/attest.py)
    attached: attest.Attached | None = None  # what the push attached to the pushed manifest


def load(path: Path, contained: bool = False, strict: bool = False) -> Loaded:
    """Config and model, checked against each other. No Docker, no network. contained (or the
    project's pack.contained): gpux.yml and the model must resolve inside the folder named.
    strict (or pack.strict): what is otherwise a warning is refused."""
    project = load_project(path, strict)
    model_path = project.model_path
    if contained or project.config.pack.contained:
        _contain(Path(path), project, model_path)
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
    signature = reconcile(project, model)
    if signature.text is not None:  # where its tokenizer.json is: a file, the Hugging Face cache, or a download
        signature = replace(signature, text=locate(project, signature.text, contained or project.config.pack.contained))
    return Loaded(project, model, signature)


def _contain(path: Path, project: Project, model_path: Path) -> None:
    """GPUX documents absolute model paths, so a build reads them by default; a contained one
    refuses whatever resolves outside the project's folder (`..`, an absolute path, a symbolic
    link out), before reading it. External data must lie in the model's own folder already."""
    folder = Path(os.path.realpath(path if path.is_dir() else path.parent))
    if not project.config_path.is_relative_to(folder):
        raise UsageError(f"{_shown(path)}: gpux.yml resolves to {project.config_path}, outside {folder} (--contained)")
    if not model_path.is_relative_to(folder):
        raise project.error(("model", "source"), f"resolves to {model_path}, outside the project folder {folder} "
                                                 "(--contained builds read nothing outside it)")
    samples = samples_path(project)
    if samples is not None and not samples.is_relative_to(folder):
        raise project.error(("pack", "optimize", "samples"), f"resolves to {samples}, outside the project folder "
                                                             f"{folder} (--contained builds read nothing outside it)")


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


def choose_providers(loaded: Loaded, cli: list[str], client: Engine | None, ui: Reporter) -> providers.Decision:
    cfg = loaded.project.config
    decision = providers.decide(cli, list(cfg.pack.providers), cfg.runtime.gpu.backend, None)
    if decision.from_host and client is not None:
        decision = providers.decide(cli, list(cfg.pack.providers), cfg.runtime.gpu.backend, engine.host_info(client))
    ui.info(f"provider: {', '.join(decision.providers)} ({decision.reason})")
    return decision


Connected = TypeVar("Connected", bound="Engine | None")  # what connect gives: an engine, or None (try_connect)


def open_project(path: Path, provider_flag: str | None, tag: str | None, connect: Callable[[], Connected],
          ui: Reporter, contained: bool = False, strict: bool = False,
          warn: bool = True) -> tuple[Loaded, providers.Decision, Connected]:
    """What every command that starts from a project does first: load it, refuse a bad tag and a
    model the images' onnxruntime cannot load before asking Docker anything, then connect and
    choose the providers (asking the Docker host only for `auto`). Says the plan's notes on gpux.yml
    (warn=False: the caller prints them). Returns the client too."""
    cli = providers.parse_provider_list(provider_flag)
    loaded = load(path, contained, strict)
    for line in notes(loaded.project, loaded.signature) if warn else ():
        ui.warn(line)
    image_tag(loaded.project, "cpu", tag)
    check_model(loaded, cli)
    client = connect()
    return loaded, choose_providers(loaded, cli, client, ui), client


def check_tag(tag: str | None, provider_names: list[str]) -> None:
    """Several providers need {provider} in --tag, or each image would take the last one's tag."""
    if tag and len(provider_names) > 1 and "{provider}" not in tag:
        raise UsageError(f"--tag {tag}: several providers ({', '.join(provider_names)}) need {{provider}} in the tag")


def base_facts(base: BaseImage, platform: str | None, python: str | None, client: Engine | None, ui: Reporter,
               pull: bool, for_platform: bool = False) -> BaseImage:
    """The base image's facts read from its files (engine/rootfs.py), else the table's."""
    found = rootfs.inspect_base(client, base, platform, python, pull, ui.info, for_platform) if client else None
    if found is None:
        found = assumed_base(base, platform, python)
        ui.info(f"base image {base.image} not inspected: assuming Python {found.python}, "
                f"glibc {found.glibc[0]}.{found.glibc[1]}")
    return found


def plan_for(
    loaded: Loaded, provider_name: str, reason: str, options: Options, client: Engine | None, ui: Reporter, pull: bool,
    resolve: Resolve | None = None,
    optimized: Optimized | None = None,
) -> Plan:
    """The plan for one provider, made once: with an engine, the base image's facts are read
    from its files first (without one, the table's are assumed); with resolve, its wheels are
    locked as it is made (see resolver); with optimized, the image takes that model."""
    project = loaded.project
    provider = providers.get(provider_name, cuda=project.config.pack.cuda)
    base = base_facts(choose_base(project, provider, options), options.platform, project.config.pack.python,
                      client, ui, pull, for_platform=options.multi_platform)
    model = optimized.model if optimized else loaded.model
    return make_plan(project, model, loaded.signature, provider, reason, base, options, resolve, optimized)


def optimized(loaded: Loaded, provider_name: str, options: Options, ui: Reporter) -> Optimized | None:
    """pack.optimize for this provider's image, before planning (the plan takes the model it
    makes): a line for each step that cannot be done for the provider, None when none can."""
    project = loaded.project
    decision = optimization(project, providers.get(provider_name, cuda=project.config.pack.cuda), options)
    for line in decision.skipped:
        ui.warn(line)
    text = loaded.signature.text
    done = optimize(project, loaded.model, loaded.signature, decision,
                    vocabulary_size(text.tokenizer.path) if text else None, ui.info, ui.warn)
    for line in summary_lines(done) if done else ():
        ui.info(line)
    return done


def resolver(ui: Reporter, refresh: bool = False, offline: bool = False) -> Resolve:
    """The plan's wheels resolved for its target (cached by requirements and target)."""
    def resolve(requirements: tuple[str, ...], target: wheels.Target, excludes: tuple[str, ...]) -> wheels.Lock:
        if not offline:
            ui.info(f"resolving wheels for {target.describe()}")
        return wheels.resolve(requirements, target, refresh=refresh, offline=offline, excludes=excludes)

    return resolve


def runtime_base_present(client: Engine | None, plan: Plan) -> bool:
    """The engine already has the runtime base image the plan's lock makes: only the model is made."""
    return client is not None and engine.image_exists(client, plan.runtime_base.tag)


def with_tokenizer(loaded: Loaded, ui: Reporter) -> Loaded:
    """The project's tokenizer.json found before planning: downloaded from the Hugging Face Hub
    when neither the project nor its cache has it (the plan and the image carry the file)."""
    text = loaded.signature.text
    if text is None or text.tokenizer.path is not None:
        return loaded
    ui.info(f"downloading tokenizer.json of {text.tokenizer.repo} from the Hugging Face Hub")
    return replace(loaded, signature=replace(loaded.signature, text=download(text)))


def prepare(
    loaded: Loaded,
    provider_name: str,
    reason: str,
    options: Options,
    client: Engine | None,
    ui: Reporter,
    pull: bool,
    refresh: bool = False,
    self_contained: bool = False,
) -> Prepared:
    """build: a model context on the provider's runtime base image (prepared too when the engine
    lacks it). self_contained (render): one context with everything, which `docker build`
    turns into an image with the same layers."""
    loaded = with_tokenizer(loaded, ui)
    plan = plan_for(loaded, provider_name, reason, options, client, ui, pull, resolver(ui, refresh),
                    optimized(loaded, provider_name, options, ui))
    if plan.externalize:
        ui.info(weights_note(plan.model.files[0], plan.model.inline_weights))
    signed: tuple[tuple[str, bytes], ...] = ()
    if plan.sign_model is not None:  # what decides the answers, as the image holds it (OpenSSF model signing)
        ui.info(f"signing the model files, gpux.json and the assets with {plan.sign_model}")
        signed = model_signature.sign(plan, plan.sign_model)
    if self_contained:
        installed = install(plan.runtime_base, ui)
        return Prepared(plan, model_context(plan, installed, dockerfile(plan, part="image"), signed))
    base_context = None
    if not runtime_base_present(client, plan):
        base_context = runtime_base_context(install(plan.runtime_base, ui),
                                            runtime_base_dockerfile(plan.runtime_base, tag=plan.runtime_base.tag))
    else:
        ui.info(f"runtime base image {plan.runtime_base.tag} is present: only the model is sent")
    return Prepared(plan, model_context(plan, None, dockerfile(plan, part="model"), signed), base_context)


def make(client: Engine, prepared: Prepared, maker: Maker, ui: Reporter,
         no_cache: bool = False) -> tuple[BuiltImage, CompiledCache | None]:
    """The runtime base image when it is missing (once, however many builds want it), then the
    model image; a baked warmup tags the warmed image instead (and gives the cache it added)."""
    plan = prepared.plan
    if prepared.runtime_base_context is not None:
        OncePerTag(maker, client, ui, reuse=not no_cache).make(
            runtime_base_recipe(plan.runtime_base, prepared.runtime_base_context))
    engine.mark_used(client, plan.runtime_base.tag)  # made or built on now: `base prune` keeps it
    baked = plan.warmup == "baked"
    built = maker.make(model_recipe(plan, prepared.context, tagged=not baked))
    return bake(client, built, plan, maker, ui) if baked else (built, None)


def bake(client: Engine, built: BuiltImage, plan: Plan, maker: Maker,
         ui: Reporter) -> tuple[BuiltImage, CompiledCache | None]:
    """`--warmup always`: what `gpux-pack warmup` does, on the image just made (untagged), to
    give the tag an image with its cache baked in. On any failure (Ctrl-C included) the
    untagged image is removed; the warmup container always is."""
    try:
        warmed = bake_image(client, built.id, ui, maker, tag=plan.tag, devices=plan.warm_devices)
    except BaseException:
        engine.remove_untagged(client, built.id)
        raise
    image = client.images.get(warmed.id)
    return BuiltImage(tag=plan.tag, id=image.id, size_bytes=image.attrs.get("Size", 0),
                      seconds=built.seconds + warmed.seconds, steps=built.steps, cached_steps=built.cached_steps,
                      assembled=built.assembled), cache_of(client, warmed)


def build_each(loaded: Loaded, decision: providers.Decision, per_platform: list[Options], client: Engine, ui: Reporter,
               failed: Callable[[str, PackError], None], no_cache: bool = False, refresh: bool = False,
               push_: bool = False) -> tuple[list[Made], list[tuple[str, PackError]], list[tuple[str, index.Index]]]:
    """Build (and push) one image per provider and platform, and one index per provider when there
    are several platforms; a failing provider does not stop the others (failed is told at once)."""
    maker = choose(client, ui, no_cache)
    results: list[Made] = []
    failures: list[tuple[str, PackError]] = []
    indexes: list[tuple[str, index.Index]] = []
    for name in decision.providers:
        try:
            done = []
            for options in per_platform:
                started = attest.now()
                prepared = prepare(loaded, name, decision.reason, options, client, ui, pull=True, refresh=refresh)
                built, cache = make(client, prepared, maker, ui, no_cache)
                flags = {"warmup": options.warmup, "base_image": options.base_image, "no_cache": no_cache,
                         "refresh": refresh, "push": push_}
                document = attest.record(prepared.plan, built, started, flags, cache)
                pushed = push(client, built.tag, ui) if push_ else None
                attached = attest.attach(client, pushed, built.id, ui) if pushed else None
                done.append(Made(prepared.plan, prepared, built, pushed, document, attached))
            index_tag = done[0].plan.index_tag
            if index_tag:
                members = [index.Member(m.plan.platform, m.pushed.digest.split("@", 1)[1]) for m in done if m.pushed]
                ui.info(f"writing the index {index_tag} ({', '.join(m.platform for m in members)})")
                indexes.append((name, index.push_index(client, index_tag, members)))
            results.extend(done)
        except PackError as e:
            if len(decision.providers) == 1:
                raise
            failures.append((name, e))
            failed(name, e)
    return results, failures, indexes


# ---------------------------------------------------------------------------------------------
# runtime base images on their own (`gpux-pack base build|render`)


def prepare_runtime_base(provider_name: str, cuda: str, base_choice: str | None, platform: str | None,
                         nvidia_libs: str | None, link_check: bool, client: Engine | None, ui: Reporter, pull: bool,
                         refresh: bool = False) -> tuple[RuntimeBase, Context]:
    provider = providers.get(provider_name, cuda=cuda)
    base = base_facts(providers.base_for(provider, base_choice), platform, None, client, ui, pull)
    runtime_base = plan_runtime_base(provider, base, platform, link_check, nvidia_libs, resolver(ui, refresh))
    dockerfile_text = runtime_base_dockerfile(runtime_base, tag=runtime_base.tag)
    return runtime_base, runtime_base_context(install(runtime_base, ui), dockerfile_text)


def make_runtime_base(client: Engine, runtime_base: RuntimeBase, context: Context, ui: Reporter,
                      no_cache: bool = False) -> BuiltImage:
    built = OncePerTag(choose(client, ui, no_cache), client, ui, reuse=False).make(runtime_base_recipe(runtime_base, context))
    engine.mark_used(client, runtime_base.tag)
    return built
