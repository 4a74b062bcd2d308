"""`gpux-pack deploy IMAGE --target compose|kubernetes|kserve`: manifests that run an image as
`gpux-pack run` does, for the orchestrator.

Decisions come from the image (its labels: provider, ports, model name and size; its pushed
digest) and the provider table (which device to request); the manifests are plain data dumped
as YAML.
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

Scale-out (the Scaling flags): cpu and memory are requested and limited alike, because the
runtime sizes itself from its cgroup (intra-op threads from the CPU quota, request budgets from
the memory limit: without limits it would size itself for the whole node). Memory comes from the
model's size (io.gpux.model.bytes), by the rule in `memory_for`; cpu from the provider (a CPU
provider computes on it, a device provider only feeds the device). `--max-replicas` above
`--replicas` adds an autoscaler on cpu (an HPA; KServe's own, through the predictor's fields);
more than one replica adds a PodDisruptionBudget and a spread across nodes; `--cache-claim`
shares one ReadWriteMany claim for compiled caches (the runtime publishes each cache entry
atomically, so replicas compiling at once do not corrupt it).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

import yaml

from gpux_pack import providers
from gpux_pack.engine.interface import Engine
from gpux_pack.errors import UsageError
from gpux_pack.plan import HEALTH_START, UID
from gpux_pack.runtime.contract import CACHE_DIR, DRAIN_SECONDS
from gpux_pack.providers import DEVICES
from gpux_pack.registry import remote
from gpux_pack.registry.push import digest_of

GRACE_SECONDS = int(DRAIN_SECONDS) + 7  # SIGTERM -> drain -> exit, with room to spare
MiB = 1 << 20
GiB = 1 << 30
RUNTIME_BYTES = 128 * MiB  # the runtime with no model: 85 MiB peak RSS measured (serve, CPU, onnxruntime 1.32)
MODEL_FACTOR = 3.5  # peak RSS per model byte: measured 3.1x to 3.25x (28 to 336 MB models, CPU EP)
MIN_MEMORY = 512 * MiB  # the least deploy asks for: below it the runtime's request budgets get tiny
UNKNOWN_MEMORY = 2 * GiB  # an image without io.gpux.model.bytes (built before the label existed)
LEAST_MEMORY = 128 * MiB  # the least --memory accepts: the runtime alone needs about 85 MiB
CPU_PROVIDER_MILLI = 2000  # cpu, openvino: the model runs on these CPUs (intra-op threads = the quota)
DEVICE_PROVIDER_MILLI = 1000  # a device provider: the CPU parses requests and feeds the device
CPU_TARGET = 70  # percent of the cpu request the autoscaler keeps replicas at
CACHE_BYTES = 10 * GiB  # the shared cache claim's size unless --cache-size


@dataclass(frozen=True)
class Subject:
    """What the manifests need to know about the image."""

    image: str  # name@sha256:...
    name: str  # a DNS-1035 label for the deployment (object_name)
    provider: str
    device: str | None  # nvidia | amd | intel | None
    port: int
    grpc_port: int | None
    model_bytes: int | None = None  # io.gpux.model.bytes; None for an image built before it


@dataclass(frozen=True)
class Scaling:
    """What deploy's scale-out flags ask, checked (scaling()): replicas, their autoscaling range,
    resources in place of the derived ones, the shared cache claim."""

    replicas: int = 1
    max_replicas: int = 1  # above replicas: an autoscaler
    cpu_milli: int | None = None  # --cpu; None: by the provider (CPU_PROVIDER_MILLI, DEVICE_PROVIDER_MILLI)
    memory_bytes: int | None = None  # --memory; None: memory_for(model)
    cache_claim: str | None = None  # a PersistentVolumeClaim's name; None: an emptyDir
    cache_bytes: int = CACHE_BYTES

    @property
    def autoscaled(self) -> bool:
        return self.max_replicas > self.replicas

    @property
    def several(self) -> bool:
        """More than one replica may run: a disruption budget and a spread are worth writing."""
        return self.max_replicas > 1


def subject(client: Engine | None, ref: str) -> Subject:
    """The image on this engine (pinned by the repo digest a push or pull left), else as its
    registry has it (pinned by the digest the registry serves for the tag); client None: the
    registry only."""
    image = remote.read(client, ref)
    pinned = image.pinned or (ref if re.search(r"@sha256:[0-9a-f]{64}$", ref) else digest_of(client, ref))
    if pinned is None:
        raise UsageError(f"{ref} has no registry digest to pin: push it first (gpux-pack push {ref})")
    provider = providers.get(image.provider)
    return Subject(pinned, object_name(image.model_name), provider.name, provider.device, image.port, image.grpc_port,
                   model_bytes(image.labels))


NAME_MAX = 50  # KServe names a predictor's objects after the InferenceService, with suffixes, in 63


def object_name(model_name: str) -> str:
    """The Deployment's, Service's and InferenceService's name: a DNS-1035 label (a letter first,
    letters, digits and dashes, an alphanumeric last) of at most NAME_MAX characters. A name cut
    to fit ends with a hash of the whole one, so two long names that share a start stay two."""
    name = re.sub(r"[^a-z0-9]+", "-", model_name.lower()).strip("-") or "model"
    if not name[0].isalpha():
        name = f"m-{name}"
    if len(name) > NAME_MAX:
        digest = hashlib.sha256(model_name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        name = f"{name[: NAME_MAX - len(digest) - 1].rstrip('-')}-{digest}"
    return name


def model_bytes(labels: dict[str, str]) -> int | None:
    size = labels.get("io.gpux.model.bytes", "")
    return int(size) if size.isdigit() else None


# a Kubernetes quantity: a number with a binary (Ki..Ei) or decimal (m, k..E) suffix or an exponent
_QUANTITY = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                       r"(?:[eE](?P<exponent>[+-]?[0-9]{1,2})|(?P<suffix>[KMGTPE]i|[mkMGTPE]))?")
_SUFFIX = {"m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
           "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
           **{f"{p}i": Decimal(2) ** (10 * (i + 1)) for i, p in enumerate("KMGTPE")}}
# a PersistentVolumeClaim's name: a DNS-1123 subdomain
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def quantity(text: str, flag: str, example: str) -> Decimal:
    """The value of a Kubernetes quantity (2, 500m, 1.5Gi, 4G, 1e9), as Kubernetes reads it."""
    found = _QUANTITY.fullmatch(text)
    if not found or len(text) > 40:
        raise UsageError(f"{flag} {text!r}: not a Kubernetes quantity (such as {example})")
    exponent = found["exponent"]
    scale = Decimal(10) ** int(exponent) if exponent else _SUFFIX.get(found["suffix"] or "", Decimal(1))
    value = Decimal(found["number"]) * scale
    if value >= 2**63 / 1000:  # Kubernetes keeps quantities in int64 milli-units
        raise UsageError(f"{flag} {text!r}: too large")
    return value


def scaling(replicas: int = 1, max_replicas: int | None = None, cpu: str | None = None,
            memory: str | None = None, cache_claim: str | None = None, cache_size: str | None = None) -> Scaling:
    """deploy's flags as a Scaling; a UsageError names the first one that is wrong."""
    if replicas < 1:
        raise UsageError(f"--replicas {replicas}: at least 1")
    top = replicas if max_replicas is None else max_replicas
    if top < replicas:
        raise UsageError(f"--max-replicas {top} is below --replicas {replicas}")
    cpu_milli = memory_bytes = None
    if cpu is not None:
        cpu_milli = math.ceil(quantity(cpu, "--cpu", "2, 500m or 1.5") * 1000)  # Kubernetes keeps cpu in millicores
        if cpu_milli < 1:
            raise UsageError(f"--cpu {cpu!r}: more than 0 CPUs")
    if memory is not None:
        memory_bytes = math.ceil(quantity(memory, "--memory", "2Gi, 1536Mi or 4G"))
        if memory_bytes < LEAST_MEMORY:
            raise UsageError(f"--memory {memory!r}: at least {_bytes(LEAST_MEMORY)} "
                             "(the runtime alone needs about 85 MiB)")
    if cache_claim is not None and (len(cache_claim) > 253 or not _SUBDOMAIN.fullmatch(cache_claim)):
        raise UsageError(f"--cache-claim {cache_claim!r}: not a Kubernetes object name (lower-case letters, digits, "
                         "'-' and '.', starting and ending with a letter or digit)")
    if cache_size is not None and cache_claim is None:
        raise UsageError("--cache-size sizes the claim --cache-claim names: give --cache-claim")
    cache_bytes = CACHE_BYTES if cache_size is None else math.ceil(quantity(cache_size, "--cache-size", "10Gi"))
    if cache_bytes < 1:
        raise UsageError(f"--cache-size {cache_size!r}: more than 0 bytes")
    return Scaling(replicas, top, cpu_milli, memory_bytes, cache_claim, cache_bytes)


