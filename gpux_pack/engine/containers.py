"""Starting an image the way it is meant to run (`run`, `predict IMAGE`, `bench`), without
remembering flags.

The image's labels say its provider and port; the provider's table entry says which devices it
needs (`--gpus all`, or /dev/kfd + /dev/dri + the video group). The container runs with a
read-only root, a tmpfs at /tmp and a named volume at GPUX_CACHE_DIR (compiled caches survive
restarts, shared by containers of the same model), the port published on 127.0.0.1 unless
--bind says otherwise. A host that cannot give the device is one line and exit 1; with
--cpu-fallback the container runs on CPU instead (GPUX_PROVIDERS=cpu: no fallback warning).
"""

from __future__ import annotations

import ipaddress
import re
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from gpux_pack import engine, providers
from gpux_pack.engine import image_labels
from gpux_pack.engine.interface import Container, Engine
from gpux_pack.errors import DockerError, PackError, UsageError
from gpux_pack.runtime.contract import CACHE_DIR
from gpux_pack.providers import Devices
from gpux_pack.ui import Reporter

ROLE = "run"


class NoDevice(PackError):
    """The host cannot give the image's accelerator: exit 1."""

    exit_code = 1


@dataclass(frozen=True)
class Started:
    container: Container
    url: str
    provider: str
    on_cpu: bool
    volume: str


def start_container(client: Engine, ref: str, ui: Reporter, port: int | None = None, bind: str = "127.0.0.1",
                    cpu_fallback: bool = False, timeout: float = 300) -> Started:
    """Start the image and wait until it is ready (or has failed: its last log lines)."""
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        raise UsageError(f"--bind {bind!r}: expected an IP address such as 127.0.0.1 or 0.0.0.0") from None
    image = image_labels.read(client, ref)
    name, inside = image.provider, image.port
    provider = providers.get(name)
    ok, why = engine.host_info(client).can_run(provider)
    devices, env = providers.devices_for(provider), {}
    if not ok:
        if not cpu_fallback:
            raise NoDevice(f"{ref} {why}; this Docker host has none (run with --cpu-fallback to serve on CPU)")
        ui.info(f"{name} {why}, which this host lacks: serving on CPU (--cpu-fallback)")
        devices, env = Devices(), {"GPUX_PROVIDERS": "cpu"}
    try:
        container = client.containers.run(
            image.id, detach=True, environment=env, labels={engine.ROLE_LABEL: ROLE, "io.gpux.image": ref[:200]},
            **container_options(image, devices, bind, port),
        )
    except Exception as e:
        raise DockerError(f"cannot start {ref}: {str(e).splitlines()[0][:300]}") from None
    try:
        container.reload()
        published = container.attrs["NetworkSettings"]["Ports"][f"{inside}/tcp"][0]["HostPort"]
        host = "127.0.0.1" if bind in ("0.0.0.0", "::") else bind
        url = f"http://{host}:{published}" if ":" not in host else f"http://[{host}]:{published}"
        wait_ready(container, url, timeout)
    except BaseException:
        engine.remove_container(container)
        raise
    return Started(container, url, name, not ok, cache_volume(image.model_name))


def cache_volume(model_name: str) -> str:
    """The named volume at GPUX_CACHE_DIR: one per model, so its containers share their caches."""
    return "gpux-cache-" + re.sub(r"[^a-z0-9_.-]", "-", model_name.lower())[:60]


def container_options(image: image_labels.GpuxImage, devices: Devices, bind: str, port: int | None) -> dict[str, Any]:
    """The Docker SDK's options that run an image as it is meant to run: read-only root, a
    tmpfs /tmp, the cache volume, the ports published on bind, the provider's devices."""
    ports: dict[str, Any] = {f"{image.port}/tcp": (bind, port)}
    if image.grpc_port:
        ports[f"{image.grpc_port}/tcp"] = (bind, None)
    return {"read_only": True, "tmpfs": {"/tmp": "rw,size=1g"}, "ports": ports,
            "volumes": {cache_volume(image.model_name): {"bind": CACHE_DIR, "mode": "rw"}},
            **engine.container_devices(devices)}


def wait_ready(container: Container, url: str, timeout: float) -> None:
    """Until /v2/health/ready answers 200; a container that exits first is one line with its last."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        container.reload()
        if container.status in ("exited", "dead"):
            tail = container.logs(tail=5).decode(errors="replace").strip().splitlines()
            code = container.attrs["State"].get("ExitCode")
            raise DockerError(f"the container exited ({code}) before it was ready: {tail[-1] if tail else 'no output'}")
        try:
            with urllib.request.urlopen(url + "/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise DockerError(f"the container was not ready within {timeout:g}s ({url}/v2/health/ready)")
