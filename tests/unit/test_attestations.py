"""The image's SBOM (CycloneDX 1.6) and provenance (in-toto Statement, SLSA v1), made from a plan
without Docker: valid against the format's schema, NTIA's minimum elements present, the same
bytes for the same inputs, and what they list is what the plan put in the image."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from gpux_pack.engine import rootfs
from gpux_pack.image import provenance, sbom
from gpux_pack.image.attestation_store import sbom_bytes
from gpux_pack.pipeline import build
from gpux_pack.plan import Options
from tests.locks import with_lock
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
    monkeypatch.setenv("GPUX_PACK_CACHE_DIR", str(tmp_path / "cache"))  # the SBOMs kept for reuse (sboms/)
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


def _other_model(plan, tmp_path):
    """The plan with a retrained, re-described model: new weights, another graph, other metadata."""
    from dataclasses import replace

    model = replace(plan.model, sha256="d" * 64, size_bytes=plan.model.size_bytes + 12, nodes=plan.model.nodes + 1)
    project = replace(plan.project, config=plan.config.model_copy(update={"description": None}))
    return replace(plan, model=model, project=project, tag="team/iris:2", created="2024-01-02T03:04:05Z")


def test_a_kept_sbom_gives_what_the_library_writes_for_another_model_and_gpux_yml(plan, tmp_path, monkeypatch):
    """The base's and the lock's part is written by the library once and kept; the next build's
    image, model, assets and time are put in by hand: the bytes must be the library's own."""
    first = sbom.document(plan, "sha256:1")
    assert first == sbom_bytes(json.loads(sbom.library_document(plan, "sha256:1")))
    assert len(list((tmp_path / "cache" / "sboms").iterdir())) == 1
    other = _other_model(plan, tmp_path)
    expected = sbom_bytes(json.loads(sbom.library_document(other, "sha256:2")))

    def not_again(*_args):
        raise AssertionError("the kept part was written again")

    monkeypatch.setattr(sbom, "library_document", not_again)
    assert sbom.document(other, "sha256:2") == expected
    doc = json.loads(expected)
    assert "description" not in doc["metadata"]["component"] and doc["metadata"]["component"]["name"] == "team/iris"
    assert sbom.validate(doc) is None


def test_an_sbom_with_a_tokenizer_keeps_the_library_s_bytes(plan, tmp_path, monkeypatch):
    for name in ("tokenizer.json", "vocab.txt"):
        (tmp_path / name).write_text(name)
    assets = (("tokenizer.json", tmp_path / "tokenizer.json"), ("vocab.txt", tmp_path / "vocab.txt"))
    monkeypatch.setattr(type(plan), "assets", property(lambda _: assets))
    sbom.document(plan, "sha256:1")  # kept
    (tmp_path / "vocab.txt").write_text("another vocabulary")
    other = _other_model(plan, tmp_path)
    assert sbom.document(other, "sha256:3") == sbom_bytes(json.loads(sbom.library_document(other, "sha256:3")))
    assert len(list((tmp_path / "cache" / "sboms").iterdir())) == 1


def test_another_lock_or_base_is_not_given_a_kept_sbom(plan, tmp_path):
    from dataclasses import replace

    sbom.document(plan)
    other_base = replace(plan, base=replace(plan.base, id="sha256:" + "e" * 64))
    assert json.loads(sbom.document(other_base))["components"] != json.loads(sbom.document(plan))["components"]
    assert len(list((tmp_path / "cache" / "sboms").iterdir())) == 2


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


def _key(folder: Path) -> tuple[Path, Path]:
    from tests.conftest import key_pair

    return key_pair(folder, "model")[:2]


def _signed_image(tmp_path: Path, project: Path, private: Path) -> Path:
    """An image's /opt/gpux as a build lays it out, signed with `private` (model, gpux.json, assets)."""
    from gpux_pack.image import context, model_signature

    loaded = build.load(project)
    plan = build.plan_for(loaded, "cpu", "test", Options(sign_model=private), None, Reporter(quiet=True), pull=False)
    signed = dict(model_signature.sign(plan, private))
    image = tmp_path / "image"
    for name, content in context.answer_files(plan):
        (image / name).parent.mkdir(parents=True, exist_ok=True)
        (image / name).write_bytes(content if isinstance(content, bytes) else content.read_bytes())
    (image / "assets").mkdir(exist_ok=True)
    for name, data in signed.items():
        (image / "assets" / name).write_bytes(data)
    (image / "cache").mkdir()
    return image


