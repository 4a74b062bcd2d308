"""The image's bill of materials: a CycloneDX 1.6 JSON document, written with the format's own
library (cyclonedx-python-lib) and checked against its schema.

CycloneDX rather than SPDX: it has a machine-learning-model component type for the model (SPDX
2.3 has none), and its library validates what it writes (the tests check every kind of SBOM
against the schema; a build does not pay for the validator). What gpux-pack knows, it lists:
- the image itself (metadata.component, a container) and what made it (gpux-pack);
- the base image (its reference and image id) and its operating system (os-release);
- every package its package manager installed (dpkg's status or apk's database; purl pkg:deb or
  pkg:apk), read from the base's files on the host;
- every Python package of the lock (purl pkg:pypi, the sha256 of the wheel installed, else the
  lock's hashes), and the gpux runtime;
- the model (sha256, size, opsets, inputs and outputs) and the files preprocessing reads;
- a baked warmup's compiled cache (with_cache: its key, provider, device and layer), added when
  `warmup` or `build --warmup always` derives the warm image.
Deterministic: the serial number is derived from the content (attestation_store.sbom_bytes) and the timestamp is the image's
creation time (SOURCE_DATE_EPOCH when set), so the same inputs give the same bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpux_pack import __version__, wheels
from gpux_pack.engine import rootfs
from gpux_pack.image.attestation_store import sbom_bytes, sbom_timestamp
from gpux_pack.plan import Plan
from gpux_pack.project.preprocess import TOKENIZER_FILE
from gpux_pack.staging import cache_dir, touch, write_bytes

MEDIA_TYPE = "application/vnd.cyclonedx+json"  # the artifactType of the SBOM in a registry


@dataclass(frozen=True)
class CompiledCache:
    """A warmup cache baked into an image: its key (runtime/caches.py) and what compiled it, and
    the layer that holds it (its diff id, the sha256 of the uncompressed layer: the cache's files,
    names and modes, byte for byte)."""

    key: str
    provider: str
    device: str
    onnxruntime: str
    layer: str  # sha256:<hex>
    path: str  # where the image holds it: /opt/gpux/warm/<key>


REUSED_FORMAT = 1  # of the documents kept under the cache's sboms/ (a change makes every one of them unused)


def document(plan: Plan, image_id: str | None = None) -> bytes:
    """The image's CycloneDX 1.6 JSON (sorted keys). Most of it (the base's packages, the lock's,
    the runtime: 130 components of examples/mlp) depends on none of what a retrained model or an
    edited gpux.yml changes; the library writes it once for those inputs (70 ms with its import,
    a tenth of a rebuild) and it is kept under the cache (sboms/, by _reused_key). What does
    change is put in by `own_parts`, on a kept document and on one the library has just written
    alike, so both give the same bytes (a test compares it with what the library writes)."""
    key = _reused_key(plan)
    kept = cache_dir() / "sboms" / f"{key}.json"
    try:
        doc = json.loads(kept.read_bytes())
        touch(kept)
    except (OSError, ValueError):
        doc = json.loads(library_document(plan, image_id))
        write_bytes(kept, json.dumps(doc).encode())
    return sbom_bytes(own_parts(doc, plan, image_id))


def _reused_key(plan: Plan) -> str:
    """Everything the library's part of the document is made from, but for what own_parts puts in."""
    lock = plan.lock
    inputs = [REUSED_FORMAT, __version__, dataclasses.asdict(plan.base),
              [[p.name, p.version, sorted(p.hashes)] for p in lock.pins] if lock else None,
              sorted(wheels.wheel_hashes(lock).items()) if lock else None, sorted(name for name, _ in plan.assets)]
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:40]


def _properties(**values: Any) -> list[dict[str, str]]:
    """Properties as the library writes them: gpux:-named, the empty left out, sorted."""
    return sorted(({"name": f"gpux:{k}", "value": str(v)} for k, v in values.items() if v not in (None, "")),
                  key=lambda p: (p["name"], p["value"]))


