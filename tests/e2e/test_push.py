"""Push to a real registry (Debian's docker-registry, Distribution 2.8) started here on
127.0.0.1 with htpasswd auth: digests, pull by digest, one-line refusals."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path

import docker
import pytest

from tests.conftest import BASE_IMAGE, EXAMPLES, free_port, key_pair, run_cli, serve
from tests.e2e.conftest import PASSWORD, USER
from tests.manifests import kserve_schema, validate

pytestmark = pytest.mark.e2e

ARM64_BASE = os.environ.get("GPUX_TEST_ARM64_BASE_IMAGE", "gpux-pack/debian-python:bookworm-arm64")


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
                   env=env)
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
        closed = f"127.0.0.1:{free_port()}"
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
                   env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield tag, json.loads(proc.stdout)["images"][0]["digest"]
    docker_client.images.remove(tag, force=True)


def test_the_sbom_lists_every_package_the_image_holds(pushed, docker_client, tmp_path):
    """The SBOM the build recorded, against `docker save` of the image: every dist-info in its
    site-packages and every package dpkg says is installed appear, and the document is valid
    CycloneDX 1.6."""
    import io
    import re
    import tarfile

    from packaging.utils import canonicalize_name

    from gpux_pack.image import sbom
    from gpux_pack.image import attestation_store

    tag, _ = pushed
    image = docker_client.images.get(tag)
    doc = json.loads((attestation_store.folder_of(image.id) / attestation_store.SBOM_FILE).read_bytes())
    assert sbom.validate(doc) is None
    purls = {c.get("purl", "").split("?")[0] for c in doc["components"]}
    dists, status = set(), ""
    with tarfile.open(fileobj=io.BytesIO(b"".join(image.save())), mode="r:") as saved:
        for member in saved:
            if not member.name.endswith(("layer.tar", ".tar")) and "blobs/sha256/" not in member.name:
                continue
            try:
                layer = tarfile.open(fileobj=saved.extractfile(member), mode="r:*")
            except (tarfile.TarError, AttributeError):
                continue
            for entry in layer:
                name = entry.name.removeprefix("./")
                m = re.match(r"^opt/gpux/site-packages/([^/]+)-([^-/]+)\.dist-info$", name)
                if m and entry.isdir():
                    dists.add((canonicalize_name(m.group(1)), m.group(2)))
                if name == "var/lib/dpkg/status" and entry.isfile():  # the last layer's copy counts
                    status = layer.extractfile(entry).read().decode()
    assert dists and status
    for name, version in dists:
        assert f"pkg:pypi/{name}@{version}" in purls, (name, version)
    installed = [dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", stanza, re.M)) for stanza in status.split("\n\n")]
    debs = [(f["Package"], f["Version"]) for f in installed if "installed" in f.get("Status", "").split()]
    assert len(debs) > 50
    names = {(c["name"], c["version"]) for c in doc["components"] if c.get("purl", "").startswith("pkg:deb/")}
    assert set(debs) == names


def test_the_registry_serves_the_sbom_and_provenance_as_referrers_of_the_digest(pushed, registry, docker_client):
    """An independent client (plain HTTP against the registry API): the referrers tag schema's
    index of the pushed digest lists the SBOM and the provenance; each names the image as its
    subject; the provenance's subject digest is the pushed digest (Distribution 2.8 has no
    referrers API: 404)."""
    import requests

    from gpux_pack.image import attestation_store

    tag, digest = pushed
    repository, sha = digest.split("@")
    path = repository.split("/", 1)[1]
    auth = (USER, PASSWORD)
    base = f"http://{registry}/v2/{path}"
    assert requests.get(f"{base}/referrers/{sha}", auth=auth, timeout=10).status_code == 404
    index = requests.get(f"{base}/manifests/{sha.replace(':', '-')}", auth=auth, timeout=10,
                         headers={"Accept": "application/vnd.oci.image.index.v1+json"}).json()
    kinds = {d["artifactType"]: d for d in index["manifests"]}
    assert set(kinds) == {"application/vnd.cyclonedx+json", "application/vnd.in-toto+json"}
    documents = {}
    for artifact_type, descriptor in kinds.items():
        manifest = requests.get(f"{base}/manifests/{descriptor['digest']}", auth=auth, timeout=10,
                                headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
        assert "sha256:" + __import__("hashlib").sha256(manifest.content).hexdigest() == descriptor["digest"]
        body = manifest.json()
        assert body["artifactType"] == artifact_type and body["subject"]["digest"] == sha
        documents[artifact_type] = requests.get(f"{base}/blobs/{body['layers'][0]['digest']}", auth=auth,
                                                timeout=10).content
    statement = json.loads(documents["application/vnd.in-toto+json"])
    assert statement["subject"] == [{"name": repository, "digest": {"sha256": sha.split(":")[1]}}]
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    image_id = docker_client.images.get(tag).id
    assert documents["application/vnd.cyclonedx+json"] == (attestation_store.folder_of(image_id) / attestation_store.SBOM_FILE).read_bytes()


def _cosign_verify(registry: str, repository_path: str, digest: str, public_key) -> bool:
    """cosign's key-based verification, written here from its specification (sigstore/cosign
    specs/SIGNATURE_SPEC.md), not with gpux-pack's code: the manifest tagged sha256-<hex>.sig,
    each simplesigning layer's payload verified (ECDSA P-256, SHA-256, base64 DER in the
    dev.cosignproject.cosign/signature annotation), and the payload naming this digest."""
    import base64 as b64

    import requests
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    base = f"http://{registry}/v2/{repository_path}"
    auth = (USER, PASSWORD)
    response = requests.get(f"{base}/manifests/{digest.replace(':', '-')}.sig", auth=auth, timeout=10,
                            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    if response.status_code != 200:
        return False
    for layer in response.json()["layers"]:
        if layer["mediaType"] != "application/vnd.dev.cosign.simplesigning.v1+json":
            continue
        payload = requests.get(f"{base}/blobs/{layer['digest']}", auth=auth, timeout=10).content
        try:
            public_key.verify(b64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"]), payload,
                              ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            continue
        critical = json.loads(payload)["critical"]
        if critical["type"] == "cosign container image signature" and \
                critical["image"]["docker-manifest-digest"] == digest:
            return True
    return False


def test_a_signature_verifies_with_cosign_s_scheme_and_a_forgery_does_not(pushed, registry, tmp_path, docker_client):
    """`gpux-pack sign` with a test key: an implementation of cosign's verification from its
    specification accepts it, and so does `gpux-pack verify`; a signature of another digest, a
    tampered payload and a wrong key each fail `gpux-pack verify` with one line, exit 1."""
    import requests

    tag, digest = pushed
    env = _docker_config(tmp_path, registry, PASSWORD)
    private, public, public_key = key_pair(tmp_path, "test")
    _, other_public, other_key = key_pair(tmp_path, "other")
    repository, sha = digest.split("@")
    path = repository.split("/", 1)[1]
    proc = run_cli("sign", tag, "--key", str(private), env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == f"signed {digest}", proc.stderr[-2000:]
    assert _cosign_verify(registry, path, sha, public_key) and not _cosign_verify(registry, path, sha, other_key)
    ok = run_cli("verify", digest, "--key", str(public), "--json", env=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["subject"] == digest and json.loads(ok.stdout)["signatures"] == 1
    shown = json.loads(run_cli("inspect", tag, "--json", env=env).stdout)
    assert shown["attached"]["signatures"] == 1 and shown["attached"]["sbom"] and shown["attached"]["provenance"]
    assert shown["sbom_recorded"].endswith("sbom.cdx.json")

    def refused(ref: str, key: Path) -> str:
        proc = run_cli("verify", ref, "--key", str(key), env=env)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
        return errors[0]

    assert "not signed with this key (a signature does not verify with this key)" in refused(digest, other_public)
    # the signature of this digest, copied under another manifest's .sig tag (the SBOM artifact's,
    # in the same repository): it names another digest
    auth = (USER, PASSWORD)
    base = f"http://{registry}/v2/{path}"
    signed = requests.get(f"{base}/manifests/{sha.replace(':', '-')}.sig", auth=auth, timeout=10,
                          headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    index = requests.get(f"{base}/manifests/{sha.replace(':', '-')}", auth=auth, timeout=10,
                         headers={"Accept": "application/vnd.oci.image.index.v1+json"}).json()
    other_sha = index["manifests"][0]["digest"]
    other_digest = f"{repository}@{other_sha}"
    put = requests.put(f"{base}/manifests/{other_sha.replace(':', '-')}.sig", data=signed.content, auth=auth,
                       headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, timeout=10)
    assert put.status_code == 201, put.text
    assert f"a signature is of {sha}, not of {other_sha}" in refused(other_digest, public)
    # a tampered payload: the same signature annotation over other bytes
    manifest = signed.json()
    payload = json.loads(requests.get(f"{base}/blobs/{manifest['layers'][0]['digest']}", auth=auth, timeout=10).content)
    payload["optional"] = {"tampered": True}
    data = json.dumps(payload).encode()
    blob_digest = "sha256:" + __import__("hashlib").sha256(data).hexdigest()
    upload = requests.post(f"{base}/blobs/uploads/", auth=auth, timeout=10)
    location = upload.headers["Location"]
    location = location if "://" in location else f"http://{registry}{location}"
    assert requests.put(f"{location}&digest={blob_digest}", data=data, auth=auth, timeout=10).status_code == 201
    manifest["layers"][0].update(digest=blob_digest, size=len(data))
    requests.put(f"{base}/manifests/{sha.replace(':', '-')}.sig", data=json.dumps(manifest), auth=auth, timeout=10,
                 headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    assert "not signed with this key (a signature does not verify with this key)" in refused(digest, public)


def test_verify_reads_the_attached_documents_and_a_forged_one_fails(pushed, registry, tmp_path, docker_client):
    """`gpux-pack verify` reads what is attached, not only its subject: forgeries written through
    the registry's API into the referrers tag index (an entry replaced, or one added), each
    naming the digest as subject, fail with one line naming the document and what is wrong;
    with the genuine index back, the image verifies and the output says what was checked."""
    import hashlib

    import requests

    tag, digest = pushed
    env = _docker_config(tmp_path, registry, PASSWORD)
    private, public, _ = key_pair(tmp_path, "documents")
    assert run_cli("sign", tag, "--key", str(private), env=env).returncode == 0
    repository, sha = digest.split("@")
    image = docker_client.images.get(tag)
    model = image.labels["io.gpux.model.sha256"]
    auth = (USER, PASSWORD)
    base = f"http://{registry}/v2/{repository.split('/', 1)[1]}"
    manifest_type, index_type = "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json"
    sbom_type, provenance_type = "application/vnd.cyclonedx+json", "application/vnd.in-toto+json"

    def blob(data: bytes) -> str:
        digest_ = "sha256:" + hashlib.sha256(data).hexdigest()
        location = requests.post(f"{base}/blobs/uploads/", auth=auth, timeout=10).headers["Location"]
        location = location if "://" in location else f"http://{registry}{location}"
        assert requests.put(f"{location}&digest={digest_}", data=data, auth=auth, timeout=10).status_code == 201
        return digest_

    def listed(artifact_type: str, data: bytes, replace: bool) -> str:
        """An artifact manifest of `data` whose subject is the image, in the referrers tag index."""
        body = json.dumps({"schemaVersion": 2, "mediaType": manifest_type, "artifactType": artifact_type,
                           "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": blob(b"{}"),
                                      "size": 2},
                           "layers": [{"mediaType": artifact_type, "digest": blob(data), "size": len(data)}],
                           "subject": {"mediaType": manifest_type, "digest": sha, "size": subject_size}}).encode()
        artifact = "sha256:" + hashlib.sha256(body).hexdigest()
        assert requests.put(f"{base}/manifests/{artifact}", data=body, auth=auth, timeout=10,
                            headers={"Content-Type": manifest_type}).status_code == 201
        index = json.loads(genuine)
        index["manifests"] = [d for d in index["manifests"] if not replace or d["artifactType"] != artifact_type]
        index["manifests"].append({"mediaType": manifest_type, "digest": artifact, "size": len(body),
                                   "artifactType": artifact_type})
        put_index(json.dumps(index).encode())
        return artifact

    def put_index(body: bytes) -> None:
        assert requests.put(f"{base}/manifests/{sha.replace(':', '-')}", data=body, auth=auth, timeout=10,
                            headers={"Content-Type": index_type}).status_code == 201

    subject_size = len(requests.get(f"{base}/manifests/{sha}", auth=auth, timeout=10,
                                    headers={"Accept": manifest_type}).content)
    genuine = requests.get(f"{base}/manifests/{sha.replace(':', '-')}", auth=auth, timeout=10,
                           headers={"Accept": index_type}).content
    documents = {}
    for entry in json.loads(genuine)["manifests"]:
        layer = requests.get(f"{base}/manifests/{entry['digest']}", auth=auth, timeout=10,
                             headers={"Accept": manifest_type}).json()["layers"][0]["digest"]
        documents[entry["artifactType"]] = requests.get(f"{base}/blobs/{layer}", auth=auth, timeout=10).content
    other_id = docker_client.images.get(BASE_IMAGE).id  # another image's SBOM: this one's, naming the base
    other_sbom = documents[sbom_type].replace(image.id.encode(), other_id.encode())
    statement = json.loads(documents[provenance_type])
    forgeries = [
        (sbom_type, b"\x00garbage", True, "is not JSON"),
        (sbom_type, b"{}", False, "is not a CycloneDX SBOM (bomFormat null)"),
        (sbom_type, other_sbom, True, f'names image "{other_id}", not this image {image.id}'),
        (provenance_type, json.dumps(dict(statement, predicateType="https://cosign.sigstore.dev/attestation/v1"))
         .encode(), False, 'has predicateType "https://cosign.sigstore.dev/attestation/v1", not SLSA Provenance v1 '
         '(https://slsa.dev/provenance/v1)'),
        (provenance_type, json.dumps([statement]).encode(), True, "is not a JSON object (a list)"),
    ]
    try:
        for artifact_type, data, replace, problem in forgeries:
            artifact = listed(artifact_type, data, replace)
            proc = run_cli("verify", tag, "--key", str(public), env=env)
            errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
            what = "SBOM" if artifact_type == sbom_type else "provenance"
            assert proc.returncode == 1 and errors == [f"error: {digest}: the attached {what} {artifact} {problem}"], \
                (problem, proc.returncode, proc.stderr[-2000:])
            assert "Traceback" not in proc.stderr
    finally:
        put_index(genuine)
    ok = run_cli("verify", tag, "--key", str(public), env=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert f"CycloneDX, names image {image.id} and model sha256:{model}" in ok.stdout, ok.stdout
    assert f"SLSA v1 of gpux-pack's build type, subject this digest, model sha256:{model}" in ok.stdout, ok.stdout
    done = json.loads(run_cli("verify", digest, "--key", str(public), "--json", env=env).stdout)
    assert [(i["image_id"], i["model_sha256"]) for i in done["images"]] == [(image.id, model)]

def _compose_schema(tmp_path: Path) -> dict:
    """The compose-spec JSON Schema, as docker-compose 1.29.2 ships it (read from its wheel)."""
    import sys
    import zipfile

    proc = subprocess.run([sys.executable, "-m", "pip", "download", "docker-compose==1.29.2", "--no-deps", "-q",
                           "-d", str(tmp_path)], capture_output=True, text=True)
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
    assert container["livenessProbe"]["exec"]["command"][-2:] == ["healthcheck", "--live"]  # podman: no curl
    assert container["securityContext"] == {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["terminationGracePeriodSeconds"] > 8
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]] and mounts["/opt/gpux/cache"] in volumes
    assert service["spec"]["ports"][0]["port"] == 8080
    # cpu: no device; cpu and memory from the provider and the model's size (its label)
    wanted = {"cpu": "2", "memory": "512Mi"}
    assert container["resources"] == {"requests": wanted, "limits": wanted}


def test_deploy_compose_validates_and_a_gpu_image_requests_its_device(pushed, tmp_path, docker_client):
    import jsonschema
    import yaml

    from gpux_pack.commands import deploy

    tag, digest = pushed
    proc = run_cli("deploy", tag, "--target", "compose")
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(proc.stdout)
    schema = jsonschema.Draft201909Validator(_compose_schema(tmp_path))
    schema.validate(doc)
    service = doc["services"]["iris-mlp"]
    assert service["image"] == digest and service["read_only"] is True and service["cap_drop"] == ["ALL"]
    # the device each provider asks for (the subject as a cuda or rocm image would give it)
    assert (service["cpus"], service["mem_limit"]) == (2.0, "512m")
    cuda = deploy.Subject(digest, "m", "cuda", "nvidia", 8080, None)
    (pod_container,) = deploy.kubernetes(cuda)[0]["spec"]["template"]["spec"]["containers"]
    assert pod_container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert deploy.compose(cuda)["services"]["m"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    rocm = deploy.Subject(digest, "m", "rocm", "amd", 8080, None)
    assert deploy.kubernetes(rocm)[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "amd.com/gpu"] == 1
    schema.validate(deploy.compose(rocm))
    schema.validate(deploy.compose(cuda, deploy.scaling(3)))  # replicas: deploy.replicas, ports Docker picks
    with pytest.raises(jsonschema.ValidationError):
        schema.validate({"services": {"m": {**deploy.compose(rocm)["services"]["m"], "readonly": True}}})
    unpushed = run_cli("deploy", BASE_IMAGE, "--target", "kubernetes")
    assert unpushed.returncode == 2 and "not an image built by gpux-pack" in unpushed.stderr


def test_deploy_kserve_validates_against_the_crd_and_speaks_v2(pushed, tmp_path):
    import jsonschema
    import yaml

    from gpux_pack.commands import deploy

    tag, digest = pushed
    proc = run_cli("deploy", tag, "--target", "kserve", "--output", str(tmp_path / "kserve"))
    assert proc.returncode == 0, proc.stderr
    (doc,) = yaml.safe_load_all((tmp_path / "kserve" / "iris-mlp-inferenceservice.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    validator = jsonschema.Draft7Validator(kserve_schema())
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
    (cuda,) = deploy.kserve(deploy.Subject(digest, "m", "cuda", "nvidia", 8080, None))
    validator.validate(cuda)
    assert cuda["spec"]["predictor"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_deploy_compose_replicas_run_and_serve(pushed, tmp_path, docker_client):
    """`--replicas 2` for compose, run by docker-compose 1.29: two containers, each with its own
    host port (Docker's choice), the cpu and memory limits the runtime sizes itself by, and both
    ready."""
    import requests

    tag, _ = pushed
    proc = run_cli("deploy", tag, "--target", "compose", "--replicas", "2", "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    project = f"gpuxreplicas{os.getpid()}"
    compose = ["docker-compose", "-p", project, "-f", str(tmp_path / "compose.yaml")]
    try:
        up = subprocess.run([*compose, "up", "-d"], capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stderr[-3000:]
        containers = docker_client.containers.list(filters={"label": f"com.docker.compose.project={project}"})
        assert len(containers) == 2
        for c in containers:
            assert (c.attrs["HostConfig"]["NanoCpus"], c.attrs["HostConfig"]["Memory"]) == (2 * 10**9, 512 << 20)
        ports = set()
        for index in (1, 2):
            port = subprocess.run([*compose, "port", "--index", str(index), "iris-mlp", "8080"], capture_output=True,
                                  text=True, timeout=60).stdout.strip().rsplit(":", 1)[-1]
            ports.add(port)
            deadline, status = time.monotonic() + 120, None
            while time.monotonic() < deadline:
                try:
                    status = requests.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code
                except requests.ConnectionError:
                    status = None
                if status == 200:
                    break
                time.sleep(0.2)
            assert status == 200, f"replica {index} on port {port} never became ready"
        assert len(ports) == 2
    finally:
        subprocess.run([*compose, "down", "-v", "--timeout", "20"], capture_output=True, timeout=300)


def test_deploy_scales_out_with_an_autoscaler_a_budget_and_a_shared_cache(pushed, tmp_path, docker_client):
    """The issue's acceptance on a pushed image: `--max-replicas 4 --cache-claim c` writes an
    HPA (KServe: its own), a PodDisruptionBudget and the claim, all strictly valid, and cpu and
    memory requests sized from the image's model-size label."""
    import yaml

    tag, digest = pushed
    model_bytes = (EXAMPLES / "mlp" / "model.onnx").stat().st_size
    assert docker_client.images.get(tag).labels["io.gpux.model.bytes"] == str(model_bytes)
    files = {"kubernetes": "iris-mlp.yaml", "kserve": "iris-mlp-inferenceservice.yaml"}
    found = {}
    for target, name in files.items():
        out = tmp_path / target
        proc = run_cli("deploy", tag, "--target", target, "--max-replicas", "4", "--cache-claim", "c",
                       "--output", str(out))
        assert proc.returncode == 0, proc.stderr
        found[target] = list(yaml.safe_load_all((out / name).read_text()))
        validate(found[target])  # Kubernetes objects by the API's schemas, the InferenceService by KServe's
    kinds = {target: [d["kind"] for d in docs] for target, docs in found.items()}
    assert kinds == {"kubernetes": ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                                    "PersistentVolumeClaim"],
                     "kserve": ["InferenceService", "PodDisruptionBudget", "PersistentVolumeClaim"]}
    deployment, _, hpa, budget, claim = found["kubernetes"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4) and "replicas" not in deployment["spec"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert claim["metadata"]["name"] == "c" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    isvc = found["kserve"][0]
    for pod in (deployment["spec"]["template"]["spec"], isvc["spec"]["predictor"]):
        (container,) = pod["containers"]
        assert container["image"] == digest
        assert container["resources"]["requests"] == {"cpu": "2", "memory": "512Mi"}
        assert {"name": "cache", "persistentVolumeClaim": {"claimName": "c"}} in pod["volumes"]
        assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    predictor = isvc["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"], predictor["scaleMetric"]) == (1, 4, "cpu")
    # overrides, and the one-line refusals (exit 2)
    proc = run_cli("deploy", tag, "--target", "kubernetes", "--cpu", "500m", "--memory", "3Gi", "--replicas", "2")
    assert proc.returncode == 0, proc.stderr
    deployment, _, _ = yaml.safe_load_all(proc.stdout)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "500m",
                                                                                              "memory": "3Gi"}
    refused = [(["--target", "kubernetes", "--memory", "lots"], "--memory 'lots': not a Kubernetes quantity"),
               (["--target", "kubernetes", "--replicas", "3", "--max-replicas", "2"],
                "--max-replicas 2 is below --replicas 3"),
               (["--target", "compose", "--max-replicas", "4"], "--max-replicas: compose has no autoscaler")]
    for flags, message in refused:
        proc = run_cli("deploy", tag, *flags)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), proc.stderr


