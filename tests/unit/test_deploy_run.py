"""`deploy` manifests and `run`'s container options: how an image is meant to run, as plain data.

No Docker and no registry: deploy.Subject stands for what the image's labels and pushed digest
say; run.container_options takes a GpuxImage built from a labels dict (no SDK image).
"""

from __future__ import annotations

import pytest
import yaml

from gpux_pack import providers
from gpux_pack.commands import deploy, run
from gpux_pack.engine.image_labels import GpuxImage
from gpux_pack.errors import UsageError
from gpux_pack.plan import CACHE_DIR
from gpux_pack.providers import Devices
from gpux_pack.runtime.settings import DRAIN_SECONDS

IMAGE = "reg.example/team/iris@sha256:" + "ab" * 32
TARGETS = ("compose", "kubernetes", "kserve")
FILES = {"compose": "compose.yaml", "kubernetes": "iris.yaml", "kserve": "iris-inferenceservice.yaml"}
# provider -> its device, as deploy.subject derives it from the table
DEVICE_ROWS = [pytest.param(p, providers.get(p).device, id=p) for p in ("cpu", "cuda", "rocm", "openvino")]


def subject(device: str | None = None, grpc_port: int | None = None, provider: str = "cpu") -> deploy.Subject:
    return deploy.Subject(IMAGE, "iris", provider, device, 8080, grpc_port)


def docs(s: deploy.Subject, target: str) -> list[dict]:
    files = deploy.manifests(s, target)
    assert list(files) == [FILES[target]]
    return list(yaml.safe_load_all(files[FILES[target]]))


def pod_of(s: deploy.Subject, target: str) -> dict:
    """The pod spec of a Kubernetes Deployment or a KServe predictor."""
    found = docs(s, target)
    if target == "kubernetes":
        assert [d["kind"] for d in found] == ["Deployment", "Service"]
        return found[0]["spec"]["template"]["spec"]
    [isvc] = found
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    return isvc["spec"]["predictor"]


def service_of(s: deploy.Subject) -> dict:
    [doc] = docs(s, "compose")
    assert doc["volumes"] == {"gpux-cache": {}}
    return doc["services"]["iris"]


# ---------------------------------------------------------------------------------------------
# deploy


def test_grace_period_outlasts_the_drain():
    assert deploy.GRACE_SECONDS == int(DRAIN_SECONDS) + 7
    assert deploy.GRACE_SECONDS > DRAIN_SECONDS


def test_unknown_target_is_a_usage_error():
    with pytest.raises(UsageError, match="--target 'helm': expected one of compose, kubernetes, kserve"):
        deploy.manifests(subject(), "helm")


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_pins_the_image_as_given(target):
    text = deploy.manifests(subject(), target)[FILES[target]]
    assert IMAGE in text
    if target == "compose":
        assert service_of(subject())["image"] == IMAGE
    else:
        assert [c["image"] for c in pod_of(subject(), target)["containers"]] == [IMAGE]


def test_compose_service_is_locked_down():
    service = service_of(subject())
    assert service["user"] == "10001:10001"
    assert service["read_only"] is True
    assert service["cap_drop"] == ["ALL"]
    assert service["security_opt"] == ["no-new-privileges:true"]
    assert service["tmpfs"] == ["/tmp"]
    assert service["volumes"] == [f"gpux-cache:{CACHE_DIR}"]
    assert service["stop_grace_period"] == f"{deploy.GRACE_SECONDS}s"
    assert service["ports"] == ["8080:8080"]


