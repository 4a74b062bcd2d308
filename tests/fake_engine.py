"""An in-memory Docker engine for unit tests: what gpux_pack.engine.interface.Engine describes,
so the pipeline's decisions (pull or not, what to remove, what to load) are tested without
Docker.

It keeps images and containers as the engine would after each call, and refuses what the
engine refuses, with the errors the real client raises: gpux-pack's (engine/interface.py's
ImageNotFound, EngineError) from images, inspect, history and load; the Docker SDK's
(ImageNotFound, NotFound, APIError) from containers, pulls and pushes, which the client hands to
the SDK as they are; or the error events the engine streams. `calls` is every call made on it, with the arguments as sent; what
it was handed whole is kept too: each archive `load_image` read (`loaded`), each build context
(`builds`). Setting it up (add_image, publish, add_container) records nothing.

What it does not model raises NotImplementedError (a filter it does not know, a call without
the arguments gpux-pack always passes), so a test never passes on something it ignored.
"""

from __future__ import annotations

import builtins
import copy
import fnmatch
import hashlib
import io
import itertools
import json
import shlex
import tarfile
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator

import docker.errors

from gpux_pack.engine.interface import EngineError, ImageNotFound

NEVER = "0001-01-01T00:00:00Z"  # the engine's "no time" (a loaded image's LastTagTime)
_serial = itertools.count(1)


