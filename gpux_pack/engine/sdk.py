"""The Docker SDK's client for an engine that is not a local unix socket (DOCKER_HOST tcp:// or
ssh://, a Docker context; a local one is engine/local.py's), raising interface.py's errors (not
the SDK's) from images, inspect, history, load, info and version: callers catch gpux-pack's
family, whatever client answers. The rest (containers, build, pull, push) is the SDK's as it is."""

from __future__ import annotations

from contextlib import contextmanager
from typing import IO, Any, Iterable, Iterator

from gpux_pack.engine.interface import EngineError, EngineGone, ImageNotFound


def ours(e: BaseException) -> EngineError | None:
    """The SDK's error as gpux-pack's (its text kept); None for anything else."""
    import docker.errors
    import requests

    if isinstance(e, docker.errors.APIError):
        kind = ImageNotFound if isinstance(e, docker.errors.ImageNotFound) else EngineError
        return kind(str(e), e.status_code, e.explanation)
    if isinstance(e, requests.RequestException):  # the connection failed or broke
        return EngineGone(str(e) or type(e).__name__)
    return None


@contextmanager
def translated() -> Iterator[None]:
    try:
        yield
    except Exception as e:
        error = ours(e)
        if error is None:
            raise
        raise error from None


class SdkEngine:
    def __init__(self, client: Any):
        self.client = client
        self.images = Images(client.images)
        self.api = Api(client.api)

    @property
    def containers(self) -> Any:
        return self.client.containers

    def info(self) -> dict[str, Any]:
        with translated():
            return self.client.info()

    def version(self) -> dict[str, Any]:
        with translated():
            return self.client.version()

    def ping(self) -> bool:
        with translated():
            return self.client.ping()


class Image:
    def __init__(self, image: Any):
        self.image = image

    @property
    def id(self) -> str:
        return self.image.id

    @property
    def tags(self) -> list[str]:
        return self.image.tags

    @property
    def attrs(self) -> dict[str, Any]:
        return self.image.attrs

    def tag(self, repository: str, tag: str | None = None) -> bool:
        with translated():
            return self.image.tag(repository, tag)


class Images:
    def __init__(self, images: Any):
        self.images = images

    def get(self, name: str) -> Image:
        with translated():
            return Image(self.images.get(name))

    def remove(self, image: str, *, force: bool = False, noprune: bool = False) -> None:
        with translated():
            self.images.remove(image, force=force, noprune=noprune)

    def list(self, *, filters: dict[str, Any] | None = None) -> list[Image]:
        with translated():
            return [Image(i) for i in self.images.list(filters=filters)]


class Api:
    def __init__(self, api: Any):
        self.api = api

    @property
    def base_url(self) -> str:
        return self.api.base_url

    @property
    def credstore_env(self) -> dict[str, str] | None:
        return self.api.credstore_env

    def build(self, *, fileobj: IO[bytes] | Iterable[bytes], **kwargs: Any) -> Iterator[dict[str, Any]]:
        return self.api.build(fileobj=fileobj, **kwargs)

    def pull(self, repository: str, **kwargs: Any) -> Any:
        return self.api.pull(repository, **kwargs)

    def push(self, repository: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        return self.api.push(repository, **kwargs)

    def inspect_image(self, image: str) -> dict[str, Any]:
        with translated():
            return self.api.inspect_image(image)

    def history(self, image: str) -> list[dict[str, Any]]:
        with translated():
            return self.api.history(image)

    def containers(self, *, all: bool = False) -> list[dict[str, Any]]:
        with translated():
            return self.api.containers(all=all)

    def load_image(self, data: Iterable[bytes], *, quiet: bool | None = None) -> Iterator[dict[str, Any]]:
        with translated():
            events = self.api.load_image(data, quiet=quiet)
        return _translating(events)


def _translating(events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    with translated():
        yield from events
