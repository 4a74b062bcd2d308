"""An OCI image index under a tag, written through the registry's HTTP API: the engine pushes one
image per platform, but has no API for the index that joins them (buildx and `docker manifest`
are CLI plugins; we need neither). The same client reads manifests and config blobs for an image
that is only in a registry (remote.py). Credentials are the user's Docker config, read by the
Docker SDK (logins, credential helpers and stores); the token dance is the distribution spec's
(401 + WWW-Authenticate Basic or Bearer). A registry the engine treats as insecure (loopback, or
listed in insecure-registries) may answer over plain HTTP, as the engine allows.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any

from gpux_pack.engine.interface import Engine
from gpux_pack.errors import DockerError
from gpux_pack.registry.push import explain
from gpux_pack.reference import parse_reference

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFESTS = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")
LISTS = (INDEX, "application/vnd.docker.distribution.manifest.list.v2+json")
TIMEOUT = 30


@dataclass(frozen=True)
class Member:
    """One platform's pushed image, as the index lists it."""

    platform: str  # linux/amd64
    digest: str  # sha256:...


@dataclass(frozen=True)
class Index:
    tag: str  # repo:tag
    digest: str  # repo@sha256:... of the index
    members: tuple[tuple[str, str], ...]  # (platform, repo@sha256:...)


def platform_of(platform: str) -> dict[str, str]:
    """linux/arm64 -> the descriptor's platform object (arm64 is v8, as registries list it)."""
    os_, arch = platform.split("/")[:2]
    return {"architecture": arch, "os": os_, **({"variant": "v8"} if arch == "arm64" else {})}


MAX_MANIFEST = 4 << 20  # Distribution's own bound on a manifest: a registry that sends more is cut off there


@dataclass(frozen=True)
class Manifest:
    """A manifest or index as the registry serves it, its digest checked against its bytes."""

    body: dict[str, Any]
    media: str
    digest: str  # sha256:...

    @property
    def is_list(self) -> bool:
        return self.media in LISTS or ("manifests" in self.body and "config" not in self.body)


