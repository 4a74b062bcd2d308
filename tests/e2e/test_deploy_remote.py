"""deploy and inspect of an image that is only in a registry (Debian's docker-registry on
127.0.0.1 with htpasswd, test_push's fixture): build --push, remove every local reference,
then the manifests pin exactly the pushed digest, read through the registry's API with the
user's Docker config. An index tag pins the index; refusals are one line."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import BASE_IMAGE, EXAMPLES, free_port, run_cli
from tests.e2e.conftest import PASSWORD, USER

pytestmark = pytest.mark.e2e

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def login(folder: Path, registry: str, password: str) -> dict[str, str]:  # noqa: F811
    """A DOCKER_CONFIG as `docker login` writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {registry: {"auth": auth}}}))
    return {"DOCKER_CONFIG": str(folder)}


def one_error_line(proc) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def put_image(registry: str, repo_tag: str, labels: dict[str, str], **auth) -> str:  # noqa: F811
    """A config blob with these labels and a manifest without layers, written through the API
    (auth: requests' auth= or headers=); the manifest's digest."""
    repo, tag = repo_tag.split(":")
    base = f"http://{registry}/v2/{repo}"
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": labels},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
    upload = requests.post(f"{base}/blobs/uploads/", timeout=10, **auth)
    assert upload.status_code == 202, upload.text
    location = upload.headers["Location"]
    location = location if location.startswith("http") else f"http://{registry}{location}"
    done = requests.put(location, params={"digest": config_digest}, data=config, timeout=10,
                        **{**auth, "headers": {**auth.get("headers", {}), "Content-Type": "application/octet-stream"}})
    assert done.status_code == 201, done.text
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [],
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                                  "size": len(config)}}).encode()
    put = requests.put(f"{base}/manifests/{tag}", data=body, timeout=10,
                       **{**auth, "headers": {**auth.get("headers", {}), "Content-Type": OCI_MANIFEST}})
    assert put.status_code == 201, put.text
    return f"sha256:{hashlib.sha256(body).hexdigest()}"


@pytest.fixture(scope="module")
def remote_only(registry, tmp_path_factory, docker_client):  # noqa: F811
    """examples/mlp built, pushed, and then gone from the engine: (tag, digest, env)."""
    import docker

    tag = f"{registry}/team/remote-only:1.0.0-cpu"
    env = login(tmp_path_factory.mktemp("login"), registry, PASSWORD)
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--base-image", BASE_IMAGE, "--tag", tag, "--push", "--json",
                   env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    digest = json.loads(proc.stdout)["images"][0]["digest"]
    docker_client.images.remove(tag, force=True)
    try:
        docker_client.images.remove(digest, force=True)  # the repo digest, when the image still has other names
    except docker.errors.ImageNotFound:
        pass
    for ref in (tag, digest):
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(ref)
    return tag, digest, env


