"""Baking a warmup into an image (`gpux-pack warmup IMAGE`, and a build's `--warmup always`):
compile the image's provider caches on the machine that has the accelerator, after the image
was built where it is absent (a CI host).

The image's own `warmup` command runs in a container (the image's user, no network, the
provider's device flags, a timeout, always removed). Its cache folder (one key: model,
provider, library versions, device, shapes, options; see runtime/caches.py) is copied out and
either written to a folder (`--export`, for a volume) or added to the image as one layer at
/opt/gpux/warm/<key>/ (the layout's "warm" layer), with the image's config unchanged but for
labels: the image maker's `derive`, assembled like every other layer (nothing is committed
from the container) or built by the engine's builder from the same tar.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from gpux_pack import engine, staging
from gpux_pack.engine import image_labels
from gpux_pack.engine.interface import Container, Engine
from gpux_pack.errors import BuildError, DockerError, PackError, UsageError
from gpux_pack.image import layer_tar
from gpux_pack.image.context import MTIME
from gpux_pack.image.layout import LAYERS
from gpux_pack.image.maker import Maker, choose
from gpux_pack.image.sbom import CompiledCache
from gpux_pack.runtime.contract import CACHE_DIR, FALLBACK_CACHE_DIR, RECORD
from gpux_pack.providers import Devices
from gpux_pack.reference import parse_reference
from gpux_pack.ui import Reporter

TIMEOUT = 3600  # seconds: TensorRT engines of large models take minutes, not hours
TAIL = 25
MAX_CACHE_BYTES = 64 * 1024**3  # a cache folder larger than this is not copied out
_KEY = re.compile(r"^[0-9a-f]{24}$")


@dataclass(frozen=True)
class Baked:
    key: str
    short: str
    record: dict[str, Any]  # the cache's warmup.json
    state: dict[str, Any]  # what the container's warmup printed
    seconds: float
    tag: str | None = None  # the derived image's tag
    id: str | None = None
    exported: Path | None = None
    assembled: bool = False


def bake_image(client: Engine, ref: str, ui: Reporter, maker: Maker | None = None, *, tag: str | None = None,
               devices: Devices = Devices(), export: Path | None = None, timeout: int = TIMEOUT) -> Baked:
    """Warm `ref` up in a container; export its cache or add it to a derived image (made by
    maker, or the engine's own choice)."""
    started = time.perf_counter()
    found = image_labels.read(client, ref)
    image, labels = found.image, found.labels
    if export is None and tag is None:
        tag = default_tag(ref, image)
    with tempfile.TemporaryDirectory(prefix="gpux-warm-") as tmp:
        state, folder = _run(client, image.id, ui, devices, timeout, Path(tmp))
        key = str(state.get("key") or "")
        record = json.loads((folder / RECORD).read_text()) if folder else {}
        short = str(record.get("short") or key[:6] or "none")  # the runtime names its cache
        if folder is None and state.get("cache") == "none":
            ui.info(f"warmup: the {labels.get('io.gpux.provider')} provider compiles nothing to cache; the image is "
                    "unchanged")
        elif folder is None:
            ui.info(f"warmup: {ref} is already warm for this device (a {state.get('cache')} cache); nothing to add")
        if export is not None:
            out = _export(folder, export, key) if folder else None
            return Baked(key, short, record, state, time.perf_counter() - started, exported=out)
        assert tag is not None
        if tag and "{short}" in tag:
            tag = tag.replace("{short}", short)
        if folder is None:
            image.tag(*parse_reference(tag).repository_tag)
            return Baked(key, short, record, state, time.perf_counter() - started, tag=tag, id=image.id)
        maker = maker or choose(client, ui)
        derived = maker.derive(image.id, tag, warm_members(folder, key), warm_labels(key, record), f"warmup cache {key}")
    return Baked(key, short, record, state, time.perf_counter() - started, tag=tag, id=derived.id,
                  assembled=derived.assembled)


def default_tag(ref: str, image: Any) -> str:
    """`<repo>:<tag>-warm-{short}` of the reference given (an image id needs --tag)."""
    if re.fullmatch(r"(sha256:)?[0-9a-f]{12,64}", ref):
        raise UsageError(f"{ref}: an image id has no tag to derive one from; pass --tag")
    repo, name = parse_reference(ref).repository_tag
    return f"{repo}:{name}-warm-{{short}}"


def _run(client: Engine, image_id: str, ui: Reporter, devices: Devices, timeout: int,
         tmp: Path) -> tuple[dict[str, Any], Path | None]:
    """Run `warmup` in a container; (its state, the compiled cache folder copied to tmp, or
    None when it found a valid cache and compiled nothing)."""
    import docker

    flags = engine.container_devices(devices)
    ui.info(f"warmup: running the model in a container{' with ' + ', '.join(flags) if flags else ''}")
    container = None
    try:
        container = client.containers.create(
            image_id, command=["warmup"], environment={"GPUX_CACHE_DIR": CACHE_DIR}, network_disabled=True,
            labels={engine.ROLE_LABEL: "warmup"}, **flags,
        )
        container.start()
        try:
            result = container.wait(timeout=timeout)
        except Exception:
            raise BuildError(f"warmup did not finish within {timeout}s", "warmup") from None
        out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace").strip().splitlines()
        err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace").strip().splitlines()
        if result.get("StatusCode") != 0:
            reason = next((line[len("gpux: "):] for line in reversed(err) if line.startswith("gpux: ")), None)
            message = reason or f"the container exited with {result.get('StatusCode')}"
            raise BuildError(f"warmup failed: {message}", "warmup", [] if reason else err[-TAIL:])
        try:
            result_line = json.loads(out[-1])
            state, folder = result_line["warmup"], str(result_line.get("folder") or "")
        except (IndexError, ValueError, KeyError, TypeError, AttributeError):
            raise BuildError("warmup printed no result", "warmup", (out + err)[-TAIL:]) from None
        for line in err:
            if " WARNING " in line:
                ui.info(f"warmup: {line.split(': ', 1)[-1]}")
        key = str(state.get("key") or "")
        if state.get("cache") != "compiled" or not _KEY.match(key):
            return state, None
        # where it published: GPUX_CACHE_DIR, or /tmp/gpux-cache in an image without that folder
        source = folder if folder in (f"{CACHE_DIR}/{key}", f"{FALLBACK_CACHE_DIR}/{key}") else f"{CACHE_DIR}/{key}"
        return state, _copy_out(container, source, key, tmp)
    except PackError:
        raise
    except docker.errors.APIError as e:
        raise DockerError(f"warmup: the Docker engine refused: {str(e).splitlines()[0][:300]}") from None
    finally:
        if container is not None:
            engine.remove_container(container)


def _copy_out(container: Container, source: str, key: str, tmp: Path) -> Path:
    """The container's cache folder for key, extracted with every name checked: only regular
    files and folders under the key, no links, no way out of tmp."""
    stream, _ = container.get_archive(source)
    spool = tempfile.TemporaryFile(dir=tmp)
    total = 0
    for chunk in stream:
        total += len(chunk)
        if total > MAX_CACHE_BYTES:
            raise BuildError(f"the warmup cache is larger than {MAX_CACHE_BYTES >> 30} GiB", "warmup")
        spool.write(chunk)
    spool.seek(0)
    dest = tmp / key
    with tarfile.open(fileobj=spool) as archive:
        for member in archive:
            path = PurePosixPath(member.name)
            if path.is_absolute() or ".." in path.parts or not path.parts or path.parts[0] != key:
                raise BuildError(f"the warmup cache holds an unexpected path {member.name!r}", "warmup")
            target = tmp.joinpath(*path.parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                assert source is not None
                with open(target, "wb") as f:
                    shutil.copyfileobj(source, f)
            else:
                raise BuildError(f"the warmup cache holds a link or device {member.name!r}", "warmup")
    if not (dest / "warmup.json").is_file():
        raise BuildError("the warmup cache has no warmup.json", "warmup")
    return dest


def _export(folder: Path, export: Path, key: str) -> Path:
    """DIR/<key>/, written under a temporary name and renamed: mount DIR at GPUX_CACHE_DIR."""
    try:
        export.mkdir(parents=True, exist_ok=True)
        final = export / key
        staged = staging.temp_path(final)
        try:
            shutil.copytree(folder, staged)
            if final.exists():
                shutil.rmtree(final)
            staged.rename(final)
        finally:
            staging.remove(staged)  # on every exit path, Ctrl-C included
        return final
    except OSError as e:
        raise UsageError(f"--export {export}: {e.strerror or e}") from None


def warm_members(folder: Path, key: str) -> list[layer_tar.Member]:
    """The layer: /opt/gpux/warm/<key>/..., root-owned and read-only to the image's user, its
    parents as the earlier layers made them."""
    return layer_tar.tree(folder, f"{LAYERS['warm'].lands}/{key}", MTIME)


KEY_LABEL = "io.gpux.warmup.key"
KEY_PARTS = ("provider", "device", "onnxruntime")  # labelled io.gpux.warmup.key.<part>


def warm_labels(key: str, record: dict[str, Any]) -> dict[str, str]:
    parts = record.get("parts") or {}
    labels = {"io.gpux.warmup": "baked", KEY_LABEL: key}
    for name in KEY_PARTS:
        if parts.get(name):
            labels[f"{KEY_LABEL}.{name}"] = str(parts[name])[:200]
    return labels


def cache_of(client: Engine, baked: Baked) -> CompiledCache | None:
    """The compiled cache a bake added to its derived image, as its SBOM and provenance name it
    (None when it added none: an export, a cache already there, a provider that compiles nothing)."""
    if not baked.id or baked.exported is not None or baked.state.get("cache") != "compiled":
        return None
    attrs = client.images.get(baked.id).attrs
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    if labels.get(KEY_LABEL) != baked.key:
        return None
    return CompiledCache(baked.key, *(labels.get(f"{KEY_LABEL}.{part}", "") for part in KEY_PARTS),
                         layer=attrs["RootFS"]["Layers"][-1], path=f"{LAYERS['warm'].lands}/{baked.key}")