def test_a_signed_model_is_checked_before_it_loads_and_a_changed_byte_refuses_to_start(tmp_path):
    from gpux_pack.runtime.session import Model
    from gpux_pack.runtime.settings import StartupError
    from tests.in_process import settings

    private, public = _key(tmp_path)
    image = _signed_image(tmp_path, ROOT / "examples" / "mlp", private)
    spec = json.loads((image / "gpux.json").read_text())
    assert spec["model_signature"] == {"bundle": "assets/model.sig", "public_key": "assets/model.pub", "verify": False}
    assert sorted(p.relative_to(image).as_posix() for p in image.rglob("*") if p.is_file()) == [
        "assets/model.pub", "assets/model.sig", "gpux.json", "model/model.onnx"]
    Model.load(settings(image, GPUX_VERIFY_MODEL="1"), warm_up=False)  # verifies
    # model-signing's own verifier accepts the bundle for the image's folder, with what it left out
    from model_signing import verifying

    (image / "site-packages").mkdir()
    (image / "site-packages" / "x.py").write_text("")
    verifying.Config().use_elliptic_key_verifier(public_key=public).verify(image, image / "assets/model.sig")
    data = bytearray((image / "model/model.onnx").read_bytes())
    data[-1] ^= 1
    (image / "model/model.onnx").write_bytes(bytes(data))
    with pytest.raises(StartupError, match=r"^model verification failed: model/model.onnx changed since it was signed"):
        Model.load(settings(image, GPUX_VERIFY_MODEL="1"), warm_up=False)
    Model.load(settings(image), warm_up=False)  # not asked (pack.verify_model false): it loads
    data[-1] ^= 1
    (image / "model/model.onnx").write_bytes(bytes(data))
    (image / "model/extra.bin").write_bytes(b"x")
    with pytest.raises(StartupError, match=r"the image's files differ from what was signed \(not signed: model/extra.bin\)"):
        Model.load(settings(image, GPUX_VERIFY_MODEL="1"), warm_up=False)
    (image / "model/extra.bin").unlink()
    _, other = _key(tmp_path / "other") if (tmp_path / "other").mkdir() is None else (None, None)
    with pytest.raises(StartupError, match=r"the model signature does not verify with model.pub"):
        Model.load(settings(image, GPUX_VERIFY_MODEL="1", GPUX_MODEL_PUBLIC_KEY=str(other)), warm_up=False)
    Model.load(settings(image, GPUX_VERIFY_MODEL="1", GPUX_MODEL_PUBLIC_KEY=str(public)), warm_up=False)


def test_model_signing_covers_gpux_json_and_the_tokenizer(tmp_path):
    """Labels reversed or the tokenizer's vocabulary changed decide other answers from the same
    weights: with the operator's key, neither starts."""
    from gpux_pack.runtime.session import Model
    from gpux_pack.runtime.settings import StartupError
    from tests.in_process import settings

    private, public = _key(tmp_path)
    from tests import text_project

    image = _signed_image(tmp_path, text_project.make(tmp_path / "text"), private)
    assert (image / "assets/tokenizer.json").is_file()
    Model.load(settings(image, GPUX_VERIFY_MODEL="1", GPUX_MODEL_PUBLIC_KEY=str(public)), warm_up=False)
    original = (image / "gpux.json").read_bytes()
    spec = json.loads(original)
    labelled = next(o for o in spec["outputs"] if o.get("labels"))
    labelled["labels"] = labelled["labels"][::-1]
    (image / "gpux.json").write_text(json.dumps(spec))
    with pytest.raises(StartupError, match=r"^model verification failed: gpux.json changed since it was signed"):
        Model.load(settings(image, GPUX_VERIFY_MODEL="1", GPUX_MODEL_PUBLIC_KEY=str(public)), warm_up=False)
    (image / "gpux.json").write_bytes(original)
    tokenizer = image / "assets/tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"great"', '"awful"', 1))
    with pytest.raises(StartupError, match=r"^model verification failed: assets/tokenizer.json changed since it"):
        Model.load(settings(image, GPUX_VERIFY_MODEL="1", GPUX_MODEL_PUBLIC_KEY=str(public)), warm_up=False)