def test_deploy_from_the_registry_alone_pins_the_pushed_digest(remote_only, tmp_path):
    tag, digest, env = remote_only
    for target, path in (("kubernetes", "spec.template.spec"), ("kserve", "spec.predictor"), ("compose", None)):
        proc = run_cli("deploy", tag, "--target", target, "--output", str(tmp_path / target), env=env)
        assert proc.returncode == 0, proc.stderr
        (written,) = (tmp_path / target).iterdir()
        doc = next(yaml.safe_load_all(written.read_text()))
        if path is None:
            images = [doc["services"]["iris-mlp"]["image"]]
        else:
            for key in path.split("."):
                doc = doc[key]
            images = [c["image"] for c in doc["containers"]]
        assert images == [digest], (target, images)
    by_digest = run_cli("deploy", digest, "--target", "kubernetes", env=env)  # repo@sha256:... alone, too
    assert by_digest.returncode == 0, by_digest.stderr
    assert next(yaml.safe_load_all(by_digest.stdout))["spec"]["template"]["spec"]["containers"][0]["image"] == digest
    no_engine = run_cli("deploy", tag, "--target", "compose", env={**env, "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert no_engine.returncode == 0, no_engine.stderr  # the registry alone: no Docker engine needed
    assert yaml.safe_load(no_engine.stdout)["services"]["iris-mlp"]["image"] == digest


def test_inspect_reads_the_registry_and_run_pulls_as_docker_run_does(remote_only, docker_client):
    tag, digest, env = remote_only
    proc = run_cli("inspect", tag, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["registry_digest"] == digest and info["id"].startswith("sha256:") and info["size_bytes"] > 0
    assert info["labels"]["io.gpux.provider"] == "cpu" and info["labels"]["io.gpux.model.name"] == "iris-mlp"
    never = run_cli("run", tag, "--pull", "never", env=env)
    assert never.returncode == 2 and f"docker pull {tag}" in one_error_line(never)
    run = run_cli("run", tag, "--detach", env=env)  # --pull missing: pulled with the login's credentials
    try:
        assert run.returncode == 0, run.stderr
        url = run.stdout.split()[0]
        assert requests.post(url + "/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]}, timeout=30).status_code == 200
        assert docker_client.images.get(tag).id == info["id"]
    finally:
        for c in docker_client.containers.list(all=True, filters={"label": "io.gpux.pack.role=run"}):
            c.remove(force=True)
        docker_client.images.remove(tag, force=True)  # the module's other tests read the registry alone
        for volume in docker_client.volumes.list(filters={"name": "gpux-cache-iris-mlp"}):
            volume.remove(force=True)
    wrong = run_cli("run", tag, env={"DOCKER_CONFIG": str(Path(env["DOCKER_CONFIG"]) / "none")})
    lines = wrong.stderr.strip().splitlines()  # the progress line, then the one error line
    assert wrong.returncode == 2 and lines[0] == f"pulling {tag}" and len(lines) == 2, wrong.stderr
    assert lines[1].startswith(f"error: {tag}: no such image on this Docker engine, and it cannot be pulled: ")
    assert "credentials" in lines[1], lines[1]


def test_an_index_tag_pins_the_index_and_its_amd64_member_is_read(remote_only, registry):  # noqa: F811
    """An index written through the API: an attestation-like entry first, then the pushed
    image as linux/amd64. deploy pins the index (each node pulls its platform)."""
    tag, digest, env = remote_only
    base = f"http://{registry}/v2/team/remote-only"
    auth = (USER, PASSWORD)
    manifest = requests.get(f"{base}/manifests/{digest.split('@')[1]}", auth=auth, timeout=10,
                            headers={"Accept": OCI_MANIFEST + ", application/vnd.docker.distribution.manifest.v2+json"})
    assert manifest.status_code == 200, manifest.text
    entry = {"mediaType": manifest.headers["Content-Type"], "digest": digest.split("@")[1],
             "size": len(manifest.content)}
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {**entry, "platform": {"architecture": "unknown", "os": "unknown"}},
        {**entry, "platform": {"architecture": "amd64", "os": "linux"}}]}
    body = json.dumps(index).encode()
    put = requests.put(f"{base}/manifests/multi", data=body, auth=auth, timeout=10, headers={"Content-Type": OCI_INDEX})
    assert put.status_code == 201, put.text
    pinned = f"{registry}/team/remote-only@sha256:{hashlib.sha256(body).hexdigest()}"
    proc = run_cli("deploy", f"{registry}/team/remote-only:multi", "--target", "kubernetes", env=env)
    assert proc.returncode == 0, proc.stderr
    assert next(yaml.safe_load_all(proc.stdout))["spec"]["template"]["spec"]["containers"][0]["image"] == pinned


def test_not_ours_unknown_tag_wrong_password_unreachable_are_one_line(remote_only, registry, tmp_path):  # noqa: F811
    tag, digest, env = remote_only
    put_image(registry, "team/plain:1", {}, auth=(USER, PASSWORD))  # an image with no gpux labels
    ours = run_cli("deploy", f"{registry}/team/plain:1", "--target", "kubernetes", env=env)
    assert ours.returncode == 2 and "not an image built by gpux-pack" in one_error_line(ours)
    shown = run_cli("inspect", f"{registry}/team/plain:1", "--json", env=env)  # inspect takes any image
    assert shown.returncode == 0 and json.loads(shown.stdout)["labels"] == {}, shown.stderr

    unknown = run_cli("deploy", f"{registry}/team/remote-only:no-such-tag", "--target", "compose", env=env)
    assert unknown.returncode == 2, unknown.stderr
    assert f"no such image in registry {registry}" in one_error_line(unknown) and "MANIFEST_UNKNOWN" in unknown.stderr
    wrong = run_cli("deploy", tag, "--target", "kserve", env=login(tmp_path / "wrong", registry, "wrong"))
    assert wrong.returncode == 1 and "authentication failed" in one_error_line(wrong)
    closed = f"127.0.0.1:{free_port()}"
    nowhere = run_cli("deploy", f"{closed}/team/remote-only:1", "--target", "compose",
                      env=login(tmp_path / "closed", closed, PASSWORD))
    assert nowhere.returncode == 1 and f"registry {closed} unreachable" in one_error_line(nowhere)
    bare = run_cli("deploy", "gpux-test/never-built:1", "--target", "compose", env=env)
    assert bare.returncode == 2 and "no such image on this Docker engine" in one_error_line(bare)


def test_a_bearer_token_registry_is_read_with_a_pull_token(token_registry, tmp_path):  # noqa: F811
    """Docker Hub's and GHCR's scheme: the token service is asked for pull on the repository only."""
    registry, issued = token_registry
    challenge = requests.get(f"http://{registry}/v2/", timeout=10).headers["WWW-Authenticate"]
    realm = challenge.split('realm="')[1].split('"')[0]
    token = requests.get(realm, params={"service": "gpux-test-registry", "scope": "repository:team/tokened:pull,push"},
                         auth=(USER, PASSWORD), timeout=10).json()["token"]
    labels = {"io.gpux.pack.version": "0.1.0", "io.gpux.provider": "cpu", "io.gpux.port": "8080",
              "io.gpux.model.name": "tokened"}
    digest = put_image(registry, "team/tokened:1", labels, headers={"Authorization": f"Bearer {token}"})
    issued.clear()
    proc = run_cli("deploy", f"{registry}/team/tokened:1", "--target", "compose",
                   env=login(tmp_path / "ok", registry, PASSWORD))
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["services"]["tokened"]["image"] == f"{registry}/team/tokened@{digest}"
    assert issued and all(a == [{"type": "repository", "name": "team/tokened", "actions": ["pull"]}] for a in issued)
    wrong = run_cli("inspect", f"{registry}/team/tokened:1", env=login(tmp_path / "bad", registry, "wrong"))
    assert wrong.returncode == 1 and "authentication failed" in one_error_line(wrong)


def test_build_push_json_replays_and_pushes_only_the_new_weights(registry, tmp_path, docker_client):  # noqa: F811
    """`build --push --sign-key --json`, as CI pipelines call it, after new weights: replayed (no
    plan, no lock), pushed (the registry has every layer but the model's) with its SBOM and
    provenance attached and signed, so `verify` passes; the summary with the new digest. With
    --sign-model the weights-only rebuild is a full one: the new image's model signature verifies."""
    import onnx
    from onnx import numpy_helper

    from tests.conftest import copy_example, key_pair, serve

    private, public, _ = key_pair(tmp_path, "key")
    env = login(tmp_path / "login", registry, PASSWORD)
    project = copy_example("mlp", tmp_path)
    tag = f"{registry}/team/replayed:1"
    args = ("build", str(project), "--base-image", BASE_IMAGE, "--tag", tag, "--push", "--json",
            "--sign-key", str(private))
    made = []

    def new_weights():
        model = onnx.load(str(project / "model.onnx"))
        init = model.graph.initializer[-1]
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + 0.5, init.name))
        onnx.save(model, str(project / "model.onnx"))

    try:
        first = run_cli(*args, env=env)
        assert first.returncode == 0, first.stderr[-2000:]
        made.append(docker_client.images.get(tag).id)  # untagged by the second build, removed below
        new_weights()
        second = run_cli(*args, env=env)
        assert second.returncode == 0 and "only the model's weights changed" in second.stderr, second.stderr[-2000:]
        made.append(docker_client.images.get(tag).id)  # untagged by the third build
        before, after = (json.loads(p.stdout)["images"][0]["digest"] for p in (first, second))
        assert after and after != before
        row = json.loads(second.stdout)["images"][0]
        assert row["attestations"]["sbom"].startswith(f"{registry}/team/replayed@sha256:"), row
        assert Path(row["sbom"]).is_file() and row["id"].replace(":", "-") in row["sbom"]
        manifest = requests.get(f"http://{registry}/v2/team/replayed/manifests/{after.split('@')[1]}",
                                auth=(USER, PASSWORD), timeout=10,
                                headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
        assert manifest.status_code == 200, manifest.text
        assert "layer already exists" in second.stderr, second.stderr[-2000:]  # all but the model layer
        verified = run_cli("verify", after, "--key", str(public), env=env)
        assert verified.returncode == 0, verified.stderr[-2000:]

        signed_model = (*args, "--sign-model", str(private))
        third = run_cli(*signed_model, env=env)
        assert third.returncode == 0, third.stderr[-2000:]
        made.append(docker_client.images.get(tag).id)
        new_weights()
        fourth = run_cli(*signed_model, env=env)
        assert fourth.returncode == 0 and "only the model's weights changed" not in fourth.stderr, fourth.stderr
        digest = json.loads(fourth.stdout)["images"][0]["digest"]
        verified = run_cli("verify", digest, "--key", str(public), env=env)
        assert verified.returncode == 0, verified.stderr[-2000:]
        with serve(tag, read_only=True, tmpfs={"/tmp": ""}, env={"GPUX_VERIFY_MODEL": "1"}) as server:
            assert server.post("/predict", json={"features": [[5.1, 3.5, 1.4, 0.2]]}).status_code == 200
    finally:
        for ref in (tag, *made):
            try:
                docker_client.images.remove(ref, force=True)
            except Exception:
                pass