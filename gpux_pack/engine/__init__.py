"""Talking to the Docker engine (outside of builds): connect, host facts, base images, images
and containers. Every engine failure becomes one DockerError line with a hint.

Beside it: interface.py (the part of the engine client gpux-pack uses, as types: what every
function here takes, and the errors it raises), local.py (a local engine's client, standard
library only), sdk.py (the Docker SDK's, for any other engine), rootfs.py (a base image's files,
read on the host) and image_labels.py (what an image built by gpux-pack says of itself)."""

from __future__ import annotations

import os
import re
import socket
import weakref
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from gpux_pack.engine import unix_socket
from gpux_pack.engine.interface import Container, Engine, EngineError, ImageNotFound
from gpux_pack.engine.local import LocalEngine
from gpux_pack.engine.sdk import SdkEngine
from gpux_pack.errors import DockerError, UsageError
from gpux_pack.providers import Devices, HostInfo
from gpux_pack.reference import parse_reference
from gpux_pack.runtime.contract import cpu_vendor

# Every container the CLI creates carries this label, so a test (or a user) can check that
# none is ever left behind: `docker ps -a --filter label=io.gpux.pack.role`.
ROLE_LABEL = "io.gpux.pack.role"
OWNER_LABEL = "io.gpux.pack.owner"  # host:pid of the gpux-pack that created it
LEFTOVER_AGE = 3600  # a never-started container of ours this old is a leftover, whoever made it


def container_labels(role: str) -> dict[str, str]:
    return {ROLE_LABEL: role, OWNER_LABEL: f"{socket.gethostname()}:{os.getpid()}"}


def remove_leftovers(client: Engine, role: str) -> int:
    """Remove the containers of this role a killed or disconnected gpux-pack left behind: never
    started, and made by a process of this host that has gone (or an hour ago, by any host: a
    process on another host sharing the engine cannot be asked). A live build's are kept.
    Never raises; how many went."""
    from datetime import datetime, timezone

    removed = 0
    try:
        found = client.containers.list(all=True, filters={"label": f"{ROLE_LABEL}={role}", "status": "created"})
    except Exception:
        return 0
    now = datetime.now(timezone.utc)
    for container in found:
        try:
            owner = (container.labels or {}).get(OWNER_LABEL, "")
            host, _, pid = owner.rpartition(":")
            created = datetime.fromisoformat(container.attrs["Created"][:19]).replace(tzinfo=timezone.utc)
            gone = host == socket.gethostname() and pid.isdigit() and not _alive(int(pid))
            if gone or not owner or (now - created).total_seconds() > LEFTOVER_AGE:
                container.remove(force=True)
                removed += 1
        except Exception:
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def connect() -> Engine:
    """A local engine that answers /_ping is spoken to with the standard library (local.py);
    any other, or one that did not answer, through the Docker SDK, which says why it cannot."""
    version = unix_socket.api_version()
    if version is not None:
        return LocalEngine(unix_socket.socket_path(), version)
    import docker

    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=600, version="auto")
        client.ping()
    except Exception as e:
        reason = short_error(e)
        raise DockerError(
            f"cannot reach the Docker engine at {where} ({reason}); start Docker, or set DOCKER_HOST"
        ) from None
    return SdkEngine(client)


def try_connect() -> Engine | None:
    try:
        return connect()
    except DockerError:
        return None


def short_error(e: BaseException) -> str:
    """An engine error in a few words (its first line, or what kind of refusal it was)."""
    text = str(e)
    for marker in ("Connection refused", "No such file or directory", "Permission denied", "timed out"):
        if marker in text:
            return marker.lower()
    return text.splitlines()[0][:160] if text else type(e).__name__


# ---------------------------------------------------------------------------------------------
# host


_HOSTS: "weakref.WeakKeyDictionary[Engine, HostInfo]" = weakref.WeakKeyDictionary()  # asked once per client