def _two_platforms(registry: str, env: dict[str, str], authorization: str, docker_client) -> None:
    """examples/mlp for amd64 and arm64 pushed with an index; the registry's and the engine's view."""
    import requests

    tag = f"{registry}/team/multi:1.0.0-cpu"
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--platform", "linux/amd64,linux/arm64",
                   "--base-image", f"linux/amd64={BASE_IMAGE}", "--base-image", f"linux/arm64={ARM64_BASE}",
                   "--tag", tag, "--push", "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    (index,) = summary["indexes"]
    images = {i["platform"]: i for i in summary["images"]}
    assert set(images) == {"linux/amd64", "linux/arm64"}
    assert images["linux/arm64"]["tag"] == f"{tag}-arm64" and index["tag"] == tag
    assert {m["platform"]: m["digest"] for m in index["manifests"]} == {p: i["digest"] for p, i in images.items()}
    # the registry's own view: GET the tag as an index, then each manifest and its config
    url = f"http://{registry}/v2/team/multi"
    auth = {"Authorization": authorization}
    got = requests.get(f"{url}/manifests/1.0.0-cpu", timeout=10,
                       headers={**auth, "Accept": "application/vnd.oci.image.index.v1+json"})
    assert got.status_code == 200, got.text
    assert got.headers["Content-Type"] == "application/vnd.oci.image.index.v1+json"
    assert index["digest"] == f"{registry}/team/multi@{got.headers['Docker-Content-Digest']}"
    listed = {(m["platform"]["os"], m["platform"]["architecture"]): m for m in got.json()["manifests"]}
    assert set(listed) == {("linux", "amd64"), ("linux", "arm64")}
    for (_, arch), entry in listed.items():
        manifest = requests.get(f"{url}/manifests/{entry['digest']}", timeout=10,
                                headers={**auth, "Accept": entry["mediaType"]})
        assert manifest.status_code == 200 and len(manifest.content) == entry["size"]
        config = requests.get(f"{url}/blobs/{manifest.json()['config']['digest']}", headers=auth, timeout=10).json()
        assert config["architecture"] == arch and config["os"] == "linux"
    # and the engine resolves the index to the platform it asks for
    for t in (f"{tag}-amd64", f"{tag}-arm64"):  # the index has no local tag
        docker_client.images.remove(t, force=True)
    pulled = docker_client.images.pull(f"{registry}/team/multi", tag="1.0.0-cpu", platform="linux/arm64",
                                       auth_config={"username": USER, "password": PASSWORD})
    assert pulled.attrs["Architecture"] == "arm64"
    docker_client.images.remove(pulled.id, force=True)


