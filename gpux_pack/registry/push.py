"""`gpux-pack push IMAGE...` and `build --push`: images to their registry through the Docker
SDK, which reads the user's Docker config (DOCKER_CONFIG, `docker login`, credential helpers
and stores) itself. The result is the pushed digest, `name@sha256:...`, the one reference that
always means these bytes (deploy manifests pin it). A refusal is one line: authentication,
TLS, an unknown repository, an unreachable registry.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from gpux_pack.engine.interface import Engine, ImageNotFound
from gpux_pack.errors import DockerError, UsageError
from gpux_pack.reference import parse_reference
from gpux_pack.ui import Reporter


@dataclass(frozen=True)
class Pushed:
    tag: str
    digest: str  # name@sha256:...
    size: int | None
    seconds: float


def push(client: Engine, ref: str, ui: Reporter) -> Pushed:
    """Push one tagged image; its digest reference."""
    import docker

    try:
        reference = parse_reference(ref)
    except ValueError as e:
        raise UsageError(f"{ref}: {e}") from None
    repo, tag = reference.repository_tag
    registry = reference.registry_path[0]
    try:
        client.images.get(f"{repo}:{tag}")
    except ImageNotFound:
        raise UsageError(f"{ref}: no such image on this Docker engine (build it first)") from None
    started = time.perf_counter()
    ui.info(f"pushing {repo}:{tag} to {registry}")
    digest, size, last = None, None, {}
    try:
        for event in client.api.push(repo, tag=tag, stream=True, decode=True):
            if event.get("error") or event.get("errorDetail"):
                message = (event.get("errorDetail") or {}).get("message") or event.get("error") or ""
                raise DockerError(f"push of {repo}:{tag} to {registry} failed: {explain(message, registry)}")
            aux = event.get("aux")
            if isinstance(aux, dict) and aux.get("Digest"):
                digest, size = aux["Digest"], aux.get("Size")
            layer, status = event.get("id"), event.get("status", "")
            if layer and status in ("Pushed", "Layer already exists", "Mounted from") and last.get(layer) != status:
                last[layer] = status
                ui.info(f"  {layer}: {status.lower()}")
    except DockerError:
        raise
    except docker.errors.APIError as e:
        raise DockerError(f"push of {repo}:{tag} to {registry} failed: {explain(str(e), registry)}") from None
    except Exception as e:  # the connection to the engine broke
        raise DockerError(f"push of {repo}:{tag} failed: {str(e).splitlines()[0][:300]}") from None
    if not digest:
        raise DockerError(f"push of {repo}:{tag} to {registry} reported no digest")
    return Pushed(f"{repo}:{tag}", f"{repo}@{digest}", size, time.perf_counter() - started)


def explain(message: str, registry: str) -> str:
    """The engine's error as the one thing to do about it."""
    text = " ".join(message.split())[:300]
    low = text.lower()
    if "unauthorized" in low or "authentication required" in low or "no basic auth credentials" in low or \
            "denied" in low:
        return f"authentication failed ({text}); log in with `docker login {registry}` or check the credentials"
    if "x509" in low or "certificate" in low or "tls" in low or "server gave http response to https client" in low:
        return f"TLS error ({text}); the registry's certificate must be trusted by the engine, or the registry " \
               "listed in its insecure-registries"
    if "name unknown" in low or "repository name not known" in low or "does not exist" in low or \
            "not found" in low:
        return f"unknown repository ({text}); create it in the registry or fix the name"
    if "connection refused" in low or "no such host" in low or "i/o timeout" in low or "dial tcp" in low:
        return f"registry unreachable ({text})"
    return text


def digest_of(client: Engine | None, ref: str) -> str | None:
    """The local image's pushed digest reference for its repository, when it has one."""
    try:
        image = client.images.get(ref)
    except Exception:
        return None
    repo = parse_reference(ref).repository_tag[0]
    for item in image.attrs.get("RepoDigests") or []:
        if item.split("@", 1)[0] == repo and re.search(r"@sha256:[0-9a-f]{64}$", item):
            return item
    return None