def host_info(client: Engine, dev: Path = Path("/dev"), sys_drm: Path = Path("/sys/class/drm")) -> HostInfo:
    """What the Docker host can give containers. /dev is only meaningful for a local engine.
    Asked once per client: the provider's choice and a baked warmup both want it."""
    if dev == Path("/dev") and sys_drm == Path("/sys/class/drm") and client in _HOSTS:
        return _HOSTS[client]
    host = _host_info(client, dev, sys_drm)
    if dev == Path("/dev") and sys_drm == Path("/sys/class/drm"):
        _HOSTS[client] = host
    return host


def _host_info(client: Engine, dev: Path, sys_drm: Path) -> HostInfo:
    try:
        info = client.info()
    except Exception as e:
        raise DockerError(f"docker info failed: {short_error(e)}") from None
    local = _is_local(client)
    host = host_from(info, dev if local else None, sys_drm if local else None)
    return replace(host, cpu=cpu_vendor()) if local else host


def host_from(info: dict[str, Any], dev: Path | None, sys_drm: Path | None) -> HostInfo:
    """Pure: `docker info` payload (+ device paths of a local host) -> HostInfo."""
    runtimes = set((info.get("Runtimes") or {}).keys())
    cdi = [d.get("ID", "") for d in (info.get("DiscoveredDevices") or []) if isinstance(d, dict)]
    nvidia = "nvidia" in runtimes or any(i.startswith("nvidia.com/gpu") for i in cdi)
    amd = bool(dev and (dev / "kfd").exists()) or any(i.startswith("amd.com/gpu") for i in cdi)
    intel = False
    if dev and (dev / "dri").is_dir() and sys_drm and sys_drm.is_dir():
        for vendor in sys_drm.glob("card*/device/vendor"):
            try:
                intel |= vendor.read_text().strip().lower() == "0x8086"
            except OSError:
                pass
    details = []
    if nvidia:
        details.append("nvidia runtime" if "nvidia" in runtimes else "NVIDIA CDI devices")
    if amd:
        details.append("/dev/kfd")
    if intel:
        details.append("Intel GPU at /dev/dri")
    return HostInfo(nvidia=nvidia, amd=amd, intel_gpu=intel, details=", ".join(details) or "no GPU")


def _is_local(client: Engine) -> bool:
    url = str(getattr(client.api, "base_url", ""))
    return url.startswith(("http+unix://", "http+docker://localunixsocket")) or "localhost" in url


# ---------------------------------------------------------------------------------------------
# base image


def base_image(client: Engine, image: str, pull: bool, log: Callable[[str], None],
               platform: str | None = None) -> dict[str, Any] | None:
    """The base image's `docker image inspect` attributes, pulled first when absent (or present
    for another platform than the one asked for: a multi-platform base serves each in turn) and
    allowed; None when absent and not to be pulled. Nothing runs in it."""
    try:
        attrs = client.images.get(image).attrs
        if platform is None or not pull or _platform_of(attrs) == _normal(platform):
            return attrs
    except ImageNotFound:
        if not pull:
            return None
    except EngineError as e:
        raise DockerError(f"cannot inspect base image {image}: {short_error(e)}") from None
    log(f"pulling base image {image}{f' for {platform}' if platform else ''}")
    repo, tag = parse_reference(image).repository_tag
    try:
        client.api.pull(repo, tag=tag, platform=platform)
        return client.images.get(image).attrs
    except Exception as e:
        raise DockerError(
            f"base image {image} is not present{f' for {platform}' if platform else ''} and cannot be pulled "
            f"({short_error(e)}); pull or load it, or pick another with --base-image"
        ) from None


def _platform_of(attrs: dict[str, Any]) -> str:
    return _normal(f"{attrs.get('Os') or 'linux'}/{attrs.get('Architecture') or 'amd64'}")


def _normal(platform: str) -> str:
    """linux/arm64/v8 -> linux/arm64: the variant does not choose between our platforms."""
    return "/".join(platform.split("/")[:2])


def remove_container(container: Container) -> None:
    """Remove a container we created, whatever state it is in; never raises."""
    try:
        container.remove(force=True)
    except Exception:
        pass


# ---------------------------------------------------------------------------------------------
# images