def test_two_platforms_push_an_oci_index_with_amd64_and_arm64(registry, tmp_path, docker_client):
    tag = f"{registry}/team/multi:1.0.0-cpu"
    refused = run_cli("build", str(EXAMPLES / "mlp"), "--platform", "linux/amd64,linux/arm64", "--tag", tag)
    assert refused.returncode == 2 and "several platforms need --push" in refused.stderr, refused.stderr
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    _two_platforms(registry, _docker_config(tmp_path, registry, PASSWORD), basic, docker_client)


def test_the_index_goes_to_a_bearer_token_registry_and_a_wrong_password_is_one_line(token_registry, tmp_path,
                                                                                   docker_client):
    import requests

    registry, issued = token_registry
    challenge = requests.get(f"http://{registry}/v2/", timeout=10).headers["WWW-Authenticate"]
    assert challenge.startswith("Bearer realm=")
    realm = challenge.split('realm="')[1].split('"')[0]
    token = requests.get(realm, params={"service": "gpux-test-registry", "scope": "repository:team/multi:pull"},
                         auth=(USER, PASSWORD), timeout=10).json()["token"]
    _two_platforms(registry, _docker_config(tmp_path, registry, PASSWORD), f"Bearer {token}", docker_client)
    assert {"type": "repository", "name": "team/multi", "actions": ["pull", "push"]} in [a for g in issued for a in g]
    # with a wrong password the token service refuses: the push fails first, one line, exit 1
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--platform", "linux/amd64,linux/arm64",
                   "--base-image", f"linux/amd64={BASE_IMAGE}", "--base-image", f"linux/arm64={ARM64_BASE}",
                   "--tag", f"{registry}/team/multi:wrong", "--push",
                   env=_docker_config(tmp_path, registry, "wrong"))
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(lines) == 1 and "authentication failed" in lines[0], proc.stderr[-2000:]
    for arch in ("amd64", "arm64"):  # the built images stay (only the push failed): the test's to remove
        try:
            docker_client.images.remove(f"{registry}/team/multi:wrong-{arch}", force=True)
        except docker.errors.ImageNotFound:
            pass


