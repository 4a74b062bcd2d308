"""The layers gpux-pack adds to a base image, declared once: the Dockerfile templates write
their instructions, the context lays out their folders, the assembler writes them as tars
and names them in the history, and warmup's derived image adds the last one.

Each layer is one tar in the context, ADDed at / (`packages.tar` holds `opt/gpux/site/...`),
never a folder COPYed: every builder unpacks a tar with the times and owners its headers give,
so BuildKit, podman, buildah and the classic builder all commit the layer gpux-pack writes
(BuildKit stamps the folders a COPY makes with the time of its own copy), and a folder can
belong to the image's user without its parents doing so (the cache)."""

from __future__ import annotations

from dataclasses import dataclass

from gpux_pack.runtime.contract import APP_DIR, ASSETS, BAKED_DIR, CACHE_DIR, SITE


@dataclass(frozen=True)
class Layer:
    name: str  # "packages": its tar in the context is packages.tar
    lands: str  # where its tree lands in the image

    @property
    def source(self) -> str:
        return f"{self.name}.tar"

    @property
    def instruction(self) -> str:
        """Its Dockerfile line, which is also its history line."""
        return f"ADD {self.source} /"


LAYERS: dict[str, Layer] = {
    layer.name: layer
    for layer in (
        Layer("packages", SITE),  # the locked wheels, installed on the host
        Layer("runtime", f"{APP_DIR}/runtime/gpux_runtime"),  # the image's runtime (gpux_pack/runtime)
        Layer("cache", CACHE_DIR),  # GPUX_CACHE_DIR, empty, owned by the image's user
        Layer("assets", f"{APP_DIR}/{ASSETS}"),  # what preprocessing reads (a tokenizer.json), when it is set
        Layer("model", f"{APP_DIR}/model"),  # the model and its external data
        Layer("config", f"{APP_DIR}/gpux.json"),  # gpux.json
        Layer("app", APP_DIR),  # a small model and gpux.json in one layer (Plan.one_layer): one less to load
        Layer("warm", BAKED_DIR),  # a baked warmup cache (gpux-pack warmup)
    )
}
# The link check script (gpux_pack/linkcheck.py) lands in the runtime's layer beside gpux_runtime,
# not inside it: the runtime never imports it; a runtime base image's build runs it where the
# provider's libraries come from an apt step (plan link_check "image").
LINKCHECK = f"{LAYERS['runtime'].lands.rsplit('/', 1)[0]}/linkcheck.py"
RUNTIME_BASE = ("packages", "runtime", "cache")  # a runtime base image's layers, in order
MODEL = ("model", "config")  # what a model image adds on its runtime base image


def model_layers(assets: bool, one_layer: bool = False) -> tuple[str, ...]:
    """A model image's layers: with preprocessing's files, their layer first (they change less
    often); the model, then gpux.json (a gpux.yml edit sends only it), or both in one layer."""
    own = ("app",) if one_layer else MODEL
    return ("assets", *own) if assets else own
