"""Images assembled on the host and handed to the engine whole (`docker load`), as google/ko
and Jib do: no builder, no container, no step runs. Layers are the context's layer folders
written by `layer_tar` (the same bytes, so the same diff ids, as `docker build` of `render
--output`); the config is the parent's with the Dockerfile's ENV, USER, WORKDIR, HEALTHCHECK,
ENTRYPOINT, CMD, EXPOSE and LABEL applied from the same plan values. Layers the engine already
holds (the parent's) are named in the manifest but not sent: the engine skips every layer
whose chain it has.

Used where the Dockerfile has no RUN and the engine is known to write layer tars the way
`layer_tar` does (checked once per engine by building one tiny image both ways); otherwise the
classic builder builds the same Dockerfile.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpux_pack import staging
from gpux_pack.engine.interface import Engine
from gpux_pack.errors import DockerError, PackError
from gpux_pack.image import layer_tar
from gpux_pack.image.archive import LayerTar, Loadable, chunks, config_bytes
from gpux_pack.image.context import MTIME, Context, Entry, layer, temporary_tar
from gpux_pack.image.layout import Layer
from gpux_pack.plan import DEFAULT_PATH, UID, ImageConfig
from gpux_pack.staging import cache_dir

NS = 1_000_000_000


@dataclass(frozen=True)
class Image:
    """One image to load: a parent's config with changes and layers on top."""

    tag: str | None  # None: untagged (a baked warmup commits and tags it)
    parent: dict[str, Any]  # `docker image inspect` of the parent
    parent_history: list[dict[str, Any]]  # `docker history` of the parent, newest first
    layers: list[LayerTar]
    config: dict[str, Any]  # the image config's "config" (Env, User, ...)
    history: list[tuple[str, bool]]  # (created_by, empty_layer) in Dockerfile order
    created: str

    def config_json(self) -> bytes:
        parent = list(reversed(self.parent_history))
        adds = adds_layer(parent, len(self.parent["RootFS"]["Layers"]))
        history = [
            {k: v for k, v in {
                "created": _iso(h.get("Created", 0)), "created_by": h.get("CreatedBy", ""),
                "comment": h.get("Comment") or None, "empty_layer": (not added) or None,
            }.items() if v is not None}
            for h, added in zip(parent, adds)
        ]
        history += [{"created": self.created, "created_by": by, **({"empty_layer": True} if empty else {})}
                    for by, empty in self.history]
        doc: dict[str, Any] = {
            "architecture": self.parent.get("Architecture") or "amd64",
            "os": self.parent.get("Os") or "linux",
            "created": self.created,
            "config": self.config,
            "rootfs": {"type": "layers",
                       "diff_ids": [*self.parent["RootFS"]["Layers"], *(layer.diff_id for layer in self.layers)]},
            "history": history,
        }
        if self.parent.get("Variant"):
            doc["variant"] = self.parent["Variant"]
        return config_bytes(doc)


ASSEMBLED = "gpux-pack (assembled, nothing ran): "  # how an assembled image's history lines begin

# how a history line names its instruction: the classic builder's "/bin/sh -c #(nop) ENV ...",
# BuildKit's "ENV ...", ours with ASSEMBLED before it
_INSTRUCTION = re.compile(r"^(?:/bin/sh -c #\(nop\)|" + re.escape(ASSEMBLED.strip()) + r")?\s*([A-Za-z]+)")
_TIERS = {"ADD": 1, "COPY": 1, "WORKDIR": 2, **{word: 4 for word in (  # 3: RUN and anything else
    "ENV", "LABEL", "EXPOSE", "USER", "CMD", "ENTRYPOINT", "HEALTHCHECK", "ARG", "SHELL", "STOPSIGNAL", "VOLUME",
    "ONBUILD", "MAINTAINER")}}


def adds_layer(history: list[dict[str, Any]], layers: int) -> list[bool]:
    """Which of an image's `docker history` entries (oldest first) add a layer: exactly
    `layers` of them (the OCI rule: one non-empty entry per layer, in order; `docker history`
    gives each such entry its layer's size, in order).

    The engine does not say which entries are empty; it reports each one's Size: the size of
    its layer's files, 0 for an entry that adds no layer, but 0 too for a layer of folders only
    (a runtime base image's `ADD cache.tar /`, a WORKDIR or a `RUN mkdir`), of empty files or
    of deletions. So every entry with a size adds a layer, and the layers left over go to the
    entries of size 0 that can add one: ADD and COPY first, then WORKDIR, then RUN and the
    rest (newest first within each); an instruction that cannot touch the file system (ENV,
    LABEL, USER, ...) only when nothing else is left."""
    def rank(index: int) -> tuple[int, int]:
        h = history[index]
        if (h.get("Size") or 0) > 0:
            return 0, -index
        word = _INSTRUCTION.match(str(h.get("CreatedBy") or ""))
        return _TIERS.get(word.group(1).upper() if word else "", 3), -index

    chosen = set(sorted(range(len(history)), key=rank)[:layers])
    return [i in chosen for i in range(len(history))]


