"""Signing keys, read one way for image signatures (cosign's format) and model signatures
(OpenSSF model signing): PEM EC P-256, PKCS#8 or SEC1, unencrypted or encrypted with the
password in GPUX_SIGN_PASSWORD (or COSIGN_PASSWORD); public keys PEM PKIX, as openssl writes them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpux_pack.errors import UsageError


def password() -> str | None:
    return os.environ.get("GPUX_SIGN_PASSWORD") or os.environ.get("COSIGN_PASSWORD")


def load_private_key(path: Path) -> Any:
    """An EC P-256 private key from a PEM file; a UsageError naming the file otherwise."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"--key {path}: cannot read ({e.strerror or e})") from None
    if b"ENCRYPTED COSIGN PRIVATE KEY" in data or b"ENCRYPTED SIGSTORE PRIVATE KEY" in data:
        raise UsageError(f"--key {path}: cosign's encrypted key format is not read; give a PEM EC P-256 key "
                         "(openssl ecparam -name prime256v1 -genkey -noout -out key.pem)")
    secret = password()
    try:
        key = serialization.load_pem_private_key(data, secret.encode() if secret else None)
    except TypeError:
        raise UsageError(f"--key {path}: the key is encrypted; set GPUX_SIGN_PASSWORD (or COSIGN_PASSWORD)") from None
    except ValueError as e:
        raise UsageError(f"--key {path}: not a PEM private key ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise UsageError(f"--key {path}: an ECDSA P-256 key is needed (cosign's scheme)")
    return key


def load_public_key(path: Path) -> Any:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as e:
        raise UsageError(f"--key {path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise UsageError(f"--key {path}: not a PEM public key ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise UsageError(f"--key {path}: an ECDSA public key is needed (cosign's scheme)")
    return key