def _optimized(plan: Plan) -> dict[str, str]:
    """The model's properties that say what pack.optimize did: the steps, each step's errors
    against the original on each output (JSON), the inputs checked, the ONNX Runtime that did it."""
    done = plan.optimized
    if done is None:
        return {}
    return {"optimize": ",".join(f"{m.step.mode}:{m.step.how}" for m in done.measured),
            "optimize_errors": json.dumps({m.step.mode: dict(m.errors) for m in done.measured}, sort_keys=True),
            "optimize_samples": done.samples, "optimize_onnxruntime": done.onnxruntime}


def _sha256(value: str) -> list[dict[str, str]]:
    return [{"alg": "SHA-256", "content": value}]


def own_parts(doc: dict[str, Any], plan: Plan, image_id: str | None) -> dict[str, Any]:
    """The document with what this image alone decides written in: the image (its tag,
    description, provider, id), the model (its digest, size, graph and signature), the files
    preprocessing reads, and the time. Each replaces the component of the same bom-ref, where
    the library sorted it (by type first: the only model and the only files keep their place)."""
    repository, _, tag = plan.tag.rpartition(":") if "@" not in plan.tag else (plan.tag, "", "")
    image = {"bom-ref": "image", "type": "container", "name": repository or plan.tag, "version": tag or plan.version,
             "properties": _properties(provider=plan.provider.name, platform=plan.platform, warmup=plan.warmup,
                                       image_id=image_id, onnxruntime=plan.ort_version)}
    if plan.config.description is not None:
        image["description"] = plan.config.description
    model = plan.model
    parts = {"model": {
        "bom-ref": "model", "type": "machine-learning-model", "name": model.files[0],
        "version": plan.config.model.version or plan.version, "hashes": _sha256(model.sha256),
        "properties": _properties(size_bytes=model.size_bytes, opset=json.dumps(model.opset, sort_keys=True),
                                  files=",".join(plan.model_files), nodes=model.nodes,
                                  inputs=json.dumps([t.to_json() for t in plan.signature.inputs], sort_keys=True),
                                  outputs=json.dumps([t.to_json() for t in plan.signature.outputs], sort_keys=True),
                                  installed_to="/opt/gpux/model", **_optimized(plan))}}
    if plan.optimized is not None:  # made from the model given: its ancestor, by digest
        parts["model"]["pedigree"] = {"ancestors": [{
            "bom-ref": "model-original", "type": "machine-learning-model", "name": model.files[0],
            "version": plan.config.model.version or plan.version, "hashes": _sha256(plan.optimized.original_sha256),
            "properties": _properties(size_bytes=plan.optimized.original_bytes)}]}
    for name, path in plan.assets:
        parts[f"asset:{name}"] = {"bom-ref": f"asset:{name}", "type": "file", "name": name,
                                  "hashes": _sha256(_file_sha256(path)),
                                  "properties": _properties(installed_to=f"/opt/gpux/assets/{name}",
                                                            role="tokenizer" if name == TOKENIZER_FILE else "asset")}
    doc["metadata"]["component"] = image
    doc["metadata"]["timestamp"] = sbom_timestamp(plan.created)
    doc["components"] = [parts.get(c.get("bom-ref"), c) for c in doc["components"]]
    return doc