class Registry:
    """One repository of one registry, with the user's credentials (client: the engine, for its
    credential-store environment and insecure-registries list; None reads the Docker config alone)."""

    actions = "pull,push"  # what a Bearer token is asked for

    def __init__(self, client: Engine | None, repository: str, actions: str = "pull,push") -> None:
        import docker.auth

        self.name, self.path = parse_reference(repository).registry_path
        self.host = "registry-1.docker.io" if self.name == "docker.io" else self.name
        self.repository = repository
        self.actions = actions
        env = getattr(getattr(client, "api", None), "credstore_env", None)
        self.auth = docker.auth.resolve_authconfig(docker.auth.load_config(credstore_env=env), self.name, env) or {}
        self.insecure = _insecure(client, self.name)
        self.token: str | None = None
        self.scheme = "https"

    def _basic(self) -> tuple[str, str] | None:
        if self.auth.get("username") and self.auth.get("password"):
            return self.auth["username"], self.auth["password"]
        return None

    def request(self, method: str, path: str, headers: dict[str, str] | None = None, **kw: Any) -> Any:
        """One call to /v2/<name>/..., answering the registry's challenge once when it asks."""
        import requests

        for attempt in (1, 2):
            token = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            try:
                response = self._send(method, f"/v2/{self.path}/{path}", headers={**(headers or {}), **token},
                                      auth=None if self.token else self._basic(), **kw)
            except requests.RequestException as e:
                raise DockerError(f"registry {self.name} unreachable ({_reason(e)})") from None
            if response.status_code != 401 or attempt == 2 or \
                    not self._login(response.headers.get("WWW-Authenticate", "")):
                return response
        raise AssertionError("unreachable")

    def _send(self, method: str, url: str, **kw: Any) -> Any:
        import requests

        try:
            return requests.request(method, f"{self.scheme}://{self.host}{url}", timeout=TIMEOUT, **kw)
        except (requests.exceptions.SSLError, requests.exceptions.ConnectionError):
            if not self.insecure or self.scheme == "http":
                raise
            self.scheme = "http"  # as the engine does for an insecure registry
            return requests.request(method, f"http://{self.host}{url}", timeout=TIMEOUT, **kw)

    def _login(self, challenge: str) -> bool:
        """Answer a Bearer challenge with a token for pull and push on this repository."""
        import requests

        if not challenge.lower().startswith("bearer "):
            return False  # Basic: the credentials went with the request already
        fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if "realm" not in fields:
            return False
        if not fields["realm"].startswith("https://") and not self.insecure:
            raise DockerError(f"registry {self.name} asks for credentials at {fields['realm']!r}, not HTTPS: "
                              "refusing to send them in the clear")
        params = {"service": fields.get("service", ""), "scope": f"repository:{self.path}:{self.actions}"}
        try:
            response = requests.get(fields["realm"], params=params, auth=self._basic(), timeout=TIMEOUT)
        except requests.RequestException as e:
            raise DockerError(f"registry {self.name}: token service unreachable ({type(e).__name__})") from None
        if response.status_code != 200:
            return False
        body = response.json()
        self.token = body.get("token") or body.get("access_token")
        return bool(self.token)

    def manifest(self, reference: str) -> Manifest:
        """The manifest or index under a tag or digest (any of the OCI and Docker v2 types). Its
        digest is the sha256 of the bytes served, which must equal the registry's
        Docker-Content-Digest and, for a digest reference, that digest. 404 is KeyError: the
        caller says which image is unknown."""
        response = self.request("GET", f"manifests/{reference}", headers={"Accept": ", ".join(MANIFESTS + LISTS)},
                                stream=True)
        if response.status_code == 404:
            raise KeyError(self._errors(response) or "HTTP 404")
        self.check(response, f"manifest {self.repository}:{reference}" if ":" not in reference else
                   f"manifest {self.repository}@{reference}")
        body = bytearray()
        for chunk in response.iter_content(1 << 16):  # what a registry sends, at most a manifest's bound
            body += chunk
            if len(body) > MAX_MANIFEST:
                response.close()
                raise DockerError(f"registry {self.name} sent more than {MAX_MANIFEST >> 20} MiB for the manifest "
                                  f"{self.repository} {reference}: refused")
        body = bytes(body)
        digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
        claimed = response.headers.get("Docker-Content-Digest") or digest
        if digest != claimed or (reference.startswith("sha256:") and digest != reference):
            raise DockerError(f"registry {self.name} returned other bytes for {self.repository} {reference} "
                              f"(sha256 of the body {digest}, expected {reference if ':' in reference else claimed})")
        try:
            parsed = json.loads(body)
        except ValueError:
            raise DockerError(f"registry {self.name} returned a manifest for {self.repository} {reference} "
                              "that is not JSON") from None
        if not isinstance(parsed, dict):
            raise DockerError(f"registry {self.name} returned a malformed manifest for {self.repository} {reference}")
        media = parsed.get("mediaType") or response.headers.get("Content-Type", "").split(";")[0].strip()
        if media not in MANIFESTS + LISTS and not ("manifests" in parsed or "config" in parsed):
            raise DockerError(f"{self.repository} {reference} is a {media or 'manifest of no type'}, not an image "
                              "(schema 1 and artifacts are not read)")
        return Manifest(parsed, media, digest)

    def blob(self, digest: str) -> bytes:
        """A blob's bytes (a config: small), checked against its digest."""
        response = self.request("GET", f"blobs/{digest}")
        self.check(response, f"blob {self.repository}@{digest}")
        if f"sha256:{hashlib.sha256(response.content).hexdigest()}" != digest:
            raise DockerError(f"registry {self.name} returned other bytes for blob {self.repository}@{digest}")
        return response.content

    def descriptor(self, member: Member) -> dict[str, Any]:
        """The index entry for one pushed manifest: its media type and size as the registry has it."""
        response = self.request("GET", f"manifests/{member.digest}", headers={"Accept": ", ".join(MANIFESTS)})
        self.check(response, f"manifest {member.digest}")
        body = response.content
        if f"sha256:{hashlib.sha256(body).hexdigest()}" != member.digest:
            raise DockerError(f"registry {self.name} returned other bytes for {self.repository}@{member.digest}")
        media = json.loads(body).get("mediaType") or response.headers.get("Content-Type", "").split(";")[0]
        if media not in MANIFESTS:
            raise DockerError(f"{self.repository}@{member.digest} is a {media or 'manifest of no type'}, not an image")
        return {"mediaType": media, "digest": member.digest, "size": len(body), "platform": platform_of(member.platform)}

    def put_index(self, tag: str, members: list[Member]) -> Index:
        index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [self.descriptor(m) for m in members]}
        body = json.dumps(index, separators=(",", ":")).encode()
        response = self.request("PUT", f"manifests/{tag}", data=body, headers={"Content-Type": INDEX})
        self.check(response, f"index {self.repository}:{tag}")
        digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
        if response.headers.get("Docker-Content-Digest", digest) != digest:
            raise DockerError(f"registry {self.name} stored the index of {self.repository}:{tag} under another digest")
        return Index(f"{self.repository}:{tag}", f"{self.repository}@{digest}",
                     tuple((m.platform, f"{self.repository}@{m.digest}") for m in members))

    @staticmethod
    def _errors(response: Any) -> str:
        """The registry's error codes and messages (distribution spec's errors[]), one line."""
        try:
            errors = response.json().get("errors") or []
            return "; ".join(f"{e.get('code', '')} {e.get('message', '')}".strip() for e in errors)[:300]
        except (ValueError, AttributeError, TypeError):
            return ""

    def check(self, response: Any, what: str) -> None:
        if response.status_code < 300:
            return
        text = self._errors(response) or f"HTTP {response.status_code}"
        if response.status_code == 401 and "unauthorized" not in text.lower():
            text = f"unauthorized: {text}"
        raise DockerError(f"{what} on {self.name} failed: {explain(text, self.name)}")


def _reason(e: Exception) -> str:
    """requests' error in a few words (its text nests the URL and pool details several deep)."""
    text = str(e)
    for marker, said in (("Connection refused", "connection refused"), ("Name or service not known", "unknown host"),
                         ("Temporary failure in name resolution", "unknown host"), ("timed out", "timed out"),
                         ("CERTIFICATE_VERIFY_FAILED", "TLS certificate not trusted")):
        if marker in text:
            return said
    return f"{type(e).__name__}: {text[:200]}"


def _insecure(client: Engine | None, registry: str) -> bool:
    """Whether the engine would talk plain HTTP to this registry (loopback, or its insecure list)."""
    host = registry.rsplit(":", 1)[0].strip("[]") if registry.count(":") <= 1 or registry.startswith("[") else registry
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and address.is_loopback:
        return True
    try:
        config = client.info().get("RegistryConfig") or {}
    except Exception:
        return False
    if (config.get("IndexConfigs") or {}).get(registry, {}).get("Secure") is False:
        return True
    if address is not None:
        for cidr in config.get("InsecureRegistryCIDRs") or []:
            try:
                if address in ipaddress.ip_network(cidr):
                    return True
            except ValueError:
                continue
    return False


def push_index(client: Engine, tag: str, members: list[Member]) -> Index:
    """Write the index for `members` (already pushed to tag's repository) under tag."""
    repo, name = parse_reference(tag).repository_tag
    return Registry(client, repo).put_index(name, members)
