"""Runtimes other than Docker's engine run what gpux-pack makes (issue 19): an image built on a
base whose config has no PATH (what `docker import` gives) is complete on its own (PATH, an
absolute entrypoint; both makers agree), `podman kube play` runs the Deployment `deploy`
writes, locked down as written, and docker-compose 1.29 runs the compose file. Containers
are reached only through ports published on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request

import pytest
import yaml

from gpux_pack.plan import DEFAULT_PATH, HEALTH_START, UID
from tests.conftest import BASE_IMAGE, EXAMPLES, RUN_ID, free_port, run_cli
from tests.e2e.conftest import PASSWORD, USER

pytestmark = pytest.mark.e2e

SAME_TIME = {"SOURCE_DATE_EPOCH": "1767225600"}  # both makers' images claim one creation time
PODMAN_PAUSE = "localhost/podman-pause"  # the infra image podman 4.3 builds for a pod (catatonit)


def sh(*args: str, timeout: float = 300, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check:
        assert proc.returncode == 0, f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def config_of(ref: str) -> dict:
    return json.loads(sh("docker", "image", "inspect", ref).stdout)[0]["Config"]


def wait_ready(url: str, alive, timeout: float = 120) -> None:
    """Poll readiness until 200; alive() says why not when the container is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        problem = alive()
        assert problem is None, problem
        time.sleep(0.2)
    pytest.fail(f"{url} never became ready")


@pytest.fixture(scope="module")
def bare_base(docker_client):
    """The offline base exported and imported: the same files, a config with no Env (no PATH)."""
    tag = f"gpux-test-{RUN_ID}/bare-base:1"
    created = sh("docker", "create", BASE_IMAGE).stdout.strip()
    try:
        export = subprocess.Popen(["docker", "export", created], stdout=subprocess.PIPE)
        sh("docker", "import", "-", tag, stdin=export.stdout)
        assert export.wait(timeout=120) == 0
    finally:
        sh("docker", "rm", created, check=False)
    assert not config_of(tag).get("Env")
    yield tag
    sh("docker", "rmi", tag, check=False)


@pytest.fixture(scope="module")
def pushed_bare(registry, bare_base, tmp_path_factory, docker_client):  # noqa: F811
    """examples/mlp on the PATH-less base, assembled on the host and pushed: tag, summary."""
    tag = f"{registry}/team/runtimes:1.0.0-cpu"
    folder = tmp_path_factory.mktemp("login")
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {registry: {"auth": auth}}}))
    started = time.monotonic()
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--base-image", bare_base, "--tag", tag, "--push", "--json",
                   env={**SAME_TIME, "DOCKER_CONFIG": str(folder)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)["images"][0]
    print(f"build + push on the bare base: {time.monotonic() - started:.1f} s")
    yield tag, summary
    sh("docker", "rmi", "-f", tag, summary["runtime_base"], check=False)


def test_an_image_on_a_base_without_path_is_complete_and_both_makers_agree(pushed_bare, bare_base, docker_client):
    tag, summary = pushed_bare
    assert summary["assembled"], summary  # the host's assembler made it (the path that lost PATH)
    config = config_of(tag)
    assert f"PATH={DEFAULT_PATH}" in config["Env"]
    python = "/usr/bin/python3"  # the offline base's Debian python3, as the probe found it
    assert config["Entrypoint"] == [python, "-m", "gpux_runtime"] and config["Cmd"] == ["serve"]
    assert config["Healthcheck"]["Test"] == ["CMD", python, "-m", "gpux_runtime", "healthcheck"]
    assert config["User"] == f"{UID}:{UID}"
    # the engine's builder, from the same Dockerfile, on the same base under another name (so
    # a runtime base image of its own is built, not reused): the same config
    other = f"gpux-test-{RUN_ID}/bare-base:builder"
    sh("docker", "tag", bare_base, other)
    built_tag = f"gpux-test-{RUN_ID}/runtimes:builder"
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--base-image", other, "--tag", built_tag, "--json",
                   env={**SAME_TIME, "GPUX_PACK_ASSEMBLE": "0"})
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        built = json.loads(proc.stdout)["images"][0]
        assert not built["assembled"] and built["runtime_base_built"], built
        for ref_a, ref_b in ((summary["runtime_base"], built["runtime_base"]), (tag, built_tag)):
            a, b = config_of(ref_a), config_of(ref_b)
            for c in (a, b):  # what differs by construction: the parent's id, the base's name
                c.pop("Image", None)
                c["Labels"].pop("org.opencontainers.image.base.name", None)
            assert a == b, (ref_a, ref_b)
    finally:
        sh("docker", "rmi", "-f", built_tag, other, *(
            [json.loads(proc.stdout)["images"][0]["runtime_base"]] if proc.returncode == 0 else []), check=False)


