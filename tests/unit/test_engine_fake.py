"""The pipeline's decisions about the engine, through the in-memory engine (tests/fake_engine.py):
what it asks, what it removes or keeps, what it loads, and the one line it says when the engine
refuses. And the Engine protocol itself: the fake and the Docker SDK's client both answer every
member it names, with the arguments gpux-pack passes."""

from __future__ import annotations

import inspect
import io
import json
import os
import socket
import tarfile
from datetime import datetime, timedelta, timezone

import docker
import pytest

from gpux_pack import engine
from gpux_pack.commands import base
from gpux_pack.engine import image_labels, interface
from gpux_pack.errors import BuildError, DockerError, UsageError
from gpux_pack.image import builder
from gpux_pack.image.archive import Loadable
from gpux_pack.image.assembler import ASSEMBLED, load
from gpux_pack.image.context import Context, Entry
from gpux_pack.image.maker import Assembler
from gpux_pack.pipeline import bake
from gpux_pack.runtime.contract import CACHE_DIR
from gpux_pack.ui import Reporter
from tests.fake_engine import FakeEngine

OURS = {"io.gpux.pack.version": "1.0", "io.gpux.provider": "cpu", "io.gpux.port": "8080"}
QUIET = Reporter(quiet=True)
NO_PROCESS = (1 << 22) + 1  # above Linux's largest pid_max: no process has it


# ---------------------------------------------------------------------------------------------
# the protocol: what it names, the fake and the SDK both answer


def _members(protocol: type) -> dict[str, object]:
    return {name: value for name, value in vars(protocol).items() if not name.startswith("_")}