def test_one_multi_platform_base_serves_both_platforms(registry, tmp_path, docker_client):
    """A base that is itself an index (as python:3.11-slim is): each platform's build pulls its own."""
    import requests

    auth = {"username": USER, "password": PASSWORD}
    base = f"{registry}/base/debian-python"
    entries = []
    for local, arch in ((BASE_IMAGE, "amd64"), (ARM64_BASE, "arm64")):
        docker_client.images.get(local).tag(base, f"bookworm-{arch}")
        for event in docker_client.api.push(base, tag=f"bookworm-{arch}", auth_config=auth, stream=True, decode=True):
            assert "error" not in event, event
        got = requests.get(f"http://{registry}/v2/base/debian-python/manifests/bookworm-{arch}", auth=(USER, PASSWORD),
                           headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"}, timeout=10)
        entries.append({"mediaType": got.headers["Content-Type"], "digest": got.headers["Docker-Content-Digest"],
                        "size": len(got.content), "platform": {"architecture": arch, "os": "linux"}})
        docker_client.images.remove(f"{base}:bookworm-{arch}")
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}
    put = requests.put(f"http://{registry}/v2/base/debian-python/manifests/bookworm", data=json.dumps(index),
                       auth=(USER, PASSWORD), timeout=10,
                       headers={"Content-Type": "application/vnd.oci.image.index.v1+json"})
    assert put.status_code == 201, put.text
    tag = f"{registry}/team/onebase:1.0.0-cpu"
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--platform", "linux/amd64,linux/arm64", "--base-image",
                   f"{base}:bookworm", "--tag", tag, "--push", "--json",
                   env=_docker_config(tmp_path, registry, PASSWORD))
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stderr.count(f"pulling base image {base}:bookworm for linux/") == 2, proc.stderr[-3000:]
        summary = json.loads(proc.stdout)
        built = {i["platform"]: docker_client.images.get(i["tag"]).attrs["Architecture"] for i in summary["images"]}
        assert built == {"linux/amd64": "amd64", "linux/arm64": "arm64"}
        (written,) = summary["indexes"]
        assert sorted(m["platform"] for m in written["manifests"]) == ["linux/amd64", "linux/arm64"]
    finally:  # the two images, the runtime bases made on the pulled base, the pulled base's names
        made = [f"{tag}-amd64", f"{tag}-arm64"]
        made += [i.id for i in docker_client.images.list(filters={"label": f"org.opencontainers.image.base.name={base}:bookworm"})]
        # the pulled base is the local base under other names: remove the names, not the image
        made += [f"{base}:bookworm"] + [d for i in docker_client.images.list() for d in i.attrs["RepoDigests"] or []
                                        if d.startswith(f"{base}@")]
        for t in made:
            try:
                docker_client.images.remove(t, force=not t.startswith(base))
            except docker.errors.ImageNotFound:
                pass