def normal(ref: str) -> str:
    """How the engine names an image: x -> x:latest, docker.io/library/x:1 -> x:1."""
    for prefix in ("docker.io/library/", "docker.io/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix):]
    if "@" not in ref and ":" not in ref.rsplit("/", 1)[-1]:
        ref += ":latest"
    return ref


def now() -> str:
    """A time as the engine writes it (RFC 3339, nanoseconds, Z)."""
    return stamp(datetime.now(timezone.utc))


def stamp(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _not_found(name: str) -> ImageNotFound:
    why = f"No such image: {name}"
    return ImageNotFound(f"404 Client Error for http+docker://localhost/v1.41/images/{name}/json: Not Found "
                         f"(\"{why}\")", 404, why)


def _conflict(image: str, why: str) -> EngineError:
    return EngineError(f"409 Client Error for http+docker://localhost/v1.41/images/{image}: Conflict (\"{why}\")",
                       409, why)


def _sdk_not_found(name: str) -> docker.errors.ImageNotFound:
    """What the SDK's containers.create and run raise for an image the engine lacks."""
    return docker.errors.ImageNotFound(f"404 Client Error: Not Found (\"No such image: {name}\")")


def _sdk_conflict(why: str) -> docker.errors.APIError:
    return docker.errors.APIError(f"409 Client Error: Conflict (\"{why}\")")


def _error(message: str) -> dict[str, Any]:
    """An error event, as the engine streams it once its answer has begun."""
    return {"errorDetail": {"message": message}, "error": message}


@dataclass
class Loaded:
    """One image of an archive `load_image` took: what the manifest named and what was sent."""

    id: str
    tags: list[str]
    config: dict[str, Any]  # the image config as sent
    layers: list[str]  # every layer's path in the manifest
    sent: dict[str, bytes]  # the layers present in the archive (diff id -> the tar's bytes)


class FakeImage:
    """An image as images.get gives it: its attrs as they were then (as the SDK's Image)."""

    def __init__(self, engine: FakeEngine, attrs: dict[str, Any]):
        self._engine = engine
        self.attrs = copy.deepcopy(attrs)

    @property
    def id(self) -> str:
        return self.attrs["Id"]

    @property
    def tags(self) -> list[str]:
        return list(self.attrs.get("RepoTags") or [])

    def tag(self, repository: str, tag: str | None = None) -> bool:
        self._engine.record("image.tag", self.id, repository, tag)
        self._engine.move_tag(f"{repository}:{tag or 'latest'}", self.id)
        return True


class FakeContainer:
    """A container; what it runs is scripted (exit code, output), nothing runs."""

    def __init__(self, engine: FakeEngine, image_id: str, image: str, options: dict[str, Any], created: str):
        self._engine = engine
        self.options = options  # what create/run was given, as given
        self.exit_code = 0
        self.output = (b"", b"")  # (stdout, stderr)
        self.files: dict[str, bytes] = {}  # its file system, for export and get_archive
        self.attrs: dict[str, Any] = {
            "Id": hashlib.sha256(f"container-{next(_serial)}".encode()).hexdigest(),
            "Created": created, "Image": image_id,
            "Config": {"Image": image, "Labels": dict(options.get("labels") or {}), "Cmd": options.get("command")},
            "State": {"Status": "created", "ExitCode": 0}, "NetworkSettings": {"Ports": {}},
        }

    @property
    def id(self) -> str:
        return self.attrs["Id"]

    @property
    def status(self) -> str:
        return self.attrs["State"]["Status"]

    @property
    def labels(self) -> dict[str, str]:
        return self.attrs["Config"]["Labels"]

    def _call(self, name: str, *args: Any, **kwargs: Any) -> None:
        self._engine.record(f"container.{name}", self.id, *args, **kwargs)
        if self.id not in self._engine.containers.by_id:
            raise docker.errors.NotFound(f"404 Client Error: Not Found (\"No such container: {self.id}\")")

    def reload(self) -> None:
        self._call("reload")

    def start(self) -> None:
        self._call("start")
        self.attrs["State"]["Status"] = "running"

    def stop(self, *, timeout: int | None = None) -> None:
        self._call("stop", timeout=timeout)
        self.attrs["State"].update(Status="exited", ExitCode=self.exit_code)

    def remove(self, *, force: bool = False) -> None:
        self._call("remove", force=force)
        if self.status == "running" and not force:
            raise _sdk_conflict(f"cannot remove container {self.id[:12]}: container is running: stop the container "
                            "before removing or force remove")
        del self._engine.containers.by_id[self.id]

    def wait(self, *, timeout: float | None = None) -> dict[str, Any]:
        self._call("wait", timeout=timeout)
        self.attrs["State"].update(Status="exited", ExitCode=self.exit_code)
        return {"StatusCode": self.exit_code, "Error": None}

    def logs(self, *, stdout: bool = True, stderr: bool = True, tail: str | int = "all") -> bytes:
        self._call("logs", stdout=stdout, stderr=stderr, tail=tail)
        lines = ((self.output[0] if stdout else b"") + (self.output[1] if stderr else b"")).splitlines(keepends=True)
        return b"".join(lines if tail == "all" else lines[-int(tail):] if int(tail) else [])

    def export(self, *, chunk_size: int = 2 << 20) -> Iterator[bytes]:
        self._call("export", chunk_size=chunk_size)
        data = _tar(self.files)
        return iter([data[i:i + chunk_size] for i in range(0, len(data), chunk_size)])

    def get_archive(self, path: str) -> tuple[Iterator[bytes], dict[str, Any]]:
        self._call("get_archive", path)
        top = path.strip("/")
        base = top.rsplit("/", 1)[0] + "/" if "/" in top else ""
        found = {name[len(base):]: data for name, data in self.files.items() if name == top or name.startswith(top + "/")}
        if not found:
            raise docker.errors.NotFound(f"404 Client Error: Not Found (\"Could not find the file {path} in container\")")
        return iter([_tar(found)]), {"name": top.rsplit("/", 1)[-1], "size": 0, "mode": 0o20000000755}

    def exec_run(self, cmd: list[str]) -> tuple[int | None, bytes]:
        self._call("exec_run", cmd)
        return self.exit_code, self.output[0]


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class FakeImages:
    def __init__(self, engine: FakeEngine):
        self._engine = engine
        self.by_id: dict[str, dict[str, Any]] = {}  # image id -> `docker image inspect` attrs
        self.histories: dict[str, list[dict[str, Any]]] = {}  # image id -> `docker history`, newest first

    def find(self, name: str) -> dict[str, Any] | None:
        """The attrs of the image a name, an id or an id's prefix names (no call recorded)."""
        for attrs in self.by_id.values():
            hexid = attrs["Id"].split(":", 1)[1]
            if name in (attrs["Id"], hexid) or (len(name) >= 12 and hexid.startswith(name.removeprefix("sha256:"))):
                return attrs
        return next((a for a in self.by_id.values() if normal(name) in (a.get("RepoTags") or [])), None)

    def get(self, name: str) -> FakeImage:
        self._engine.record("images.get", name)
        attrs = self.find(name)
        if attrs is None:
            raise _not_found(name)
        return FakeImage(self._engine, attrs)

    def remove(self, image: str, *, force: bool = False, noprune: bool = False) -> None:
        """As `docker rmi`: a tag of an image with others goes alone; an image by id with several
        tags, or one a container uses, only when forced."""
        self._engine.record("images.remove", image, force=force, noprune=noprune)
        attrs = self.find(image)
        if attrs is None:
            raise _not_found(image)
        tags = attrs.get("RepoTags") or []
        by_tag = normal(image) in tags
        if by_tag and len(tags) > 1:
            tags.remove(normal(image))
            return
        if not by_tag and len(tags) > 1 and not force:
            raise _conflict(image, f"conflict: unable to delete {attrs['Id'][7:19]} (must be forced) - image is "
                            "referenced in multiple repositories")
        users = [c for c in self._engine.containers.by_id.values() if c.attrs["Image"] == attrs["Id"]]
        if users and not force:
            raise _conflict(image, f"conflict: unable to delete {image} (must be forced) - image is being used by "
                            f"container {users[0].id[:12]}")
        del self.by_id[attrs["Id"]]
        self.histories.pop(attrs["Id"], None)

    def list(self, *, filters: dict[str, Any] | None = None) -> list[FakeImage]:
        self._engine.record("images.list", filters=filters)
        unknown = set(filters or {}) - {"reference"}
        if unknown:
            raise NotImplementedError(f"the fake engine has no image filter {sorted(unknown)}")
        pattern = (filters or {}).get("reference")
        found = []
        for attrs in self.by_id.values():
            names = [n for tag in attrs.get("RepoTags") or [] for n in (tag, tag.rsplit(":", 1)[0])]
            if pattern is None or any(fnmatch.fnmatchcase(n, pattern) for n in names):
                found.append(FakeImage(self._engine, attrs))
        return found


class FakeContainers:
    def __init__(self, engine: FakeEngine):
        self._engine = engine
        self.by_id: dict[str, FakeContainer] = {}

    def list(self, *, all: bool = False, filters: dict[str, Any] | None = None) -> list[FakeContainer]:
        self._engine.record("containers.list", all=all, filters=filters)
        filters = filters or {}
        unknown = set(filters) - {"label", "status", "ancestor"}
        if unknown:
            raise NotImplementedError(f"the fake engine has no container filter {sorted(unknown)}")

        def listed(value: Any) -> list[str]:
            return [value] if isinstance(value, str) else list(value)

        def labelled(container: FakeContainer, wanted: str) -> bool:
            key, eq, value = wanted.partition("=")
            return key in container.labels and (not eq or container.labels[key] == value)

        ancestors = {(self._engine.images.find(a) or {}).get("Id") for a in listed(filters.get("ancestor", []))}
        return [c for c in self.by_id.values()
                if (all or c.status == "running")
                and builtins.all(labelled(c, w) for w in listed(filters.get("label", [])))
                and ("status" not in filters or c.status in listed(filters["status"]))
                and ("ancestor" not in filters or c.attrs["Image"] in ancestors)]

    def create(self, image: str, **kwargs: Any) -> FakeContainer:
        self._engine.record("containers.create", image, **kwargs)
        attrs = self._engine.images.find(image)
        if attrs is None:
            raise _sdk_not_found(image)
        container = self._engine.made(FakeContainer(self._engine, attrs["Id"], image, kwargs, now()))
        return container

    def run(self, image: str, **kwargs: Any) -> FakeContainer:
        self._engine.record("containers.run", image, **kwargs)
        if kwargs.get("detach") is not True:
            raise NotImplementedError("the fake engine runs containers detached only")
        attrs = self._engine.images.find(image)
        if attrs is None:
            raise _sdk_not_found(image)
        container = self._engine.made(FakeContainer(self._engine, attrs["Id"], image, kwargs, now()))
        container.attrs["State"]["Status"] = "running"
        return container



class FakeApi:
    base_url = "http+docker://localhost"  # a local engine's
    credstore_env = None

    def __init__(self, engine: FakeEngine):
        self._engine = engine

    def inspect_image(self, image: str) -> dict[str, Any]:
        self._engine.record("api.inspect_image", image)
        attrs = self._engine.images.find(image)
        if attrs is None:
            raise _not_found(image)
        return copy.deepcopy(attrs)

    def history(self, image: str) -> list[dict[str, Any]]:
        self._engine.record("api.history", image)
        attrs = self._engine.images.find(image)
        if attrs is None:
            raise _not_found(image)
        return copy.deepcopy(self._engine.images.histories.get(attrs["Id"], []))

    def containers(self, *, all: bool = False) -> list[dict[str, Any]]:
        self._engine.record("api.containers", all=all)
        return [{"Id": c.id, "Image": c.attrs["Config"]["Image"], "ImageID": c.attrs["Image"], "Labels": c.labels,
                 "State": c.status} for c in self._engine.containers.by_id.values() if all or c.status == "running"]

    def pull(self, repository: str, *, tag: str | None = None, stream: bool = False, decode: bool = False,
             platform: str | None = None) -> Any:
        """From `registry` (publish): a name it lacks, or lacks for the platform, is the engine's 404
        at once; a published error comes as an error event. The image is stored when the stream
        is read to its end, as the engine stores it when the pull is done."""
        self._engine.record("api.pull", repository, tag=tag, stream=stream, decode=decode, platform=platform)
        if stream and not decode:
            raise NotImplementedError("the fake engine streams decoded events only")
        ref = normal(f"{repository}:{tag or 'latest'}")
        variants = self._engine.registry.get(ref, [])
        if not variants:
            raise docker.errors.NotFound("404 Client Error: Not Found", explanation=(
                f"pull access denied for {repository}, repository does not exist or may require 'docker login'"))
        chosen = variants[0] if platform is None else next(
            (v for v in variants if isinstance(v, dict) and _platform(v) == "/".join(platform.split("/")[:2])), None)
        if chosen is None:
            raise docker.errors.NotFound("404 Client Error: Not Found",
                                         explanation=f"no matching manifest for {platform} in the manifest list entries")

        def events() -> Iterator[dict[str, Any]]:
            yield {"status": f"Pulling from {repository}", "id": tag or "latest"}
            if isinstance(chosen, str):  # published as an error: the registry failed mid-pull
                yield _error(chosen)
                return
            for layer in chosen["RootFS"]["Layers"]:
                yield {"status": "Pulling fs layer", "progressDetail": {}, "id": layer[7:19]}
                yield {"status": "Pull complete", "progressDetail": {}, "id": layer[7:19]}
            self._engine.store(ref, copy.deepcopy(chosen), [{"Created": 0, "CreatedBy": "ADD rootfs /",
                                                            "Size": 1, "Comment": ""}] * len(chosen["RootFS"]["Layers"]))
            yield {"status": f"Status: Downloaded newer image for {ref}"}

        if stream:
            return events()
        said = list(events())
        for event in said:
            if "error" in event:
                raise docker.errors.APIError("500 Server Error", explanation=event["error"])
        return "\n".join(json.dumps(e) for e in said)

    def push(self, repository: str, *, tag: str | None = None, stream: bool = False,
             decode: bool = False) -> Iterator[dict[str, Any]]:
        self._engine.record("api.push", repository, tag=tag, stream=stream, decode=decode)
        if not (stream and decode):
            raise NotImplementedError("the fake engine pushes with stream and decode only")
        ref = normal(f"{repository}:{tag or 'latest'}")
        attrs = self._engine.images.find(ref)
        if attrs is None:
            return iter([{"status": f"The push refers to repository [{repository}]"},
                         _error(f"An image does not exist locally with the tag: {repository}")])
        digest = _sha256(json.dumps(attrs["Config"], sort_keys=True).encode() + attrs["Id"].encode())
        attrs.setdefault("RepoDigests", []).append(f"{repository}@{digest}")
        self._engine.registry[ref] = [copy.deepcopy(attrs)]
        return iter([{"status": f"The push refers to repository [{repository}]"},
                     *({"status": "Pushed", "progressDetail": {}, "id": d[7:19]} for d in attrs["RootFS"]["Layers"]),
                     {"status": f"{tag}: digest: {digest} size: 1234"},
                     {"progressDetail": {}, "aux": {"Tag": tag, "Digest": digest, "Size": 1234}}])

    def load_image(self, data: Iterable[bytes], *, quiet: bool | None = None) -> Iterator[dict[str, Any]]:
        """`docker load`: the archive is read whole first (the SDK sends it before the answer
        begins). A layer in the archive must have the diff id its config says (the sha256 of its
        bytes); one named but absent must be one the engine holds, with the layers below it."""
        self._engine.record("api.load_image", data, quiet=quiet)
        archive = b"".join(data)
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        if "manifest.json" not in files:
            return iter([_error("open /var/lib/docker/tmp/docker-import/manifest.json: no such file or directory")])
        held = [a["RootFS"]["Layers"] for a in self._engine.images.by_id.values()]
        events = []
        for entry in json.loads(files["manifest.json"]):
            config_bytes = files[entry["Config"]]
            config = json.loads(config_bytes)
            diff_ids = config["rootfs"]["diff_ids"]
            if len(diff_ids) != len(entry["Layers"]):
                return iter([*events, _error("invalid manifest, layers length mismatch")])
            sent = {}
            for i, (path, diff_id) in enumerate(zip(entry["Layers"], diff_ids)):
                if path in files:
                    if _sha256(files[path]) != diff_id:
                        return iter([*events, _error(f"invalid diffID for layer {i}: expected {diff_id}, "
                                                     f"got {_sha256(files[path])}")])
                    sent[diff_id] = files[path]
                elif not any(layers[:i + 1] == diff_ids[:i + 1] for layers in held):
                    return iter([*events, _error(f"open /var/lib/docker/tmp/docker-import/{path}: "
                                                 "no such file or directory")])
            image_id = _sha256(config_bytes)
            tags = [normal(t) for t in entry.get("RepoTags") or []]
            parent_size = max((a.get("Size", 0) for a in self._engine.images.by_id.values()
                               if a["RootFS"]["Layers"] and diff_ids[:len(a["RootFS"]["Layers"])] == a["RootFS"]["Layers"]),
                              default=0)
            attrs = {"Id": image_id, "RepoTags": [], "RepoDigests": [], "Created": config.get("created", NEVER),
                     "Config": config.get("config") or {}, "Os": config.get("os", "linux"),
                     "Architecture": config.get("architecture", "amd64"),
                     "RootFS": {"Type": "layers", "Layers": diff_ids},
                     "Size": parent_size + sum(len(b) for b in sent.values()), "Metadata": {"LastTagTime": NEVER}}
            history = [{"Created": h.get("created", 0), "CreatedBy": h.get("created_by", ""),
                        "Size": 0 if h.get("empty_layer") else 1, "Comment": h.get("comment", "")}
                       for h in reversed(config.get("history") or [])]
            self._engine.store(tags[0] if tags else None, attrs, history)
            for extra in tags[1:]:
                self._engine.move_tag(extra, image_id)
            self._engine.loaded.append(Loaded(image_id, tags, config, list(entry["Layers"]), sent))
            events += [{"stream": f"Loaded image: {t}\n"} for t in tags] or [{"stream": f"Loaded image ID: {image_id}\n"}]
        return iter(events)

    def build(self, *, fileobj: Any, custom_context: bool = False, encoding: str | None = None,
              tag: str | None = None, rm: bool = False, forcerm: bool = False, pull: bool = False,
              nocache: bool = False, decode: bool = False, platform: str | None = None,
              labels: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
        """The classic builder's event stream for the context's Dockerfile; nothing runs. A step
        scripted to fail (fail_step: (step, output lines, exit code)) fails as RUN does."""
        sent = dict(fileobj=fileobj, custom_context=custom_context, encoding=encoding, tag=tag, rm=rm,
                    forcerm=forcerm, pull=pull, nocache=nocache, decode=decode, platform=platform, labels=labels)
        self._engine.record("api.build", **sent)
        if not (custom_context and decode):
            raise NotImplementedError("the fake engine builds a custom context with decoded events only")
        context = fileobj.read() if hasattr(fileobj, "read") else b"".join(fileobj)
        self._engine.builds.append({**sent, "fileobj": context})
        with tarfile.open(fileobj=io.BytesIO(context), mode="r:") as tar:
            dockerfile = tar.extractfile("Dockerfile").read().decode()
        steps = [" ".join(line.split()) for line in dockerfile.replace("\\\n", " ").splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        return self._built(steps, context, tag, labels)

    def _built(self, steps: list[str], context: bytes, tag: str | None,
               labels: dict[str, str] | None) -> Iterator[dict[str, Any]]:
        parent: dict[str, Any] = {"Config": {}, "RootFS": {"Layers": []}, "Os": "linux", "Architecture": "amd64"}
        config_labels: dict[str, str] = {}
        layers: list[str] = []
        for number, step in enumerate(steps, 1):
            yield {"stream": f"Step {number}/{len(steps)} : {step}"}
            yield {"stream": "\n"}
            word, _, rest = step.partition(" ")
            if word.upper() == "FROM" and rest.strip() != "scratch":
                found = self._engine.images.find(rest.strip())
                if found is None:
                    yield _error(f"pull access denied for {rest.strip()}, repository does not exist or may require "
                                 "'docker login'")
                    return
                parent = found
            elif word.upper() == "LABEL":
                config_labels.update(item.split("=", 1) for item in shlex.split(rest) if "=" in item)
            elif word.upper() in ("ADD", "COPY", "RUN"):
                layers.append(_sha256(f"{step}\0{len(layers)}".encode() + context))
            if self._engine.fail_step and self._engine.fail_step[0] == number:
                _, output, code = self._engine.fail_step
                for line in output:
                    yield {"stream": line + "\n"}
                yield _error(f"The command '/bin/sh -c {rest}' returned a non-zero code: {code}")
                return
            yield {"stream": f" ---> {_sha256(f'{number}'.encode() + context)[7:19]}\n"}
        config = {**copy.deepcopy(parent["Config"])}
        config["Labels"] = {**(config.get("Labels") or {}), **config_labels, **(labels or {})}
        all_layers = [*parent["RootFS"]["Layers"], *layers]
        image_id = _sha256(json.dumps([config, all_layers], sort_keys=True).encode())
        attrs = {"Id": image_id, "RepoTags": [], "RepoDigests": [], "Created": now(), "Config": config,
                 "Os": parent.get("Os", "linux"), "Architecture": parent.get("Architecture", "amd64"),
                 "RootFS": {"Type": "layers", "Layers": all_layers}, "Size": parent.get("Size", 0) + len(context),
                 "Metadata": {"LastTagTime": NEVER}}
        self._engine.store(tag, attrs, [{"Created": 0, "CreatedBy": s, "Size": 1, "Comment": ""} for s in steps[::-1]])
        yield {"aux": {"ID": image_id}}
        yield {"stream": f"Successfully built {image_id[7:19]}\n"}
        if tag:
            yield {"stream": f"Successfully tagged {normal(tag)}\n"}


def _platform(attrs: dict[str, Any]) -> str:
    return f"{attrs.get('Os') or 'linux'}/{attrs.get('Architecture') or 'amd64'}"


class FakeEngine:
    """The engine: images, containers, its API, and what a registry it pulls from holds."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.failing: dict[str, BaseException] = {}  # call name ("images.get") -> what it raises
        self.registry: dict[str, list[dict[str, Any] | str]] = {}  # ref -> its images per platform, or an error
        self.loaded: list[Loaded] = []
        self.builds: list[dict[str, Any]] = []  # each build's arguments, the context's tar bytes as fileobj
        self.fail_step: tuple[int, list[str], int] | None = None  # a build's step that fails: (step, output, code)
        self.scripts: dict[str, tuple[int, tuple[bytes, bytes], dict[str, bytes]]] = {}  # image id -> script
        self.info_doc: dict[str, Any] = {"Runtimes": {"runc": {}}, "RegistryConfig": {"IndexConfigs": {}}}
        self.images = FakeImages(self)
        self.containers = FakeContainers(self)
        self.api = FakeApi(self)

    # -- the engine's own calls ------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        self.record("info")
        return copy.deepcopy(self.info_doc)

    def version(self) -> dict[str, Any]:
        self.record("version")
        return {"Version": "27.0.0-fake", "GitCommit": "fake", "Components": [{"Name": "Engine"}]}

    def ping(self) -> bool:
        self.record("ping")
        return True

    # -- what the tests read -----------------------------------------------------------------------

    def record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if name in self.failing:
            raise self.failing[name]

    def called(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """The arguments of every call of this name, in order."""
        return [(args, kwargs) for called, args, kwargs in self.calls if called == name]

    def names(self) -> list[str]:
        """Which calls were made, in order."""
        return [name for name, _, _ in self.calls]

    def tags(self) -> dict[str, str]:
        """Every tag on the engine and the id it names."""
        return {t: a["Id"] for a in self.images.by_id.values() for t in a.get("RepoTags") or []}

    # -- setting it up (records nothing) -----------------------------------------------------------

    def add_image(self, ref: str | None, *, labels: dict[str, str] | None = None, layers: int = 2,
                  os: str = "linux", architecture: str = "amd64", size: int = 1000, more_tags: Iterable[str] = (),
                  last_tagged: datetime | None = None) -> dict[str, Any]:
        """An image on the engine (layers made up, one history entry each), tagged ref and
        more_tags (last_tagged: when, now by default); its attrs."""
        attrs = self.store(ref, self.make_image(ref, labels=labels, layers=layers, os=os, architecture=architecture,
                                                size=size),
                           [{"Created": 0, "CreatedBy": f"ADD layer{i} /", "Size": 100, "Comment": ""}
                            for i in reversed(range(layers))])
        for more in more_tags:
            self.move_tag(more, attrs["Id"])
        if last_tagged is not None:
            attrs["Metadata"]["LastTagTime"] = stamp(last_tagged)
        return attrs

    def publish(self, ref: str, *, labels: dict[str, str] | None = None, layers: int = 2,
                architecture: str = "amd64", error: str | None = None) -> None:
        """An image the registry holds under ref (one more platform when called again), or an
        error it answers mid-pull."""
        image: dict[str, Any] | str = error if error is not None else \
            self.make_image(ref, labels=labels, layers=layers, architecture=architecture)
        self.registry.setdefault(normal(ref), []).append(image)

    def add_container(self, image: str, *, labels: dict[str, str] | None = None, status: str = "created",
                      created: datetime | None = None) -> FakeContainer:
        attrs = self.images.find(image)
        assert attrs is not None, f"no image {image} to make a container of"
        container = FakeContainer(self, attrs["Id"], image, {"labels": labels or {}},
                                  stamp(created or datetime.now(timezone.utc)))
        container.attrs["State"]["Status"] = status
        return self.made(container)

    def script(self, image: str, *, exit_code: int = 0, stdout: bytes = b"", stderr: bytes = b"",
               files: dict[str, bytes] | None = None) -> None:
        """What a container of this image does: its exit code, its output, its files (paths
        without the leading /)."""
        attrs = self.images.find(image)
        assert attrs is not None, f"no image {image} to script"
        self.scripts[attrs["Id"]] = (exit_code, (stdout, stderr), dict(files or {}))

    def made(self, container: FakeContainer) -> FakeContainer:
        """A new container: kept, and as its image is scripted."""
        script = self.scripts.get(container.attrs["Image"])
        if script is not None:
            container.exit_code, container.output, container.files = script[0], script[1], dict(script[2])
        self.containers.by_id[container.id] = container
        return container

    @staticmethod
    def make_image(ref: str | None, *, labels: dict[str, str] | None = None, layers: int = 2, os: str = "linux",
                   architecture: str = "amd64", size: int = 1000) -> dict[str, Any]:
        seed = f"{ref}-{architecture}-{next(_serial)}"
        return {"Id": _sha256(seed.encode()), "RepoTags": [], "RepoDigests": [], "Created": now(),
                "Config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Labels": dict(labels or {})},
                "Os": os, "Architecture": architecture, "Size": size, "Metadata": {"LastTagTime": NEVER},
                "RootFS": {"Type": "layers", "Layers": [_sha256(f"{seed}-layer{i}".encode()) for i in range(layers)]}}

    def store(self, ref: str | None, attrs: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
        """Keep an image (replacing one with the same id) and move ref's tag to it."""
        attrs.setdefault("RepoTags", [])
        kept = self.images.by_id.get(attrs["Id"])
        if kept is not None:
            attrs["RepoTags"] = kept.get("RepoTags") or []
        self.images.by_id[attrs["Id"]] = attrs
        self.images.histories[attrs["Id"]] = history
        if ref is not None:
            self.move_tag(ref, attrs["Id"])
        return attrs

    def move_tag(self, ref: str, image_id: str) -> None:
        """The tag now names this image (and no other); the engine records when."""
        ref = normal(ref)
        for attrs in self.images.by_id.values():
            if ref in (attrs.get("RepoTags") or []):
                attrs["RepoTags"].remove(ref)
        attrs = self.images.by_id[image_id]
        attrs["RepoTags"].append(ref)
        attrs.setdefault("Metadata", {})["LastTagTime"] = now()
