"""Strict validation of deploy's manifests, shared by the unit and e2e tests: Kubernetes objects
against the API's own schemas (kubernetes-validate bundles them: no cluster, no network) and
InferenceServices against KServe's CRD schema (vendored in tests/schemas)."""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

KUBERNETES = "1.30.0"  # the API version the manifests are checked against
KSERVE_SCHEMA = Path(__file__).parent / "schemas" / "kserve-inferenceservice-v1beta1.json.gz"


@lru_cache(maxsize=1)
def _kserve_schema_text() -> str:
    return gzip.decompress(KSERVE_SCHEMA.read_bytes()).decode()


def kserve_schema() -> dict:
    """The InferenceService v1beta1 schema from KServe's CRD, made strict as `kubectl
    --validate=strict` is: a field the schema does not name is an error, not pruned."""
    schema = json.loads(_kserve_schema_text())

    def strict(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node and \
                    not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    return schema


def validate(docs: list[dict]) -> None:
    """Every document strictly: an InferenceService by KServe's schema, anything else by the
    Kubernetes API's; raises on an unknown or mistyped field."""
    import jsonschema
    import kubernetes_validate

    for doc in docs:
        if doc.get("kind") == "InferenceService":
            jsonschema.Draft7Validator(kserve_schema()).validate(doc)
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
