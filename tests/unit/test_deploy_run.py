"""`deploy` manifests and `run`'s container options: how an image is meant to run, as plain data.

No Docker and no registry: deploy.Subject stands for what the image's labels and pushed digest
say; containers.container_options takes a GpuxImage built from a labels dict (no SDK image). The
scale-out manifests are validated strictly here too (tests/manifests.py: the Kubernetes API's
schemas, bundled by kubernetes-validate, and KServe's CRD schema; no network).
"""

from __future__ import annotations

from decimal import Decimal

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpux_pack import providers
from gpux_pack.commands import deploy
from gpux_pack.engine import containers
from gpux_pack.engine.image_labels import GpuxImage
from gpux_pack.errors import UsageError
from gpux_pack.plan import HEALTH_START
from gpux_pack.runtime.contract import CACHE_DIR, DRAIN_SECONDS
from gpux_pack.providers import Devices
from tests.manifests import validate

IMAGE = "reg.example/team/iris@sha256:" + "ab" * 32
TARGETS = ("compose", "kubernetes", "kserve")
FILES = {"compose": "compose.yaml", "kubernetes": "iris.yaml", "kserve": "iris-inferenceservice.yaml"}
# provider -> its device, as deploy.subject derives it from the table
DEVICE_ROWS = [pytest.param(p, providers.get(p).device, id=p) for p in ("cpu", "cuda", "rocm", "openvino")]


def subject(device: str | None = None, grpc_port: int | None = None, provider: str = "cpu",
            model_bytes: int | None = 269) -> deploy.Subject:
    return deploy.Subject(IMAGE, "iris", provider, device, 8080, grpc_port, model_bytes)


def docs(s: deploy.Subject, target: str, sc: deploy.Scaling | None = None) -> list[dict]:
    files = deploy.manifests(s, target, sc)
    assert list(files) == [FILES[target]]
    return list(yaml.safe_load_all(files[FILES[target]]))


def pod_of(s: deploy.Subject, target: str, sc: deploy.Scaling | None = None) -> dict:
    """The pod spec of a Kubernetes Deployment or a KServe predictor."""
    found = docs(s, target, sc)
    if target == "kubernetes":
        assert [d["kind"] for d in found][:2] == ["Deployment", "Service"]
        return found[0]["spec"]["template"]["spec"]
    isvc = found[0]
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
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    probes = {k: container[k]["httpGet"] for k in ("startupProbe", "readinessProbe")}
    assert probes == {
        "startupProbe": {"path": "/v2/health/ready", "port": 8080},
        "readinessProbe": {"path": "/v2/health/ready", "port": 8080},
    }
    # every probe says how long it waits (Kubernetes' default is 1 s, podman's 30 s)
    assert [container[k].get("timeoutSeconds") for k in ("startupProbe", "readinessProbe", "livenessProbe")] == [2, 2, 5]
    # the image's own check, not httpGet: podman runs the liveness probe inside the container (curl)
    assert container["livenessProbe"]["exec"]["command"] == ["python3", "-m", "gpux_runtime", "healthcheck", "--live"]
    assert container["livenessProbe"]["initialDelaySeconds"] == HEALTH_START  # podman's start period
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
            {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}}
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
    limits = container["resources"]["limits"]
    expected = {"nvidia": {"nvidia.com/gpu": 1}, "amd": {"amd.com/gpu": 1}}.get(device, {})
    assert {k: v for k, v in limits.items() if k not in ("cpu", "memory")} == expected


def test_intel_device_row():
    s = subject("intel", provider="openvino")
    assert service_of(s)["devices"] == ["/dev/dri"]
    [container] = pod_of(s, "kubernetes")["containers"]
    assert container["resources"]["limits"]["gpu.intel.com/i915"] == 1


def test_grpc_port_is_exposed_when_set():
    s = subject(grpc_port=8081)
    assert service_of(s)["ports"] == ["8080:8080", "8081:8081"]
    deployment, service = docs(s, "kubernetes")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", 8080), ("grpc", 8081)]
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("http", 8080, "http"), ("grpc", 8081, "grpc")]
    [kserve_container] = pod_of(s, "kserve")["containers"]
    assert [p["containerPort"] for p in kserve_container["ports"]] == [8080]  # KServe's predictor: HTTP only