def _iso(value: Any) -> str:
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def layer_of(ctx: Context, layer: Layer, uname: bytes) -> LayerTar:
    """A layout layer from the members of the context's tar for it."""
    entry = next(e for e in ctx.entries if e.name == layer.source)
    return of_members(layer, list(entry.members or ()), uname)


def of_members(layer: Layer, members: list[layer_tar.Member], uname: bytes) -> LayerTar:
    """A layer of these members (what ADD of a tar holding them commits)."""
    members = layer_tar.walk_order(members)
    layer_tar.check(members)
    return LayerTar(layer.name, members, layer_tar.digest(members, uname), layer_tar.size_of(members),
                    layer.instruction, uname)


def derive_config(parent: dict[str, Any], labels: dict[str, str], image: ImageConfig | None = None,
                  ports: tuple[int, ...] = ()) -> dict[str, Any]:
    """The one way an image's config is made: its parent's, with what the Dockerfile sets on
    top (a runtime base image's ENV, USER, WORKDIR, HEALTHCHECK, ENTRYPOINT and CMD; a model
    image's EXPOSE), and the labels added. As Docker's builders and buildah do: a PATH when the
    parent's config has none (appended; podman and containerd add no default), and ENV replaces
    a variable where it stands, else appends it."""
    config = dict(parent.get("Config") or {})
    config.pop("Image", None)
    env = list(config.get("Env") or [])
    if not any(item.split("=", 1)[0] == "PATH" for item in env):
        config["Env"] = env = [*env, f"PATH={DEFAULT_PATH}"]
    if image is not None:
        for key, value in image.env:
            at = next((i for i, item in enumerate(env) if item.split("=", 1)[0] == key), len(env))
            env[at:at + 1] = [f"{key}={value}"]
        config["Env"] = env
        config["User"] = image.user
        if image.workdir:
            config["WorkingDir"] = image.workdir
        config["Healthcheck"] = {
            "Test": ["CMD", *image.healthcheck], "Interval": image.health_interval * NS,
            "Timeout": image.health_timeout * NS, "StartPeriod": image.health_start * NS,
            "Retries": image.health_retries,
        }
        config["Entrypoint"] = list(image.entrypoint)
        config["Cmd"] = list(image.cmd)
    if ports:
        config["ExposedPorts"] = {**(config.get("ExposedPorts") or {}), **{f"{p}/tcp": {} for p in ports}}
    config["Labels"] = {**(config.get("Labels") or {}), **labels}
    return config


# ---------------------------------------------------------------------------------------------
# the archive `docker load` reads


def loadable(image: Image) -> Loadable:
    """What the archive holds of an image (image/archive.py)."""
    return Loadable(image.tag, image.config_json(), list(image.parent["RootFS"]["Layers"]), image.layers,
                    len(image.history))


def load(client: Engine, images: list[Loadable]) -> str:
    """Load the images; the id of the last one. Tags move only when the engine took it all."""
    try:
        out = client.api.load_image(chunks(images), quiet=True)
        text = ""
        for event in out if not isinstance(out, (bytes, str)) else [out]:
            if isinstance(event, dict):
                if event.get("error") or event.get("errorDetail"):
                    message = (event.get("errorDetail") or {}).get("message") or event.get("error")
                    raise DockerError(f"the engine refused the assembled image: {message}")
                text += event.get("stream", "")
            else:
                text += event.decode() if isinstance(event, bytes) else str(event)
    except PackError:  # DockerError too, and a file of the image that changed while it was read
        raise
    except Exception as e:
        first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        if isinstance(e, ConnectionError):  # the engine went away mid-load (EngineGone, a broken pipe)
            raise DockerError(f"lost the Docker engine while loading the assembled image ({first}); no tag moved: "
                              "check that the engine runs, then build again") from None
        if isinstance(e, OSError):  # this host's files
            raise PackError(f"cannot read the assembled image's files: {e.strerror or first}") from None
        raise DockerError(f"the engine refused the assembled image: {first}") from None
    last = images[-1]
    if last.tag:
        return client.images.get(last.tag).id
    ids = re.findall(r"Loaded image ID: (sha256:[0-9a-f]{64})", text)
    if not ids:
        raise DockerError("the engine loaded the assembled image but did not say its id")
    return ids[-1]