def image_exists(client: Engine, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except ImageNotFound:
        return False
    except EngineError as e:
        raise DockerError(f"cannot inspect {ref}: {short_error(e)}") from None


PULL_POLICIES = ("missing", "always", "never")  # `docker run --pull`'s


def ensure_image(client: Engine, ref: str, policy: str, log: Callable[[str], None]) -> None:
    """Pull ref as `docker run --pull POLICY` does: missing (pull when this engine lacks it),
    always, or never. The engine pulls with the credentials of your Docker config (docker
    login, credential helpers), which the SDK reads and sends; a progress line every few layers.
    A pull that fails for an image this engine lacks is a usage error (exit 2: no such image
    anywhere it looked), one for an image it has (--pull always) an engine failure (exit 1)."""
    try:
        parsed = parse_reference(ref)
    except ValueError:  # not a reference: the command's own reading of it says so in one line
        return
    present = image_exists(client, ref)
    if policy == "never" or (policy == "missing" and present):
        return
    repo, tag = parsed.repository_tag
    log(f"pulling {ref}")
    done: set[str] = set()
    try:
        for event in client.api.pull(repo, tag=tag, stream=True, decode=True):
            if "error" in event:
                raise _pull_failed(ref, " ".join(str(event["error"]).split())[:300], present)
            if event.get("status") in ("Pull complete", "Already exists") and event.get("id") not in done:
                done.add(event.get("id", ""))
                if len(done) % 4 == 0:
                    log(f"pulling {ref}: {len(done)} layers")
    except (DockerError, UsageError):
        raise
    except Exception as e:  # the registry refused (401, unknown manifest) or cannot be reached
        said = getattr(e, "explanation", None)  # the engine's own words, not the SDK's URL
        raise _pull_failed(ref, " ".join(str(said).split())[:300] if said else short_error(e), present) from None
    log(f"pulled {ref} ({len(done)} layers)")


def _pull_failed(ref: str, why: str, present: bool) -> Exception:
    if present:
        return DockerError(f"{ref}: cannot pull it: {why}")
    return UsageError(f"{ref}: no such image on this Docker engine, and it cannot be pulled: {why}")


def inspect_parent(client: Engine, ref: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An image's `docker image inspect` and `docker history` (newest first)."""
    try:
        return client.api.inspect_image(ref), client.api.history(ref)
    except Exception as e:
        raise DockerError(f"cannot inspect {ref}: {str(e).splitlines()[0][:300]}") from None


def remove_untagged(client: Engine, image_id: str) -> None:
    """A made image that never got its tag is garbage; one that is tagged elsewhere is kept."""
    try:
        if not client.images.get(image_id).tags:
            client.images.remove(image_id, noprune=False)
    except Exception:
        pass


def mark_used(client: Engine, ref: str) -> None:
    """Tag the image again with its own name: the engine records when (LastTagTime), which is
    what `gpux-pack base prune` goes by. An image that is not there is nothing to mark."""
    try:
        repository, tag = parse_reference(ref).repository_tag
        client.images.get(ref).tag(repository, tag)
    except Exception:
        pass


def last_tagged(attrs: dict[str, Any]) -> float:
    """When the engine last tagged an image (`docker image inspect`'s Metadata.LastTagTime), as a
    Unix time; else (a loaded image has none) when it was created; 0 when neither says."""
    return _unix((attrs.get("Metadata") or {}).get("LastTagTime")) or _unix(attrs.get("Created"))


def _unix(value: Any) -> float:
    """An RFC 3339 time of the engine's (nanoseconds, Z), as a Unix time; 0 for none or year 1."""
    text = str(value or "")
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text)
    if not m:
        return 0.0
    stamp = datetime.fromisoformat(m.group(1) + (m.group(2) or "")[:7] + m.group(3).replace("Z", "+00:00"))
    return max(stamp.timestamp(), 0.0)


def container_devices(devices: Devices) -> dict[str, Any]:
    """The Docker SDK's keyword arguments that give a container these devices."""
    import docker

    out: dict[str, Any] = {}
    if devices.gpus:
        count = -1 if devices.gpus == "all" else int(devices.gpus)
        out["device_requests"] = [docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])]
    if devices.devices:
        out["devices"] = [f"{d}:{d}:rwm" for d in devices.devices]
    if devices.groups:
        out["group_add"] = list(devices.groups)
    return out
