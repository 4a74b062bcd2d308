"""`gpux-pack inspect PATH|MODEL.onnx`: what a project or a model file holds, without Docker (GPUX's
`inspect`): the model's inputs, outputs, opsets and size; for a project also what gpux.yml
declares, what the image will serve and the build's notes. An image: its gpux labels, from this
engine or else from the registry its name gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpux_pack.engine.interface import Engine
from gpux_pack.errors import PackError
from gpux_pack.image import attestation_store
from gpux_pack.plan import notes
from gpux_pack.registry import remote, signatures
from gpux_pack.project.config import model_name
from gpux_pack.reference import parse_reference
from gpux_pack.project.load import load_project
from gpux_pack.project.model import ModelInfo, inspect_model, reconcile


def of_image(client: Engine | None, image: str) -> dict[str, Any]:
    """An image's gpux labels (on this engine, else in its registry), the SBOM its build recorded
    here, and what its registry holds for it (SBOM, provenance, signatures)."""
    found = remote.read(client, image, built_by_us=False)
    recorded = attestation_store.folder_of(found.id) / attestation_store.SBOM_FILE
    attached: dict[str, Any] | None = None
    pinned = found.pinned or _pushed_as(found, image)
    if pinned:
        repository, digest = pinned.split("@", 1)
        try:
            attached = signatures.attachments(client, repository, digest)
        except PackError as e:  # the registry is out of reach: the rest is still worth showing
            attached = {"error": str(e)}
    return {"image": image, "id": found.id, "size_bytes": found.size_bytes, "labels": found.shown,
            "registry_digest": found.pinned, "sbom_recorded": str(recorded) if recorded.is_file() else None,
            "attached": attached}


def _pushed_as(found: Any, ref: str) -> str | None:
    """A local image's digest in the repository its reference names, once pushed there (RepoDigests)."""
    if found.image is None or "/" not in ref:
        return None
    repository = parse_reference(ref).repository_tag[0]
    return next((d for d in found.image.attrs.get("RepoDigests") or () if d.startswith(f"{repository}@")), None)


def of_path(path: Path) -> dict[str, Any]:
    """A model file's facts, or a project's: both the model's and gpux.yml's."""
    if path.is_file() and path.suffix.lower() == ".onnx":
        model = inspect_model(path, str(path))
        return {"model": _model(model), "inputs": _tensors(model.inputs), "outputs": _tensors(model.outputs)}
    project = load_project(path)
    model = inspect_model(project.model_path, str(project.model_path))
    signature = reconcile(project, model)
    cfg = project.config
    declared = {side: [t.to_json() for t in getattr(cfg, side)] if getattr(cfg, side) is not None else None
                for side in ("inputs", "outputs")}
    return {
        "project": {"config": project.display, "name": cfg.name, "model_name": model_name(cfg.name),
                    "version": cfg.version, "description": cfg.description},
        "model": _model(model),
        "inputs": _tensors(signature.inputs),  # what the image serves: the graph's, with gpux.yml's words
        "outputs": _tensors(signature.outputs),
        "declared": declared,
        "notes": list(notes(project, signature)),
    }


def _model(model: ModelInfo) -> dict[str, Any]:
    return {"path": str(model.path), "files": list(model.files), "size_bytes": model.size_bytes,
            "size_mb": round(model.size_bytes / (1024 * 1024), 2), "sha256": model.sha256,
            "ir_version": model.ir_version, "opsets": model.opsets, "producer": model.producer,
            "nodes": model.nodes}


def _tensors(specs: Any) -> list[dict[str, Any]]:
    return [t.to_json() for t in specs]


def lines(info: dict[str, Any]) -> list[str]:
    """The text `inspect` prints."""
    if "labels" in info:  # an image
        where = f" (in its registry, compressed: {info['registry_digest']})" if info["registry_digest"] else ""
        out = [f"{info['image']}  {info['id']}  {(info['size_bytes'] or 0) / 1e6:.0f} MB{where}",
               *(f"  {key}: {value}" for key, value in info["labels"].items())]
        if info.get("sbom_recorded"):
            out.append(f"sbom recorded: {info['sbom_recorded']}")
        attached = info.get("attached")
        if attached and "error" in attached:
            out.append(f"attached: unknown ({attached['error']})")
        elif attached:
            out.append(f"attached: sbom {attached['sbom'] or 'none'}, provenance {attached['provenance'] or 'none'}, "
                       f"{attached['signatures']} signature(s) (check them with `gpux-pack verify`)")
        return out
    model, out = info["model"], []
    if "project" in info:
        p = info["project"]
        out.append(f"{p['name']} {p['version']}  ({p['config']}; serves as {p['model_name']})")
    out.append(f"model  {model['path']}  {model['size_mb']} MB  IR {model['ir_version']}  opsets "
               + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(model["opsets"].items()))
               + (f"  by {model['producer']}" if model["producer"] else ""))
    for side in ("inputs", "outputs"):
        out.append(f"{side}:")
        for t in info[side]:
            shape = "dynamic" if t["shape"] is None else "[" + ", ".join(map(str, t["shape"])) + "]"
            extra = "" if t.get("required", True) else "  (optional)"
            labels = f"  labels: {', '.join(t['labels'])}" if t.get("labels") else ""
            out.append(f"  {t['name']}  {t['type']}  {shape}{extra}{labels}")
    for note in info.get("notes", ()):
        out.append(f"note: {note}")
    return out
