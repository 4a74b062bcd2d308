"""Where things are in an image, spelled once: the packager puts them there, the runtime finds
them there. Standard library only (the runtime's settings read it before anything heavy)."""

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