def memory_for(model: int | None) -> int:
    """Memory to request and limit for a model of this many bytes: the runtime gives half its
    memory limit to tensors in flight (runtime/resources.py), so the other half must hold the
    runtime and the loaded model (RUNTIME_BYTES + MODEL_FACTOR x its bytes: onnxruntime holds
    the weights more than once while it loads and prepacks them). Rounded up to 64 MiB; at least
    MIN_MEMORY. A device provider keeps the weights on the device once loaded, but peaks alike
    while loading."""
    if model is None:
        return UNKNOWN_MEMORY
    need = 2 * (RUNTIME_BYTES + math.ceil(MODEL_FACTOR * model))
    return max(MIN_MEMORY, -(-need // (64 * MiB)) * 64 * MiB)


def resources(s: Subject, sc: Scaling) -> tuple[int, int]:
    """(cpu in millicores, memory in bytes) each replica requests and is limited to."""
    derived = CPU_PROVIDER_MILLI if s.device is None else DEVICE_PROVIDER_MILLI
    cpu = sc.cpu_milli if sc.cpu_milli is not None else derived
    return cpu, sc.memory_bytes if sc.memory_bytes is not None else memory_for(s.model_bytes)


def _cpu(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _bytes(n: int) -> str:
    for suffix, unit in (("Gi", GiB), ("Mi", MiB), ("Ki", 1024)):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def manifests(s: Subject, target: str, sc: Scaling | None = None) -> dict[str, str]:
    """File name -> YAML text."""
    if target not in TARGETS:
        raise UsageError(f"--target {target!r}: expected one of {', '.join(TARGETS)}")
    return TARGETS[target](s, sc or Scaling())


def _dump(docs: list[dict[str, Any]]) -> str:
    return "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=False) for d in docs)


def compose(s: Subject, sc: Scaling = Scaling()) -> dict[str, Any]:
    """One service; with --replicas above 1 each replica publishes its ports on a host port of
    Docker's choosing (one fixed host port cannot serve two containers: put a proxy in front)."""
    if sc.autoscaled:
        raise UsageError("--max-replicas: compose has no autoscaler; --replicas sets how many run")
    if sc.cache_claim:
        raise UsageError("--cache-claim names a Kubernetes PersistentVolumeClaim; compose's replicas share "
                         "the gpux-cache volume already")
    ports = [s.port] + ([s.grpc_port] if s.grpc_port else [])
    cpu, memory = resources(s, sc)
    service: dict[str, Any] = {
        "image": s.image,
        "ports": [f"{p}:{p}" if sc.replicas == 1 else str(p) for p in ports],
        "read_only": True,
        "tmpfs": ["/tmp"],
        "volumes": [f"gpux-cache:{CACHE_DIR}"],
        "user": f"{UID}:{UID}",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "stop_grace_period": f"{GRACE_SECONDS}s",
        "restart": "unless-stopped",
        "cpus": cpu / 1000,
        "mem_limit": f"{-(-memory // MiB)}m",  # Compose's m is MiB
    }
    deploy: dict[str, Any] = {"replicas": sc.replicas} if sc.replicas > 1 else {}
    device = DEVICES.get(s.device or "")
    if device and device.gpus:  # Compose's GPU reservation (the NVIDIA runtime)
        deploy["resources"] = {"reservations": {"devices": [
            {"driver": s.device, "count": device.gpus, "capabilities": ["gpu"]}]}}
    if deploy:
        service["deploy"] = deploy
    if device and device.devices:
        service["devices"] = list(device.devices)
    if device and device.groups:
        service["group_add"] = list(device.groups)
    return {"services": {s.name: service}, "volumes": {"gpux-cache": {}}}


def _probe(path: str, port: int, **more: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, **more}


# The liveness probe runs the image's own check in the container (python3 from the image's PATH,
# which every gpux image's config sets): `podman kube play` turns the liveness probe, the only one
# it uses, into a health check run inside the container, an httpGet one as `curl`, which the image
# lacks; its failures restart the container and took the pod down (podman 4.3). An exec probe
# means the same to Kubernetes; 5 s leaves the interpreter's start time under a cpu limit.
# podman ignores the startup probe and turns initialDelaySeconds into the check's start period
# (failures before the first success do not count): without it, a model loading for 30 s was
# restarted. Kubernetes runs the liveness probe only once the startup probe has passed.
LIVENESS = {"exec": {"command": ["python3", "-m", "gpux_runtime", "healthcheck", "--live"]},
            "initialDelaySeconds": HEALTH_START, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}


def _labels(s: Subject) -> dict[str, str]:
    return {"app.kubernetes.io/name": s.name, "app.kubernetes.io/component": "inference",
            "app.kubernetes.io/managed-by": "gpux-pack"}


def _container(s: Subject, sc: Scaling, name: str, ports: list[dict[str, Any]]) -> dict[str, Any]:
    """The model's container: image by digest, probes (the startup probe gives warmup, a TensorRT
    build, up to 10 minutes), locked down, /tmp and the cache mounted, cpu and memory requested
    and limited alike (what the runtime sizes itself by) with the provider's device."""
    container: dict[str, Any] = {"name": name, "image": s.image, "ports": ports}
    container.update({
        # readiness stays 200 while the server refuses work for lack of room (503 + Retry-After):
        # that is load shed per request, and turning every busy replica unready at once would send
        # the load nowhere. It answers off the event loop's decoding work, so 2 s is plenty.
        "startupProbe": _probe("/v2/health/ready", s.port, periodSeconds=2, timeoutSeconds=2, failureThreshold=300),
        "readinessProbe": _probe("/v2/health/ready", s.port, periodSeconds=5, timeoutSeconds=2, failureThreshold=2),
        "livenessProbe": LIVENESS,
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": CACHE_DIR}],
    })
    cpu, memory = resources(s, sc)
    wanted = {"cpu": _cpu(cpu), "memory": _bytes(memory)}
    device = DEVICES.get(s.device or "")
    container["resources"] = {"requests": dict(wanted), "limits": {
        **wanted, **({device.kubernetes: 1} if device and device.kubernetes else {})}}
    return container


def _pod(sc: Scaling, labels: dict[str, str], containers: list[dict[str, Any]]) -> dict[str, Any]:
    cache = {"persistentVolumeClaim": {"claimName": sc.cache_claim}} if sc.cache_claim else {"emptyDir": {}}
    pod = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "containers": containers,
        "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                    {"name": "cache", **cache}],
    }
    if sc.several:  # replicas on different nodes where the scheduler can: a node's loss takes one
        pod["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": labels}, "matchLabelKeys": ["pod-template-hash"]}]
    return pod


