"""A model-only rebuild: when the same `gpux-pack build` runs again and nothing but the model's
weights changed, the last build's image is replayed with the new model instead of loading
the config, the model's graph, the plan, the lock and the Dockerfile again.

After an assembled build of one image (no --refresh, --no-cache, baked warmup, several
platforms, --sign-model or --sbom), `record` writes what was loaded (image/archive.py's
Loadable: config, layers, parent) keyed by the command as the CLI parsed it (Request), the
working folder, gpux-pack's version and the environment variables a build reads. The `build`
command asks `replay` first: it answers the next identical command when every input but the model is as recorded (the project folder's other files, the
wheel lock, the base and runtime base images' ids) and the new model differs from the recorded
one only in the values of its initializers: the same graph, names, types, shapes and byte
lengths, so every check the full build makes on a model gives the same verdict. The image is
then the recorded one with the model layer rewritten, the model's digest put in gpux.json and
the labels (its size is the recorded one, or the replay is no replay), and a new creation time:
byte for byte what the full build makes (a test compares the two). Its SBOM and provenance are
the last build's with the model's digest, the image id and the times put in
(image/attestation_store.py): again what the full build records. --json, --push and --sign-key
are replayed as the full build does them: the summary printed again; the image pushed (only the
model's layer is new to the registry) with its SBOM and provenance attached, and signed.
Anything else, or anything unexpected, returns False and the full build runs.
GPUX_PACK_REBUILD=0 turns it off.

It imports only the standard library and a few small modules (the protobuf wire walk is the
model skeleton's; pushing imports what a push needs), and talks to the engine over its unix
socket itself: the whole rebuild is mostly the engine's `docker load`.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpux_pack import __version__, staging
from gpux_pack.engine import unix_socket
from gpux_pack.image import attestation_store, layer_tar
from gpux_pack.image.archive import LayerTar, Loadable, chunks, config_bytes
from gpux_pack.project.skeleton import FileBytes, WireError, fields
from gpux_pack.runtime.contract import open_regular  # not through a link: the recorded path is resolved, so a link there is new
from gpux_pack.timestamps import created_now
from gpux_pack.ui import built_line

FORMAT = 5  # 5: keyed by the parsed command (Request), not the words typed
ENV_PREFIXES = ("GPUX", "DOCKER", "PIP_", "UV_", "SOURCE_DATE_EPOCH", "HOME", "XDG_CACHE_HOME", "SSL_CERT",
                "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
MAX_PROJECT_FILES = 2000


class Miss(Exception):
    """The fast path does not apply: the full build runs."""


@dataclass(frozen=True)
class Request:
    """A `build` command as the CLI parsed it: what a replay is keyed by and does again."""

    path: str
    provider: str | None = None
    tag: str | None = None
    base_image: tuple[str, ...] = ()
    platform: str | None = None
    warmup: str | None = None
    no_cache: bool = False
    quiet: bool = False
    json_out: bool = False
    refresh: bool = False
    push: bool = False
    sbom: str | None = None
    sign_key: str | None = None
    sign_model: str | None = None
    contained: bool = False
    strict: bool = False
    optimize: str | None = None

    @property
    def replayable(self) -> bool:
        """What the replay does not do as the full build does: re-resolve or rebuild without the
        cache, a baked warmup or a chosen platform, the model signature (it signs gpux.json too,
        which names the model's digest), an SBOM folder, an optimisation (made and checked anew)."""
        return not (self.refresh or self.no_cache or self.platform or self.warmup or self.sign_model or self.sbom
                    or self.optimize)


# ---------------------------------------------------------------------------------------------
# the key and the inputs it does not cover


def _record_path(request: Request) -> Path:
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) and k != "GPUX_PACK_REBUILD")
    key = json.dumps([FORMAT, __version__, os.getcwd(), dataclasses.astuple(request), env])
    return staging.cache_dir() / "rebuild" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


HASHED = 64 << 20  # project files up to this size are compared by content when their time changes