def _podman_images() -> set[str]:
    return set(sh("podman", "images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split())


def test_podman_kube_play_runs_the_deployment_locked_down(pushed_bare, registry, tmp_path):  # noqa: F811
    """podman 4.3 pulls the pinned digest from the registry (--creds, --tls-verify=false), applies
    the read-only root, the user, no-new-privileges and the dropped capabilities, and runs the
    liveness probe as its health check inside the container: it must pass there, or podman
    restarts the container and takes the pod down (the image has no curl)."""
    tag, _ = pushed_bare
    started = time.monotonic()
    proc = run_cli("deploy", tag, "--target", "kubernetes", "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (manifest,) = tmp_path.glob("*.yaml")
    docs = list(yaml.safe_load_all(manifest.read_text()))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]  # podman plays the first, skips the Service
    pod = docs[0]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    digest = container["image"]
    port = free_port()
    container["ports"][0].update(hostPort=port, hostIP="127.0.0.1")  # published on loopback only
    played = tmp_path / "played.yaml"
    played.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    before = _podman_images()
    name = f"{docs[0]['metadata']['name']}-pod-0-{container['name']}"  # podman's name for the container
    try:
        sh("podman", "kube", "play", "--tls-verify=false", "--creds", f"{USER}:{PASSWORD}", str(played), timeout=300)

        def alive() -> str | None:
            state = json.loads(sh("podman", "inspect", name).stdout)[0]["State"]
            if state["Status"] != "running":
                return f"{name} is {state['Status']}:\n" + sh("podman", "logs", name, check=False).stderr[-3000:]
            return None

        wait_ready(f"http://127.0.0.1:{port}", alive)
        print(f"podman kube play -> ready: {time.monotonic() - started:.1f} s")
        info = json.loads(sh("podman", "inspect", name).stdout)[0]
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        assert info["Config"]["User"] == f"{UID}:{UID}" and info["EffectiveCaps"] in (None, [])
        assert "no-new-privileges" in info["HostConfig"]["SecurityOpt"]
        assert sh("podman", "exec", name, "id", "-u").stdout.strip() == str(UID)
        denied = sh("podman", "exec", name, "touch", "/written", check=False)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr, denied
        assert sh("podman", "exec", name, "touch", "/tmp/written", check=False).returncode == 0  # the emptyDir
        # the liveness probe as podman's health check: a start period, so a slow load is not restarted
        assert info["Config"]["Healthcheck"]["StartPeriod"] == HEALTH_START * 10**9, info["Config"]["Healthcheck"]
        # the liveness probe, as podman runs it (a systemd timer where systemd runs; here, by hand)
        health = sh("podman", "healthcheck", "run", name, check=False)
        assert health.returncode == 0, (info["Config"].get("Healthcheck"), health.stdout, health.stderr)
        assert alive() is None
    finally:
        down = sh("podman", "kube", "down", str(played), check=False)
        made = _podman_images() - before
        sh("podman", "rmi", "-f", digest, *made, check=False)
        leftovers = sh("podman", "ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}").stdout.strip()
        print(f"podman kube play, checks, down: {time.monotonic() - started:.1f} s")
    assert down.returncode == 0 and not leftovers, (down.stderr, leftovers)


def test_docker_compose_runs_the_compose_file(pushed_bare, tmp_path, docker_client):
    """docker-compose 1.29 `up -d` of what deploy writes (its "8080:8080" moved to a free port on
    127.0.0.1), ready, healthy by the image's own HEALTHCHECK, locked down; then `down -v`."""
    tag, _ = pushed_bare
    started = time.monotonic()
    proc = run_cli("deploy", tag, "--target", "compose", "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load((tmp_path / "compose.yaml").read_text())
    (service_name,) = doc["services"]
    service = doc["services"][service_name]
    assert service["ports"] == ["8080:8080"]
    port = free_port()
    service["ports"] = [f"127.0.0.1:{port}:8080"]
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    project = f"gpuxtest{RUN_ID}"
    compose = ["docker-compose", "-p", project, "-f", str(tmp_path / "compose.yaml")]
    try:
        sh(*compose, "up", "-d", timeout=300)
        (cid,) = sh(*compose, "ps", "-q").stdout.split()

        def state() -> dict:
            return json.loads(sh("docker", "inspect", cid).stdout)[0]["State"]

        def alive() -> str | None:
            s = state()
            return None if s["Running"] else f"exited: {sh('docker', 'logs', cid, check=False).stderr[-3000:]}"

        wait_ready(f"http://127.0.0.1:{port}", alive)
        print(f"docker-compose up -> ready: {time.monotonic() - started:.1f} s")
        deadline = time.monotonic() + 60  # the HEALTHCHECK's first run comes one interval (10 s) after start
        while (health := state()["Health"])["Status"] != "healthy":  # one read a round: it may turn meanwhile
            assert health["Status"] == "starting" and time.monotonic() < deadline, health
            time.sleep(0.5)
        host = json.loads(sh("docker", "inspect", cid).stdout)[0]["HostConfig"]
        assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"]
        print(f"docker-compose -> healthy: {time.monotonic() - started:.1f} s")
    finally:
        down = sh(*compose, "down", "-v", timeout=120, check=False)
        print(f"docker-compose up, checks, down: {time.monotonic() - started:.1f} s")
    assert down.returncode == 0, down.stderr
    made_by = f"label=com.docker.compose.project={project}"
    assert not sh("docker", "ps", "-aq", "--filter", made_by).stdout.strip()
    assert not sh("docker", "volume", "ls", "-q", "--filter", made_by).stdout.strip()
