"""Which member of an index stands for the image, and which references are looked up in a
registry when the engine lacks them (registry/remote.py, engine/image_labels.py)."""

from __future__ import annotations

import pytest

from gpux_pack.engine.image_labels import GpuxImage, from_config, names_registry
from gpux_pack.errors import UsageError
from gpux_pack.registry.remote import pick

OCI = "application/vnd.oci.image.manifest.v1+json"
DOCKER = "application/vnd.docker.distribution.manifest.v2+json"


def member(arch: str, n: int, os_: str = "linux", media: str = OCI) -> dict:
    return {"mediaType": media, "digest": f"sha256:{n:064x}", "size": 100,
            "platform": {"architecture": arch, "os": os_}}


ARM, AMD, ATTESTATION = member("arm64", 1), member("amd64", 2), member("unknown", 3, os_="unknown")


@pytest.mark.parametrize(("manifests", "host", "expected"), [
    ([ARM, AMD], "arm64", AMD),  # amd64 first, whatever the host
    ([ATTESTATION, ARM], "amd64", ARM),  # buildx's attestation is no image
    ([ARM, member("ppc64le", 4)], "ppc64le", member("ppc64le", 4)),  # no amd64: the host's
    ([member("s390x", 5), ARM], "riscv64", member("s390x", 5)),  # neither: the first image
    ([member("arm64", 6, media=DOCKER)], "amd64", member("arm64", 6, media=DOCKER)),  # the only one (Docker list)
    ([ATTESTATION], "amd64", None),
    ([{**AMD, "mediaType": "application/vnd.oci.image.index.v1+json"}, ARM], "amd64", ARM),  # nested index skipped
    ([{"platform": {"architecture": "amd64", "os": "linux"}}, ARM], "amd64", ARM),  # no digest: skipped
    ([], "amd64", None),
])
def test_index_member_for_the_labels(manifests, host, expected):
    assert pick(manifests, host) == expected


@pytest.mark.parametrize(("ref", "expected"), [
    ("127.0.0.1:5000/team/m:1", True),
    ("localhost/m:1", True),
    ("ghcr.io/org/m@sha256:" + "a" * 64, True),
    ("docker.io/team/m:1", True),
    ("team/m:1", False),  # a local build most often: not looked up on Docker Hub
    ("m:1", False),
    ("sha256:" + "b" * 64, False),
    ("Not A Ref", False),
])
def test_which_references_are_read_from_their_registry(ref, expected):
    assert names_registry(ref) is expected


LABELS = {"io.gpux.pack.version": "0.1.0", "io.gpux.provider": "cpu", "io.gpux.port": "8080"}


def test_an_image_from_its_config_blob():
    config = {"architecture": "amd64", "os": "linux", "config": {"Labels": LABELS}}
    image = from_config("r.example/m:1", config, "sha256:" + "c" * 64, 1234, "r.example/m@sha256:" + "d" * 64)
    assert isinstance(image, GpuxImage) and image.image is None
    assert (image.id, image.size_bytes, image.pinned, image.port) == ("sha256:" + "c" * 64, 1234,
                                                                      "r.example/m@sha256:" + "d" * 64, 8080)
    with pytest.raises(UsageError, match="not an image built by gpux-pack"):
        from_config("r.example/m:1", {"config": {}}, "sha256:" + "c" * 64, 0, "r.example/m@sha256:" + "d" * 64)
    bare = from_config("r.example/m:1", {"config": {"Labels": None}}, "sha256:" + "c" * 64, 0, "x", built_by_us=False)
    assert bare.labels == {}