def _fingerprint(folder: Path, skip: set[str]) -> list[list[Any]]:
    """Every file under the project folder but the model: name, size, modification time."""
    found: list[list[Any]] = []
    stack = [folder]
    while stack:
        current = stack.pop()
        with os.scandir(current) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                    continue
                if entry.path in skip:
                    continue
                st = entry.stat(follow_symlinks=True) if entry.is_file() else entry.stat(follow_symlinks=False)
                found.append([os.path.relpath(entry.path, folder), st.st_size, st.st_mtime_ns])
                if len(found) > MAX_PROJECT_FILES:
                    raise Miss("the project folder has too many files to fingerprint")
    return sorted(found)


def _with_digests(folder: Path, files: list[list[Any]]) -> list[list[Any]]:
    """The fingerprint with each file's sha256 (None past HASHED: those must keep their time)."""
    return [[name, size, mtime, _file_sha256(folder / name, size) if size <= HASHED else None]
            for name, size, mtime in files]


def _unchanged(folder: Path, recorded: list[list[Any]], now: list[list[Any]]) -> bool:
    """The project's other files as recorded: the same names and sizes, and each the same time
    or, when a checkout or a sync tool wrote it again, the same bytes (hashed only then)."""
    if [r[:2] for r in recorded] != [n[:2] for n in now]:
        return False
    for (name, size, mtime, digest), (_, _, mtime_now) in zip(recorded, now):
        if mtime_now != mtime and (digest is None or _file_sha256(folder / name, size) != digest):
            return False
    return True


def _file_sha256(path: Path, size: int) -> str | None:
    try:
        return _sha256(path, size)
    except (Miss, OSError):
        return None


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


# ---------------------------------------------------------------------------------------------
# the model: everything but its initializers' values


_TENSOR_VALUES = {4, 5, 6, 7, 9, 10, 11}  # TensorProto: float/int32/string/int64/raw/double/uint64 data
_TENSOR_EXTERNAL = {13, 14}  # external_data, data_location
_GRAPH, _INITIALIZER = 7, 5  # ModelProto.graph, GraphProto.initializer


def structure(path: Path) -> str:
    """A digest of the model file with its initializers' values left out (their lengths kept):
    equal for two files that differ only in trained weights. Miss for external data."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise Miss("the model is empty")
        try:  # read, not mapped: a model cut short meanwhile is a WireError, not a SIGBUS
            _digest_message(FileBytes(f.fileno(), size), 0, size, h, 0)
        except WireError as e:
            raise Miss(f"the model is not a well-formed protobuf ({e})") from None
    return h.hexdigest()


def _digest_message(buf: Any, start: int, end: int, h: Any, depth: int) -> None:
    """depth 0: a ModelProto, 1: its GraphProto, 2: an initializer (TensorProto)."""
    for number, wire, tag_start, value_start, value_end in fields(buf, start, end):
        h.update(buf[tag_start:value_start])
        if depth == 0 and number == _GRAPH and wire == 2:
            _digest_message(buf, value_start, value_end, h, 1)
        elif depth == 1 and number == _INITIALIZER and wire == 2:
            _digest_message(buf, value_start, value_end, h, 2)
            h.update(b"\x00")
        elif depth == 2 and number in _TENSOR_EXTERNAL:
            raise Miss("the model keeps weights in external data")
        elif depth == 2 and number in _TENSOR_VALUES:
            h.update((value_end - value_start).to_bytes(8, "little"))
        else:
            h.update(buf[value_start:value_end])


def _sha256(path: Path, size: int) -> str:
    """The model's digest, if it has the recorded size (new weights keep every length): at most
    that many bytes are read, whatever the file does meanwhile."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        if os.fstat(f.fileno()).st_size != size:
            raise Miss("the model's size changed")
        left = size
        while left and (chunk := f.read(min(1 << 20, left))):
            h.update(chunk)
            left -= len(chunk)
    if left:
        raise Miss("the model shrank while it was read")
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# the engine, over its socket


