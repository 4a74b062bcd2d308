"""`verify` against a registry in this process (the distribution API's manifests, blobs and
uploads, no referrers API: the tag schema, as Distribution 2.8): every attached SBOM and
provenance is read and checked against the image, a forged extra one fails, a document over its
cap is refused unread, an index is verified by its signature and each platform's documents, and
every malformed answer is one line. What each document check refuses: test_attestations.py."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import uuid
from dataclasses import dataclass, field

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from gpux_pack.commands import verify as verify_cmd
from gpux_pack.registry import referrers, signatures
from gpux_pack.registry.index import INDEX
from gpux_pack.registry.referrers import MANIFEST, Artifact, tag_of
from gpux_pack.registry.signatures import VerifyError

MODEL = "a" * 64
OTHER = "sha256:" + "9" * 64


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Store:
    """What the registry holds: manifests by tag and digest (bytes, media type), blobs by digest,
    and each GET's path (what a check read)."""

    manifests: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    uploads: dict[str, bytes] = field(default_factory=dict)
    gets: list[str] = field(default_factory=list)
    served: dict[str, bytes] = field(default_factory=dict)  # a blob served as other bytes than stored

    def put_manifest(self, ref: str, body: bytes, media: str) -> str:
        digest = _sha(body)
        self.manifests[ref] = self.manifests[digest] = (body, media)
        return digest


class _Handler(http.server.BaseHTTPRequestHandler):
    store: Store

    def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _route(self) -> tuple[str, str, str]:
        path, _, query = self.path.partition("?")
        for kind in ("manifests", "blobs/uploads", "blobs", "referrers"):
            if f"/{kind}/" in path:
                return kind, path.split(f"/{kind}/", 1)[1], query
        return "", path, query

    def do_GET(self) -> None:  # noqa: N802
        kind, ref, _ = self._route()
        if self.command == "GET":
            self.store.gets.append(f"{kind}/{ref}")
        if kind == "manifests" and ref in self.store.manifests:
            body, media = self.store.manifests[ref]
            return self._answer(200, body, {"Content-Type": media, "Docker-Content-Digest": _sha(body)})
        if kind == "blobs" and ref in self.store.blobs:
            return self._answer(200, self.store.served.get(ref, self.store.blobs[ref]))
        self._answer(404, b'{"errors": [{"code": "NOT_FOUND", "message": "unknown"}]}',
                     {"Content-Type": "application/json"})

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        name = self.path.split("/blobs/uploads/", 1)[0]
        self._answer(202, headers={"Location": f"{name}/blobs/uploads/{uuid.uuid4()}?state=1"})

    def do_PUT(self) -> None:  # noqa: N802
        kind, ref, query = self._route()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if kind == "blobs/uploads":
            digest = dict(p.split("=", 1) for p in query.split("&"))["digest"]
            self.store.blobs[digest] = body
            return self._answer(201, headers={"Docker-Content-Digest": digest})
        digest = self.store.put_manifest(ref, body, self.headers.get("Content-Type", MANIFEST))
        self._answer(201, headers={"Docker-Content-Digest": digest})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """(store, repository) of a registry on 127.0.0.1 that asks for no credentials."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    store = Store()
    handler = type("Handler", (_Handler,), {"store": store})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield store, f"127.0.0.1:{server.server_address[1]}/team/app"
    server.shutdown()
    server.server_close()
    thread.join()


def _image(store: Store, arch: str = "amd64", labels: dict[str, str] | None = None) -> tuple[str, str]:
    """An image manifest and its config (labels: gpux's model label by default): (digest, config digest)."""
    config = json.dumps({"architecture": arch, "os": "linux",
                         "config": {"Labels": {signatures.MODEL_LABEL: MODEL} if labels is None else labels}}).encode()
    layer = f"layer {arch}".encode()
    store.blobs[_sha(config)], store.blobs[_sha(layer)] = config, layer
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _sha(config),
                           "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _sha(layer),
                            "size": len(layer)}]}
    return store.put_manifest(f"v-{arch}", json.dumps(manifest).encode(), MANIFEST), _sha(config)


def sbom_of(image_id: str, model: str = MODEL) -> bytes:
    """The least SBOM verify accepts: CycloneDX naming the image by id, and its one model."""
    return json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6",
                       "metadata": {"component": {"type": "container", "name": "app",
                                                  "properties": [{"name": "gpux:image_id", "value": image_id}]}},
                       "components": [{"type": "machine-learning-model", "name": "model.onnx",
                                       "hashes": [{"alg": "SHA-256", "content": model}]}]}).encode()