@pytest.mark.parametrize("target", ["kubernetes", "kserve"])
def test_pod_is_locked_down_with_probes_and_grace(target):
    pod = pod_of(subject(), target)
    security = pod["securityContext"]
    assert security["runAsUser"] == security["runAsGroup"] == 10001
    assert security["runAsNonRoot"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["terminationGracePeriodSeconds"] == deploy.GRACE_SECONDS
    [container] = pod["containers"]
    assert container["securityContext"] == {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    probes = {k: container[k]["httpGet"] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes == {
        "startupProbe": {"path": "/v2/health/ready", "port": 8080},
        "readinessProbe": {"path": "/v2/health/ready", "port": 8080},
        "livenessProbe": {"path": "/v2/health/live", "port": 8080},
    }
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/tmp": "tmp", CACHE_DIR: "cache"}
    assert {v["name"] for v in pod["volumes"]} == {"tmp", "cache"}


def test_kserve_predictor_speaks_v2_in_raw_deployment_mode():
    [isvc] = docs(subject(), "kserve")
    [container] = isvc["spec"]["predictor"]["containers"]
    assert container["name"] == "kserve-container"
    assert container["env"] == [{"name": "PROTOCOL", "value": "v2"}]
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert isvc["metadata"]["annotations"]["prometheus.kserve.io/port"] == "8080"


@pytest.mark.parametrize(("provider", "device"), DEVICE_ROWS)
def test_compose_devices_come_from_the_table(provider, device):
    service = service_of(subject(device, provider=provider))
    if device == "nvidia":
        assert service["deploy"] == {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}}  # fmt: skip
        assert "devices" not in service and "group_add" not in service
    elif device == "amd":
        assert service["devices"] == ["/dev/kfd", "/dev/dri"]
        assert service["group_add"] == ["video"]
        assert "deploy" not in service
    else:
        assert device is None
        assert not {"deploy", "devices", "group_add"} & set(service)


@pytest.mark.parametrize(("provider", "device"), DEVICE_ROWS)
@pytest.mark.parametrize("target", ["kubernetes", "kserve"])
def test_kubernetes_device_limits_come_from_the_table(target, provider, device):
    [container] = pod_of(subject(device, provider=provider), target)["containers"]
    expected = {"nvidia": {"limits": {"nvidia.com/gpu": 1}}, "amd": {"limits": {"amd.com/gpu": 1}}}.get(device)
    assert container.get("resources") == expected


def test_intel_device_row():
    s = subject("intel", provider="openvino")
    assert service_of(s)["devices"] == ["/dev/dri"]
    [container] = pod_of(s, "kubernetes")["containers"]
    assert container["resources"] == {"limits": {"gpu.intel.com/i915": 1}}


def test_grpc_port_is_exposed_when_set():
    s = subject(grpc_port=8081)
    assert service_of(s)["ports"] == ["8080:8080", "8081:8081"]
    deployment, service = docs(s, "kubernetes")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", 8080), ("grpc", 8081)]
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("http", 8080, "http"), ("grpc", 8081, "grpc")]  # fmt: skip
    [kserve_container] = pod_of(s, "kserve")["containers"]
    assert [p["containerPort"] for p in kserve_container["ports"]] == [8080]  # KServe's predictor: HTTP only


def test_no_grpc_port_by_default():
    _, service = docs(subject(), "kubernetes")
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]


# ---------------------------------------------------------------------------------------------
# run

LABELS = {"io.gpux.pack.version": "0.1.0", "io.gpux.provider": "cuda", "io.gpux.port": "8080",
          "io.gpux.grpc_port": "8081", "io.gpux.model.name": "My Model"}  # fmt: skip


def image(**changes: str | None) -> GpuxImage:
    labels = {k: v for k, v in {**LABELS, **changes}.items() if v is not None}
    return GpuxImage("my-model:1", None, labels)


def test_image_labels_parse():
    img = image()
    assert (img.provider, img.port, img.grpc_port, img.model_name) == ("cuda", 8080, 8081, "My Model")
    bare = image(**{"io.gpux.grpc_port": None, "io.gpux.model.name": None})
    assert (bare.grpc_port, bare.model_name) == (None, "model")
    assert image(**{"io.gpux.grpc_port": "x"}).grpc_port is None


def test_cache_volume_name():
    assert run.cache_volume("My Model") == "gpux-cache-my-model"
    assert run.cache_volume("a/b:c") == "gpux-cache-a-b-c"


def test_container_options_without_devices():
    options = run.container_options(image(), Devices(), "0.0.0.0", 9000)
    assert options == {
        "read_only": True,
        "tmpfs": {"/tmp": "rw,size=1g"},
        "ports": {"8080/tcp": ("0.0.0.0", 9000), "8081/tcp": ("0.0.0.0", None)},
        "volumes": {run.cache_volume("My Model"): {"bind": CACHE_DIR, "mode": "rw"}},
    }
    assert CACHE_DIR == "/opt/gpux/cache"


def test_container_options_without_grpc_publish_only_http():
    options = run.container_options(image(**{"io.gpux.grpc_port": None}), Devices(), "127.0.0.1", None)
    assert options["ports"] == {"8080/tcp": ("127.0.0.1", None)}


def test_nvidia_devices():
    devices = providers.devices_for(providers.get("cuda"))
    options = run.container_options(image(), devices, "127.0.0.1", 8080)
    [request] = options["device_requests"]
    assert request.count == -1
    assert request.capabilities == [["gpu"]]
    assert "devices" not in options and "group_add" not in options


def test_amd_devices():
    devices = providers.devices_for(providers.get("rocm"))
    options = run.container_options(image(**{"io.gpux.provider": "rocm"}), devices, "127.0.0.1", 8080)
    assert options["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert options["group_add"] == ["video"]
    assert "device_requests" not in options


@pytest.mark.parametrize("name", ["cpu", "openvino"])
def test_cpu_providers_get_no_devices(name):
    options = run.container_options(image(), providers.devices_for(providers.get(name)), "127.0.0.1", None)
    assert not {"device_requests", "devices", "group_add"} & set(options)