def _refusals(wanted: inspect.Signature, given: inspect.Signature) -> list[str]:
    """The protocol's arguments the implementation would not take as gpux-pack passes them (the
    first ones by position, the rest by name), and its own required arguments nobody passes."""
    kinds = inspect.Parameter
    params = list(given.parameters.values())
    positional = [p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    star = any(p.kind is kinds.VAR_POSITIONAL for p in params)
    star_star = any(p.kind is kinds.VAR_KEYWORD for p in params)
    wanted_params = list(wanted.parameters.values())[1:]  # self
    out = []
    for at, p in enumerate(wanted_params):
        if p.kind is kinds.VAR_KEYWORD:
            ok = star_star
        elif p.kind is kinds.POSITIONAL_OR_KEYWORD:
            ok = (at < len(positional) and positional[at] == p.name) or (star and star_star)
        else:
            ok = p.name in given.parameters and given.parameters[p.name].kind is not kinds.POSITIONAL_ONLY or star_star
        if ok and p.default is not p.empty and p.name in given.parameters \
                and given.parameters[p.name].default is p.empty:
            ok = False  # the protocol lets callers leave it out; the implementation requires it
        if not ok:
            out.append(p.name)
    names = {p.name for p in wanted_params}
    out += [f"requires {p.name}" for p in params if p.default is p.empty and p.name not in names
            and p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    return out


def _mismatches(pairs: list[tuple[type, object]]) -> list[str]:
    found = []
    for protocol, obj in pairs:
        for name, member in _members(protocol).items():
            where = f"{protocol.__name__}.{name} on {type(obj).__name__}"
            if isinstance(member, property):
                if not hasattr(obj, name):
                    found.append(f"{where}: missing")
            elif not callable(getattr(obj, name, None)):
                found.append(f"{where}: not a method")
            else:
                refused = _refusals(inspect.signature(member), inspect.signature(getattr(obj, name)))
                if refused:
                    found.append(f"{where}: {refused}")
    return found


def _pairs(client, image, container) -> list[tuple[type, object]]:
    return [(interface.Engine, client), (interface.Images, client.images), (interface.Containers, client.containers),
            (interface.Api, client.api), (interface.Image, image), (interface.Container, container)]


def test_the_protocol_names_members_and_nothing_else():
    """Every public name of a protocol is a member (a property or a method), so the checks below
    miss none; the module imports no Docker SDK."""
    for protocol in (interface.Engine, interface.Images, interface.Containers, interface.Api, interface.Image,
                     interface.Container):
        assert _members(protocol)
        assert all(isinstance(m, property) or inspect.isfunction(m) for m in _members(protocol).values()), protocol
    source = inspect.getsource(interface)
    assert "import docker" not in source and "from docker" not in source


def test_the_fake_engine_answers_the_whole_protocol():
    fake = FakeEngine()
    fake.add_image("gpux-test/m:1")
    image = fake.images.get("gpux-test/m:1")
    assert _mismatches(_pairs(fake, image, fake.containers.create("gpux-test/m:1"))) == []


def test_the_docker_sdk_answers_the_whole_protocol():
    """The protocol says what the real client takes: the same check on the SDK's own objects
    (made without an engine: an explicit API version asks nothing)."""
    from docker.models.containers import Container
    from docker.models.images import Image

    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    image = Image(attrs={"Id": "sha256:" + "0" * 64, "RepoTags": []}, client=client, collection=client.images)
    container = Container(attrs={"Id": "0" * 64, "State": {"Status": "created"}, "Config": {"Labels": {}}},
                          client=client, collection=client.containers)
    assert _mismatches(_pairs(client, image, container)) == []


def test_the_standard_library_client_and_the_sdk_adapter_answer_the_whole_protocol():
    """engine/local.py's client and sdk.py's wrapper of the SDK's (made without an engine: nothing
    is asked until a call); their containers are the SDK's."""
    from docker.models.containers import Container
    from docker.models.images import Image

    from gpux_pack.engine import local, sdk

    attrs = {"Id": "sha256:" + "0" * 64, "RepoTags": []}
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    container = Container(attrs={"Id": "0" * 64, "State": {"Status": "created"}, "Config": {"Labels": {}}},
                          client=client, collection=client.containers)
    mine = local.LocalEngine("/nonexistent/docker.sock", "1.41")
    mine._sdk = client
    assert _mismatches(_pairs(mine, local.Image(mine, attrs), container)) == []
    wrapped = sdk.SdkEngine(client)
    assert _mismatches(_pairs(wrapped, sdk.Image(Image(attrs=attrs, client=client, collection=client.images)),
                              container)) == []


def test_the_check_sees_a_missing_member_and_a_renamed_argument():
    class Images:
        def get(self, ref):  # not `name`: ImageCollection.get(name=...) would refuse it by name
            return None

        def remove(self, image, force=False):  # no noprune
            return None

    found = _mismatches([(interface.Images, Images())])
    assert any("Images.get" in f for f in found)
    assert any("Images.remove" in f and "noprune" in f for f in found)
    assert any("Images.list" in f and "not a method" in f for f in found)


# ---------------------------------------------------------------------------------------------
# ensure_image: `docker run --pull`'s policies


def test_present_with_pull_missing_asks_the_engine_once_and_pulls_nothing():
    fake = FakeEngine()
    fake.add_image("gpux-test/m:1")
    engine.ensure_image(fake, "gpux-test/m:1", "missing", print)
    assert fake.names() == ["images.get"]


def test_absent_with_pull_never_pulls_nothing_and_raises_nothing():
    fake = FakeEngine()
    fake.publish("localhost:5000/team/m:2")
    engine.ensure_image(fake, "localhost:5000/team/m:2", "never", print)
    assert fake.names() == ["images.get"] and fake.tags() == {}


def test_absent_with_pull_missing_pulls_repository_and_tag_and_says_how_many_layers():
    fake = FakeEngine()
    fake.publish("localhost:5000/team/m:2", layers=5)
    said = []
    engine.ensure_image(fake, "localhost:5000/team/m:2", "missing", said.append)
    assert fake.called("api.pull") == [(("localhost:5000/team/m",),
                                        {"tag": "2", "stream": True, "decode": True, "platform": None})]
    assert "localhost:5000/team/m:2" in fake.tags()
    assert said == ["pulling localhost:5000/team/m:2", "pulling localhost:5000/team/m:2: 4 layers",
                    "pulled localhost:5000/team/m:2 (5 layers)"]


def test_pull_always_pulls_an_image_that_is_present():
    fake = FakeEngine()
    old = fake.add_image("gpux-test/m:1")
    fake.publish("gpux-test/m:1")
    engine.ensure_image(fake, "gpux-test/m:1", "always", lambda _: None)
    assert len(fake.called("api.pull")) == 1
    assert fake.tags()["gpux-test/m:1"] != old["Id"]  # the registry's image has the tag now


def test_an_image_nowhere_is_a_usage_error_with_the_engines_own_words():
    fake = FakeEngine()
    with pytest.raises(UsageError) as err:
        engine.ensure_image(fake, "gpux-test/nowhere:1", "missing", lambda _: None)
    assert type(err.value) is UsageError and "\n" not in str(err.value)
    assert str(err.value) == ("gpux-test/nowhere:1: no such image on this Docker engine, and it cannot be pulled: "
                              "pull access denied for gpux-test/nowhere, repository does not exist or may require "
                              "'docker login'")


def test_a_failed_pull_of_an_image_this_engine_has_is_an_engine_error():
    fake = FakeEngine()
    fake.add_image("gpux-test/m:1")
    fake.publish("gpux-test/m:1", error="toomanyrequests: You have reached your pull rate limit.")
    with pytest.raises(DockerError) as err:
        engine.ensure_image(fake, "gpux-test/m:1", "always", lambda _: None)
    assert str(err.value) == "gpux-test/m:1: cannot pull it: toomanyrequests: You have reached your pull rate limit."


def test_not_a_reference_asks_the_engine_nothing():
    fake = FakeEngine()
    engine.ensure_image(fake, "REL4/MLP", "always", lambda _: None)
    assert fake.calls == []


# ---------------------------------------------------------------------------------------------
# base_image: present, absent, another platform


def test_a_base_present_for_another_platform_is_pulled_for_this_one_when_allowed():
    fake = FakeEngine()
    here = fake.add_image("gpux-test/base:1", architecture="amd64")
    fake.publish("gpux-test/base:1", architecture="arm64")
    kept = engine.base_image(fake, "gpux-test/base:1", False, print, platform="linux/arm64")
    assert kept["Id"] == here["Id"] and fake.called("api.pull") == []  # not allowed: the one here, as it is
    said = []
    attrs = engine.base_image(fake, "gpux-test/base:1", True, said.append, platform="linux/arm64")
    assert attrs["Architecture"] == "arm64" and fake.tags()["gpux-test/base:1"] == attrs["Id"]
    assert fake.called("api.pull") == [(("gpux-test/base",), {"tag": "1", "stream": False, "decode": False,
                                                              "platform": "linux/arm64"})]
    assert said == ["pulling base image gpux-test/base:1 for linux/arm64"]


def test_an_absent_base_is_none_without_pull_and_one_line_when_it_cannot_be_pulled():
    fake = FakeEngine()
    assert engine.base_image(fake, "gpux-test/base:1", False, print) is None
    assert fake.called("api.pull") == []
    with pytest.raises(DockerError) as err:
        engine.base_image(fake, "gpux-test/base:1", True, lambda _: None)
    assert str(err.value).startswith("base image gpux-test/base:1 is not present and cannot be pulled (")
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# what gpux-pack removes


def test_leftovers_are_the_never_started_containers_of_gone_or_unknown_owners():
    fake = FakeEngine()
    fake.add_image("gpux-test/base:1")
    host, long_ago = socket.gethostname(), datetime.now(timezone.utc) - timedelta(hours=2)

    def made(role: str = "export", owner: str | None = None, **kw) -> str:
        labels = {engine.ROLE_LABEL: role, **({engine.OWNER_LABEL: owner} if owner is not None else {})}
        return fake.add_container("gpux-test/base:1", labels=labels, **kw).id

    gone = made(owner=f"{host}:{NO_PROCESS}")
    unowned = made()
    old_elsewhere = made(owner="elsewhere:12", created=long_ago)
    kept = {made(owner=f"{host}:{os.getpid()}"),  # a live build's
            made(owner="elsewhere:12"),  # another host's, recent: its owner may be alive
            made(owner=f"{host}:{NO_PROCESS}", status="running"),  # started: not ours to judge
            made(owner=f"{host}:{NO_PROCESS}", status="exited"),
            made(role="warmup", owner=f"{host}:{NO_PROCESS}")}
    assert engine.remove_leftovers(fake, "export") == 3
    assert set(fake.containers.by_id) == kept
    assert {args[0] for args, _ in fake.called("container.remove")} == {gone, unowned, old_elsewhere}
    assert fake.called("containers.list") == [((), {"all": True, "filters": {
        "label": f"{engine.ROLE_LABEL}=export", "status": "created"}})]


def test_removing_leftovers_never_raises():
    fake = FakeEngine()
    fake.add_image("gpux-test/base:1")
    fake.add_container("gpux-test/base:1", labels={engine.ROLE_LABEL: "export"})
    fake.failing["container.remove"] = docker.errors.APIError("500 Server Error: removal in progress")
    assert engine.remove_leftovers(fake, "export") == 0
    fake.failing["containers.list"] = docker.errors.APIError("500 Server Error: engine busy")
    assert engine.remove_leftovers(fake, "export") == 0


def test_remove_untagged_removes_an_image_without_a_tag_only():
    fake = FakeEngine()
    tagged = fake.add_image("gpux-test/m:1")
    untagged = fake.add_image(None)
    engine.remove_untagged(fake, tagged["Id"])
    assert tagged["Id"] in fake.images.by_id and fake.called("images.remove") == []
    engine.remove_untagged(fake, untagged["Id"])
    assert untagged["Id"] not in fake.images.by_id
    assert fake.called("images.remove") == [((untagged["Id"],), {"force": False, "noprune": False})]
    engine.remove_untagged(fake, untagged["Id"])  # gone already: nothing to do, nothing raised


def test_base_prune_removes_unused_runtime_bases_by_their_tags_only():
    fake = FakeEngine()
    days_ago = datetime.now(timezone.utc) - timedelta(days=3)
    old = fake.add_image("gpux-pack/runtime-cpu:old", last_tagged=days_ago)
    fake.add_image("gpux-pack/runtime-cpu:new")
    used = fake.add_image("gpux-pack/runtime-cuda:used", last_tagged=days_ago)
    fake.add_container("gpux-pack/runtime-cuda:used", status="exited")  # a stopped container still uses it
    twice = fake.add_image("gpux-pack/runtime-rocm:a", more_tags=["gpux-pack/runtime-rocm:b"], last_tagged=days_ago)
    marked = fake.add_image("gpux-pack/runtime-openvino:1", last_tagged=days_ago)
    other = fake.add_image("gpux-test/unrelated:1", last_tagged=days_ago)
    engine.mark_used(fake, "gpux-pack/runtime-openvino:1")  # a build used it just now

    removed = base.prune(fake, older_than=86400)
    assert sorted(tag for row in removed for tag in row["tags"]) == [
        "gpux-pack/runtime-cpu:old", "gpux-pack/runtime-rocm:a", "gpux-pack/runtime-rocm:b"]
    assert old["Id"] not in fake.images.by_id and twice["Id"] not in fake.images.by_id
    assert {used["Id"], marked["Id"], other["Id"]} <= set(fake.images.by_id)
    assert sorted(args[0] for args, _ in fake.called("images.remove")) == [
        "gpux-pack/runtime-cpu:old", "gpux-pack/runtime-rocm:a", "gpux-pack/runtime-rocm:b"]  # by tag, never by id
    assert fake.called("images.list") == [((), {"filters": {"reference": "gpux-pack/runtime-*"}})]


# ---------------------------------------------------------------------------------------------
# an image's labels


def test_an_image_of_ours_is_read_with_its_labels():
    fake = FakeEngine()
    attrs = fake.add_image("gpux-test/m:1", labels={**OURS, "other": "x"})
    found = image_labels.read(fake, "gpux-test/m:1")
    assert found.id == attrs["Id"] and found.provider == "cpu" and found.port == 8080
    assert found.labels["other"] == "x" and found.size_bytes == attrs["Size"]


def test_an_image_not_ours_is_refused_unless_anything_goes():
    fake = FakeEngine()
    fake.add_image("gpux-test/plain:1", labels={"maintainer": "someone"})
    with pytest.raises(UsageError, match=r"^gpux-test/plain:1: not an image built by gpux-pack \(no "):
        image_labels.read(fake, "gpux-test/plain:1")
    assert image_labels.read(fake, "gpux-test/plain:1", built_by_us=False).labels == {"maintainer": "someone"}


def test_an_absent_image_is_none_here_and_one_usage_line_for_run():
    fake = FakeEngine()
    assert image_labels.local(fake, "gpux-test/m:1") is None
    with pytest.raises(UsageError) as err:
        image_labels.read(fake, "localhost:5000/m:1")
    assert str(err.value) == ("localhost:5000/m:1: no such image on this Docker engine "
                              "(--pull never; docker pull localhost:5000/m:1 gets it)")
    with pytest.raises(UsageError) as err:
        image_labels.read(fake, "gpux-test/m:1")
    assert str(err.value) == "gpux-test/m:1: no such image on this Docker engine"


def test_a_bad_reference_asks_nothing_and_an_engine_failure_is_one_docker_line():
    fake = FakeEngine()
    with pytest.raises(UsageError):
        image_labels.local(fake, "REL4/MLP")
    assert fake.calls == []
    fake.failing["images.get"] = interface.EngineError("500 Server Error: Internal Server Error\nmore", 500)
    with pytest.raises(DockerError) as err:
        image_labels.local(fake, "gpux-test/m:1")
    assert str(err.value) == "cannot inspect gpux-test/m:1: 500 Server Error: Internal Server Error"


# ---------------------------------------------------------------------------------------------
# images made: loaded (the assembler) and built (the engine's builder)


KEY = "0123456789abcdef01234567"


def _warming(fake: FakeEngine, *, exit_code: int = 0, state: dict | None = None, stderr: bytes = b"") -> dict:
    """An image of ours whose warmup container compiles a cache (or does as told)."""
    parent = fake.add_image("gpux-test/m:1", labels=OURS, layers=3)
    record = {"parts": {"provider": "cpu", "device": "x86_64", "onnxruntime": "1.20"}}
    line = json.dumps({"warmup": state or {"cache": "compiled", "key": KEY}, "folder": f"{CACHE_DIR}/{KEY}"})
    where = f"{CACHE_DIR.lstrip('/')}/{KEY}"
    fake.script("gpux-test/m:1", exit_code=exit_code, stdout=line.encode() + b"\n", stderr=stderr,
                files={f"{where}/warmup.json": json.dumps(record).encode(), f"{where}/model.engine": b"compiled!"})
    return parent


def _files(layer: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def test_a_baked_warmup_loads_the_image_with_only_the_cache_layer_sent():
    fake = FakeEngine()
    parent = _warming(fake)
    baked = bake.bake_image(fake, "gpux-test/m:1", QUIET, Assembler(fake, QUIET, b""), tag="gpux-test/m:warm")

    (create_args, create_kw), = fake.called("containers.create")
    assert create_args == (parent["Id"],) and create_kw["command"] == ["warmup"] and create_kw["network_disabled"]
    assert create_kw["labels"] == {engine.ROLE_LABEL: "warmup"}
    assert fake.containers.by_id == {}  # the warmup container went
    (loaded,) = fake.loaded
    assert loaded.tags == ["gpux-test/m:warm"] and baked.id == loaded.id == fake.tags()["gpux-test/m:warm"]
    assert loaded.config["rootfs"]["diff_ids"][:3] == parent["RootFS"]["Layers"]  # on the parent's layers ...
    (layer, data), = loaded.sent.items()  # ... which were not sent again: only the cache's
    assert loaded.config["rootfs"]["diff_ids"] == [*parent["RootFS"]["Layers"], layer]
    assert _files(data) == {f"opt/gpux/warm/{KEY}/warmup.json": json.dumps({"parts": {
        "provider": "cpu", "device": "x86_64", "onnxruntime": "1.20"}}).encode(),
        f"opt/gpux/warm/{KEY}/model.engine": b"compiled!"}
    labels = loaded.config["config"]["Labels"]
    assert labels == {**OURS, "io.gpux.warmup": "baked", "io.gpux.warmup.key": KEY,
                      "io.gpux.warmup.key.provider": "cpu", "io.gpux.warmup.key.device": "x86_64",
                      "io.gpux.warmup.key.onnxruntime": "1.20"}
    assert loaded.config["history"][-2]["created_by"].startswith(ASSEMBLED)
    cache = bake.cache_of(fake, baked)
    assert cache is not None and cache.layer == layer and cache.path == f"/opt/gpux/warm/{KEY}"


def test_a_warmup_that_compiles_nothing_tags_the_image_itself():
    fake = FakeEngine()
    parent = _warming(fake, state={"cache": "none", "key": ""})
    baked = bake.bake_image(fake, "gpux-test/m:1", QUIET, Assembler(fake, QUIET, b""), tag="gpux-test/m:warm")
    assert baked.id == parent["Id"] == fake.tags()["gpux-test/m:warm"]
    assert fake.loaded == [] and fake.called("api.load_image") == []


def test_a_failed_warmup_is_its_own_last_words_and_leaves_no_container():
    fake = FakeEngine()
    _warming(fake, exit_code=3, stderr=b"loading the model\ngpux: no NVIDIA GPU visible in the container\n")
    with pytest.raises(BuildError) as err:
        bake.bake_image(fake, "gpux-test/m:1", QUIET, Assembler(fake, QUIET, b""), tag="gpux-test/m:warm")
    assert str(err.value) == "warmup failed: no NVIDIA GPU visible in the container"
    assert fake.containers.by_id == {} and fake.loaded == []


def test_an_archive_naming_layers_the_engine_lacks_is_refused_and_moves_no_tag():
    fake = FakeEngine()
    fake.add_image("gpux-test/m:1")
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": ["sha256:" + "1" * 64]}, "config": {}}).encode()
    with pytest.raises(DockerError) as err:
        load(fake, [Loadable("gpux-test/m:1", config, ["sha256:" + "1" * 64], [])])
    assert str(err.value).startswith("the engine refused the assembled image: open ")
    assert fake.loaded == [] and len(fake.tags()) == 1


def _context(dockerfile: str) -> Context:
    return Context((Entry("Dockerfile", data=dockerfile.encode()),))


def test_the_builder_builds_the_tag_and_counts_its_steps():
    fake = FakeEngine()
    fake.add_image("gpux-test/base:1")
    built = builder.engine_build(fake, _context("FROM gpux-test/base:1\nRUN true\nLABEL a=b\n"), "gpux-test/b:1", QUIET,
                          platform="linux/amd64")
    assert built.tag == "gpux-test/b:1" and built.id == fake.tags()["gpux-test/b:1"] and built.steps == 3
    (sent,) = fake.builds
    assert {k: sent[k] for k in ("tag", "pull", "nocache", "rm", "forcerm", "platform")} == {
        "tag": "gpux-test/b:1", "pull": False, "nocache": False, "rm": True, "forcerm": True, "platform": "linux/amd64"}
    assert fake.images.by_id[built.id]["Config"]["Labels"] == {"a": "b"}


def test_a_failed_step_is_one_line_with_its_exit_code_and_its_last_output():
    fake = FakeEngine()
    fake.add_image("gpux-test/base:1")
    fake.fail_step = (2, ["collecting numpy", "error: no matching distribution"], 7)
    with pytest.raises(BuildError) as err:
        builder.engine_build(fake, _context("FROM gpux-test/base:1\nRUN pip install numpy\n"), "gpux-test/b:1", QUIET)
    assert str(err.value) == "step 2/2 failed (exit 7): error: no matching distribution\n  in: RUN pip install numpy"
    assert err.value.log_tail == ["collecting numpy", "error: no matching distribution"]
    assert "gpux-test/b:1" not in fake.tags()
