"""The layers gpux-pack adds to a base image, declared once: the Dockerfile templates write
their instructions, the context lays out their folders, the assembler writes them as tars
and names them in the history, and warmup's derived image adds the last one.

Each layer is one tree placed from / (the context's `packages/opt/...` lands at `/opt/...`),
or one tar ADDed at / where a folder must belong to the image's user (COPY cannot own a
folder without also owning its parents)."""

from __future__ import annotations

from dataclasses import dataclass

from gpux_pack.plan import APP_DIR, BAKED_DIR, CACHE_DIR, SITE


@dataclass(frozen=True)
class Layer:
    name: str  # the context's folder for it ("packages"), or its tar ("cache" -> cache.tar)
    lands: str  # where its tree lands in the image
    tar: bool = False  # ADD of a tar (owned folders) instead of COPY of a folder

    @property
    def source(self) -> str:
        return f"{self.name}.tar" if self.tar else f"{self.name}/"

    @property
    def instruction(self) -> str:
        """Its Dockerfile line, which is also its history line."""
        return f"{'ADD' if self.tar else 'COPY'} {self.source} /"

    @property
    def root(self) -> str:
        """Its folder in the context: the tree below it lands at / (packages/opt/... -> /opt/...)."""
        return f"{self.name}{self.lands}"


LAYERS: dict[str, Layer] = {
    layer.name: layer
    for layer in (
        Layer("packages", SITE),  # the locked wheels, installed on the host
        Layer("runtime", f"{APP_DIR}/runtime/gpux_runtime"),  # the image's runtime (gpux_pack/runtime)
        Layer("cache", CACHE_DIR, tar=True),  # GPUX_CACHE_DIR, empty, owned by the image's user
        Layer("model", f"{APP_DIR}/model"),  # the model and its external data
        Layer("config", f"{APP_DIR}/gpux.json"),  # gpux.json
        Layer("warm", BAKED_DIR, tar=True),  # a baked warmup cache (gpux-pack warmup)
    )
}
RUNTIME_BASE = ("packages", "runtime", "cache")  # a runtime base image's layers, in order
MODEL = ("model", "config")  # what a model image adds on its runtime base image
