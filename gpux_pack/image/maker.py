"""One way to make images: a Maker makes an image from a plan's layers (`make`) or derives an
image with one more layer (`derive`). Two makers sit behind it, chosen once per engine
(`choose`): the host assembler (nothing runs; see assembler.py) and the engine's builder
(builder.py). Falling back from one to the other, and making a content-addressed image only
once when builds run side by side, are wrappers around the same two methods.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, replace
from typing import Protocol

from gpux_pack import staging
from gpux_pack.engine import image_exists, inspect_parent
from gpux_pack.engine.interface import Engine
from gpux_pack.image import assembler, builder, layer_tar
from gpux_pack.image.archive import Loadable
from gpux_pack.image.builder import BuiltImage
from gpux_pack.image.context import Context, Entry
from gpux_pack.image.dockerfile import config_instructions, env_instruction, warm_dockerfile
from gpux_pack.image.layout import LAYERS, RUNTIME_BASE, model_layers
from gpux_pack.plan import ImageConfig, Plan, RuntimeBase
from gpux_pack.timestamps import created_now
from gpux_pack.ui import Reporter

ASSEMBLED = assembler.ASSEMBLED  # how an assembled image's history lines begin


@dataclass(frozen=True)
class Recipe:
    """One image to make: layers of a context on a parent, and what its Dockerfile sets."""

    tag: str | None  # None: untagged (a baked warmup will tag the warmed image)
    shown: str  # the tag it is made for (messages, the result)
    parent: str  # what its Dockerfile's FROM names
    context: Context
    layers: tuple[str, ...]  # layout names, in order
    labels: dict[str, str]
    history: tuple[tuple[str, bool], ...]  # its Dockerfile's instructions after FROM: (text, adds no layer)
    created: str
    config: ImageConfig | None = None  # a runtime base image's ENV, USER, ... (None: the parent's)
    ports: tuple[int, ...] = ()
    runs_nothing: bool = True  # its Dockerfile has no RUN: it can be assembled
    platform: str | None = None
    assembling: str = ""  # what the log says, {mb}: the layers' size
    building: str = ""  # {mb}: the context's size


def runtime_base_recipe(runtime_base: RuntimeBase, context: Context) -> Recipe:
    config = runtime_base.config
    tag = runtime_base.tag
    history = (
        (env_instruction(config), True),
        *((LAYERS[name].instruction, False) for name in RUNTIME_BASE),
        *((line, True) for line in config_instructions(config)),
        ("LABEL (the runtime base image's labels)", True),
    )
    return Recipe(tag=tag, shown=tag, parent=runtime_base.base.image, context=context, layers=RUNTIME_BASE,
               labels=runtime_base.labels, history=history, created=created_now(), config=config,
               runs_nothing=runtime_base.runs_nothing, platform=runtime_base.platform,
               assembling=f"assembling the runtime base image {tag} ({{mb:.0f}} MB of layers; nothing runs)",
               building=f"building the runtime base image {tag} ({{mb:.0f}} MB context)")


def model_recipe(plan: Plan, context: Context, tagged: bool = True) -> Recipe:
    """A model image on its runtime base image; untagged when a baked warmup will tag it."""
    layers = model_layers(plan.carries_assets, plan.one_layer)
    history = (("EXPOSE " + " ".join(map(str, plan.ports)), True),
               *((LAYERS[name].instruction, False) for name in layers), ("LABEL (the model image's labels)", True))
    return Recipe(tag=plan.tag if tagged else None, shown=plan.tag, parent=plan.runtime_base.tag, context=context,
               layers=layers, labels=plan.labels, history=history, created=plan.created, ports=plan.ports,
               platform=plan.platform,
               assembling=f"assembling {plan.tag} ({plan.provider.name}, {{mb:.1f}} MB of layers; nothing runs)",
               building=f"building {plan.tag} ({plan.provider.name}, {{mb:.0f}} MB context)")


class Maker(Protocol):
    def make(self, recipe: Recipe) -> BuiltImage:
        """The image of a recipe."""

    def derive(self, parent: str, tag: str, members: list[layer_tar.Member], labels: dict[str, str],
               note: str) -> BuiltImage:
        """`parent` plus one layer (the layout's "warm": these members) and labels, config
        otherwise unchanged."""


class Assembler:
    """Layers written on the host, loaded with the config derived from the parent's."""

    def __init__(self, client: Engine, ui: Reporter, uname: bytes):
        self.client, self.ui, self.uname = client, ui, uname

    def make(self, recipe: Recipe) -> BuiltImage:
        started = time.perf_counter()
        tars = [assembler.layer_of(recipe.context, LAYERS[name], self.uname) for name in recipe.layers]
        parent, history = inspect_parent(self.client, recipe.parent)
        image = assembler.Image(
            tag=recipe.tag, parent=parent, parent_history=history, layers=tars,
            config=assembler.derive_config(parent, recipe.labels, recipe.config, recipe.ports),
            history=[(f"{ASSEMBLED}{text}", empty) for text, empty in recipe.history], created=recipe.created,
        )
        self.ui.info(recipe.assembling.format(mb=sum(x.size for x in tars) / 1e6))
        loaded = assembler.loadable(image)
        return self._loaded(recipe.shown, assembler.load(self.client, [loaded]), started, loaded)

    def derive(self, parent: str, tag: str, members: list[layer_tar.Member], labels: dict[str, str],
               note: str) -> BuiltImage:
        started = time.perf_counter()
        warm = LAYERS["warm"]
        tar = assembler.of_members(warm, members, self.uname)
        config, history = inspect_parent(self.client, parent)
        image = assembler.Image(
            tag=tag, parent=config, parent_history=history, layers=[tar],
            config=assembler.derive_config(config, labels),
            history=[(f"{ASSEMBLED}{warm.instruction} ({note})", False),
                     (f"{ASSEMBLED}LABEL io.gpux.warmup=baked ...", True)],
            created=created_now(),
        )
        self.ui.info(f"warmup: assembling {tag} (+1 layer, {tar.size / 1e6:.1f} MB; nothing runs)")
        return self._loaded(tag, assembler.load(self.client, [assembler.loadable(image)]), started)

    def _loaded(self, tag: str, image_id: str, started: float, loaded: Loadable | None = None) -> BuiltImage:
        size = self.client.images.get(image_id).attrs.get("Size", 0)
        return BuiltImage(tag=tag, id=image_id, size_bytes=size, seconds=time.perf_counter() - started, steps=0,
                          cached_steps=0, assembled=True, loaded=loaded)


class Builder:
    """The context's Dockerfile, built by the engine's builder."""

    def __init__(self, client: Engine, ui: Reporter, no_cache: bool = False):
        self.client, self.ui, self.no_cache = client, ui, no_cache

    def make(self, recipe: Recipe) -> BuiltImage:
        built = builder.engine_build(self.client, recipe.context, recipe.tag, self.ui, self.no_cache, recipe.platform,
                              title=recipe.building.format(mb=recipe.context.size_bytes / 1e6))
        return built if recipe.tag else replace(built, tag=recipe.shown)

    def derive(self, parent: str, tag: str, members: list[layer_tar.Member], labels: dict[str, str],
               note: str) -> BuiltImage:
        context = Context(tuple(sorted([
            Entry("Dockerfile", data=warm_dockerfile(parent, labels).encode()),
            Entry(LAYERS["warm"].source, members=tuple(layer_tar.walk_order(members))),
        ], key=lambda e: e.name)))
        return builder.engine_build(self.client, context, tag, self.ui, False, None,
                             title=f"building {tag} (+1 layer: the warmup cache)")


class Fallback:
    """The assembler where the Dockerfile runs nothing and every layer can be written as the
    engine writes it; the builder otherwise."""

    def __init__(self, first: Maker, second: Maker, ui: Reporter):
        self.first, self.second, self.ui = first, second, ui

    def make(self, recipe: Recipe) -> BuiltImage:
        if recipe.runs_nothing:
            try:
                return self.first.make(recipe)
            except layer_tar.Unsupported as e:
                self.ui.info(f"building with the engine's builder: {e}")
        return self.second.make(recipe)

    def derive(self, parent: str, tag: str, members: list[layer_tar.Member], labels: dict[str, str],
               note: str) -> BuiltImage:
        try:
            return self.first.derive(parent, tag, members, labels, note)
        except layer_tar.Unsupported as e:
            self.ui.info(f"building with the engine's builder: {e}")
        return self.second.derive(parent, tag, members, labels, note)


class OncePerTag:
    """Builds making the same tag at once take turns (a lock per tag under the cache); with
    reuse (the tag is content-addressed), the later one finds the image made and uses it."""

    def __init__(self, maker: Maker, client: Engine, ui: Reporter, reuse: bool):
        self.maker, self.client, self.ui, self.reuse = maker, client, ui, reuse

    def make(self, recipe: Recipe) -> BuiltImage:
        name = hashlib.sha256(recipe.shown.encode()).hexdigest()[:24]
        with staging.lock_file(staging.cache_dir() / ".locks" / f"image-{name}.lock"):
            if self.reuse and image_exists(self.client, recipe.shown):
                self.ui.info(f"runtime base image {recipe.shown} was made by another build meanwhile: using it")
                image = self.client.images.get(recipe.shown)
                return BuiltImage(tag=recipe.shown, id=image.id, size_bytes=image.attrs.get("Size", 0), seconds=0.0,
                                  steps=0, cached_steps=0, assembled=True)
            return self.maker.make(recipe)

    def derive(self, parent: str, tag: str, members: list[layer_tar.Member], labels: dict[str, str],
               note: str) -> BuiltImage:
        return self.maker.derive(parent, tag, members, labels, note)


def choose(client: Engine, ui: Reporter, no_cache: bool = False) -> Maker:
    """The assembler (falling back to the builder) on an engine that writes layer tars as we
    do; the builder alone otherwise (or with GPUX_PACK_ASSEMBLE=0)."""
    build = Builder(client, ui, no_cache)
    uname = assembler.engine_uname(client)
    return build if uname is None else Fallback(Assembler(client, ui, uname), build, ui)