def _scale_out(s: Subject, sc: Scaling, labels: dict[str, str]) -> list[dict[str, Any]]:
    """A PodDisruptionBudget (a drain evicts one replica at a time) when several replicas may
    run, and the shared cache's claim (ReadWriteMany: every replica mounts it)."""
    docs: list[dict[str, Any]] = []
    if sc.several:
        docs.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                     "metadata": {"name": s.name, "labels": _labels(s)},
                     "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}})
    if sc.cache_claim:
        docs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "metadata": {"name": sc.cache_claim, "labels": _labels(s)},
                     "spec": {"accessModes": ["ReadWriteMany"],
                              "resources": {"requests": {"storage": _bytes(sc.cache_bytes)}}}})
    return docs


def kubernetes(s: Subject, sc: Scaling = Scaling()) -> list[dict[str, Any]]:
    """A Deployment and its Service; an HPA when autoscaled (the Deployment then leaves replicas
    to it: a re-apply would otherwise reset the count), then _scale_out's."""
    labels = _labels(s)
    ports = [{"name": "http", "containerPort": s.port, "protocol": "TCP"}]
    if s.grpc_port:
        ports.append({"name": "grpc", "containerPort": s.grpc_port, "protocol": "TCP"})
    replicas = {} if sc.autoscaled else {"replicas": sc.replicas}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": s.name, "labels": labels},
        "spec": {**replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": _pod(sc, labels, [_container(s, sc, "model", ports)])}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": s.name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": p["name"], "port": p["containerPort"], "targetPort": p["name"],
                                                "protocol": "TCP"} for p in ports]},
    }
    docs = [deployment, service]
    if sc.autoscaled:
        docs.append({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": s.name, "labels": labels},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": s.name},
                     "minReplicas": sc.replicas, "maxReplicas": sc.max_replicas,
                     "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                         "type": "Utilization", "averageUtilization": CPU_TARGET}}}]},
        })
    return docs + _scale_out(s, sc, labels)


