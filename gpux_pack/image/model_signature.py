"""What decides the image's answers, signed at build in OpenSSF's model-signing format (the
`model-signing` library: a Sigstore bundle holding a DSSE envelope of an in-toto statement that
lists each file's sha256), with a PEM EC key: gpux.json (labels, normalisation, every setting the
runtime reads), preprocessing's assets (the tokenizer.json) and the model's files, by their paths
under /opt/gpux; the statement records what it leaves out (contract.UNSIGNED: the packages, the
runtime, the cache folders, the signature). The bundle and the public key go into the image's
assets, and the image checks them all before loading when asked (gpux_pack/runtime/model_check.py).
`model_signing verify key` accepts the bundle for the image's /opt/gpux folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from gpux_pack.errors import UsageError
from gpux_pack.plan import Plan
from gpux_pack.image.context import answer_files
from gpux_pack.runtime.contract import APP_DIR, MODEL_PUBLIC_KEY, MODEL_SIGNATURE, UNSIGNED


def sign(plan: Plan, key_path: Path) -> tuple[tuple[str, bytes], ...]:
    """(name, bytes) of the bundle and the public key, for the files that decide the answers
    exactly as the image holds them (a folder laid out as /opt/gpux: links, copies, or bytes)."""
    # here, not at the top: every build imports this module, and only --sign-model needs
    # cryptography (9 ms of a 0.4 s rebuild)
    from cryptography.hazmat.primitives import serialization

    from gpux_pack.keys import load_private_key, password

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
    with tempfile.TemporaryDirectory(prefix="gpux-sign-") as tmp:
        root = Path(tmp) / Path(APP_DIR).name
        for name, content in answer_files(plan):
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
                continue
            try:
                os.link(content, target)
            except OSError:
                shutil.copyfile(content, target)
        bundle = Path(tmp) / MODEL_SIGNATURE
        hashing_config = hashing.Config().use_file_serialization(hashing_algorithm="sha256").set_ignored_paths(
            paths=list(UNSIGNED), ignore_git_paths=False)
        try:
            signing.Config().use_elliptic_key_signer(private_key=key_path, password=password()).set_hashing_config(
                hashing_config).sign(root, bundle)
        except Exception as e:  # the library's own refusals: one line
            raise UsageError(f"--sign-model {key_path}: {(str(e).splitlines() or [type(e).__name__])[0][:200]}") from None
        return (MODEL_SIGNATURE, bundle.read_bytes()), (MODEL_PUBLIC_KEY, public)