def _call(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        return unix_socket.call(method, url, body, headers)
    except unix_socket.Unreachable as e:
        raise Miss(str(e)) from None


def _image_id(ref: str) -> str | None:
    try:
        return unix_socket.image_id(ref)
    except unix_socket.Unreachable as e:
        raise Miss(str(e)) from None


# ---------------------------------------------------------------------------------------------
# record and replay


def record(request: Request, project_dir: Path, model_path: Path, model_sha256: str, model_size: int,
           provider: str, images: dict[str, str], lock: Path, loaded: Loadable,
           variables: tuple[tuple[str, str | None], ...] = (), summary: dict[str, Any] | None = None) -> None:
    """After a build: what the next identical command needs to replay it. images: the base and
    runtime base references -> their ids now; variables: the ${VAR}s gpux.yml used, and their values;
    summary: the image's row of `build --json`, which a replay of a --json build prints anew. Nothing is written when the build is not one
    this can replay; a failure to write is not the build's failure."""
    path = _record_path(request)
    try:
        if not request.replayable or os.environ.get("GPUX_PACK_REBUILD") == "0":
            raise Miss("not a command a rebuild replays")
        if request.json_out and not summary:
            raise Miss("no summary to print again")
        model = str(model_path.resolve())
        layers = []
        for lay in loaded.layers:
            members = []
            for m in lay.members:
                item: dict[str, Any] = {"name": m.name, "mode": m.mode, "mtime": m.mtime, "uid": m.uid, "gid": m.gid}
                if m.source is not None:
                    if str(Path(m.source).resolve()) != model:
                        raise Miss("a layer copies a file other than the model")
                    item["model"] = True
                    if m.ranges is not None:  # its weights, moved to a data file: where they lie in the model
                        item["ranges"] = [list(r) for r in m.ranges]
                elif m.data is not None:
                    item["data"] = base64.b64encode(m.data).decode()
                members.append(item)
            layers.append({"name": lay.name, "created_by": lay.created_by, "uname": lay.uname.decode(),
                           "members": members})
        doc = {
            "format": FORMAT, "version": __version__, "tag": loaded.tag, "provider": provider,
            "project": str(project_dir.resolve()),
            "files": _with_digests(project_dir.resolve(), _fingerprint(project_dir.resolve(), {model})),
            "model": {"path": model, "sha256": model_sha256, "size": model_size, "structure": structure(model_path)},
            "images": images, "lock": [str(lock), _stat(str(lock))], "variables": [list(v) for v in variables],
            "summary": summary,
            "image_id": f"sha256:{hashlib.sha256(loaded.config).hexdigest()}",
            "config": loaded.config.decode(), "parent_diff_ids": loaded.parent_diff_ids,
            "own_history": loaded.own_history, "layers": layers,
        }
        staging.write_text(path, json.dumps(doc))
    except (Miss, OSError, ValueError):
        try:
            path.unlink()
        except OSError:
            pass


def replay(request: Request) -> bool:
    """Rebuild from the record when only the model's weights changed; False: build it all."""
    if os.environ.get("GPUX_PACK_REBUILD") == "0" or not request.replayable:
        return False
    started = time.perf_counter()
    path = _record_path(request)
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != FORMAT or doc.get("version") != __version__:
            raise Miss("recorded by another gpux-pack")
        line = _replay(doc, path, started, request)
    except (Miss, OSError, ValueError, KeyError, TypeError, IndexError, layer_tar.Unsupported):
        return False
    print(line)
    return True


def _replay(doc: dict[str, Any], path: Path, started: float, request: Request) -> str:
    json_out, quiet = request.json_out, request.quiet
    model = Path(doc["model"]["path"])
    if not _unchanged(Path(doc["project"]), doc["files"], _fingerprint(Path(doc["project"]), {str(model)})):
        raise Miss("a project file changed")
    if _stat(doc["lock"][0]) != doc["lock"][1]:
        raise Miss("the wheel lock changed")
    if [[name, os.environ.get(name)] for name, _ in doc["variables"]] != doc["variables"]:
        raise Miss("a variable gpux.yml uses changed")
    old_sha = doc["model"]["sha256"]
    sha = _sha256(model, doc["model"]["size"])  # the same structure is the same size: gpux.json's size_bytes stays
    if sha == old_sha or structure(model) != doc["model"]["structure"]:
        raise Miss("the model did not change, or not only in its weights")
    for ref, recorded in doc["images"].items():
        if _image_id(ref) != recorded:
            raise Miss(f"{ref} changed")
    old_id = doc["image_id"]
    if attestation_store.recorded(old_id) is None:  # the new image's SBOM and provenance are made from these
        raise Miss("the last build's SBOM and provenance are not recorded")
    if not quiet:
        print("only the model's weights changed: rebuilding from the last build "
              "(GPUX_PACK_REBUILD=0 builds it all)", file=sys.stderr)
    layers = []
    for lay in doc["layers"]:
        members = []
        for m in lay["members"]:
            data = None
            if "data" in m:
                data = base64.b64decode(m["data"])
                data = data.replace(old_sha.encode(), sha.encode())
                m["data"] = base64.b64encode(data).decode()
            ranges = tuple(tuple(r) for r in m["ranges"]) if "ranges" in m else None  # the same structure: the same places
            members.append(layer_tar.Member(m["name"], m["mode"], m["mtime"], source=model if m.get("model") else None,
                                            data=data, uid=m["uid"], gid=m["gid"], ranges=ranges))
        uname = lay["uname"].encode()
        layer_tar.check(members)
        layers.append(LayerTar(lay["name"], members, layer_tar.digest(members, uname), layer_tar.size_of(members),
                               lay["created_by"], uname))
    config = json.loads(doc["config"].replace(old_sha, sha))
    created = created_now()
    config["created"] = created
    config["config"]["Labels"]["org.opencontainers.image.created"] = created
    for entry in config["history"][-doc["own_history"]:]:
        entry["created"] = created
    config["rootfs"]["diff_ids"] = [*doc["parent_diff_ids"], *(lay.diff_id for lay in layers)]
    loaded_config = config_bytes(config)
    status, body = _call("POST", "/images/load?quiet=1", chunks([Loadable(doc["tag"], loaded_config,
                         doc["parent_diff_ids"], layers)]), {"Content-Type": "application/x-tar"})
    if status != 200 or b'"error' in body:
        raise Miss("the engine refused the image")
    status, body = _call("GET", f"/images/{hashlib.sha256(loaded_config).hexdigest()}/json")
    if status != 200:
        raise Miss("the engine did not keep the image")
    image = json.loads(body)
    sbom = attestation_store.with_new_model(old_id, image["Id"], old_sha, sha, created, created, created_now())
    if sbom is None:
        raise Miss("the last build's SBOM and provenance are gone")
    doc["model"]["sha256"] = sha
    doc["config"] = loaded_config.decode()
    doc["image_id"] = image["Id"]
    staging.write_text(path, json.dumps(doc))
    pushed = _push(doc["tag"], image["Id"], request.sign_key, quiet) if request.push else None  # only the model's layer goes up
    seconds = time.perf_counter() - started
    digest = pushed[0] if pushed else None
    if json_out:  # build --json: the summary CI pipelines read, as the full build prints it
        row = {**doc["summary"], "id": image["Id"], "size_bytes": image.get("Size", 0), "seconds": round(seconds, 2),
               "runtime_base_built": False, "steps": 0, "cached_steps": 0, "digest": digest, "sbom": str(sbom),
               "attestations": pushed[1] if pushed else None}
        return json.dumps({"images": [row], "indexes": [], "failed": [], "seconds": round(seconds, 2)}, indent=2)
    line = built_line(doc["tag"], image["Id"], image.get("Size", 0), doc["provider"], seconds, "assembled, nothing ran")
    return line + (f"\npushed {digest}" + (" (with its SBOM and provenance)" if pushed[1] else "") if pushed else "")


def _push(tag: str, image_id: str, key_path: str | None, quiet: bool) -> tuple[str, dict[str, str] | None]:
    """Push the replayed image as build --push does (the Docker SDK, the user's credentials), its
    SBOM and provenance attached, signed with --sign-key's key: its digest and the attached
    documents. A refusal falls back to the full build, which says why in one line."""
    from gpux_pack import engine
    from gpux_pack.errors import PackError
    from gpux_pack.pipeline import attest
    from gpux_pack.registry import signatures
    from gpux_pack.registry.push import push
    from gpux_pack.ui import Reporter

    ui = Reporter(quiet=quiet)
    try:
        key = signatures.load_private_key(Path(key_path)) if key_path else None
        client = engine.connect()
        pushed = push(client, tag, ui)
        attached = attest.attach(client, pushed, image_id, ui)
        if key is not None:
            ui.info(f"signing {pushed.digest}")
            signatures.sign(client, *pushed.digest.split("@", 1), key)
    except PackError as e:
        raise Miss(f"the push failed: {e}") from None
    return pushed.digest, {"sbom": attached.sbom, "provenance": attached.provenance} if attached else None

