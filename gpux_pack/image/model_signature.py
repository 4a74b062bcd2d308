"""The model files signed at build in OpenSSF's model-signing format (the `model-signing` library:
a Sigstore bundle holding a DSSE envelope of an in-toto statement that lists each file's sha256),
with a PEM EC key; the bundle and the public key go into the image's assets, and the image checks
them before loading when asked (gpux_pack/runtime/model_check.py). `model_signing verify key`
accepts the bundle for the image's model folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from gpux_pack.errors import UsageError
from gpux_pack.plan import Plan
from gpux_pack.keys import load_private_key, password
from gpux_pack.runtime.paths import MODEL_PUBLIC_KEY, MODEL_SIGNATURE


def sign(plan: Plan, key_path: Path) -> tuple[tuple[str, bytes], ...]:
    """(name, bytes) of the bundle and the public key, for the model files exactly as the image
    holds them (a folder of those files alone: links, else copies)."""
    try:
        from model_signing import hashing, signing
    except ImportError as e:
        raise UsageError(f"--sign-model needs the model-signing library here ({e.name} is missing): "
                         "pip install 'gpux-pack[sign]'") from None
    if plan.externalize:
        raise UsageError("--sign-model: the image moves the model's inline weights to a data file (pack.weights: "
                         "auto); set pack.weights: inline to sign the files as given")
    key = load_private_key(key_path)  # checked (P-256, PEM, password) with cosign's rules
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    folder = plan.model.path.parent
    with tempfile.TemporaryDirectory(prefix="gpux-sign-") as tmp:
        model_dir = Path(tmp) / "model"
        model_dir.mkdir()
        for name in plan.model_files:
            target = model_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(folder / name, target)
            except OSError:
                shutil.copyfile(folder / name, target)
        bundle = Path(tmp) / MODEL_SIGNATURE
        try:
            signing.Config().use_elliptic_key_signer(private_key=key_path, password=password()).set_hashing_config(
                hashing.Config().use_file_serialization(hashing_algorithm="sha256")).sign(model_dir, bundle)
        except Exception as e:  # the library's own refusals: one line
            raise UsageError(f"--sign-model {key_path}: {(str(e).splitlines() or [type(e).__name__])[0][:200]}") from None
        return (MODEL_SIGNATURE, bundle.read_bytes()), (MODEL_PUBLIC_KEY, public)
