"""Push to a real registry (Debian's docker-registry, Distribution 2.8) started here on
127.0.0.1 with htpasswd auth: digests, pull by digest, one-line refusals."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import BASE_IMAGE, EXAMPLES, run_cli, serve

pytestmark = pytest.mark.e2e

USER, PASSWORD = "gpux", "s3cret-pass"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """host:port of a registry that wants USER/PASSWORD; stopped (and its storage removed) after."""
    import bcrypt

    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("the push tests need Debian's docker-registry package (`bash scripts/dev test` installs it)")
    root = tmp_path_factory.mktemp("registry")
    (root / "htpasswd").write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=5)).decode()}\n")
    port = _free_port()
    (root / "config.yml").write_text(
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
        f"auth: {{htpasswd: {{realm: test, path: {root / 'htpasswd'}}}}}\n"
    )
    proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=open(root / "registry.log", "wb"))  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)
        except urllib.error.HTTPError as e:
            if e.code == 401:
                break  # up, and asking for credentials
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the registry did not start: {(root / 'registry.log').read_text()[-2000:]}")
        time.sleep(0.05)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


def _docker_config(tmp_path: Path, registry: str, password: str) -> dict[str, str]:
    """A DOCKER_CONFIG as `docker login` writes it."""
    folder = tmp_path / f"docker-{password}"
    folder.mkdir()
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {registry: {"auth": auth}}}))
    return {"DOCKER_CONFIG": str(folder)}


def test_build_push_digest_pull_by_digest_and_serve(registry, tmp_path, docker_client):
    tag = f"{registry}/team/iris-mlp:1.0.0-cpu"
    env = _docker_config(tmp_path, registry, PASSWORD)
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--base-image", BASE_IMAGE, "--tag", tag, "--push", "--json",
                   env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    import jsonschema

    from tests.conftest import ROOT

    jsonschema.Draft202012Validator(json.loads((ROOT / "build-summary.schema.json").read_text())).validate(summary)
    digest = summary["images"][0]["digest"]
    assert digest.startswith(f"{registry}/team/iris-mlp@sha256:") and len(digest.split("@sha256:")[1]) == 64
    docker_client.images.remove(tag, force=True)
    auth = {"username": USER, "password": PASSWORD}
    pulled = docker_client.images.pull(digest, auth_config=auth)  # by digest: these bytes or nothing
    assert digest in pulled.attrs["RepoDigests"]
    with serve(pulled.id) as server:
        assert server.post("/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]}).status_code == 200
    again = run_cli("push", tag, "--json", env=env)
    assert again.returncode == 2 and "no such image" in again.stderr  # removed above: one line, usage
    docker_client.images.remove(pulled.id, force=True)


def test_a_wrong_password_or_no_registry_is_one_line_exit_1(registry, tmp_path, docker_client, tags):
    tag = f"{registry}/team/iris-mlp:wrong"
    local = docker_client.images.get(BASE_IMAGE)
    local.tag(tag)
    try:
        proc = run_cli("push", tag, env=_docker_config(tmp_path, registry, "wrong"))
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len([line for line in lines if line.startswith("error:")]) == 1, lines
        assert lines[-1].startswith(f"error: push of {tag} to {registry} failed: authentication failed"), lines
        closed = f"127.0.0.1:{_free_port()}"
        other = f"{closed}/team/iris-mlp:nowhere"
        local.tag(other)
        proc = run_cli("push", other, env=_docker_config(tmp_path, closed, PASSWORD))
        assert proc.returncode == 1 and "registry unreachable" in proc.stderr.strip().splitlines()[-1], proc.stderr
    finally:
        for t in (tag, f"{closed}/team/iris-mlp:nowhere"):
            try:
                docker_client.images.remove(t)
            except Exception:
                pass


@pytest.fixture(scope="module")
def pushed(registry, tmp_path_factory, docker_client):
    """examples/mlp built and pushed: its tag and digest (the deploy tests' subject)."""
    tag = f"{registry}/team/deployed:1.0.0-cpu"
    env = _docker_config(tmp_path_factory.mktemp("login"), registry, PASSWORD)
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--base-image", BASE_IMAGE, "--tag", tag, "--push", "--json",
                   env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield tag, json.loads(proc.stdout)["images"][0]["digest"]
    docker_client.images.remove(tag, force=True)


def _compose_schema(tmp_path: Path) -> dict:
    """The compose-spec JSON Schema, as docker-compose 1.29.2 ships it (read from its wheel)."""
    import sys
    import zipfile

    proc = subprocess.run([sys.executable, "-m", "pip", "download", "docker-compose==1.29.2", "--no-deps", "-q",
                           "-d", str(tmp_path)], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    with zipfile.ZipFile(next(tmp_path.glob("docker_compose-*.whl"))) as z:
        return json.loads(z.read("compose/config/compose_spec.json"))


def test_deploy_kubernetes_validates_pins_the_digest_and_locks_the_pod_down(pushed, tmp_path):
    import kubernetes_validate
    import yaml

    tag, digest = pushed
    proc = run_cli("deploy", tag, "--target", "kubernetes", "--output", str(tmp_path / "k8s"))
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all((tmp_path / "k8s" / "iris-mlp.yaml").read_text()))
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)  # raises on any unknown or mistyped field
    deployment, service = docs
    wrong = json.loads(json.dumps(deployment))
    wrong["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFS"] = True  # a typo must not pass
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, "1.30.0", strict=True)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == digest
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    assert container["securityContext"] == {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["terminationGracePeriodSeconds"] > 8
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]] and mounts["/opt/gpux/cache"] in volumes
    assert service["spec"]["ports"][0]["port"] == 8080
    assert "resources" not in container  # cpu: no device to request


