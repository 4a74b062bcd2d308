"""What an image built by gpux-pack says of itself, in its io.gpux.* labels: the one reader,
for run, deploy, warmup, bench and inspect. The plan writes them (plan.labels)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpux_pack.engine import short_error
from gpux_pack.errors import DockerError, UsageError

REQUIRED = ("io.gpux.pack.version", "io.gpux.provider", "io.gpux.port")


@dataclass(frozen=True)
class GpuxImage:
    ref: str  # as the user named it
    image: Any  # the Docker SDK's Image
    labels: dict[str, str]

    @property
    def id(self) -> str:
        return self.image.id

    @property
    def size_bytes(self) -> int | None:
        return self.image.attrs.get("Size")

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


def read(client: Any, ref: str, built_by_us: bool = True) -> GpuxImage:
    """The image and its labels; built_by_us: refuse an image without gpux-pack's labels."""
    import docker

    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise UsageError(f"{ref}: no such image on this Docker engine") from None
    except docker.errors.APIError as e:
        raise DockerError(f"cannot inspect {ref}: {short_error(e)}") from None
    labels = dict(image.attrs["Config"].get("Labels") or {})
    if built_by_us and (not all(labels.get(k) for k in REQUIRED) or not labels["io.gpux.port"].isdigit()):
        raise UsageError(f"{ref}: not an image built by gpux-pack (no {' / '.join(REQUIRED)} labels)")
    return GpuxImage(ref, image, labels)
