"""The part of the Docker engine client (the Docker SDK's DockerClient) that gpux-pack uses, as
Protocols: what a function that takes an engine may ask of it, and what a stand-in engine must
answer (the unit tests' in-memory one). Only the members gpux-pack calls, with the argument
names it passes; an argument it passes by name is keyword-only here. And the errors an engine
raises from images, inspect, history, load, info and version, the same whichever client answers
(engine/sdk.py translates the SDK's), so a caller catches one family.

This module imports nothing but the standard library, and nothing checks an engine against
the Protocols at run time."""

from __future__ import annotations

from typing import IO, Any, Iterable, Iterator, Protocol, Sequence


class EngineError(Exception):
    """The engine refused a call (its HTTP status and its own words, `explanation`), or could
    not be reached (EngineGone). str() is the SDK's APIError text: "404 Client Error for URL:
    Not Found ("No such image: x")"."""

    def __init__(self, message: str, status_code: int | None = None, explanation: str | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.explanation = explanation


class ImageNotFound(EngineError):
    """No image by that name or id (a 404 that says so)."""


class EngineGone(EngineError, ConnectionError):
    """The connection to the engine failed or broke mid-call: not the engine's answer."""


class Image(Protocol):
    """An image on the engine (`docker image inspect`'s attrs)."""

    @property
    def id(self) -> str: ...

    @property
    def tags(self) -> Sequence[str]: ...

    @property
    def attrs(self) -> dict[str, Any]: ...

    def tag(self, repository: str, tag: str | None = None) -> bool:
        """Name it (again): the engine records when (LastTagTime), which `base prune` goes by."""
        ...


class Container(Protocol):
    """A container gpux-pack created: export, warmup, run."""

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def labels(self) -> dict[str, str]: ...

    @property
    def attrs(self) -> dict[str, Any]: ...

    def reload(self) -> None:
        """Read its state again (status, attrs: the published ports)."""
        ...

    def start(self) -> None: ...

    def stop(self, *, timeout: int | None = None) -> None: ...

    def remove(self, *, force: bool = False) -> None: ...

    def wait(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Until it exits: {"StatusCode": ...}."""
        ...

    def logs(self, *, stdout: bool = True, stderr: bool = True, tail: str | int = "all") -> bytes: ...

    def export(self, *, chunk_size: int = 2 << 20) -> Iterator[bytes]:
        """Its file system as a tar stream (`docker export`)."""
        ...

    def get_archive(self, path: str) -> tuple[Iterator[bytes], dict[str, Any]]:
        """A path of it as a tar stream (`docker cp`), and the path's stat."""
        ...

    def exec_run(self, cmd: list[str]) -> tuple[int | None, bytes]:
        """Run a command in it: (exit code, output)."""
        ...


class Images(Protocol):
    def get(self, name: str) -> Image:
        """The image a name or id names; ImageNotFound when there is none."""
        ...

    def remove(self, image: str, *, force: bool = False, noprune: bool = False) -> None:
        """`docker rmi`: a tag goes; the image with its last tag (or by id)."""
        ...

    def list(self, *, filters: dict[str, Any] | None = None) -> Sequence[Image]: ...


class Containers(Protocol):
    def list(self, *, all: bool = False, filters: dict[str, Any] | None = None) -> Sequence[Container]: ...

    def create(self, image: str, **kwargs: Any) -> Container:
        """A container, not started; kwargs: the SDK's container options (docker run's flags)."""
        ...

    def run(self, image: str, **kwargs: Any) -> Container:
        """Create and start (gpux-pack passes detach=True: the container, not its output)."""
        ...


class Api(Protocol):
    """The engine's HTTP API, where the SDK's objects do not reach: streamed builds, pulls,
    pushes and loads (their progress events, decoded), and the raw inspect and history."""

    @property
    def base_url(self) -> str:
        """Where the engine listens: a unix socket is a local engine, whose /dev is this host's."""
        ...

    @property
    def credstore_env(self) -> dict[str, str] | None:
        """The environment of the Docker credential helpers, for reading registry logins."""
        ...

    def build(self, *, fileobj: IO[bytes] | Iterable[bytes], custom_context: bool = False, encoding: str | None = None,
              tag: str | None = None, rm: bool = False, forcerm: bool = False, pull: bool = False,
              nocache: bool = False, decode: bool = False, platform: str | None = None,
              labels: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
        """Build a context (a tar as a file or an iterator of its bytes) with the classic builder."""
        ...

    def pull(self, repository: str, *, tag: str | None = None, stream: bool = False, decode: bool = False,
             platform: str | None = None) -> Any:
        """stream and decode: an iterator of progress events; otherwise the engine's whole answer."""
        ...

    def push(self, repository: str, *, tag: str | None = None, stream: bool = False,
             decode: bool = False) -> Iterator[dict[str, Any]]: ...

    def load_image(self, data: Iterable[bytes], *, quiet: bool | None = None) -> Iterator[dict[str, Any]]:
        """`docker load` of a docker-save archive, sent as a stream of its bytes."""
        ...

    def inspect_image(self, image: str) -> dict[str, Any]: ...

    def history(self, image: str) -> list[dict[str, Any]]:
        """`docker history`, newest first."""
        ...

    def containers(self, *, all: bool = False) -> list[dict[str, Any]]:
        """`docker ps` rows (ImageID: what `base prune` keeps)."""
        ...


class Engine(Protocol):
    """A connected Docker engine (engine.connect): what every function that talks to it takes."""

    @property
    def images(self) -> Images: ...

    @property
    def containers(self) -> Containers: ...

    @property
    def api(self) -> Api: ...

    def info(self) -> dict[str, Any]:
        """`docker info`: runtimes and devices (the host's accelerators), the insecure registries."""
        ...

    def version(self) -> dict[str, Any]:
        """The engine's version: the assembler's layer-tar check is recorded per version."""
        ...

    def ping(self) -> bool: ...