def kserve(s: Subject, sc: Scaling = Scaling()) -> list[dict[str, Any]]:
    """An InferenceService whose predictor is this image (KServe's one container name), serving
    the v2 protocol over HTTP; metrics scraped from /metrics on the same port. Its replicas are
    KServe's (minReplicas, maxReplicas; autoscaled on cpu by the HPA KServe makes in
    RawDeployment mode); the predictor's pods carry our labels, which the budget selects."""
    labels = _labels(s)
    container = _container(s, sc, "kserve-container", [{"name": "http1", "containerPort": s.port, "protocol": "TCP"}])
    container["env"] = [{"name": "PROTOCOL", "value": "v2"}]
    autoscale = {"scaleMetric": "cpu", "scaleTarget": CPU_TARGET} if sc.autoscaled else {}
    predictor = {"minReplicas": sc.replicas, "maxReplicas": sc.max_replicas, **autoscale, "labels": labels,
                 **_pod(sc, labels, [container])}
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": s.name, "labels": labels, "annotations": {
            "serving.kserve.io/deploymentMode": "RawDeployment",
            "serving.kserve.io/enable-prometheus-scraping": "true",
            "prometheus.kserve.io/port": str(s.port), "prometheus.kserve.io/path": "/metrics"}},
        "spec": {"predictor": predictor},
    }
    return [isvc, *_scale_out(s, sc, labels)]


# --target: name -> file name -> YAML text
TARGETS: dict[str, Callable[[Subject, Scaling], dict[str, str]]] = {
    "compose": lambda s, sc: {"compose.yaml": _dump([compose(s, sc)])},
    "kubernetes": lambda s, sc: {f"{s.name}.yaml": _dump(kubernetes(s, sc))},
    "kserve": lambda s, sc: {f"{s.name}-inferenceservice.yaml": _dump(kserve(s, sc))},
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