def test_no_grpc_port_by_default():
    _, service = docs(subject(), "kubernetes")
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]


# ---------------------------------------------------------------------------------------------
# deploy: resources and scale-out

# (model bytes, the runtime's peak RSS in MiB): `gpux-pack serve` on CPU, onnxruntime 1.32, a
# one-hidden-layer model of examples/mlp's interface (28 bytes of weights per hidden unit)
MEASURED = [(269, 85), (28_000_259, 168), (112_000_261, 425), (336_000_262, 1126)]


@pytest.mark.parametrize(("size", "peak_mib"), MEASURED)
def test_memory_leaves_the_runtime_its_in_flight_half(size, peak_mib):
    """The runtime lends half its memory limit to tensors in flight: the measured peak of the
    runtime with its model must fit in the other half."""
    memory = deploy.memory_for(size)
    assert memory // 2 >= peak_mib * deploy.MiB
    assert memory % (64 * deploy.MiB) == 0 and memory >= deploy.MIN_MEMORY


def test_memory_rule():
    assert deploy.memory_for(269) == 512 * deploy.MiB  # the floor
    assert deploy.memory_for(336_000_262) == 2560 * deploy.MiB  # 2 x (128 MiB + 3.5 x 336 MB), up to 64 MiB
    assert deploy.memory_for(None) == 2 * deploy.GiB  # an image without io.gpux.model.bytes
    sizes = [0, 10**6, 10**8, 10**9, 10**10]
    assert [deploy.memory_for(n) for n in sizes] == sorted(deploy.memory_for(n) for n in sizes)
    assert deploy.model_bytes({"io.gpux.model.bytes": "1234"}) == 1234
    assert deploy.model_bytes({}) is None and deploy.model_bytes({"io.gpux.model.bytes": "-1"}) is None


@pytest.mark.parametrize(("provider", "device", "cpu"), [("cpu", None, "2"), ("openvino", None, "2"),
                                                         ("cuda", "nvidia", "1"), ("rocm", "amd", "1")])
@pytest.mark.parametrize("target", ["kubernetes", "kserve"])
def test_cpu_and_memory_are_requested_and_limited_alike(target, provider, device, cpu):
    [container] = pod_of(subject(device, provider=provider, model_bytes=112_000_261), target)["containers"]
    wanted = {"cpu": cpu, "memory": "1Gi"}  # 2 x (128 MiB + 3.5 x 112 MB), up to 64 MiB
    assert container["resources"]["requests"] == wanted
    assert {k: container["resources"]["limits"][k] for k in wanted} == wanted
    assert deploy.resources(subject(device, provider=provider), deploy.Scaling()) == (int(cpu) * 1000, 512 * deploy.MiB)


def test_flags_override_the_derived_resources():
    sc = deploy.scaling(cpu="500m", memory="3Gi")
    [container] = pod_of(subject(), "kubernetes", sc)["containers"]
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "3Gi"},
                                      "limits": {"cpu": "500m", "memory": "3Gi"}}
    [doc] = docs(subject(), "compose", sc)
    assert (doc["services"]["iris"]["cpus"], doc["services"]["iris"]["mem_limit"]) == (0.5, "3072m")
    default = service_of(subject())
    assert (default["cpus"], default["mem_limit"]) == (2.0, "512m")


@pytest.mark.parametrize(("text", "value"), [
    ("2", 2), ("500m", 0.5), ("1.5", 1.5), (".5", 0.5), ("1Ki", 1024), ("1536Mi", 1536 << 20), ("4G", 4 * 10**9),
    ("1e9", 10**9), ("1E3", 1000), ("2P", 2 * 10**15), ("1k", 1000), ("1e-3", 0.001)])
def test_kubernetes_quantities(text, value):
    assert deploy.quantity(text, "--memory", "2Gi") == Decimal(str(value))