# ---------------------------------------------------------------------------------------------
# does this engine write layer tars as `layers` does?

_PROBE_DOCKERFILE = b"FROM scratch\nADD probe.tar /\nADD owned.tar /\n"
_PROBE_OWNED = [layer_tar.Member("opt", 0o755, MTIME), layer_tar.Member("opt/gpux", 0o755, MTIME),
                layer_tar.Member("opt/gpux/cache", 0o755, MTIME, uid=UID, gid=UID)]
_PROBE = Layer("probe", "/")


def probe_context() -> Context:
    """Folders, an executable, a name long enough for the prefix split, names that sort
    differently by path and by component ("a-b" and "a/b")."""
    long_name = "opt/gpux/" + "d" * 60 + "/" + "f" * 90 + ".py"
    probe = [layer_tar.Member("opt/gpux/a.so", 0o755, MTIME, data=b"\x7fELF" + b"x" * 700),
             layer_tar.Member("opt/gpux/a/b.py", 0o644, MTIME, data=b""),
             layer_tar.Member("opt/gpux/a-b.py", 0o644, MTIME, data=b"x = 1\n"),
             layer_tar.Member(long_name, 0o644, MTIME, data=b"print('gpux')\n")]
    return Context((Entry("Dockerfile", data=_PROBE_DOCKERFILE), Entry("owned.tar", members=tuple(_PROBE_OWNED)),
                    layer(_PROBE, probe)))


def engine_uname(client: Engine) -> bytes | None:
    """The owner name this engine writes in layer tars, when it writes them as `layers` does;
    None when it does not (then the builder builds). Found by building one tiny image with the
    engine's builder and comparing its layer's diff id with ours for the same files (a long
    name included, for the prefix split): "root" up to Docker 20.10, "" later. Cached per
    engine version."""
    if os.environ.get("GPUX_PACK_ASSEMBLE") == "0":  # the builder, always (a check, or an odd engine)
        return None
    try:
        info = client.version()
        key = re.sub(r"[^A-Za-z0-9._-]", "_", f"{info.get('Version')}-{info.get('GitCommit')}")
    except Exception:
        return None
    if any("podman" in str(c.get("Name", "")).lower() for c in info.get("Components") or []):
        return None  # podman's `docker load` needs every layer in the archive, its parent's too: it builds
    cached = cache_dir() / "engines" / f"{key}-3.json"  # -3: the probe ADDs tars, as the layers do
    found = _recorded(cached)
    if found is not _UNKNOWN:
        return found
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with staging.locked(cached):  # a second build waits for the first's probe, then reuses it
            found = _recorded(cached)
            if found is _UNKNOWN:
                found = _probe(client, cached)
            return found
    except OSError:
        return _probe(client, cached)


_UNKNOWN = object()


def _recorded(cached: Path) -> Any:
    """The engine's recorded answer, or _UNKNOWN when there is none (or it cannot be read)."""
    try:
        uname = json.loads(cached.read_text()).get("uname")
        return None if uname is None else uname.encode()
    except (OSError, ValueError, AttributeError):
        return _UNKNOWN


def _probe(client: Engine, cached: Path) -> bytes | None:
    """Build the probe image and compare its layers with ours; the answer is recorded in cached
    (written whole under a temporary name) unless the engine's build failed."""
    ctx = probe_context()
    image_id = None
    try:
        with temporary_tar(ctx) as fileobj:
            for event in client.api.build(fileobj=fileobj, custom_context=True, rm=True, forcerm=True, decode=True,
                                          labels={"io.gpux.pack.role": "engine-check"}):
                if "aux" in event and isinstance(event["aux"], dict):
                    image_id = event["aux"].get("ID", image_id)
                m = re.match(r"Successfully built ([0-9a-f]+)", (event.get("stream") or "").strip())
                if m:
                    image_id = image_id or m.group(1)
                if "error" in event:
                    return None
        if image_id is None:
            return None
        diff_ids = client.images.get(image_id).attrs["RootFS"]["Layers"][-2:]
    except Exception:
        return None
    finally:
        if image_id is not None:
            try:
                client.images.remove(image_id, force=True)
            except Exception:
                pass
    found = None
    for uname in ("root", ""):
        try:
            ours = [layer_of(ctx, _PROBE, uname.encode()).diff_id,
                    of_members(_PROBE, list(_PROBE_OWNED), uname.encode()).diff_id]
            if ours == diff_ids:
                found = uname
                break
        except layer_tar.Unsupported:
            break
    try:
        staging.write_text(cached, json.dumps({"uname": found, "checked": time.time()}))
    except OSError:
        pass
    return None if found is None else found.encode()