def provenance_of(digest: str, model: str = MODEL, predicate_type: str = signatures.PREDICATE) -> bytes:
    """The least provenance verify accepts: gpux-pack's build type, this digest, the model."""
    return json.dumps({"_type": signatures.STATEMENT, "predicateType": predicate_type,
                       "subject": [{"name": "app", "digest": {"sha256": digest.split(":")[1]}}],
                       "predicate": {"buildDefinition": {"buildType": signatures.BUILD_TYPE, "resolvedDependencies": [
                           {"uri": "file:model.onnx", "name": "model", "digest": {"sha256": model}}]}}}).encode()


def _attest(repository: str, digest: str, image_id: str) -> list[str]:
    """What a push attaches (registry/referrers.attach, with the kinds pipeline/attest gives)."""
    return referrers.attach(None, repository, digest, [
        Artifact(signatures.SBOM_MEDIA, sbom_of(image_id), {"dev.gpux.kind": "sbom"}),
        Artifact(signatures.PROVENANCE_MEDIA, provenance_of(digest), {"dev.gpux.kind": "provenance"})])


def _add_referrer(store: Store, subject: str, artifact_type: str, manifest: dict) -> str:
    """An artifact manifest written as is (a forger's), listed in the subject's referrers tag index."""
    digest = store.put_manifest(f"forged-{uuid.uuid4()}", json.dumps(manifest).encode(), MANIFEST)
    tag = tag_of(subject)
    index = json.loads(store.manifests[tag][0]) if tag in store.manifests else {"schemaVersion": 2, "manifests": []}
    index["manifests"].append({"mediaType": MANIFEST, "digest": digest, "size": len(store.manifests[digest][0]),
                               "artifactType": artifact_type})
    store.put_manifest(tag, json.dumps(index).encode(), INDEX)
    return digest


def _document_manifest(store: Store, subject: str, artifact_type: str, data: bytes, size: int | None = None) -> dict:
    store.blobs[_sha(data)] = data
    return {"schemaVersion": 2, "mediaType": MANIFEST, "artifactType": artifact_type,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": _sha(b"{}"), "size": 2},
            "layers": [{"mediaType": artifact_type, "digest": _sha(data), "size": len(data) if size is None else size}],
            "subject": {"mediaType": MANIFEST, "digest": subject, "size": 1}}


def _refused(repository: str, digest: str, key, match: str) -> str:
    with pytest.raises(VerifyError) as raised:
        signatures.verify(None, repository, digest, key.public_key())
    message = str(raised.value)
    assert match in message and "\n" not in message, message
    return message


def test_verify_reads_every_attached_document_and_says_what_it_checked(registry):
    store, repository = registry
    key = ec.generate_private_key(ec.SECP256R1())
    digest, image_id = _image(store)
    sbom_artifact, provenance_artifact = _attest(repository, digest, image_id)
    signatures.sign(None, repository, digest, key)
    done = signatures.verify(None, repository, digest, key.public_key())
    assert done.subject == f"{repository}@{digest}" and done.signatures == 1
    assert done.images == [{"manifest": f"{repository}@{digest}", "platform": "linux/amd64", "image_id": image_id,
                            "model_sha256": MODEL, "sbom": [sbom_artifact], "provenance": [provenance_artifact]}]
    assert f"blobs/{_sha(sbom_of(image_id))}" in store.gets  # read, not only listed
    assert f"blobs/{_sha(provenance_of(digest))}" in store.gets
    json.dumps(done.__dict__)  # what `verify --json` prints
    shown = verify_cmd.lines(done)
    assert shown[0] == f"verified {repository}@{digest}: signed (1 signature with this key); its SBOM and " \
                       "provenance checked"
    assert shown[1] == f"  sbom        {sbom_artifact}  CycloneDX, names image {image_id} and model sha256:{MODEL}"
    assert shown[2].startswith(f"  provenance  {provenance_artifact}  SLSA v1 of gpux-pack's build type")

    # a second SBOM, another image's, beside the genuine one: every attached document must pass
    (forged,) = referrers.attach(None, repository, digest, [Artifact(signatures.SBOM_MEDIA, sbom_of(OTHER))])
    assert _refused(repository, digest, key, "names image") == (
        f"{repository}@{digest}: the attached SBOM {forged} names image \"{OTHER}\", not this image {image_id}")
    # the genuine SBOM's entry replaced by an empty document: no SBOM of this image is left
    referrers.attach(None, repository, digest, [Artifact(signatures.SBOM_MEDIA, b"{}", {"dev.gpux.kind": "sbom"})])
    index = json.loads(store.manifests[tag_of(digest)][0])
    index["manifests"] = [d for d in index["manifests"] if d["digest"] != forged]
    store.put_manifest(tag_of(digest), json.dumps(index).encode(), INDEX)
    _refused(repository, digest, key, "is not a CycloneDX SBOM (bomFormat null)")


