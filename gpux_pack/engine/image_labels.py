"""What an image built by gpux-pack says of itself, in its io.gpux.* labels: the one reader,
for run, deploy, warmup, bench and inspect. The plan writes them (plan.labels). An image read
from its registry instead (registry/remote.py: deploy and inspect) is the same type, made from
its config blob, so every command reads labels one way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpux_pack.engine import short_error
from gpux_pack.engine.interface import Engine, EngineError, Image, ImageNotFound
from gpux_pack.errors import DockerError, UsageError
from gpux_pack.providers import PROVIDERS
from gpux_pack.reference import parse_reference

REQUIRED = ("io.gpux.pack.version", "io.gpux.provider", "io.gpux.port")


@dataclass(frozen=True)
class GpuxImage:
    ref: str  # as the user named it
    image: Image | None  # the engine's image; None for an image read from its registry
    labels: dict[str, str]
    config_digest: str | None = None  # from a registry: the config blob's digest (what the engine calls its id)
    layers_bytes: int | None = None  # from a registry: its layers' sizes summed (compressed, as pushed)
    pinned: str | None = None  # from a registry: repo@sha256:<digest of the manifest the reference names>

    @property
    def id(self) -> str:
        return self.image.id if self.image is not None else self.config_digest or ""

    @property
    def size_bytes(self) -> int | None:
        return self.image.attrs.get("Size") if self.image is not None else self.layers_bytes

    @property
    def provider(self) -> str:
        return self.labels.get("io.gpux.provider", "")

    @property
    def port(self) -> int:
        return int(self.labels["io.gpux.port"])

    @property
    def grpc_port(self) -> int | None:
        grpc = self.labels.get("io.gpux.grpc_port", "")
        return int(grpc) if grpc.isdigit() else None

    @property
    def model_name(self) -> str:
        return self.labels.get("io.gpux.model.name", "model")

    @property
    def shown(self) -> dict[str, str]:
        """The labels `inspect` shows: gpux's and the OCI ones, sorted."""
        return {k: v for k, v in sorted(self.labels.items()) if k.startswith(("io.gpux.", "org.opencontainers."))}


def names_registry(ref: str) -> bool:
    """Whether the reference says which registry holds it (`host[:port]/...`, `localhost/...`,
    `docker.io/...`): only then is a reference missing here looked up there; a bare `name:tag`
    is most often a local build that is not there, not a Docker Hub image."""
    try:
        reference = parse_reference(ref)
    except ValueError:
        return False
    return reference.registry_path[0] != "docker.io" or reference.name.startswith("docker.io/")


def local(client: Engine, ref: str, built_by_us: bool = True) -> GpuxImage | None:
    """The engine's image and its labels, None when the engine has no such image. A reference
    that is no reference (`REL4/MLP`, `$(id)`, a line break) is one usage line, not the engine's
    400 text."""
    try:
        parse_reference(ref)
    except ValueError as e:
        raise UsageError(str(e)) from None  # it names the reference and what a reference looks like
    try:
        image = client.images.get(ref)
    except ImageNotFound:
        return None
    except EngineError as e:
        raise DockerError(f"cannot inspect {ref}: {short_error(e)}") from None
    return GpuxImage(ref, image, checked(ref, dict(image.attrs["Config"].get("Labels") or {}), built_by_us))


def read(client: Engine, ref: str, built_by_us: bool = True) -> GpuxImage:
    """The image and its labels; built_by_us: refuse an image without gpux-pack's labels. For
    the commands that start the image (run, warmup, predict, bench), which need it here."""
    found = local(client, ref, built_by_us)
    if found is None:
        hint = f" (--pull never; docker pull {ref} gets it)" if names_registry(ref) else ""
        raise UsageError(f"{ref}: no such image on this Docker engine{hint}")
    return found


def from_config(ref: str, config: dict[str, Any], config_digest: str, layers_bytes: int, pinned: str,
                built_by_us: bool = True) -> GpuxImage:
    """An image known only by its registry's config blob (the image config JSON: labels under
    config.Labels), its digest, its layers' size and the digest reference it was read by."""
    labels = (config.get("config") or {}).get("Labels") or {}
    if not isinstance(labels, dict):
        raise UsageError(f"{ref}: its image config has malformed labels")
    labels = {str(k): str(v) for k, v in labels.items()}
    return GpuxImage(ref, None, checked(ref, labels, built_by_us), config_digest, layers_bytes, pinned)


MAX_MODEL_BYTES = 1 << 40  # 1 TiB: more than any model gpux-pack bakes; past it a label was made by hand


def checked(ref: str, labels: dict[str, str], built_by_us: bool) -> dict[str, str]:
    """The labels, checked before any command uses them: an image whose labels were made or
    changed by hand gets one line here, not a KeyError or a manifest Kubernetes refuses."""
    if not built_by_us:
        return labels
    if not all(labels.get(k) for k in REQUIRED):
        raise UsageError(f"{ref}: not an image built by gpux-pack (no {' / '.join(REQUIRED)} labels)")

    def bad(key: str, expected: str) -> UsageError:
        return UsageError(f"{ref}: label {key}={labels[key][:40]!r} is not {expected}; not as gpux-pack built it")

    if labels["io.gpux.provider"] not in PROVIDERS:
        raise bad("io.gpux.provider", f"a provider ({', '.join(PROVIDERS)})")
    for key in ("io.gpux.port", "io.gpux.grpc_port"):
        value = labels.get(key)
        if value is not None and (not value.isdigit() or not 1 <= int(value) <= 65535):
            raise bad(key, "a port from 1 to 65535")
    if labels.get("io.gpux.grpc_port") == labels["io.gpux.port"]:
        raise bad("io.gpux.grpc_port", "a port other than the HTTP port")
    size = labels.get("io.gpux.model.bytes")
    if size is not None and (not size.isdigit() or int(size) > MAX_MODEL_BYTES):
        raise bad("io.gpux.model.bytes", "a model's size in bytes (at most 1 TiB)")
    return labels