def library_document(plan: Plan, image_id: str | None = None) -> bytes:
    """The whole document as the library writes it from the plan. The library is imported here:
    90 ms that `plan`, `render` and the rest of the CLI need not pay."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.contact import OrganizationalEntity
    from cyclonedx.model.dependency import Dependency
    from cyclonedx.model.tool import ToolRepository
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    pypi = OrganizationalEntity(name="Python Package Index (pypi.org)")  # who distributed the wheels

    def supplier(maintainer: str) -> Any:
        """A Debian or Alpine maintainer field (Name <mail>) as the component's supplier."""
        name = maintainer.split("<", 1)[0].strip()
        return OrganizationalEntity(name=name) if name else None

    def sha256(values: Any) -> list[Any]:
        return [HashType(alg=HashAlgorithm.SHA_256, content=v) for v in sorted(values)]

    def props(**values: Any) -> list[Any]:
        return [Property(name=f"gpux:{k}", value=str(v)) for k, v in values.items() if v not in (None, "")]

    repository, _, tag = plan.tag.rpartition(":") if "@" not in plan.tag else (plan.tag, "", "")
    image = Component(type=ComponentType.CONTAINER, name=repository or plan.tag, version=tag or plan.version,
                      bom_ref="image", description=plan.config.description,
                      properties=props(provider=plan.provider.name, platform=plan.platform, warmup=plan.warmup,
                                       image_id=image_id, onnxruntime=plan.ort_version))
    base = plan.base
    base_component = Component(type=ComponentType.CONTAINER, name=base.image, bom_ref="base-image",
                               version=base.id or None, properties=props(python=base.python, arch=base.arch,
                                                                        inspected=base.probed))
    components = [base_component]
    os_refs = []
    if base.rootfs:
        root = Path(base.rootfs)
        release = rootfs.os_release(root)
        distro = f"{release.get('ID', '')}-{release.get('VERSION_ID', '')}".strip("-")
        if release:
            components.append(Component(type=ComponentType.OPERATING_SYSTEM, name=release.get("ID", "linux"),
                                        version=release.get("VERSION_ID"), bom_ref="os",
                                        description=release.get("PRETTY_NAME")))
        for p in rootfs.os_packages(root):
            qualifiers = {"arch": p.arch, **({"distro": distro} if distro else {})}
            purl = PackageURL(type=p.manager, namespace=release.get("ID") or None, name=p.name, version=p.version,
                              qualifiers={k: v for k, v in qualifiers.items() if v})
            ref = f"{p.manager}:{p.name}@{p.version}:{p.arch}"
            os_refs.append(ref)
            components.append(Component(type=ComponentType.LIBRARY, name=p.name, version=p.version, purl=purl,
                                        bom_ref=ref, supplier=supplier(p.maintainer),
                                        properties=props(source="base image package database")))
    installed = wheels.wheel_hashes(plan.lock) if plan.lock else {}
    py_refs = []
    for pin in plan.lock.pins if plan.lock else ():
        ref = f"pypi:{pin.name}@{pin.version}"
        py_refs.append(ref)
        chosen = installed.get(pin.name)
        components.append(Component(
            type=ComponentType.LIBRARY, name=pin.name, version=pin.version, bom_ref=ref, supplier=pypi,
            purl=PackageURL(type="pypi", name=pin.name, version=pin.version),
            hashes=sha256([chosen] if chosen else pin.hashes),
            properties=props(installed_to="/opt/gpux/site-packages",
                             hashes="the installed wheel" if chosen else "every file of the release (lock)")))
    runtime = Component(type=ComponentType.APPLICATION, name="gpux-runtime", version=__version__,
                        bom_ref="runtime", supplier=OrganizationalEntity(name="gpux-pack"), purl=PackageURL(type="pypi", name="gpux-pack", version=__version__),
                        properties=props(installed_to="/opt/gpux/runtime"))
    components.append(runtime)
    model = plan.model
    model_component = Component(
        type=ComponentType.MACHINE_LEARNING_MODEL, name=plan.model.files[0], version=plan.config.model.version
        or plan.version, bom_ref="model", hashes=sha256([model.sha256]),
        properties=props(size_bytes=model.size_bytes, opset=json.dumps(model.opset, sort_keys=True),
                         files=",".join(plan.model_files), nodes=model.nodes,
                         inputs=json.dumps([t.to_json() for t in plan.signature.inputs], sort_keys=True),
                         outputs=json.dumps([t.to_json() for t in plan.signature.outputs], sort_keys=True),
                         installed_to="/opt/gpux/model", **_optimized(plan)))
    if plan.optimized is not None:
        from cyclonedx.model.component import Pedigree

        model_component.pedigree = Pedigree(ancestors=[Component(
            type=ComponentType.MACHINE_LEARNING_MODEL, name=model.files[0], bom_ref="model-original",
            version=plan.config.model.version or plan.version, hashes=sha256([plan.optimized.original_sha256]),
            properties=props(size_bytes=plan.optimized.original_bytes))])
    components.append(model_component)
    for name, path in plan.assets:
        components.append(Component(type=ComponentType.FILE, name=name, bom_ref=f"asset:{name}",
                                    hashes=sha256([_file_sha256(path)]),
                                    properties=props(installed_to=f"/opt/gpux/assets/{name}",
                                                     role="tokenizer" if name == TOKENIZER_FILE else "asset")))
    tools = ToolRepository(components=[Component(type=ComponentType.APPLICATION, name="gpux-pack",
                                                 version=__version__)])
    created = datetime.fromisoformat(plan.created.replace("Z", "+00:00"))
    bom = Bom(components=components, metadata=BomMetaData(component=image, tools=tools, timestamp=created))

    def on(parent: Any, refs: list[str]) -> Dependency:
        return Dependency(ref=parent.bom_ref, dependencies=[Dependency(ref=c.bom_ref) for c in components
                                                            if c.bom_ref.value in refs])

    bom.dependencies.update([on(image, ["base-image", "runtime", "model"]), on(base_component, os_refs),
                             on(runtime, py_refs)])
    return sbom_bytes(json.loads(JsonV1Dot6(bom).output_as_string(indent=None)))