def test_a_document_over_its_cap_is_refused_unread_and_a_longer_one_is_cut_off(registry, monkeypatch):
    store, repository = registry
    key = ec.generate_private_key(ec.SECP256R1())
    digest, image_id = _image(store)
    _attest(repository, digest, image_id)
    signatures.sign(None, repository, digest, key)
    genuine = store.manifests[tag_of(digest)]
    big = sbom_of(image_id) + b" " * 4096
    monkeypatch.setattr(referrers, "MAX_DOCUMENT", 4096)
    referrers.attach(None, repository, digest, [Artifact(signatures.SBOM_MEDIA, big, {"dev.gpux.kind": "sbom"})])
    _refused(repository, digest, key, f"is a document of {len(big)} bytes (more than 4096 bytes): refused unread")
    assert f"blobs/{_sha(big)}" not in store.gets
    # a layer that says it is 10 bytes long, served longer: no more than 10 bytes are taken
    store.manifests[tag_of(digest)] = genuine
    short = sbom_of(image_id)
    _add_referrer(store, digest, signatures.SBOM_MEDIA, _document_manifest(store, digest, signatures.SBOM_MEDIA,
                                                                           short, size=10))
    _refused(repository, digest, key, "is more than 10 bytes as served: refused")


def test_malformed_referrers_and_artifacts_are_one_line(registry):
    store, repository = registry
    key = ec.generate_private_key(ec.SECP256R1())
    digest, image_id = _image(store)
    signatures.sign(None, repository, digest, key)
    _refused(repository, digest, key, f"{repository}@{digest}: no SBOM attached")
    _attest(repository, digest, image_id)
    signatures.verify(None, repository, digest, key.public_key())
    tag = tag_of(digest)
    genuine = store.manifests[tag]
    cases = [
        ({"artifactType": signatures.SBOM_MEDIA}, "the attached SBOM has no sha256 digest in the referrers list"),
        ({"artifactType": signatures.SBOM_MEDIA, "digest": "sha256:../../x"}, "has no sha256 digest"),
        ({"artifactType": signatures.PROVENANCE_MEDIA, "digest": digest, "size": 10 << 20},
         "has a manifest of 10485760 bytes (more than 4 MiB): refused unread"),
    ]
    for entry, message in cases:
        index = json.loads(genuine[0])
        index["manifests"] += ["a string", 7, {"artifactType": [signatures.SBOM_MEDIA], "digest": []}, entry]
        store.put_manifest(tag, json.dumps(index).encode(), INDEX)
        _refused(repository, digest, key, message)
    forgeries = [
        (dict(_document_manifest(store, digest, signatures.SBOM_MEDIA, sbom_of(image_id)), layers=[]),
         "has 0 layer descriptors; an attached document is one"),
        (dict(_document_manifest(store, digest, signatures.SBOM_MEDIA, sbom_of(image_id)), layers="x"),
         "has 0 layer descriptors"),
        (dict(_document_manifest(store, digest, signatures.SBOM_MEDIA, sbom_of(image_id)), subject={"digest": OTHER}),
         f"names \"{OTHER}\" as its subject, not this digest"),
        (dict(_document_manifest(store, digest, signatures.SBOM_MEDIA, sbom_of(image_id)), subject="x"),
         "names null as its subject"),
        (dict(_document_manifest(store, digest, signatures.SBOM_MEDIA, sbom_of(image_id)),
              artifactType="application/spdx+json"), "its manifest says \"application/spdx+json\""),
        (_document_manifest(store, digest, signatures.PROVENANCE_MEDIA, b"[1]"), "is not a JSON object (a list)"),
        (_document_manifest(store, digest, signatures.PROVENANCE_MEDIA, b"\x00garbage"), "is not JSON"),
    ]
    for manifest, message in forgeries:
        store.manifests[tag] = genuine
        forged = _add_referrer(store, digest, manifest["artifactType"] if manifest["artifactType"] in
                               signatures.DOCUMENTS else signatures.SBOM_MEDIA, manifest)
        assert forged in _refused(repository, digest, key, message)
    store.manifests[tag] = genuine
    assert signatures.attachments(None, repository, digest)["signatures"] == 1  # what inspect shows
    store.put_manifest(tag, json.dumps({"manifests": [[], {"artifactType": {}}]}).encode(), INDEX)
    assert signatures.attachments(None, repository, digest)["sbom"] is None
    _refused(repository, digest, key, "no SBOM attached")
    store.manifests[tag] = genuine
    served = sbom_of(image_id)
    store.served[_sha(served)] = served.replace(b"1.6", b"1.7")  # the registry serves other bytes
    _refused(repository, digest, key, "was served by registry")
    del store.served[_sha(served)]
    signatures.verify(None, repository, digest, key.public_key())