@pytest.mark.parametrize(("flags", "message"), [
    ({"replicas": 0}, "--replicas 0: at least 1"),
    ({"replicas": 3, "max_replicas": 2}, "--max-replicas 2 is below --replicas 3"),
    ({"cpu": "two"}, "--cpu 'two': not a Kubernetes quantity (such as 2, 500m or 1.5)"),
    ({"cpu": "-1"}, "--cpu '-1': not a Kubernetes quantity"),
    ({"cpu": "0"}, "--cpu '0': more than 0 CPUs"),
    ({"memory": "1.5GB"}, "--memory '1.5GB': not a Kubernetes quantity (such as 2Gi, 1536Mi or 4G)"),
    ({"memory": "2 Gi"}, "--memory '2 Gi': not a Kubernetes quantity"),
    ({"memory": "64Mi"}, "--memory '64Mi': at least 128Mi"),
    ({"memory": "9Ei"}, "--memory '9Ei': too large"),
    ({"memory": "1e999"}, "--memory '1e999': not a Kubernetes quantity"),
    ({"cache_claim": "Cache_1"}, "--cache-claim 'Cache_1': not a Kubernetes object name"),
    ({"cache_claim": "-c"}, "--cache-claim '-c': not a Kubernetes object name"),
    ({"cache_size": "5Gi"}, "--cache-size sizes the claim --cache-claim names: give --cache-claim"),
    ({"cache_claim": "c", "cache_size": "lots"}, "--cache-size 'lots': not a Kubernetes quantity"),
])
def test_bad_scale_flags_are_one_line_usage_errors(flags, message):
    with pytest.raises(UsageError) as e:
        deploy.scaling(**flags)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_one_replica_writes_no_budget_no_spread_no_autoscaler():
    found = docs(subject(), "kubernetes")
    assert [d["kind"] for d in found] == ["Deployment", "Service"]
    assert found[0]["spec"]["replicas"] == 1
    assert "topologySpreadConstraints" not in found[0]["spec"]["template"]["spec"]
    [isvc] = docs(subject(), "kserve")
    predictor = isvc["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (1, 1)
    assert not {"scaleMetric", "scaleTarget", "topologySpreadConstraints"} & set(predictor)


def test_fixed_replicas_get_a_budget_and_a_spread_but_no_autoscaler():
    sc = deploy.scaling(3)
    found = docs(subject(), "kubernetes", sc)
    assert [d["kind"] for d in found] == ["Deployment", "Service", "PodDisruptionBudget"]
    deployment, _, budget = found
    assert deployment["spec"]["replicas"] == 3
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": labels}}
    [spread] = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread == {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                      "labelSelector": {"matchLabels": labels}, "matchLabelKeys": ["pod-template-hash"]}
    isvc, kserve_budget = docs(subject(), "kserve", sc)
    predictor = isvc["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (3, 3) and "scaleMetric" not in predictor
    assert kserve_budget["spec"]["selector"]["matchLabels"] == predictor["labels"]  # the labels KServe puts on its pods
    validate(found + [isvc, kserve_budget])


def test_autoscaling_is_an_hpa_on_cpu_and_kserves_own():
    sc = deploy.scaling(2, 5)
    found = docs(subject(), "kubernetes", sc)
    assert [d["kind"] for d in found] == ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"]
    deployment, _, hpa, _ = found
    assert "replicas" not in deployment["spec"]  # the HPA's to set: a re-apply must not reset it
    assert hpa["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "iris"},
        "minReplicas": 2, "maxReplicas": 5,
        "metrics": [{"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]}
    isvc, _ = docs(subject(), "kserve", sc)
    predictor = isvc["spec"]["predictor"]
    assert {k: predictor[k] for k in ("minReplicas", "maxReplicas", "scaleMetric", "scaleTarget")} == {
        "minReplicas": 2, "maxReplicas": 5, "scaleMetric": "cpu", "scaleTarget": 70}


@pytest.mark.parametrize("target", ["kubernetes", "kserve"])
def test_cache_claim_replaces_the_emptydir_and_is_written(target):
    sc = deploy.scaling(cache_claim="gpux-cache.shared", cache_size="50Gi")
    pod = pod_of(subject(), target, sc)
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "gpux-cache.shared"}} in pod["volumes"]
    claim = docs(subject(), target, sc)[-1]
    assert (claim["kind"], claim["metadata"]["name"]) == ("PersistentVolumeClaim", "gpux-cache.shared")
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "50Gi"}}}
    assert docs(subject(), target, deploy.scaling(cache_claim="c"))[-1]["spec"]["resources"] == {
        "requests": {"storage": "10Gi"}}
    assert {"name": "cache", "emptyDir": {}} in pod_of(subject(), target)["volumes"]