def test_deploy_compose_validates_and_a_gpu_image_requests_its_device(pushed, tmp_path, docker_client):
    import jsonschema
    import yaml

    from gpux_pack import deploy

    tag, digest = pushed
    proc = run_cli("deploy", tag, "--target", "compose")
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(proc.stdout)
    schema = jsonschema.Draft201909Validator(_compose_schema(tmp_path))
    schema.validate(doc)
    service = doc["services"]["iris-mlp"]
    assert service["image"] == digest and service["read_only"] is True and service["cap_drop"] == ["ALL"]
    # the device each provider asks for (the subject as a cuda or rocm image would give it)
    cuda = deploy.Subject(digest, "m", "cuda", "nvidia", 8080, None)
    (pod_container,) = deploy.kubernetes(cuda)[0]["spec"]["template"]["spec"]["containers"]
    assert pod_container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert deploy.compose(cuda)["services"]["m"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    rocm = deploy.Subject(digest, "m", "rocm", "amd", 8080, None)
    assert deploy.kubernetes(rocm)[0]["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"amd.com/gpu": 1}}
    schema.validate(deploy.compose(rocm))
    with pytest.raises(jsonschema.ValidationError):
        schema.validate({"services": {"m": {**deploy.compose(rocm)["services"]["m"], "readonly": True}}})
    unpushed = run_cli("deploy", BASE_IMAGE, "--target", "kubernetes")
    assert unpushed.returncode == 2 and "not an image built by gpux-pack" in unpushed.stderr


def _kserve_schema() -> dict:
    """The InferenceService v1beta1 schema from KServe's CRD (tests/schemas), made strict as
    `kubectl --validate=strict` is: a field the schema does not name is an error, not pruned."""
    import gzip

    schema = json.loads(gzip.decompress((Path(__file__).parents[1] / "schemas" /
                                         "kserve-inferenceservice-v1beta1.json.gz").read_bytes()))  # fmt: skip

    def strict(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node and \
                    not node.get("x-kubernetes-preserve-unknown-fields"):  # fmt: skip
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    return schema


def test_deploy_kserve_validates_against_the_crd_and_speaks_v2(pushed, tmp_path):
    import jsonschema
    import yaml

    from gpux_pack import deploy

    tag, digest = pushed
    proc = run_cli("deploy", tag, "--target", "kserve", "--output", str(tmp_path / "kserve"))
    assert proc.returncode == 0, proc.stderr
    (doc,) = yaml.safe_load_all((tmp_path / "kserve" / "iris-mlp-inferenceservice.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    validator = jsonschema.Draft7Validator(_kserve_schema())
    validator.validate(doc)
    typo = json.loads(json.dumps(doc))
    typo["spec"]["predictor"]["containers"][0]["readOnlyRootFS"] = True
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(typo)
    predictor = doc["spec"]["predictor"]
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container" and container["image"] == digest
    assert {"name": "PROTOCOL", "value": "v2"} in container["env"]
    assert container["ports"] == [{"name": "http1", "containerPort": 8080, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert predictor["securityContext"]["runAsNonRoot"] is True and predictor["terminationGracePeriodSeconds"] > 8
    assert doc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    cuda = deploy.kserve(deploy.Subject(digest, "m", "cuda", "nvidia", 8080, None))
    validator.validate(cuda)
    assert cuda["spec"]["predictor"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_two_platforms_push_an_oci_index_with_amd64_and_arm64(registry, tmp_path, docker_client):
    import requests

    arm64_base = os.environ.get("GPUX_TEST_ARM64_BASE_IMAGE", "gpux-pack/debian-python:bookworm-arm64")
    tag = f"{registry}/team/multi:1.0.0-cpu"
    env = _docker_config(tmp_path, registry, PASSWORD)
    refused = run_cli("build", str(EXAMPLES / "mlp"), "--platform", "linux/amd64,linux/arm64", "--tag", tag)
    assert refused.returncode == 2 and "several platforms need --push" in refused.stderr, refused.stderr
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--platform", "linux/amd64,linux/arm64",
                   "--base-image", f"linux/amd64={BASE_IMAGE}", "--base-image", f"linux/arm64={arm64_base}",
                   "--tag", tag, "--push", "--json", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    (index,) = summary["indexes"]
    images = {i["platform"]: i for i in summary["images"]}
    assert set(images) == {"linux/amd64", "linux/arm64"}
    assert images["linux/arm64"]["tag"] == f"{tag}-arm64" and index["tag"] == tag
    assert {m["platform"]: m["digest"] for m in index["manifests"]} == {p: i["digest"] for p, i in images.items()}
    # the registry's own view: GET the tag as an index, then each manifest and its config
    auth = (USER, PASSWORD)
    url = f"http://{registry}/v2/team/multi"
    got = requests.get(f"{url}/manifests/1.0.0-cpu", auth=auth, timeout=10,
                       headers={"Accept": "application/vnd.oci.image.index.v1+json"})  # fmt: skip
    assert got.status_code == 200, got.text
    assert got.headers["Content-Type"] == "application/vnd.oci.image.index.v1+json"
    assert index["digest"] == f"{registry}/team/multi@{got.headers['Docker-Content-Digest']}"
    listed = {(m["platform"]["os"], m["platform"]["architecture"]): m for m in got.json()["manifests"]}
    assert set(listed) == {("linux", "amd64"), ("linux", "arm64")}
    for (_, arch), entry in listed.items():
        manifest = requests.get(f"{url}/manifests/{entry['digest']}", auth=auth, timeout=10,
                                headers={"Accept": entry["mediaType"]})  # fmt: skip
        assert manifest.status_code == 200 and len(manifest.content) == entry["size"]
        config = requests.get(f"{url}/blobs/{manifest.json()['config']['digest']}", auth=auth, timeout=10).json()
        assert config["architecture"] == arch and config["os"] == "linux"
    # and the engine resolves the index to the platform it asks for
    for t in (f"{tag}-amd64", f"{tag}-arm64"):  # the index has no local tag
        docker_client.images.remove(t, force=True)
    pulled = docker_client.images.pull(f"{registry}/team/multi", tag="1.0.0-cpu", platform="linux/arm64",
                                       auth_config={"username": USER, "password": PASSWORD})  # fmt: skip
    assert pulled.attrs["Architecture"] == "arm64"
    docker_client.images.remove(pulled.id, force=True)
