"""The image's SBOM (CycloneDX 1.6) and provenance (in-toto Statement, SLSA v1), made from a plan
without Docker: valid against the format's schema, NTIA's minimum elements present, the same
bytes for the same inputs, and what they list is what the plan put in the image."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpux_pack.engine import rootfs
from gpux_pack.image import provenance, sbom
from gpux_pack.pipeline import build
from gpux_pack.plan import Options, with_lock
from gpux_pack.registry import referrers
from gpux_pack.ui import Reporter
from tests.in_process import ROOT
from tests.unit.test_render import lock_for

STATUS = """\
Package: libc6
Status: install ok installed
Maintainer: GNU Libc Maintainers <debian-glibc@lists.debian.org>
Architecture: amd64
Version: 2.36-9+deb12u10

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: zlib1g
Status: install ok installed
Maintainer: Mark Brown <broonie@debian.org>
Architecture: amd64
Version: 1:1.2.13.dfsg-1
"""


@pytest.fixture
def plan(tmp_path, monkeypatch):
    """examples/mlp's plan on a base whose files say Debian 12 with two installed packages."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    root = tmp_path / "rootfs"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(STATUS)
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text('ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
    loaded = build.load(ROOT / "examples" / "mlp")
    made = build.plan_for(loaded, "cpu", "test", Options(), None, Reporter(quiet=True), pull=False)
    from dataclasses import replace

    made = replace(made, base=replace(made.base, rootfs=str(root), id="sha256:" + "b" * 64, probed=True))
    return with_lock(made, lock_for(made))


def test_the_sbom_is_valid_cyclonedx_with_ntia_s_minimum_elements(plan):
    doc = json.loads(sbom.document(plan, "sha256:" + "c" * 64))
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6" and sbom.validate(doc) is None
    # NTIA minimum elements: author of the SBOM data, timestamp, and per component a supplier
    # (packages), name, version, unique identifier, and the dependency relationships
    assert doc["metadata"]["tools"]["components"][0]["name"] == "gpux-pack"
    assert doc["metadata"]["timestamp"] == "2023-11-14T22:13:20+00:00"  # SOURCE_DATE_EPOCH
    packages = [c for c in doc["components"] if c.get("purl", "").startswith(("pkg:deb", "pkg:pypi"))]
    assert all(c["name"] and c["version"] and c["purl"] and c["bom-ref"] for c in packages)
    assert all(c["supplier"]["name"] for c in packages)
    deps = {d["ref"]: set(d.get("dependsOn", [])) for d in doc["dependencies"]}
    assert deps["image"] == {"base-image", "runtime", "model"}
    assert deps["base-image"] == {"deb:libc6@2.36-9+deb12u10:amd64", "deb:zlib1g@1:1.2.13.dfsg-1:amd64"}
    assert deps["runtime"] == {f"pypi:{p.name}@{p.version}" for p in plan.lock.pins}


def test_the_sbom_lists_the_base_s_packages_the_lock_and_the_model(plan):
    doc = json.loads(sbom.document(plan))
    by_ref = {c["bom-ref"]: c for c in doc["components"]}
    libc = by_ref["deb:libc6@2.36-9+deb12u10:amd64"]
    assert libc["purl"] == "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64&distro=debian-12"
    assert libc["supplier"]["name"] == "GNU Libc Maintainers"
    assert not any("removed-one" in ref for ref in by_ref)  # config-files only: not installed
    assert by_ref["os"]["name"] == "debian" and by_ref["os"]["version"] == "12"
    assert by_ref["base-image"]["version"] == "sha256:" + "b" * 64
    for pin in plan.lock.pins:
        c = by_ref[f"pypi:{pin.name}@{pin.version}"]
        assert c["purl"] == f"pkg:pypi/{pin.name}@{pin.version}"
        assert {h["content"] for h in c["hashes"]} == set(pin.hashes)  # no cached wheel: the lock's hashes
    model = by_ref["model"]
    assert model["type"] == "machine-learning-model" and model["hashes"][0]["content"] == plan.model.sha256
    props = {p["name"]: p["value"] for p in model["properties"]}
    assert json.loads(props["gpux:inputs"])[0]["name"] == "features" and props["gpux:opset"] == "17"


def test_the_same_inputs_give_the_same_bytes(plan):
    assert sbom.document(plan, "sha256:1") == sbom.document(plan, "sha256:1")
    assert sbom.document(plan, "sha256:1") != sbom.document(plan, "sha256:2")  # the serial number follows


def test_the_provenance_is_an_in_toto_statement_of_slsa_v1(plan):
    predicate = provenance.predicate(plan, "2023-11-14T22:13:20Z", "2023-11-14T22:13:20Z", {"push": True})
    statement = json.loads(provenance.statement([("registry/team/mlp", "sha256:" + "d" * 64)], predicate))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [{"name": "registry/team/mlp", "digest": {"sha256": "d" * 64}}]
    definition = statement["predicate"]["buildDefinition"]
    assert definition["externalParameters"]["provider"] == "cpu"
    assert definition["externalParameters"]["gpuxYml"]["digest"]["sha256"] == \
        __import__("hashlib").sha256((ROOT / "examples/mlp/gpux.yml").read_bytes()).hexdigest()
    deps = {d["uri"]: d for d in definition["resolvedDependencies"]}
    assert deps["file:model.onnx"]["digest"]["sha256"] == plan.model.sha256
    assert deps[f"docker-image:{plan.base.image}"]["digest"]["sha256"] == "b" * 64
    assert all(f"pkg:pypi/{p.name}@{p.version}" in deps for p in plan.lock.pins)
    assert statement["predicate"]["runDetails"]["builder"]["version"]["gpux-pack"]


CACHE = sbom.CompiledCache(key="a" * 24, provider="OpenVINOExecutionProvider", device="cpu: Intel Xeon",
                           onnxruntime="1.23.0", layer="sha256:" + "e" * 64, path="/opt/gpux/warm/" + "a" * 24)


def test_a_baked_warmup_adds_its_compiled_cache_to_the_sbom_and_the_provenance(plan):
    parent, derived = "sha256:" + "c" * 64, "sha256:" + "f" * 64
    before = sbom.document(plan, parent)
    after = sbom.with_cache(before, derived, CACHE)
    doc = json.loads(after)
    assert sbom.validate(doc) is None
    by_ref = {c["bom-ref"]: c for c in doc["components"]}
    cache = by_ref[f"cache:{CACHE.key}"]
    props = {p["name"]: p["value"] for p in cache["properties"]}
    assert cache["type"] == "data" and cache["hashes"] == [{"alg": "SHA-256", "content": "e" * 64}]
    assert props["gpux:key"] == CACHE.key and props["gpux:provider"] == "OpenVINOExecutionProvider"
    assert props["gpux:layer"] == CACHE.layer and props["gpux:installed_to"] == CACHE.path
    deps = {d["ref"]: set(d.get("dependsOn", [])) for d in doc["dependencies"]}
    assert deps["image"] == {"base-image", "runtime", "model", f"cache:{CACHE.key}"}
    assert deps[f"cache:{CACHE.key}"] == {"model"}  # compiled from the model
    image = {p["name"]: p["value"] for p in doc["metadata"]["component"]["properties"]}
    assert image["gpux:image_id"] == derived and image["gpux:warmup"] == "baked"
    # everything the parent's SBOM listed is still there, and nothing else changed but the serial
    old = json.loads(before)
    assert {c["bom-ref"] for c in old["components"]} == set(by_ref) - {f"cache:{CACHE.key}"}
    assert doc["serialNumber"] != old["serialNumber"] and sbom.with_cache(before, derived, CACHE) == after

    predicate = provenance.predicate(plan, "2023-11-14T22:13:20Z", "2023-11-14T22:13:20Z", {})
    warmed = provenance.with_cache(predicate, parent, CACHE, "2023-11-14T22:14:00Z")
    assert "byproducts" not in predicate["runDetails"]  # the parent's predicate is left as it was
    assert warmed["buildDefinition"]["internalParameters"]["warmup"] == "baked"
    assert warmed["buildDefinition"]["resolvedDependencies"][-1] == {
        "uri": f"docker-image:{parent}", "name": "image before warmup", "digest": {"sha256": "c" * 64}}
    (byproduct,) = warmed["runDetails"]["byproducts"]
    assert byproduct["digest"] == {"sha256": "e" * 64} and byproduct["annotations"]["key"] == CACHE.key
    assert warmed["runDetails"]["metadata"]["finishedOn"] == "2023-11-14T22:14:00Z"


def test_os_packages_reads_apk_too(tmp_path):
    (tmp_path / "lib/apk/db").mkdir(parents=True)
    (tmp_path / "lib/apk/db/installed").write_text("P:musl\nV:1.2.4-r2\nA:x86_64\nm:Timo <t@alpinelinux.org>\n\n"
                                                   "P:busybox\nV:1.36.1-r15\nA:x86_64\n")
    found = rootfs.os_packages(tmp_path)
    assert [(p.name, p.version, p.manager, p.maintainer) for p in found] == [
        ("busybox", "1.36.1-r15", "apk", ""), ("musl", "1.2.4-r2", "apk", "Timo <t@alpinelinux.org>")]


def test_the_referrers_tag_of_a_digest():
    assert referrers.tag_of("sha256:" + "a" * 64) == "sha256-" + "a" * 64


def test_build_sbom_dir_is_a_usage_error_when_it_cannot_be_made(tmp_path):
    from gpux_pack.commands import build as build_cmd
    from gpux_pack.errors import UsageError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    outcome = build_cmd.Outcome([], [], [], 0.0, None, None)
    with pytest.raises(UsageError, match=r"--sbom .*file/sub: cannot make the folder"):
        build_cmd.write_sboms(outcome, blocker / "sub")
    shutil.rmtree(tmp_path / "file", ignore_errors=True)
    assert Path(tmp_path).is_dir()


def _key(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = tmp_path / "model.key", tmp_path / "model.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def test_a_signed_model_is_checked_before_it_loads_and_a_changed_byte_refuses_to_start(tmp_path):
    from gpux_pack.image import model_signature
    from gpux_pack.runtime.session import Model
    from gpux_pack.runtime.settings import StartupError
    from tests.in_process import settings

    private, public = _key(tmp_path)
    loaded = build.load(ROOT / "examples" / "mlp")
    plan = build.plan_for(loaded, "cpu", "test", Options(sign_model=private), None, Reporter(quiet=True), pull=False)
    files = dict(model_signature.sign(plan, private))
    assert plan.gpux_json["model_signature"] == {"bundle": "assets/model.sig", "public_key": "assets/model.pub",
                                                 "verify": False}
    assert "cryptography>=42" in plan.requirements
    image = tmp_path / "image"
    (image / "model").mkdir(parents=True)
    (image / "assets").mkdir()
    shutil.copy(ROOT / "examples/mlp/model.onnx", image / "model" / "model.onnx")
    for name, data in files.items():
        (image / "assets" / name).write_bytes(data)
    (image / "gpux.json").write_text(json.dumps(plan.gpux_json))
    Model.load(settings(image, GPUX_VERIFY_MODEL="1"), warm_up=False)  # verifies
    # model-signing's own verifier accepts the bundle for the model folder
    from model_signing import verifying

    verifying.Config().use_elliptic_key_verifier(public_key=public).verify(image / "model", image / "assets/model.sig")
    data = bytearray((image / "model/model.onnx").read_bytes())
    data[-1] ^= 1
    (image / "model/model.onnx").write_bytes(bytes(data))
    with pytest.raises(StartupError, match=r"^model verification failed: model.onnx changed since it was signed"):
        Model.load(settings(image, GPUX_VERIFY_MODEL="1"), warm_up=False)
    Model.load(settings(image), warm_up=False)  # not asked (pack.verify_model false): it loads
    (image / "model/extra.bin").write_bytes(b"x")
    with pytest.raises(StartupError, match=r"the model folder differs from what was signed \(not signed: extra.bin\)"):
        Model.load(settings(image, GPUX_VERIFY_MODEL="1"), warm_up=False)
    _, other = _key(tmp_path / "other") if (tmp_path / "other").mkdir() is None else (None, None)
    with pytest.raises(StartupError, match=r"the model signature does not verify with model.pub.pem"):
        Model.load(settings(image, GPUX_VERIFY_MODEL="1", GPUX_MODEL_PUBLIC_KEY=str(other)), warm_up=False)


def test_verify_model_without_a_signature_refuses_to_start(tmp_path):
    from gpux_pack.runtime.session import Model
    from gpux_pack.runtime.settings import StartupError
    from tests.in_process import settings, spec_dir

    folder = spec_dir(tmp_path, "mlp")
    with pytest.raises(StartupError, match=r"^GPUX_VERIFY_MODEL=1, but this image carries no model signature"):
        Model.load(settings(folder, GPUX_VERIFY_MODEL="1"), warm_up=False)