def test_verify_model_without_a_signature_refuses_to_start(tmp_path, monkeypatch):
    from gpux_pack.runtime.session import Model
    from gpux_pack.runtime.settings import StartupError
    from tests.in_process import settings, spec_dir

    folder = spec_dir(tmp_path, "mlp")
    with monkeypatch.context() as patched:  # an unsigned image's lock has no cryptography
        for name in [n for n in sys.modules if n == "cryptography" or n.startswith("cryptography.")]:
            patched.delitem(sys.modules, name)
        patched.setitem(sys.modules, "cryptography", None)
        with pytest.raises(StartupError, match=r"^GPUX_VERIFY_MODEL=1, but this image carries no model signature"):
            Model.load(settings(folder, GPUX_VERIFY_MODEL="1"), warm_up=False)


# What `gpux-pack verify` checks in each attached document (registry/signatures.py): pure
# functions of the document's bytes and the image (its id, its model's sha256, the digest).

IMAGE_ID, OTHER_ID = "sha256:" + "c" * 64, "sha256:" + "9" * 64
DIGEST = "sha256:" + "d" * 64


@pytest.fixture
def documents(plan):
    """The SBOM and provenance gpux-pack's own code writes for examples/mlp's image IMAGE_ID
    pushed as DIGEST, and the model's sha256 (the image's io.gpux.model.sha256 label)."""
    predicate = provenance.predicate(plan, "2023-11-14T22:13:20Z", "2023-11-14T22:13:20Z", {"push": True})
    return (sbom.document(plan, IMAGE_ID), provenance.statement([("registry/team/mlp", DIGEST)], predicate),
            plan.model.sha256)


def test_verify_s_constants_are_the_writers(plan):
    """registry/ may not import image/ (the layering), so verify keeps its own copies: pinned here."""
    from gpux_pack.registry import signatures

    assert (signatures.SBOM_MEDIA, signatures.PROVENANCE_MEDIA) == (sbom.MEDIA_TYPE, provenance.MEDIA_TYPE)
    assert (signatures.STATEMENT, signatures.PREDICATE, signatures.BUILD_TYPE) == (
        provenance.STATEMENT, provenance.PREDICATE, provenance.BUILD_TYPE)
    from gpux_pack.plan import labels

    assert labels(plan)[signatures.MODEL_LABEL] == plan.model.sha256


def test_verify_accepts_the_documents_gpux_pack_writes_built_and_warmed(documents, plan):
    from gpux_pack.registry import signatures

    sbom_doc, statement, model = documents
    signatures.check_sbom(sbom_doc, IMAGE_ID, model, DIGEST)
    signatures.check_provenance(statement, IMAGE_ID, model, DIGEST)
    warmed = "sha256:" + "f" * 64  # a baked warmup's image: the parent's documents, the new id
    signatures.check_sbom(sbom.with_cache(sbom_doc, warmed, CACHE), warmed, model, DIGEST)
    predicate = provenance.with_cache(json.loads(statement)["predicate"], IMAGE_ID, CACHE, "2023-11-14T22:14:00Z")
    signatures.check_provenance(provenance.statement([("r/m", DIGEST), ("r/m", "sha256:" + "1" * 64)], predicate),
                                warmed, model, DIGEST)


def _edit(data: bytes, change) -> bytes:
    doc = json.loads(data)
    change(doc)
    return json.dumps(doc).encode()


def _model_component(doc: dict) -> dict:
    return next(c for c in doc["components"] if c["type"] == "machine-learning-model")


def _image_props(doc: dict) -> list:
    return doc["metadata"]["component"]["properties"]


