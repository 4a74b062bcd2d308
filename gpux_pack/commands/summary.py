"""`gpux-pack build --json`: the summary CI pipelines read, as typed models, so its JSON Schema
(build-summary.schema.json, `gpux-pack schema --of build-summary`) is generated, not written."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BuiltImage(_Model):
    tag: str = Field(description="The image's tag")
    id: str = Field(description="The image id (sha256:...)")
    size_bytes: int
    provider: str = Field(description="cpu, cuda, tensorrt, rocm, migraphx or openvino")
    reason: str = Field(description="Why this provider (auto says what it saw)")
    base_image: str
    runtime_base: Optional[str] = Field(description="The provider's runtime base image (content-addressed tag)")
    runtime_base_built: bool = Field(description="Whether this build made the runtime base image")
    context_bytes: int = Field(description="Bytes sent or assembled for the model image")
    platform: Optional[str]
    python: str
    onnxruntime: Optional[str] = Field(description="The onnxruntime version in the image")
    warmup: str = Field(description="none, at-start or baked")
    seconds: float
    steps: int
    cached_steps: int
    assembled: bool = Field(description="Made on the host and loaded (nothing ran), rather than built")
    digest: Optional[str] = Field(None, description="name@sha256:... when pushed (--push)")
    notes: list[str] = Field(default_factory=list, description="Warnings about gpux.yml: what was left out or not "
                             "acted on, where the graph overrules a declaration (file:line: field: text)")


class IndexManifest(_Model):
    platform: str = Field(description="os/architecture, e.g. linux/arm64")
    digest: str = Field(description="name@sha256:... of that platform's image")


class PushedIndex(_Model):
    provider: str
    tag: str = Field(description="The tag the OCI image index was pushed under")
    digest: str = Field(description="name@sha256:... of the index")
    manifests: list[IndexManifest]


class Failure(_Model):
    provider: str
    error: str = Field(description="The one-line error")
    exit_code: int


class BuildSummary(_Model):
    images: list[BuiltImage]
    indexes: list[PushedIndex] = Field(
        default_factory=list, description="--platform a,b --push: one OCI image index per provider"
    )
    failed: list[Failure]
    seconds: float


def json_schema() -> dict[str, Any]:
    out = BuildSummary.model_json_schema()
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "gpux-pack build --json"
    return out