def test_an_image_without_gpux_s_model_label_is_one_line(registry):
    store, repository = registry
    key = ec.generate_private_key(ec.SECP256R1())
    digest, image_id = _image(store, labels={})
    _attest(repository, digest, image_id)
    signatures.sign(None, repository, digest, key)
    _refused(repository, digest, key, f"{repository}@{digest}: its config has no io.gpux.model.sha256 label")


def test_an_index_is_verified_by_its_signature_and_each_platform_s_documents(registry):
    """What build --push --sign-key does for several platforms: each platform's manifest has its
    documents, and the index (whose digest fixes the members') is signed. verify of the index
    checks its signature and every platform's documents."""
    store, repository = registry
    key = ec.generate_private_key(ec.SECP256R1())
    members = {arch: _image(store, arch) for arch in ("amd64", "arm64")}
    for digest, image_id in members.values():
        _attest(repository, digest, image_id)
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [
        {"mediaType": MANIFEST, "digest": digest, "size": len(store.manifests[digest][0]),
         "platform": {"os": "linux", "architecture": arch}} for arch, (digest, _) in members.items()] + [
        {"mediaType": MANIFEST, "digest": OTHER, "size": 1, "platform": {"os": "unknown", "architecture": "unknown"}}]}
    top = store.put_manifest("1.0", json.dumps(index).encode(), INDEX)
    _refused(repository, top, key, f"{repository}@{top}: no signature")
    signatures.sign(None, repository, top, key)
    done = signatures.verify(None, repository, top, key.public_key())
    assert [(i["platform"], i["manifest"], i["image_id"], i["signed_by"]) for i in done.images] == [
        (f"linux/{arch}", f"{repository}@{digest}", image_id, f"{repository}@{top}")
        for arch, (digest, image_id) in members.items()]
    shown = verify_cmd.lines(done)
    assert shown[0].endswith("; an index of 2 images, each one's SBOM and provenance checked")
    assert shown[1] == f"  linux/amd64  {repository}@{members['amd64'][0]}"
    assert shown[2].startswith("    sbom        sha256:")
    # arm64's provenance replaced by an in-toto statement of another predicate
    arm64, _ = members["arm64"]
    (forged,) = referrers.attach(None, repository, arm64, [Artifact(
        signatures.PROVENANCE_MEDIA, provenance_of(arm64, predicate_type="https://spdx.dev/Document"),
        {"dev.gpux.kind": "provenance"})])
    assert _refused(repository, top, key, "not SLSA Provenance v1") == (
        f"{repository}@{arm64}: the attached provenance {forged} has predicateType \"https://spdx.dev/Document\", "
        f"not SLSA Provenance v1 ({signatures.PREDICATE})")


def test_a_manifest_past_4_mib_is_cut_off_where_it_passes_the_bound(registry):
    """A registry that serves a huge manifest (a tag, the .sig, an index) is read no further than
    a manifest's bound: one line, not the registry's whole answer in memory."""
    from gpux_pack.errors import DockerError
    from gpux_pack.registry.index import MAX_MANIFEST, Registry

    store, repository = registry
    huge = b'{"schemaVersion": 2, "manifests": [' + b" " * (MAX_MANIFEST + 10) + b"]}"
    store.put_manifest("huge", huge, INDEX)
    with pytest.raises(DockerError, match=r"sent more than 4 MiB for the manifest .* huge: refused"):
        Registry(None, repository, actions="pull").manifest("huge")