SBOM_FORGERIES = {
    "garbage": (lambda d: b"\x00garbage", "is not JSON"),
    "not utf-8": (lambda d: b'{"bomFormat": "\xff\xfe"}', "is not JSON"),
    "empty object": (lambda d: b"{}", "is not a CycloneDX SBOM (bomFormat null)"),
    "a list": (lambda d: b"[1, 2]", "is not a JSON object (a list)"),
    "a string": (lambda d: b'"CycloneDX"', "is not a JSON object (a string)"),
    "a number": (lambda d: b"1e999", "is not a JSON object (a number)"),
    "nested too deep": (lambda d: b"[" * 200_000 + b"]" * 200_000, "nested too deep"),
    "spdx": (lambda d: b'{"spdxVersion": "SPDX-2.3"}', "is not a CycloneDX SBOM"),
    "no spec version": (lambda d: _edit(d, lambda x: x.pop("specVersion")), "has no CycloneDX specVersion"),
    "spec version a number": (lambda d: _edit(d, lambda x: x.update(specVersion=1.6)),
                              "has no CycloneDX specVersion (found 1.6)"),
    "no metadata": (lambda d: _edit(d, lambda x: x.pop("metadata")), "has no metadata.component"),
    "metadata a list": (lambda d: _edit(d, lambda x: x.update(metadata=[])), "has no metadata.component"),
    "component a number": (lambda d: _edit(d, lambda x: x["metadata"].update(component=7)),
                           "has no metadata.component"),
    "no image id": (lambda d: _edit(d, lambda x: x["metadata"]["component"].pop("properties")),
                    "names no image (metadata.component has no gpux:image_id property)"),
    "properties a string": (lambda d: _edit(d, lambda x: x["metadata"]["component"].update(properties="x")),
                            "names no image"),
    "another image's": (lambda d: _edit(d, lambda x: [p.update(value=OTHER_ID) for p in _image_props(x)
                                                      if p["name"] == "gpux:image_id"]),
                        f'names image "{OTHER_ID}", not this image {IMAGE_ID}'),
    "two image ids": (lambda d: _edit(d, lambda x: _image_props(x).append({"name": "gpux:image_id",
                                                                            "value": OTHER_ID})),
                      "names image ["),
    "image id a line break": (lambda d: _edit(d, lambda x: [p.update(value="a\nb") for p in _image_props(x)
                                                            if p["name"] == "gpux:image_id"]),
                              'names image "a\\nb"'),
    "no model": (lambda d: _edit(d, lambda x: x.update(components=[c for c in x["components"]
                                                                   if c["type"] != "machine-learning-model"])),
                 "lists 0 machine-learning-model components"),
    "components a dict": (lambda d: _edit(d, lambda x: x.update(components={})),
                          "lists 0 machine-learning-model components"),
    "two models": (lambda d: _edit(d, lambda x: x["components"].append(dict(_model_component(x), name="b"))),
                   "lists 2 machine-learning-model components"),
    "another model": (lambda d: _edit(d, lambda x: _model_component(x).update(
        hashes=[{"alg": "SHA-256", "content": "e" * 64}])), f'lists model sha256 "{"e" * 64}", not this image'),
    "model hash a number": (lambda d: _edit(d, lambda x: _model_component(x).update(
        hashes=[{"alg": "SHA-256", "content": 5}])), "lists model sha256 5, not"),
    "model without sha-256": (lambda d: _edit(d, lambda x: _model_component(x).update(
        hashes=[{"alg": "MD5", "content": "0" * 32}])), "lists its model without a SHA-256"),
    "model hashes a string": (lambda d: _edit(d, lambda x: _model_component(x).update(hashes="sha")),
                              "lists its model without a SHA-256"),
}


@pytest.mark.parametrize("name", list(SBOM_FORGERIES))
def test_verify_refuses_an_sbom_that_does_not_name_this_image_and_model(documents, name):
    from gpux_pack.registry.signatures import VerifyError, check_sbom

    make, message = SBOM_FORGERIES[name]
    sbom_doc, _, model = documents
    with pytest.raises(VerifyError) as raised:
        check_sbom(make(sbom_doc), IMAGE_ID, model, DIGEST)
    assert message in str(raised.value) and "\n" not in str(raised.value), str(raised.value)


def _predicate(x: dict) -> dict:
    return x["predicate"]["buildDefinition"]


def _model_dependency(x: dict) -> dict:
    return next(d for d in _predicate(x)["resolvedDependencies"] if d["name"] == "model")