def with_cache(document_: bytes, image_id: str, cache: CompiledCache) -> bytes:
    """The SBOM of the image a baked warmup derived from the one `document_` describes: the same
    components, the compiled cache as one more (compiled from the model, held by the image), and
    the new image's id. Read back and written by the library, so it stays valid."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.dependency import Dependency
    from cyclonedx.output.json import JsonV1Dot6

    doc = json.loads(document_)
    bom = Bom.from_json(doc)  # type: ignore[attr-defined]
    properties = {"key": cache.key, "provider": cache.provider, "device": cache.device,
                  "onnxruntime": cache.onnxruntime, "layer": cache.layer, "installed_to": cache.path}
    component = Component(
        type=ComponentType.DATA, name=f"compiled cache {cache.key}", version=cache.key, bom_ref=f"cache:{cache.key}",
        description=f"what {cache.provider or 'the provider'} compiled from the model at warmup; the image loads it "
                    "instead of compiling again",
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=cache.layer.split(":", 1)[-1])],
        properties=[Property(name=f"gpux:{k}", value=v) for k, v in properties.items() if v])
    bom.components.add(component)
    image = bom.metadata.component
    image.properties = [p for p in image.properties if p.name not in ("gpux:image_id", "gpux:warmup")] + [
        Property(name="gpux:image_id", value=image_id), Property(name="gpux:warmup", value="baked")]
    on_image = next((d for d in bom.dependencies if d.ref == image.bom_ref), None)
    if on_image is not None:  # replaced, not changed in place: the set is sorted
        bom.dependencies.remove(on_image)
    bom.dependencies.add(Dependency(ref=image.bom_ref, dependencies=[
        *(on_image.dependencies if on_image else ()), Dependency(ref=component.bom_ref)]))
    model = next((c for c in bom.components if c.bom_ref.value == "model"), None)
    if model is not None:
        bom.dependencies.add(Dependency(ref=component.bom_ref, dependencies=[Dependency(ref=model.bom_ref)]))
    return sbom_bytes(json.loads(JsonV1Dot6(bom).output_as_string(indent=None)))


def validate(doc: dict[str, Any]) -> str | None:
    """The first schema error of a CycloneDX 1.6 JSON document, or None. Not run by a build: its
    validator's imports alone take a second (jsonschema's format checkers); the tests run it on
    every kind of SBOM a build writes."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(doc))
    return str(error)[:300] if error else None


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