@pytest.mark.parametrize(("provider", "device"), DEVICE_ROWS)
@pytest.mark.parametrize("target", ["kubernetes", "kserve"])
def test_scaled_manifests_validate_strictly(target, provider, device):
    """The issue's acceptance: --max-replicas 4 --cache-claim c gives an autoscaler, a budget and
    the claim, all valid to the letter (as YAML text, as deploy writes it)."""
    found = docs(subject(device, 8081, provider), target, deploy.scaling(max_replicas=4, cache_claim="c"))
    kinds = [d["kind"] for d in found]
    if target == "kubernetes":
        assert kinds == ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                         "PersistentVolumeClaim"]
    else:
        assert kinds == ["InferenceService", "PodDisruptionBudget", "PersistentVolumeClaim"]
    validate(found)
    [container] = pod_of(subject(device, provider=provider), target, deploy.scaling(max_replicas=4))["containers"]
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}


@pytest.mark.parametrize("model_name", ["1mlp", "a" * 49 + "_b", "x" * 126, "Sentiment Analysis", "9", "---"])
def test_every_valid_model_name_gives_object_names_kubernetes_and_kserve_accept(model_name):
    """gpux.yml's name is free text; a Service and an InferenceService need a DNS-1035 label: a
    letter first, no dash last, at most 63 (KServe's own suffixes leave 50). `1mlp` was kept as is,
    and 51 characters were cut to one ending in a dash; schema tools never check names."""
    import re

    name = deploy.object_name(model_name)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= deploy.NAME_MAX, name
    s = deploy.Subject(IMAGE, name, "cpu", None, 8080, None, 269)
    for target in ("kubernetes", "kserve"):
        [text] = deploy.manifests(s, target, deploy.scaling(max_replicas=4)).values()
        found = list(yaml.safe_load_all(text))
        validate(found)
        assert {d["metadata"]["name"] for d in found} == {name}
    assert deploy.object_name("x" * 126) != deploy.object_name("x" * 125)  # a cut name keeps a hash of the whole


def test_strict_validation_catches_a_typo_in_the_new_objects():
    _, _, hpa, budget, claim = deploy.kubernetes(subject(), deploy.scaling(max_replicas=4, cache_claim="c"))
    for doc, typo in ((hpa, "maxReplica"), (budget, "maxUnavailble"), (claim, "accesModes")):
        with pytest.raises(kubernetes_validate.ValidationError):
            validate([{**doc, "spec": {**doc["spec"], typo: 1}}])
    isvc, *_ = deploy.kserve(subject(), deploy.scaling(max_replicas=4))
    with pytest.raises(jsonschema.ValidationError):
        validate([{**isvc, "spec": {"predictor": {**isvc["spec"]["predictor"], "scaleMetrics": "cpu"}}}])


