"""`gpux-pack deploy IMAGE --target compose|kubernetes|kserve`: manifests that run an image as
`gpux-pack run` does, for the orchestrator.

Decisions come from the image (its labels: provider, ports, model name; its pushed digest) and
the provider table (which device to request); the manifests are plain data dumped as YAML.
The image is pinned by digest (a tag can move under a running deployment): the local image's
repo digest, which `gpux-pack push` or a pull leaves. Pods are locked down (non-root uid 10001,
read-only root, no privilege escalation, every capability dropped, the runtime's seccomp
profile), with an emptyDir at /tmp and a cache volume at GPUX_CACHE_DIR, probes on
/v2/health/live and /v2/health/ready (a startup probe gives warmup its time), and a
termination grace longer than the server's drain. KServe gets the same pod as an
InferenceService whose predictor is our container: KServe reads a custom container's protocol
from its PROTOCOL env (`v2`; `protocolVersion` is a field of runtime-backed model specs only),
and RawDeployment mode makes a plain Deployment, so the pod spec applies as written (Knative
restricts probes, volumes and ports).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from gpux_pack import providers
from gpux_pack.engine import image_labels
from gpux_pack.errors import UsageError
from gpux_pack.plan import CACHE_DIR, UID
from gpux_pack.providers import DEVICES
from gpux_pack.registry.push import digest_of
from gpux_pack.runtime.settings import DRAIN_SECONDS

GRACE_SECONDS = int(DRAIN_SECONDS) + 7  # SIGTERM -> drain -> exit, with room to spare


@dataclass(frozen=True)
class Subject:
    """What the manifests need to know about the image."""

    image: str  # name@sha256:...
    name: str  # a DNS-1123 label for the deployment
    provider: str
    device: str | None  # nvidia | amd | intel | None
    port: int
    grpc_port: int | None


def subject(client: Any, ref: str) -> Subject:
    image = image_labels.read(client, ref)
    pinned = ref if re.search(r"@sha256:[0-9a-f]{64}$", ref) else digest_of(client, ref)
    if pinned is None:
        raise UsageError(f"{ref} has no registry digest to pin: push it first (gpux-pack push {ref})")
    provider = providers.get(image.provider)
    name = re.sub(r"[^a-z0-9-]+", "-", image.model_name.lower()).strip("-")[:50] or "model"
    return Subject(pinned, name, provider.name, provider.device, image.port, image.grpc_port)


def manifests(s: Subject, target: str) -> dict[str, str]:
    """File name -> YAML text."""
    if target not in TARGETS:
        raise UsageError(f"--target {target!r}: expected one of {', '.join(TARGETS)}")
    return TARGETS[target](s)


def _dump(docs: list[dict[str, Any]]) -> str:
    return "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=False) for d in docs)


def compose(s: Subject) -> dict[str, Any]:
    service: dict[str, Any] = {
        "image": s.image,
        "ports": [f"{s.port}:{s.port}"] + ([f"{s.grpc_port}:{s.grpc_port}"] if s.grpc_port else []),
        "read_only": True,
        "tmpfs": ["/tmp"],
        "volumes": [f"gpux-cache:{CACHE_DIR}"],
        "user": f"{UID}:{UID}",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "stop_grace_period": f"{GRACE_SECONDS}s",
        "restart": "unless-stopped",
    }
    device = DEVICES.get(s.device or "")
    if device and device.gpus:  # Compose's GPU reservation (the NVIDIA runtime)
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": s.device, "count": device.gpus, "capabilities": ["gpu"]}]}}}  # fmt: skip
    if device and device.devices:
        service["devices"] = list(device.devices)
    if device and device.groups:
        service["group_add"] = list(device.groups)
    return {"services": {s.name: service}, "volumes": {"gpux-cache": {}}}


def _probe(path: str, port: int, **more: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, **more}


def _labels(s: Subject) -> dict[str, str]:
    return {"app.kubernetes.io/name": s.name, "app.kubernetes.io/component": "inference",
            "app.kubernetes.io/managed-by": "gpux-pack"}  # fmt: skip


def _container(s: Subject, name: str, ports: list[dict[str, Any]]) -> dict[str, Any]:
    """The model's container: image by digest, probes (the startup probe gives warmup, a TensorRT
    build, up to 10 minutes), locked down, /tmp and the cache mounted."""
    container: dict[str, Any] = {"name": name, "image": s.image, "ports": ports}
    container.update({
        "startupProbe": _probe("/v2/health/ready", s.port, periodSeconds=2, failureThreshold=300),
        "readinessProbe": _probe("/v2/health/ready", s.port, periodSeconds=5, failureThreshold=2),
        "livenessProbe": _probe("/v2/health/live", s.port, periodSeconds=10, failureThreshold=3),
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": CACHE_DIR}],
    })  # fmt: skip
    device = DEVICES.get(s.device or "")
    if device and device.kubernetes:
        container["resources"] = {"limits": {device.kubernetes: 1}}
    return container


def _pod(containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "containers": containers,
        "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                    {"name": "cache", "emptyDir": {}}],
    }  # fmt: skip


def kubernetes(s: Subject) -> list[dict[str, Any]]:
    labels = _labels(s)
    ports = [{"name": "http", "containerPort": s.port, "protocol": "TCP"}]
    if s.grpc_port:
        ports.append({"name": "grpc", "containerPort": s.grpc_port, "protocol": "TCP"})
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": s.name, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": _pod([_container(s, "model", ports)])}},
    }  # fmt: skip
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": s.name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": p["name"], "port": p["containerPort"], "targetPort": p["name"],
                                                "protocol": "TCP"} for p in ports]},
    }  # fmt: skip
    return [deployment, service]


def kserve(s: Subject) -> dict[str, Any]:
    """An InferenceService whose predictor is this image (KServe's one container name), serving
    the v2 protocol over HTTP; metrics scraped from /metrics on the same port."""
    container = _container(s, "kserve-container", [{"name": "http1", "containerPort": s.port, "protocol": "TCP"}])
    container["env"] = [{"name": "PROTOCOL", "value": "v2"}]
    predictor = {"minReplicas": 1, **_pod([container])}
    return {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": s.name, "labels": _labels(s), "annotations": {
            "serving.kserve.io/deploymentMode": "RawDeployment",
            "serving.kserve.io/enable-prometheus-scraping": "true",
            "prometheus.kserve.io/port": str(s.port), "prometheus.kserve.io/path": "/metrics"}},
        "spec": {"predictor": predictor},
    }  # fmt: skip


# --target: name -> file name -> YAML text
TARGETS: dict[str, Callable[[Subject], dict[str, str]]] = {
    "compose": lambda s: {"compose.yaml": _dump([compose(s)])},
    "kubernetes": lambda s: {f"{s.name}.yaml": _dump(kubernetes(s))},
    "kserve": lambda s: {f"{s.name}-inferenceservice.yaml": _dump([kserve(s)])},
}


def write(files: dict[str, str], output: Path | None) -> list[Path]:
    if output is None:
        return []
    try:
        output.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (output / name).write_text(text)
    except OSError as e:
        raise UsageError(f"--output {output}: {e.strerror or e}") from None
    return [output / name for name in files]
