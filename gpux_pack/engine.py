"""Talking to the Docker engine (outside of builds): connect, host facts, base-image probe,
image labels. Every engine failure becomes one DockerError line with a hint."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from gpux_pack.errors import DockerError, PackError, UsageError
from gpux_pack.providers import BaseImage, HostInfo
from gpux_pack.reference import parse_reference
from gpux_pack.wheels import ARCHES, cache_dir

# Every container the CLI creates carries this label, so a test (or a user) can check that
# none is ever left behind: `docker ps -a --filter label=io.gpux.pack.role`.
ROLE_LABEL = "io.gpux.pack.role"


def connect() -> Any:
    import docker

    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as e:
        reason = _short(e)
        raise DockerError(
            f"cannot reach the Docker engine at {where} ({reason}); start Docker, or set DOCKER_HOST"
        ) from None
    return client


def try_connect() -> Any | None:
    try:
        return connect()
    except DockerError:
        return None


def _short(e: BaseException) -> str:
    text = str(e)
    for marker in ("Connection refused", "No such file or directory", "Permission denied", "timed out"):
        if marker in text:
            return marker.lower()
    return text.splitlines()[0][:160] if text else type(e).__name__


# ---------------------------------------------------------------------------------------------
# host


def host_info(client: Any, dev: Path = Path("/dev"), sys_drm: Path = Path("/sys/class/drm")) -> HostInfo:
    """What the Docker host can give containers. /dev is only meaningful for a local engine."""
    try:
        info = client.info()
    except Exception as e:
        raise DockerError(f"docker info failed: {_short(e)}") from None
    local = _is_local(client)
    return host_from(info, dev if local else None, sys_drm if local else None)


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


def _is_local(client: Any) -> bool:
    url = str(getattr(client.api, "base_url", ""))
    return url.startswith(("http+unix://", "http+docker://localunixsocket")) or "localhost" in url


# ---------------------------------------------------------------------------------------------
# base image

_PROBE = (
    "import json, platform, sys; "
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], "
    "'libc': platform.libc_ver(), 'machine': platform.machine()}))"
)


def probe_base(client: Any, base: BaseImage, pull: bool, log: Callable[[str], None]) -> BaseImage | None:
    """Read Python, glibc and architecture from the base image itself (cached by image id).
    None when the image is absent and may not be pulled."""
    import docker

    image = base.image
    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound:
        if not pull:
            return None
        log(f"pulling base image {image}")
        repo, tag = parse_reference(image).repository_tag
        try:
            client.api.pull(repo, tag=tag)
            img = client.images.get(image)
        except Exception as e:
            raise DockerError(
                f"base image {image} is not present and cannot be pulled ({_short(e)}); "
                "pull or load it, or pick another with --base-image"
            ) from None
    except docker.errors.APIError as e:
        raise DockerError(f"cannot inspect base image {image}: {_short(e)}") from None

    cached = cache_dir() / "probes" / f"{img.id.replace(':', '-')}.json"
    if cached.is_file():
        facts = json.loads(cached.read_text())
    else:
        facts = _run_probe(client, image)
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(facts))
    lib, version = facts["libc"]
    if lib != "glibc":
        raise UsageError(f"{image} has no glibc (musl/Alpine?); ONNX Runtime wheels need a glibc base")
    major, minor = (int(p) for p in version.split(".")[:2])
    arch = ARCHES.get(f"linux/{img.attrs.get('Architecture', 'amd64')}", facts["machine"])
    return replace(base, python=facts["python"], glibc=(major, minor), arch=arch, probed=True)


def _run_probe(client: Any, image: str) -> dict[str, Any]:
    """Run python3 in the base image. The container is removed on every path: a base without
    python3 fails at start, after the container exists."""
    import docker

    container = None
    try:
        container = client.containers.create(
            image, entrypoint=["python3", "-c", _PROBE], network_disabled=True, user="0",
            labels={ROLE_LABEL: "probe"},
        )  # fmt: skip
        container.start()
        code = container.wait(timeout=120).get("StatusCode")
        out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        if code != 0:
            err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace").strip().splitlines()
            raise UsageError(f"{image}: python3 failed in the base image (exit {code}: {err[-1][:200] if err else ''})")
        return json.loads(out.strip().splitlines()[-1])
    except PackError:
        raise
    except docker.errors.APIError as e:
        if "executable file not found" in str(e) or "no such file" in str(e).lower():
            raise UsageError(
                f"{image} has no python3 on PATH; use a base with Python 3.11+ (e.g. python:3.11-slim)"
            ) from None
        raise DockerError(f"cannot run base image {image}: {_short(e)}") from None
    except (ValueError, IndexError, KeyError, TypeError):
        raise UsageError(f"{image}: cannot read its Python version") from None
    except Exception as e:  # the engine went away, or the probe hung past its timeout
        raise DockerError(f"cannot run base image {image}: {_short(e)}") from None
    finally:
        if container is not None:
            remove_container(container)


def remove_container(container: Any) -> None:
    """Remove a container we created, whatever state it is in; never raises."""
    try:
        container.remove(force=True)
    except Exception:
        pass


# ---------------------------------------------------------------------------------------------
# images


def image_exists(client: Any, ref: str) -> bool:
    import docker

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as e:
        raise DockerError(f"cannot inspect {ref}: {_short(e)}") from None


def image_labels(client: Any, ref: str) -> dict[str, Any]:
    import docker

    try:
        img = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise UsageError(f"{ref}: no such image") from None
    except docker.errors.APIError as e:
        raise DockerError(f"cannot inspect {ref}: {_short(e)}") from None
    labels = img.labels or {}
    return {
        "image": ref,
        "id": img.id,
        "size_bytes": img.attrs.get("Size"),
        "labels": {k: v for k, v in sorted(labels.items()) if k.startswith(("io.gpux.", "org.opencontainers."))},
    }