PROVENANCE_FORGERIES = {
    "garbage": (lambda d: b"\x00garbage", "is not JSON"),
    "empty object": (lambda d: b"{}", "is not an in-toto Statement v1 (_type null)"),
    "a list": (lambda d: b'[{"_type": "https://in-toto.io/Statement/v1"}]', "is not a JSON object (a list)"),
    "a string": (lambda d: b'"x"', "is not a JSON object (a string)"),
    "null": (lambda d: b"null", "is not a JSON object (a null)"),
    "statement v0.1": (lambda d: _edit(d, lambda x: x.update(_type="https://in-toto.io/Statement/v0.1")),
                       'is not an in-toto Statement v1 (_type "https://in-toto.io/Statement/v0.1")'),
    "another predicate": (lambda d: _edit(d, lambda x: x.update(predicateType="https://cosign.sigstore.dev/attestation/vuln/v1")),
                          'has predicateType "https://cosign.sigstore.dev/attestation/vuln/v1", not SLSA Provenance v1'),
    "slsa 0.2": (lambda d: _edit(d, lambda x: x.update(predicateType="https://slsa.dev/provenance/v0.2")),
                 "not SLSA Provenance v1"),
    "another digest": (lambda d: _edit(d, lambda x: x.update(subject=[{"name": "r", "digest": {"sha256": "1" * 64}}])),
                       f'has subject digests ["{"1" * 64}"], not this digest'),
    "string subjects": (lambda d: _edit(d, lambda x: x.update(subject=["d" * 64, DIGEST])),
                        "has subject digests [null, null], not this digest"),
    "subject a dict": (lambda d: _edit(d, lambda x: x.update(subject={"digest": {"sha256": "d" * 64}})),
                       "has subject digests [], not this digest"),
    "digest a string": (lambda d: _edit(d, lambda x: x.update(subject=[{"digest": DIGEST}])),
                        "has subject digests [null]"),
    "no predicate": (lambda d: _edit(d, lambda x: x.pop("predicate")), "has buildType null, not gpux-pack's"),
    "predicate a list": (lambda d: _edit(d, lambda x: x.update(predicate=[])), "has buildType null"),
    "another build type": (lambda d: _edit(d, lambda x: _predicate(x).update(
        buildType="https://actions.github.io/buildtypes/workflow/v1")),
        'has buildType "https://actions.github.io/buildtypes/workflow/v1", not gpux-pack\'s'),
    "no model dependency": (lambda d: _edit(d, lambda x: _predicate(x).update(resolvedDependencies=[
        e for e in _predicate(x)["resolvedDependencies"] if e.get("name") != "model"])),
        'lists 0 resolved dependencies named "model"'),
    "dependencies a number": (lambda d: _edit(d, lambda x: _predicate(x).update(resolvedDependencies=3)),
                              'lists 0 resolved dependencies named "model"'),
    "another model": (lambda d: _edit(d, lambda x: _model_dependency(x).update(digest={"sha256": "e" * 64})),
                      f'lists model sha256 "{"e" * 64}", not this image\'s model'),
    "model digest a list": (lambda d: _edit(d, lambda x: _model_dependency(x).update(digest=["x"])),
                            "lists model sha256 null"),
}


@pytest.mark.parametrize("name", list(PROVENANCE_FORGERIES))
def test_verify_refuses_a_provenance_that_is_not_gpux_pack_s_of_this_digest(documents, name):
    from gpux_pack.registry.signatures import VerifyError, check_provenance

    make, message = PROVENANCE_FORGERIES[name]
    _, statement, model = documents
    with pytest.raises(VerifyError) as raised:
        check_provenance(make(statement), IMAGE_ID, model, DIGEST)
    assert message in str(raised.value) and "\n" not in str(raised.value), str(raised.value)


def _paths(doc, prefix=(), depth=6):
    """Every path into a JSON document down to `depth` (lists by index), the document's own first."""
    yield prefix
    if depth == 0:
        return
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from _paths(value, prefix + (key,), depth - 1)


def test_verify_never_fails_other_than_one_line_whatever_json_a_document_holds(documents):
    """Each value the checks read (and its parents) replaced by every JSON type: the check passes
    or raises VerifyError with one line, never another exception."""
    from gpux_pack.registry.signatures import VerifyError, check_provenance, check_sbom

    sbom_doc, statement, model = documents
    short = json.loads(sbom_doc)
    short["components"] = [_model_component(short)]  # the packages' hundreds of paths add nothing here
    for check, doc in ((check_sbom, short), (check_provenance, json.loads(statement))):
        for path in _paths(doc):
            for value in ([], {}, "x", 0, 1.5, None, True, [None], {"sha256": None}):
                changed = json.loads(json.dumps(doc))
                if path:
                    parent = changed
                    for key in path[:-1]:
                        parent = parent[key]
                    parent[path[-1]] = value
                else:
                    changed = value
                try:
                    check(json.dumps(changed).encode(), IMAGE_ID, model, DIGEST)
                except VerifyError as e:
                    assert "\n" not in str(e) and len(str(e)) < 400, (path, value, str(e))


def test_verify_refuses_a_document_over_its_size_cap_unparsed(documents, monkeypatch):
    from gpux_pack.registry.signatures import VerifyError, check_sbom

    sbom_doc, _, model = documents
    monkeypatch.setattr(referrers, "MAX_DOCUMENT", len(sbom_doc) - 1)
    with pytest.raises(VerifyError, match=rf"^is {len(sbom_doc)} bytes, more than {len(sbom_doc) - 1} bytes: refused$"):
        check_sbom(sbom_doc, IMAGE_ID, model, DIGEST)