def test_compose_replicas_publish_on_ports_docker_picks():
    service = service_of(subject(grpc_port=8081))
    assert service["ports"] == ["8080:8080", "8081:8081"] and "deploy" not in service
    [doc] = docs(subject(grpc_port=8081), "compose", deploy.scaling(3))
    service = doc["services"]["iris"]
    assert service["deploy"] == {"replicas": 3}
    assert service["ports"] == ["8080", "8081"]  # one fixed host port cannot serve three containers
    gpu = deploy.compose(subject("nvidia", provider="cuda"), deploy.scaling(2))["services"]["iris"]["deploy"]
    assert gpu["replicas"] == 2 and gpu["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


@pytest.mark.parametrize(("flags", "message"), [
    ({"max_replicas": 4}, "--max-replicas: compose has no autoscaler; --replicas sets how many run"),
    ({"cache_claim": "c"}, "--cache-claim names a Kubernetes PersistentVolumeClaim; compose's replicas share"),
])
def test_compose_refuses_what_it_cannot_do(flags, message):
    with pytest.raises(UsageError, match=f"^{message}"):
        deploy.manifests(subject(), "compose", deploy.scaling(**flags))


# ---------------------------------------------------------------------------------------------
# run

LABELS = {"io.gpux.pack.version": "0.1.0", "io.gpux.provider": "cuda", "io.gpux.port": "8080",
          "io.gpux.grpc_port": "8081", "io.gpux.model.name": "My Model"}


def image(**changes: str | None) -> GpuxImage:
    labels = {k: v for k, v in {**LABELS, **changes}.items() if v is not None}
    return GpuxImage("my-model:1", None, labels)


def test_image_labels_parse():
    img = image()
    assert (img.provider, img.port, img.grpc_port, img.model_name) == ("cuda", 8080, 8081, "My Model")
    bare = image(**{"io.gpux.grpc_port": None, "io.gpux.model.name": None})
    assert (bare.grpc_port, bare.model_name) == (None, "model")
    assert image(**{"io.gpux.grpc_port": "x"}).grpc_port is None


@pytest.mark.parametrize("key, value, words", [
    ("io.gpux.provider", "quantum", "is not a provider"),
    ("io.gpux.port", "0", "is not a port from 1 to 65535"),
    ("io.gpux.port", "99999", "is not a port from 1 to 65535"),
    ("io.gpux.grpc_port", "8080", "a port other than the HTTP port"),
    ("io.gpux.grpc_port", "x", "is not a port"),
    ("io.gpux.model.bytes", str(10 ** 20), "at most 1 TiB"),
])
def test_hand_made_labels_are_one_line_before_any_command_uses_them(key, value, words):
    """An unknown provider was a KeyError in deploy; ports 0 or 99999, a gRPC port on the HTTP port
    and a 1e20-byte model gave manifests Kubernetes refuses, with exit 0."""
    from gpux_pack.engine.image_labels import checked

    labels = {**LABELS, key: value}
    assert checked("my-model:1", dict(LABELS), True) == LABELS
    with pytest.raises(UsageError, match=words) as err:
        checked("my-model:1", labels, True)
    assert str(err.value).startswith(f"my-model:1: label {key}=") and "\n" not in str(err.value)
    assert checked("my-model:1", labels, False) == labels  # what inspect shows of any image


def test_cache_volume_name():
    assert containers.cache_volume("My Model") == "gpux-cache-my-model"
    assert containers.cache_volume("a/b:c") == "gpux-cache-a-b-c"


def test_container_options_without_devices():
    options = containers.container_options(image(), Devices(), "0.0.0.0", 9000)
    assert options == {
        "read_only": True,
        "tmpfs": {"/tmp": "rw,size=1g"},
        "ports": {"8080/tcp": ("0.0.0.0", 9000), "8081/tcp": ("0.0.0.0", None)},
        "volumes": {containers.cache_volume("My Model"): {"bind": CACHE_DIR, "mode": "rw"}},
    }
    assert CACHE_DIR == "/opt/gpux/cache"


def test_container_options_without_grpc_publish_only_http():
    options = containers.container_options(image(**{"io.gpux.grpc_port": None}), Devices(), "127.0.0.1", None)
    assert options["ports"] == {"8080/tcp": ("127.0.0.1", None)}


def test_nvidia_devices():
    devices = providers.devices_for(providers.get("cuda"))
    options = containers.container_options(image(), devices, "127.0.0.1", 8080)
    [request] = options["device_requests"]
    assert request.count == -1
    assert request.capabilities == [["gpu"]]
    assert "devices" not in options and "group_add" not in options


def test_amd_devices():
    devices = providers.devices_for(providers.get("rocm"))
    options = containers.container_options(image(**{"io.gpux.provider": "rocm"}), devices, "127.0.0.1", 8080)
    assert options["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert options["group_add"] == ["video"]
    assert "device_requests" not in options


@pytest.mark.parametrize("name", ["cpu", "openvino"])
def test_cpu_providers_get_no_devices(name):
    options = containers.container_options(image(), providers.devices_for(providers.get(name)), "127.0.0.1", None)
    assert not {"device_requests", "devices", "group_add"} & set(options)
