"""The model files checked against their OpenSSF model-signing bundle before the model loads:
the DSSE envelope's ECDSA signature verified with the public key (over DSSE's pre-authentication
encoding), then each file the signed statement lists hashed and compared, and no other file in the
model folder. Any difference is a StartupError: the container never serves a changed model.

Asked for by gpux.yml's pack.verify_model (gpux.json's model_signature.verify) or by
GPUX_VERIFY_MODEL=1 (=0 turns it off); GPUX_MODEL_PUBLIC_KEY names another public key (one the
operator holds, not the one the image carries)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from .settings import StartupError

PREDICATE = "https://model_signing/signature/v1.0"


def wanted(spec: dict[str, Any], asked: bool | None) -> bool:
    """asked: GPUX_VERIFY_MODEL (None when unset); else gpux.yml's pack.verify_model."""
    return asked if asked is not None else bool((spec.get("model_signature") or {}).get("verify"))


def verify(spec: dict[str, Any], root: Path, model_dir: Path, public_key: Path | None = None) -> int:
    """Check the model folder against the image's bundle; the number of files checked."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    signed = spec.get("model_signature")
    if not signed:
        raise StartupError("GPUX_VERIFY_MODEL=1, but this image carries no model signature (build --sign-model KEY)")
    key_path = public_key or root / signed["public_key"]
    try:
        bundle = json.loads((root / signed["bundle"]).read_bytes())
        key = serialization.load_pem_public_key(key_path.read_bytes())
        envelope = bundle["dsseEnvelope"]
        payload = base64.b64decode(envelope["payload"])
        kind = envelope["payloadType"].encode()
        signatures = [base64.b64decode(s["sig"]) for s in envelope["signatures"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
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
    except (ValueError, KeyError, TypeError) as e:
        raise StartupError(f"model verification failed: the signed statement is not model signing's ({_first(e)})") from None
    present = {p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()}
    if present != set(listed):
        extra, missing = sorted(present - set(listed)), sorted(set(listed) - present)
        what = f"not signed: {', '.join(extra)}" if extra else f"missing: {', '.join(missing)}"
        raise StartupError(f"model verification failed: the model folder differs from what was signed ({what})")
    for name, digest in sorted(listed.items()):
        h = hashlib.sha256()
        with open(model_dir / name, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        if h.hexdigest() != digest:
            raise StartupError(f"model verification failed: {name} changed since it was signed (sha256 "
                               f"{h.hexdigest()[:16]}..., signed {digest[:16]}...)")
    return len(listed)


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
