"""Image references (`registry:5000/team/model:1.0@sha256:...`), parsed by the grammar of
distribution/reference that Docker itself uses, so a value that reaches `FROM`, `--tag` or the
engine is a reference and nothing else: no whitespace, no line break, no second instruction."""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
_NAME = re.compile(rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)", re.ASCII)
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}", re.ASCII)
NAME_MAX = 255


@dataclass(frozen=True)
class Reference:
    name: str  # [domain/]path
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    @property
    def repository_tag(self) -> tuple[str, str]:
        """(repository, tag or digest) as the engine's pull/commit/push calls take them."""
        return self.name, self.digest or self.tag or "latest"

    @property
    def registry_path(self) -> tuple[str, str]:
        """(registry, repository path in it) by Docker's rule: the first component names a
        registry when it has a '.' or ':' or is localhost; otherwise Docker Hub, where a single
        name lives under library/."""
        first, _, rest = self.name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            return first, rest
        return "docker.io", self.name if rest else f"library/{self.name}"


def parse_reference(text: str) -> Reference:
    """The reference, or ValueError saying what is wrong with it (one line)."""
    if not isinstance(text, str) or not text:
        raise ValueError("an image reference cannot be empty")
    shown = f"{ascii(text[:60])[:-1]}...' ({len(text)} characters)" if len(text) > 80 else \
        ascii(text) if not text.isprintable() else f"'{text}'"
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"{shown} has a malformed digest (expected sha256:<64 hex>)")
    tag = None
    head, sep, last = rest.rpartition("/")
    if ":" in last:
        last, tag = last.split(":", 1)
        if not _TAG.fullmatch(tag):
            raise ValueError(f"{shown} has an invalid tag (letters, digits, '_', '.', '-'; at most 128)")
    name = f"{head}{sep}{last}"
    m = _NAME.fullmatch(name)
    if not m:
        raise ValueError(
            f"{shown} is not a valid image reference (lowercase [registry/]repository[:tag][@digest])"
        )
    if len(name) > NAME_MAX:
        raise ValueError(f"{shown} is longer than {NAME_MAX} characters")
    return Reference(name, tag, digest)

