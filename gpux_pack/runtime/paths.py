"""Where things are in an image, spelled once: the packager puts them there, the runtime finds
them there. Standard library only (the runtime's settings read it before anything heavy)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

APP_DIR = "/opt/gpux"
SITE = f"{APP_DIR}/site-packages"  # the locked wheels, installed on the build host
CACHE_DIR = f"{APP_DIR}/cache"  # GPUX_CACHE_DIR: owned by the image's user, so a volume mounted there is writable
BAKED_DIR = f"{APP_DIR}/warm"  # caches `gpux-pack warmup` bakes into the image (read in place)
FALLBACK_CACHE_DIR = "/tmp/gpux-cache"  # when GPUX_CACHE_DIR cannot be written (read-only root, no volume)
CACHE_PLACEHOLDER = "${GPUX_CACHE_DIR}"  # in provider options: this container's cache folder, put in at start
ASSETS = "assets"  # files preprocessing reads (a tokenizer.json), in APP_DIR: gpux.json names them from there
MODEL_SIGNATURE = "model.sig"  # in ASSETS: the model files' OpenSSF model-signing bundle (build --sign-model)
MODEL_PUBLIC_KEY = "model.pub"  # in ASSETS: the key that bundle verifies with
# What model signing leaves out of APP_DIR: the packages and the runtime (the SBOM lists them), the
# cache folders (caches.py checks a baked cache by its key) and the signature itself. Everything
# else there (gpux.json, the model's files, preprocessing's assets) decides the answers: signed.
UNSIGNED = ("site-packages", "runtime", "cache", "warm", f"{ASSETS}/{MODEL_SIGNATURE}", f"{ASSETS}/{MODEL_PUBLIC_KEY}")


class NotRegular(OSError):
    """What open_regular found is no regular file (a FIFO, a device, a folder)."""


def open_regular(path: Path) -> BinaryIO:
    """The file, opened without waiting (a FIFO would block the open), not through a symbolic
    link (what the caller checked or recorded is the path, not where a link leads), and only if it
    is a regular file: a FIFO never answers a read and a link to /dev/zero never ends. NotRegular
    (an OSError, as a missing file's) otherwise. The packager's model-only rebuild and the
    runtime's cache checks read through it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(f"{path.name} is not a regular file")
    return os.fdopen(fd, "rb")
