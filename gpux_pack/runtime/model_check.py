"""What decides the answers, checked against the image's OpenSSF model-signing bundle before the
model loads: the DSSE envelope's ECDSA signature verified with the public key (over DSSE's
pre-authentication encoding), then each file the signed statement lists hashed and compared
(gpux.json, the assets such as the tokenizer.json, the model's files), and no other file in the
image's folder but what signing leaves out (contract.UNSIGNED). Any difference is a StartupError:
the container never serves a changed model, label, normalisation or tokenizer.

Asked for by gpux.yml's pack.verify_model (gpux.json's model_signature.verify) or by
GPUX_VERIFY_MODEL=1 (=0 turns it off); GPUX_MODEL_PUBLIC_KEY names another public key (one the
operator holds, not the one the image carries)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from .contract import ASSETS, GpuxJson, MODEL_PUBLIC_KEY, MODEL_SIGNATURE, UNSIGNED
from .settings import StartupError

PREDICATE = "https://model_signing/signature/v1.0"


def wanted(spec: GpuxJson, asked: bool | None) -> bool:
    """asked: GPUX_VERIFY_MODEL (None when unset); else gpux.yml's pack.verify_model."""
    return asked if asked is not None else bool(spec.model_signature and spec.model_signature.verify)


def check(spec: GpuxJson, config: Path, public_key: Path | None = None) -> int:
    """Check the image's folder (the one holding `config`, its gpux.json) against its bundle; the
    number of files checked. cryptography is imported only for an image that carries a bundle
    (the lock has it only then)."""
    if not spec.model_signature:
        raise StartupError("GPUX_VERIFY_MODEL=1, but this image carries no model signature (build --sign-model KEY)")
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    root = config.parent
    key_path = public_key or root / ASSETS / MODEL_PUBLIC_KEY
    try:
        bundle = json.loads((root / ASSETS / MODEL_SIGNATURE).read_bytes())
        key = serialization.load_pem_public_key(key_path.read_bytes())
        envelope = bundle["dsseEnvelope"]
        payload = base64.b64decode(envelope["payload"])
        kind = envelope["payloadType"].encode()
        signatures = [base64.b64decode(s["sig"]) for s in envelope["signatures"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise StartupError(f"model verification failed: cannot read the signature or key ({_first(e)})") from None
    pae = b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)
    for signature in signatures:
        try:
            key.verify(signature, pae, ec.ECDSA(hashes.SHA256()))
            break
        except (InvalidSignature, ValueError, TypeError, AttributeError):
            continue
    else:
        raise StartupError(f"model verification failed: the model signature does not verify with {key_path.name}")
    try:
        statement = json.loads(payload)
        if statement["predicateType"] != PREDICATE:
            raise ValueError(f"predicate {statement['predicateType']!r}")
        listed = {r["name"]: r["digest"] for r in statement["predicate"]["resources"] if r["algorithm"] == "sha256"}
        if not all(isinstance(name, str) and isinstance(digest, str) for name, digest in listed.items()):
            raise ValueError("a resource that is not a name and a digest")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise StartupError(f"model verification failed: the signed statement is not model signing's ({_first(e)})") from None
    present = _present(root, config)
    if set(present) != set(listed):
        extra, missing = sorted(set(present) - set(listed)), sorted(set(listed) - set(present))
        what = f"not signed: {', '.join(extra)}" if extra else f"missing: {', '.join(missing)}"
        raise StartupError(f"model verification failed: the image's files differ from what was signed ({what})")
    for name, digest in sorted(listed.items()):
        h = hashlib.sha256()
        with open(present[name], "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        if h.hexdigest() != digest:
            raise StartupError(f"model verification failed: {name} changed since it was signed (sha256 "
                               f"{h.hexdigest()[:16]}..., signed {digest[:16]}...)")
    return len(listed)


def _present(root: Path, config: Path) -> dict[str, Path]:
    """The files under root that signing covers, by their names in the statement (the gpux.json
    the runtime read is `gpux.json`, whatever GPUX_CONFIG called it); links are files here too."""
    found = {"gpux.json": config}
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        rel = here.relative_to(root).as_posix()
        dirs[:] = [d for d in dirs if _signed(f"{d}" if rel == "." else f"{rel}/{d}")]
        for name in files:
            path = name if rel == "." else f"{rel}/{name}"
            if _signed(path) and (here / name) != config and path != "gpux.json":
                found[path] = here / name
    return found


def _signed(path: str) -> bool:
    return not any(path == left or path.startswith(f"{left}/") for left in UNSIGNED)


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
