"""--platform a,b and --base-image PLATFORM=IMAGE: what each platform gets, and refusals."""

from __future__ import annotations

import pytest
from gpux_pack.commands.build import platforms as _platforms
from gpux_pack.errors import UsageError
from gpux_pack.registry.index import platform_of


def test_each_platform_gets_its_base_and_a_plain_base_is_for_all():
    platforms, bases = _platforms("linux/amd64,linux/arm64", ["linux/arm64=arm:1", "any:1"], True)
    assert platforms == ["linux/amd64", "linux/arm64"]
    assert bases == {"linux/arm64": "arm:1", None: "any:1"}
    assert _platforms(None, ["img:1"], False) == ([None], {None: "img:1"})
    assert _platforms(None, ["a:1", "b:1"], False) == ([None], {None: "b:1"})  # the last one wins


@pytest.mark.parametrize(
    ("platform", "bases", "push", "message"),
    [
        ("linux/amd64,linux/arm64", [], False, "several platforms need --push"),
        ("linux/arm64,linux/arm64/v8", [], True, "names a platform twice"),
        ("linux/amd64,linux/arm64", ["linux/s390x=img:1"], True, "linux/s390x is not a platform being built"),
    ],
)
def test_refusals_name_the_option(platform, bases, push, message):
    with pytest.raises(UsageError, match=message):
        _platforms(platform, bases, push)


def test_descriptor_platforms():
    assert platform_of("linux/amd64") == {"architecture": "amd64", "os": "linux"}
    assert platform_of("linux/arm64") == {"architecture": "arm64", "os": "linux", "variant": "v8"}


def test_credentials_never_go_to_a_plain_http_token_service_of_a_secure_registry():
    from gpux_pack.errors import DockerError
    from gpux_pack.registry.index import Registry

    registry = Registry.__new__(Registry)  # the fields _login reads; no engine needed
    registry.name, registry.path, registry.insecure, registry.auth = "registry.example", "team/m", False, {}
    with pytest.raises(DockerError, match="not HTTPS: refusing to send them in the clear"):
        registry._login('Bearer realm="http://auth.example/token",service="registry.example"')


@pytest.mark.parametrize(("ref", "expected"), [
    ("127.0.0.1:5000/team/m:1", ("127.0.0.1:5000", "team/m")),
    ("localhost/m", ("localhost", "m")),
    ("ghcr.io/org/m", ("ghcr.io", "org/m")),
    ("team/m:1", ("docker.io", "team/m")),
    ("python:3.11-slim", ("docker.io", "library/python")),
])
def test_which_registry_a_reference_names(ref, expected):
    from gpux_pack.reference import parse_reference

    assert parse_reference(ref).registry_path == expected
