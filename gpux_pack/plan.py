"""Every decision of a build, made once: config + model + provider + base image facts -> Plan,
and provider + base image facts -> RuntimeBase (what `gpux-pack base build` makes, and what a
model image builds on). One set of checks for both.

Later stages (install, Dockerfile, context, image) only turn a plan into bytes; they decide
nothing. What the plan decides: the tag, the base image and whether it fits (Python, glibc,
platform), the link check's place, the warmup and the devices a baked warmup gets, the
requirements, the runtime base image's content-addressed tag, both label sets, gpux.json
(session options and TensorRT profiles included), and whether an image's Dockerfile runs
anything (so it can be assembled on the host instead of built).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from gpux_pack import __version__, sources
from gpux_pack.errors import ModelError, UsageError
from gpux_pack.project.config import TensorSpec, model_name, tag_template_parts
from gpux_pack.project.load import Project
from gpux_pack.optimize import Decision, Optimized, decide, done_at_build
from gpux_pack.project.model import ModelInfo, Signature
from gpux_pack.project.preprocess import TOKENIZER_FILE
from gpux_pack.providers import (CPU_EPS, EP_NAMES, MEMORY_OPTION, BaseImage, Devices, HostInfo, Provider, base_for,
                                 devices_for)
from gpux_pack.reference import parse_reference
from gpux_pack.timestamps import created_now
from gpux_pack.runtime import contract
from gpux_pack.runtime.contract import (APP_DIR, ASSETS, CACHE_DIR, CACHE_PLACEHOLDER, CONTEXT_MODEL, MODEL_PUBLIC_KEY,
                                        MODEL_SIGNATURE, SITE)
from gpux_pack.wheels import ARCHES, INSTALL_FORMAT, Lock, Pin, Target

RUNTIME_BASES = "gpux-pack/runtime-"  # every runtime base image's repository starts so: `base ls|prune` find them
# seconds a container has to load and warm up before failed health checks count (Docker's
# HEALTHCHECK --start-period; the liveness probe's initialDelaySeconds, which podman reads as one)
HEALTH_START = 60
PYTHON = "python3"  # the base image's own interpreter, by name (RUN steps and `docker exec`)
# The PATH an image gets when its base image's config sets none: what Docker's builders (classic,
# BuildKit) and buildah write then, and what Debian and Ubuntu set. Runtimes other than Docker
# (podman, containerd) add no default, so the assembler writes it too.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GRPC_REQUIREMENTS = ("grpcio>=1.60", "protobuf>=4.25")  # with serving.grpc_port (onnxruntime brings protobuf)
TEXT_REQUIREMENTS = ("tokenizers>=0.15",)  # with a tokenizer: Hugging Face's Rust tokenizers, no transformers or torch
# tokenizers declares huggingface-hub (and its hf-xet, httpx, fsspec, tqdm, pyyaml ...) for
# Tokenizer.from_pretrained, which the image never calls: its tokenizer.json is baked at build
TEXT_EXCLUDES = ("huggingface-hub",)
IMAGE_REQUIREMENTS = ("pillow>=10",)
MODEL_SIGNATURE_REQUIREMENTS = ("cryptography>=42",)  # a signed model: the image checks its ECDSA signature  # with image preprocessing: decoding (JPEG, PNG, WebP ...) and resizing
UID = 10001  # the image's user: numeric, so it works on any base and needs no useradd
USER = f"{UID}:{UID}"
DEFAULT_TAG = "{name}:{version}-{provider}"


@dataclass(frozen=True)
class ImageConfig:
    """What a runtime base image sets besides its files: one source for the Dockerfile's ENV,
    USER, WORKDIR, HEALTHCHECK, ENTRYPOINT and CMD and for the config of an assembled image.
    The entrypoint and health check name the interpreter by its absolute path, so they resolve
    on any OCI runtime whatever PATH the config carries (podman and containerd do not search a
    default PATH the way Docker does)."""

    env: tuple[tuple[str, str], ...]
    python: str  # the base image's python3, absolute (see interpreter)
    user: str = USER
    workdir: str = ""  # "": the base's, which is / (no WORKDIR: BuildKit commits a layer for one)
    cmd: tuple[str, ...] = ("serve",)
    health_interval: int = 10  # seconds
    health_timeout: int = 5
    health_start: int = HEALTH_START
    health_retries: int = 3

    @property
    def entrypoint(self) -> tuple[str, ...]:
        return (self.python, "-m", "gpux_runtime")

    @property
    def healthcheck(self) -> tuple[str, ...]:
        return (self.python, "-m", "gpux_runtime", "healthcheck")


def interpreter(base: BaseImage) -> str:
    """The absolute path of the image's python3: where the probe found it in the base image's
    files; else where apt puts it (a base without Python, or any base but the official
    python images, which keep theirs in /usr/local/bin)."""
    if base.interpreter:
        return base.interpreter
    official = re.match(r"^(?:(?:docker\.io|index\.docker\.io|registry-1\.docker\.io)/)?(?:library/)?python:",
                        base.image)
    return "/usr/local/bin/python3" if base.has_python and official else "/usr/bin/python3"


def image_config(provider: Provider, base: BaseImage) -> ImageConfig:
    env = (
        ("PYTHONPATH", f"{SITE}:{APP_DIR}/runtime"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONUNBUFFERED", "1"),
        ("HOME", "/tmp"),
        ("GPUX_CONFIG", f"{APP_DIR}/gpux.json"),
        *provider.env,
        ("GPUX_CACHE_DIR", CACHE_DIR),
    )
    # the runtime needs no working folder; / where the base sets one the image's user may not enter
    return ImageConfig(env=env, python=interpreter(base), workdir="" if base.workdir in ("", "/") else "/")


@dataclass(frozen=True)
class Options:
    """What the command line (and the Docker host) add to gpux.yml."""

    tag: str | None = None
    base_image: str | None = None
    platform: str | None = None
    warmup: str | None = None  # the setting asked for: auto | always | never (the plan's warmup is its mode)
    host: HostInfo | None = None  # the Docker host's devices, when known: a baked warmup needs the accelerator
    multi_platform: bool = False  # one of several platforms joined by an index under the tag
    sign_model: Path | None = None  # build --sign-model KEY: the model files signed (OpenSSF model signing)
    optimize: tuple[str, ...] | None = None  # build --optimize: replaces pack.optimize's steps (() none)


def options(tag: str | None, base_image: str | None, platform: str | None, warmup: str | None) -> Options:
    """The command line's flags, checked: a bad one is a UsageError naming it."""
    if warmup is not None and warmup not in ("auto", "always", "never"):
        raise UsageError(f"--warmup '{warmup}' is not auto, always or never")
    if base_image is not None and base_image not in ("default", "vendor"):
        try:
            parse_reference(base_image)
        except ValueError as e:
            raise UsageError(f"--base-image: {e}") from None
    if platform is not None and platform not in ARCHES:
        raise UsageError(f"--platform '{platform}' is not one of {', '.join(ARCHES)}")
    return Options(tag=tag, base_image=base_image, platform=platform, warmup=warmup)


@dataclass(frozen=True)
class RuntimeBase:
    """A provider's runtime base image: base image -> installed packages -> runtime, no model.
    Its tag is content-addressed, so an image of that tag is the one this plan would make."""

    provider: Provider
    base: BaseImage
    platform: str
    link_check: str  # host | image | off: see link_check_mode
    nvidia_libs: str  # wheels | base
    lock: Lock | None = None  # None: planned without resolving the wheels (see Resolve)

    @property
    def requirements(self) -> tuple[str, ...]:
        return self.provider.requirements(self.nvidia_libs)

    @property
    def target(self) -> Target:
        return Target(self.base.python, self.base.arch, self.base.glibc)

    @property
    def ort_version(self) -> str:
        """The locked onnxruntime's version (the table's before the lock)."""
        return (self.lock.version_of(self.provider.ort) if self.lock else None) or self.provider.version

    @cached_property
    def tag(self) -> str:
        """A digest of everything that makes it: base image, lock, install format, link check,
        templates, runtime sources and the link check script (sources.shipped), gpux-pack version."""
        assert self.lock is not None, "the tag names the lock: plan with a resolver"
        h = hashlib.sha256()
        parts = [__version__, INSTALL_FORMAT, self.provider.name, self.base.image, self.base.id, self.base.python,
                 self.link_check, self.lock.target.describe(), self.config.python]
        parts += [f"{pin.name}=={pin.version}" for pin in self.lock.pins]
        h.update("\n".join(parts).encode())
        for name, data in sources.shipped():
            h.update(name.encode() + b"\0" + data)
        return f"{RUNTIME_BASES}{self.provider.name}:{self.ort_version}-{h.hexdigest()[:12]}"

    @property
    def config(self) -> ImageConfig:
        return image_config(self.provider, self.base)

    @property
    def apt_packages(self) -> tuple[str, ...]:
        return self.base.apt_packages()

    @property
    def runs_nothing(self) -> bool:
        """Its Dockerfile has no RUN (no apt step, no link check in the image): it can be
        assembled on the host instead of built."""
        return not self.apt_packages and self.link_check != "image"

    @property
    def labels(self) -> dict[str, str]:
        provider = self.provider
        return {
            "org.opencontainers.image.title": f"gpux runtime for {provider.name}",
            "org.opencontainers.image.description": f"{provider.ort} {provider.version} and the gpux runtime, "
                                                    "without a model",
            "org.opencontainers.image.base.name": self.base.image,
            "io.gpux.provider": provider.name,
            "io.gpux.onnxruntime.version": provider.version,
            "io.gpux.pack.version": __version__,
        }


@dataclass(frozen=True)
class Plan:
    """A model image: a model and its gpux.json on its provider's runtime base image."""

    project: Project
    model: ModelInfo
    signature: Signature
    provider: Provider
    reason: str
    base: BaseImage
    platform: str
    tag: str
    warmup: str  # the mode: none | at-start | baked (the setting was auto | always | never)
    warm_devices: Devices  # what a baked warmup's container gets
    created: str
    nvidia_libs: str  # wheels | base
    link_check: str  # host | image | off: see link_check_mode
    index_tag: str | None = None  # several platforms: the index's tag (tag is this platform's)
    lock: Lock | None = None  # the wheels resolved for target; None: planned without resolving them (see Resolve)
    externalize: bool = False  # the image keeps the model's large inline weights in a data file: see externalize
    sign_model: Path | None = None  # the key that signs the model files at build (the image then carries the bundle)
    optimized: Optimized | None = None  # pack.optimize: what was done to the model (model is the result)

    @property
    def model_files(self) -> tuple[str, ...]:
        """The model's files in the image: its own, or the model and the data file its weights move to."""
        return (self.model.files[0], f"{self.model.files[0]}.data") if self.externalize else self.model.files

    @property
    def name(self) -> str:
        return model_name(self.project.config.name)

    @property
    def notes(self) -> tuple[str, ...]:
        return notes(self.project, self.signature, self.model.inline_weights if self.externalize else 0)

    @property
    def version(self) -> str:
        return self.project.config.version

    @property
    def config(self) -> Any:
        return self.project.config

    @property
    def target(self) -> Target:
        return Target(self.base.python, self.base.arch, self.base.glibc)

    @property
    def requirements(self) -> tuple[str, ...]:
        return requirements(self.project, self.signature, self.provider, self.nvidia_libs, self.sign_model)

    @property
    def excludes(self) -> tuple[str, ...]:
        return excludes(self.signature)

    @property
    def one_layer(self) -> bool:
        """A small model goes in one layer with gpux.json: each layer costs the engine's load
        about as much as sending ONE_LAYER_BYTES again, so a gpux.yml edit that sends a small
        model again costs less than a second layer on every build (docs/benchmarks.md)."""
        return not self.externalize and len(self.model.files) == 1 and self.model.size_bytes <= ONE_LAYER_BYTES

    @property
    def carries_assets(self) -> bool:
        """The image has an assets layer: preprocessing's files, or the model's signature bundle."""
        return bool(self.assets) or self.sign_model is not None

    @property
    def assets(self) -> tuple[tuple[str, Path], ...]:
        """Files the image's preprocessing reads (its own layer, under assets/): (name, file here)."""
        text = self.signature.text
        return ((TOKENIZER_FILE, text.tokenizer.path),) if text and text.tokenizer.path else ()

    @property
    def port(self) -> int:
        return self.config.serving.port

    @property
    def ports(self) -> tuple[int, ...]:
        """What the image EXPOSEs: HTTP, and gRPC when serving.grpc_port is set."""
        grpc = self.config.serving.grpc_port
        return (self.port, grpc) if grpc else (self.port,)

    @property
    def ort_version(self) -> str:
        """The locked onnxruntime's version; "unknown" before the lock."""
        return (self.lock.version_of(self.provider.ort) if self.lock else None) or "unknown"

    @cached_property
    def runtime_base(self) -> RuntimeBase:
        """The runtime base image it builds on (made from this plan's lock)."""
        return RuntimeBase(self.provider, self.base, self.platform, self.link_check, self.nvidia_libs, self.lock)

    @cached_property
    def labels(self) -> dict[str, str]:
        return labels(self)

    @cached_property
    def tensorrt_profiles(self) -> dict[str, dict[str, list[int]]]:
        """Only a TensorRT session has optimization profiles."""
        return tensorrt_profiles(self.config, self.signature.inputs) if self.provider.name == "tensorrt" else {}

    @cached_property
    def execution_providers(self) -> list[list[Any]]:
        return execution_providers(self.provider, self.config, self.tensorrt_profiles)

    @cached_property
    def gpux_json(self) -> contract.GpuxJson:
        return gpux_json(self)


def choose_base(project: Project, provider: Provider, options: Options) -> BaseImage:
    """--base-image, else pack.base_image for this provider or for all, else the table's
    default. "vendor" names the provider's vendor image from the table."""
    images = project.config.pack.base_image
    return base_for(provider, options.base_image or images.get(provider.name) or images.get("*"))


def assumed_base(base: BaseImage, platform: str | None, python: str | None = None) -> BaseImage:
    """What to assume of a base image that could not be inspected: the table's facts."""
    arch = ARCHES.get(platform or "linux/amd64", "x86_64")
    return replace(base, python=python or _python_from_tag(base.image) or base.python, arch=arch, probed=False)


def _python_from_tag(image: str) -> str | None:
    m = re.search(r"(?:^|/)python:(3\.\d+)", image)
    return m.group(1) if m else None


# What resolves a plan's wheels: (requirements, target, excludes) -> the lock (wheels.resolve, with
# the command line's --refresh and --offline; a fixed lock in tests and for `serve` on this machine)
Resolve = Callable[[tuple[str, ...], Target, tuple[str, ...]], Lock]


def pinned(*pins: Pin) -> Resolve:
    """A resolver that locks these pins whatever is asked: `serve` and `predict` on this machine
    plan for the onnxruntime installed here."""
    return lambda requirements, target, excludes: Lock(target, requirements, pins)


def requirements(project: Project, signature: Signature, provider: Provider, nvidia_libs: str,
                 sign_model: Path | None) -> tuple[str, ...]:
    """What the image's wheels must satisfy: the provider's, then what the project's features need."""
    cfg = project.config
    grpc = GRPC_REQUIREMENTS if cfg.serving.grpc_port else ()
    text = TEXT_REQUIREMENTS if signature.text else ()
    image = IMAGE_REQUIREMENTS if signature.image else ()
    signed = MODEL_SIGNATURE_REQUIREMENTS if sign_model else ()
    return (*provider.requirements(nvidia_libs), *grpc, *text, *image, *signed, *cfg.pack.requirements)


def excludes(signature: Signature) -> tuple[str, ...]:
    """Distributions a requirement declares and the image never imports: left out of the lock."""
    return TEXT_EXCLUDES if signature.text else ()


def make_plan(
    project: Project,
    model: ModelInfo,
    signature: Signature,
    provider: Provider,
    reason: str,
    base: BaseImage,
    options: Options,
    resolve: Resolve | None = None,
    optimized: Optimized | None = None,
) -> Plan:
    """A model image's plan, made once from what was gathered (the project, the model, the base
    image's facts, what pack.optimize made of the model: then model is its result) and, with
    resolve, the wheels it locks (without: the table's onnxruntime, "unknown" in labels and
    gpux.json; `plan --offline` and tests)."""
    cfg = project.config
    check_model_for(model, provider)
    if cfg.pack.python and base.probed and cfg.pack.python != base.python:
        raise project.error(("pack", "python"), f"is {cfg.pack.python} but {base.image} has Python {base.python}")
    platform = check_base(provider, base, options.platform)
    tag = image_tag(project, provider.name, options.tag)
    index_tag = None
    if options.multi_platform:  # each platform's image under <tag>-<arch>, the index under <tag>
        repo, name = parse_reference(tag).repository_tag
        index_tag, tag = f"{repo}:{name}", image_tag(project, provider.name, f"{repo}:{name}-{platform.split('/')[1]}")
    warmup = warmup_mode(options.warmup or cfg.pack.warmup, provider, options.host)
    on_device = options.host is not None and options.host.has(provider.device)
    nvidia_libs = cfg.pack.nvidia_libs or base.nvidia_libs
    lock = None
    if resolve is not None:
        lock = resolve(requirements(project, signature, provider, nvidia_libs, options.sign_model),
                       Target(base.python, base.arch, base.glibc), excludes(signature))
    return Plan(
        project=project,
        model=model,
        signature=signature,
        provider=provider,
        reason=reason,
        base=base,
        platform=platform,
        tag=tag,
        index_tag=index_tag,
        warmup=warmup,
        warm_devices=devices_for(provider) if warmup == "baked" and on_device else Devices(),
        created=created_now(),
        nvidia_libs=nvidia_libs,
        link_check=link_check_mode(cfg.pack.link_check, base),
        lock=lock,
        externalize=externalize(cfg.pack.weights, model),
        sign_model=options.sign_model,
        optimized=optimized,
    )


def optimization(project: Project, provider: Provider, options: Options) -> Decision:
    """What pack.optimize (or build --optimize) does to the model for this provider's image."""
    settings = project.config.pack.optimize
    steps = options.optimize if options.optimize is not None else tuple(settings.steps)
    return decide(steps, provider, settings.samples is not None)


ONE_LAYER_BYTES = 8 << 20  # a model up to this size shares gpux.json's layer (Plan.one_layer)
EXTERNALIZE_FROM = 64 << 20  # inline weights from which `pack.weights: auto` moves them (docs/benchmarks.md)


def weights_note(model_file: str, moved: int) -> str:
    return (f"the image keeps the model's {moved / 1e6:.0f} MB of inline weights in an external data file beside it "
            f"({model_file}.data, page-aligned), which ONNX Runtime starts faster: the same graph and bytes "
            "(pack.weights: inline keeps the file as given)")


def externalize(setting: str, model: ModelInfo) -> bool:
    """Whether the image keeps the model's large inline weights in an external data file instead:
    ONNX Runtime parses an inline model's weights out of one protobuf message (copies), but maps
    page-aligned external data; it started a 1.5 GB model in 0.4x the time (bench/ort_load.py).
    A model that has external data already is baked as it is."""
    if setting == "inline" or not model.inline_weights or len(model.files) > 1:
        return False
    return setting == "external" or model.inline_weights >= EXTERNALIZE_FROM


def plan_runtime_base(provider: Provider, base: BaseImage, platform: str | None, link_check: bool,
                      nvidia_libs: str | None = None, resolve: Resolve | None = None) -> RuntimeBase:
    """A runtime base image on its own (`gpux-pack base build|render`): the same checks as a
    model image's base, and with resolve its wheels locked. nvidia_libs: --nvidia-libs, else the
    base image's."""
    base = replace(base, nvidia_libs=nvidia_libs) if nvidia_libs else base
    wanted = provider.requirements(base.nvidia_libs)
    lock = resolve(wanted, Target(base.python, base.arch, base.glibc), ()) if resolve is not None else None
    return RuntimeBase(provider, base, check_base(provider, base, platform), link_check_mode(link_check, base),
                       base.nvidia_libs, lock)


def check_base(provider: Provider, base: BaseImage, platform: str | None) -> str:
    """The base image must carry a Python the runtime and the provider's wheels support, a
    glibc the wheels' manylinux floor allows, and be of the platform asked for, which the
    provider must ship for. Returns the platform (the base's own when none was asked for)."""
    version = _version(base.python)
    if version < (3, 11):
        raise UsageError(f"{base.image} has Python {base.python}; the image's runtime needs Python 3.11 or newer")
    low, high = provider.python
    if not _version(low) <= version <= _version(high):
        raise UsageError(
            f"{base.image} has Python {base.python}; {provider.ort} {provider.version} has wheels for Python {low} to {high}"
        )
    if base.glibc < provider.min_glibc:
        need = ".".join(map(str, provider.min_glibc))
        raise UsageError(
            f"{base.image} has glibc {base.glibc[0]}.{base.glibc[1]}; {provider.pip_requirement} needs glibc {need} or newer"
        )
    platform = platform or {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}[base.arch]
    if base.probed and ARCHES[platform] != base.arch:
        raise UsageError(f"--platform {platform}: base image {base.image} is for {base.arch}; "
                         "give a base image of that platform with --base-image")
    if platform not in provider.platforms:
        raise UsageError(f"--platform {platform}: {provider.name} images exist for {', '.join(provider.platforms)}")
    return platform


def link_check_mode(enabled: bool, base: BaseImage) -> str:
    """Where the link check runs. host: on the build host, reading the base image's exported
    files and the installed packages (nothing runs in the image; any architecture). image: a
    RUN step after the apt step that installs the provider's system libraries (MIGraphX), which
    the host cannot see before the build; python3 alone from apt does not count. off: turned
    off (pack.link_check: false), e.g. when the host mounts the libraries at run time."""
    if not enabled:
        return "off"
    return "image" if base.system_packages else "host"


def check_model_for(model: ModelInfo, provider: Provider) -> None:
    """The model must load in the onnxruntime the image carries: opsets it knows, operators it
    implements. Otherwise the image builds and every container exits at start."""
    ort = f"{provider.ort} {provider.version}"
    if model.ir_version > provider.onnx_ir:
        raise ModelError(model.path.name, f"IR version {model.ir_version}; {ort} loads IR versions up to "
                                          f"{provider.onnx_ir} (save it with an older IR version, e.g. "
                                          f"onnx.helper.make_model(..., ir_version={provider.onnx_ir}))")
    for domain, newest in (("ai.onnx", provider.onnx_opset), ("ai.onnx.ml", provider.onnx_ml_opset)):
        version = model.opsets.get(domain, 0)
        if version > newest:
            raise ModelError(model.path.name, f"imports opset {version} of {domain}; {ort} loads opsets up to {newest} "
                                              "(export the model with an older opset)")
    if model.custom_ops:
        more = f" (and {len(model.custom_ops) - 1} more)" if len(model.custom_ops) > 1 else ""
        raise ModelError(model.path.name, f"uses the custom operator {model.custom_ops[0]}{more}, which {ort} does not "
                                          "implement; custom operator libraries are not packaged")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def warmup_mode(setting: str, provider: Provider, host: HostInfo | None) -> str:
    """never -> none; always -> baked; auto -> baked for a provider whose row says so
    (TensorRT: its engines take minutes to build) on a host with its device, else at-start
    (one warmup inference before reporting ready)."""
    if setting == "never":
        return "none"
    if setting == "always":
        return "baked"
    return "baked" if provider.warmup_bakes and host is not None and host.has(provider.device) else "at-start"


EVERY_INTERFACE = ("0.0.0.0", "::")


def serving_host(cfg: Any) -> str:
    """In the image the server listens on every interface of the container, whatever
    serving.host says (a loopback address there would make the published port unreachable):
    serving.host is for `gpux-pack serve` on this machine."""
    return cfg.serving.host if cfg.serving.host in EVERY_INTERFACE else "0.0.0.0"


def notes(project: Project, signature: Signature, moved: int = 0) -> tuple[str, ...]:
    """What the build tells the user before it starts: what gpux.yml holds that was left out or
    is not acted on, where the graph overrules a declaration, and where the image differs
    (moved: the bytes of inline weights the image keeps as external data)."""
    cfg = project.config
    out = [*project.notes, *signature.notes]
    if moved:
        out.append(weights_note(project.model_path.name, moved))
    if "host" in cfg.serving.model_fields_set and serving_host(cfg) != cfg.serving.host:
        out.append(project.note(("serving", "host"), f"{cfg.serving.host} applies to `gpux-pack serve` on this "
                                                     "machine; in the image the server listens on every interface "
                                                     "(0.0.0.0), so a published port reaches it"))
    memory = cfg.runtime.gpu.memory
    if memory is not None and memory < 1 << 20:
        out.append(project.note(("runtime", "gpu", "memory"), f"{memory} bytes (a number is bytes, as GPUX's tutorial "
                                                              "writes it); write 2GB for two gigabytes"))
    return tuple(sorted(out, key=lambda note: int(m.group(1)) if (m := re.match(r"[^\n]*?:(\d+): ", note)) else 0))


def image_tag(project: Project, provider: str, cli_tag: str | None) -> str:
    cfg = project.config
    template = cli_tag or cfg.pack.tag or DEFAULT_TAG
    fields = {
        "name": re.sub(r"[^a-z0-9._/-]+", "-", model_name(cfg.name).lower()).strip("-._/") or "model",
        "version": re.sub(r"[^A-Za-z0-9_.-]+", "-", cfg.version).strip("-.") or "latest",
        "provider": provider,
    }
    try:
        tag = "".join(literal + (fields[field] if field else "") for literal, field in tag_template_parts(template))
    except ValueError as e:  # pack.tag was checked when gpux.yml loaded: this is --tag
        raise UsageError(f"--tag {_cut(template)}: {e}") from None
    try:
        if parse_reference(tag).digest:
            raise ValueError(f"{_cut(tag)} has a digest; a tag names what is built")
    except ValueError as e:
        if cli_tag:
            raise UsageError(f"--tag: {e}") from None
        if cfg.pack.tag:
            raise project.error(("pack", "tag"), str(e)) from None
        raise _default_tag_error(project, fields, tag) from None
    return tag


def _cut(text: str) -> str:
    """A value for an error line: quoted, and at most about 80 characters of it."""
    return ascii(text) if len(text) <= 80 else f"{ascii(text[:60])[:-1]}...' ({len(text)} characters)"


def _default_tag_error(project: Project, fields: dict[str, str], tag: str) -> UsageError:
    """The default tag <name>:<version>-<provider> is no image reference: blame the field of
    gpux.yml that made it so (a valid name such as 'a..b' can still be an invalid repository)."""
    cfg = project.config
    try:
        parse_reference(fields["name"])
    except ValueError:
        return project.error(("name",), f"'{cfg.name}' cannot name an image: '{fields['name']}' is not a valid "
                                        "repository ('.', '_', '__' or '-' only between letters or digits); "
                                        "rename it, or give --tag or pack.tag")
    return project.error(("version",), f"'{cfg.version}' cannot tag an image: '{tag}' is not a valid image "
                                       "reference (a tag is at most 128 characters); shorten it, or give "
                                       "--tag or pack.tag")


# ---------------------------------------------------------------------------------------------
# What the plan writes into the image


def label_value(text: str) -> str:
    """A label value as one line of visible text, the same bytes whether the image is assembled
    or built from the rendered Dockerfile: every control, format, separator or unassigned
    character (Unicode categories C* and Z*: line breaks of every kind, tabs, U+2028, U+202E,
    U+FEFF, ...) becomes a space, runs of them one space, ends stripped."""
    return " ".join("".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in text).split())


def labels(plan: Plan) -> dict[str, str]:
    """The image's labels, each value through label_value (user text: description, pack.labels)."""
    cfg = plan.project.config
    out = {
        "org.opencontainers.image.title": cfg.name,  # as written; the model's name below is URL-safe
        "org.opencontainers.image.version": cfg.version,
        "org.opencontainers.image.created": plan.created,
        "org.opencontainers.image.description": cfg.description or f"{cfg.name} served by gpux-pack",
        "org.opencontainers.image.base.name": plan.base.image,
        "io.gpux.model.name": plan.name,
        "io.gpux.model.version": cfg.model.version or cfg.version,
        "io.gpux.model.sha256": plan.model.sha256,
        "io.gpux.model.bytes": str(plan.model.size_bytes),  # with its external data: deploy sizes memory by it
        "io.gpux.provider": plan.provider.name,
        "io.gpux.onnxruntime.version": plan.ort_version,
        "io.gpux.pack.version": __version__,
        "io.gpux.warmup": plan.warmup,
        "io.gpux.port": str(plan.port),
        **({"io.gpux.grpc_port": str(cfg.serving.grpc_port)} if cfg.serving.grpc_port else {}),
    }
    if plan.optimized is not None:  # what the image's model is, against the model given
        done = plan.optimized
        out["io.gpux.optimize"] = ",".join(f"{s.mode}:{s.how}" for s in done.steps)
        out["io.gpux.optimize.errors"] = json.dumps(dict(done.errors), separators=(",", ":"))
        out["io.gpux.model.original.sha256"] = done.original_sha256
    for key, value in cfg.pack.labels.items():
        out.setdefault(key, value)  # user labels never override the contract's
    return {key: label_value(value) for key, value in out.items()}


def batching(cfg: Any) -> dict[str, float] | None:
    """serving.batching, else GPUX's serving.batch_size above 1 as its max_batch_size (2 ms)."""
    if cfg.serving.batching is not None:
        return cfg.serving.batching.model_dump()
    if cfg.serving.batch_size > 1:
        return {"max_batch_size": cfg.serving.batch_size, "max_delay_ms": 2.0}
    return None


TRT_MAX_BATCH = 32  # a derived profile's largest batch, unless the config's batch size is larger


def tensorrt_profiles(cfg: Any, inputs: Any) -> dict[str, dict[str, list[int]]]:
    """TensorRT optimization profiles (min/opt/max shape per input): pack.tensorrt.profiles,
    else derived when every dynamic input's only dynamic dimension is its first (the batch):
    min 1, opt the configured batch size (runtime.batch_size, serving.batch_size), max the
    larger of that and 32; fixed dimensions as declared. Otherwise none: TensorRT then builds
    an engine for each new shape it meets (set pack.tensorrt.profiles)."""
    if cfg.pack.tensorrt.profiles:
        return {name: {"min": list(p.min), "opt": list(p.opt), "max": list(p.max)}
                for name, p in cfg.pack.tensorrt.profiles.items()}
    opt = max(cfg.runtime.batch_size, cfg.serving.batch_size)
    out: dict[str, dict[str, list[int]]] = {}
    for t in inputs:
        shape = list(t.shape or ())
        dynamic = [i for i, d in enumerate(shape) if not (isinstance(d, int) and d > 0)]
        if not dynamic:
            continue
        if dynamic != [0]:
            return {}
        rest = [int(d) for d in shape[1:]]
        out[t.name] = {"min": [1, *rest], "opt": [opt, *rest], "max": [max(opt, TRT_MAX_BATCH), *rest]}
    return out


def gpux_json(plan: Plan) -> contract.GpuxJson:
    """gpux.json: everything the image's runtime needs, so it never reads YAML."""
    cfg = plan.config
    provider, model, signature = plan.provider, plan.model, plan.signature
    accuracy, batch = cfg.pack.accuracy, batching(cfg)
    return contract.GpuxJson(
        name=plan.name,
        title=cfg.name,
        version=cfg.version,
        description=cfg.description,
        model=contract.ModelFiles(
            path=f"model/{model.files[0]}", file=model.files[0], files=tuple(plan.model_files),
            weights_moved=plan.externalize, sha256=model.sha256, size_bytes=model.size_bytes, opset=model.opset,
            nodes=model.nodes,
            working_memory=tuple(contract.WorkingMemory(tuple(dims), n) for dims, n in model.working_memory),
            transformers_done=done_at_build(plan.optimized, plan.ort_version)),
        inputs=tuple(served(t, signature) for t in signature.inputs),
        overridable_inputs=tuple(served(t) for t in signature.overridable),
        outputs=tuple(served(t) for t in signature.outputs),
        preprocessing=preprocessing(signature),
        model_signature=contract.ModelSignature(f"{ASSETS}/{MODEL_SIGNATURE}", f"{ASSETS}/{MODEL_PUBLIC_KEY}",
                                                cfg.pack.verify_model) if plan.sign_model else None,
        provider=provider.name,
        execution_providers=tuple((name, dict(options)) for name, options in plan.execution_providers),
        provider_names=dict(EP_NAMES),
        cpu_providers=tuple(CPU_EPS),
        plugin=contract.Plugin(provider.ep, provider.plugin, cfg.pack.openvino.device) if provider.plugin else None,
        ep_context=provider.ep_context,
        libraries=contract.Libraries(tuple(provider.libraries), tuple(provider.dlopen), tuple(provider.library_dirs),
                                     tuple(provider.driver_libs)),
        run_flags=provider.run_flags,
        onnxruntime=plan.ort_version,
        warmup=plan.warmup,  # type: ignore[arg-type]
        warmup_profiles={name: contract.Profile(tuple(p["min"]), tuple(p["opt"]), tuple(p["max"]))
                         for name, p in plan.tensorrt_profiles.items()},
        accuracy=contract.Accuracy(accuracy.atol, accuracy.rtol) if accuracy else None,
        runtime=contract.RuntimeOptions(float(cfg.runtime.timeout), cfg.runtime.batch_size,
                                        cfg.runtime.enable_profiling),
        serving=contract.Serving(cfg.serving.port, serving_host(cfg), cfg.serving.max_workers,
                                 float(cfg.serving.timeout),
                                 contract.Batching(int(batch["max_batch_size"]), float(batch["max_delay_ms"]))
                                 if batch else None, cfg.serving.grpc_port),
        metadata=dict(cfg.metadata),
        pack_version=__version__,
    )


def preprocessing(signature: Signature) -> contract.Preprocessing | None:
    """gpux.json's preprocessing: each step the image applies, by modality."""
    if not (signature.text or signature.image or signature.audio):
        return None
    return contract.Preprocessing(
        text=signature.text.served(f"{ASSETS}/{TOKENIZER_FILE}") if signature.text else None,
        image=signature.image.served() if signature.image else None,
        audio=signature.audio.served() if signature.audio else None,
    )


def served(t: TensorSpec, signature: Signature | None = None) -> contract.Tensor:
    """An input (with its signature) or output as gpux.json serves it. An input whose gpux.yml
    shape fixes sizes the graph leaves open: warmup runs that shape. One that carries encoded
    media: its BYTES are kept as bytes, not read as UTF-8 text."""
    declared = dict(signature.declared) if signature else {}
    media = {step.input for step in (signature.image, signature.audio) if step} if signature else set()
    return contract.Tensor(
        name=t.name, type=t.type, shape=tuple(t.shape) if t.shape is not None else None, required=t.required,
        labels=tuple(t.labels) if t.labels is not None else None, description=t.description,
        max_length=t.max_length,
        declared_shape=tuple(declared[t.name]) if t.name in declared else None, encoded=t.name in media,
    )


def execution_providers(provider: Provider, config: Any, profiles: dict[str, dict[str, list[int]]]) -> list[list[Any]]:
    """[[EP name, options], ...] for gpux.json: the table's defaults, then runtime.gpu,
    pack.tensorrt (with the plan's TensorRT profiles), pack.openvino, pack.device_id and
    pack.provider_options. Values are strings, as ONNX Runtime parses them."""
    gpu, trt = config.runtime.gpu, config.pack.tensorrt
    out = []
    for ep in provider.execution_providers:
        opts = dict(provider.options.get(ep, {}))
        if gpu.memory and ep in MEMORY_OPTION:
            opts[MEMORY_OPTION[ep]] = str(gpu.memory)
        if ep == "TensorrtExecutionProvider":
            opts["trt_fp16_enable"] = _flag(trt.fp16)
            opts["trt_int8_enable"] = _flag(trt.int8)
            if trt.workspace:
                opts["trt_max_workspace_size"] = str(trt.workspace)
            for point in ("min", "opt", "max") if profiles else ():
                opts[f"trt_profile_{point}_shapes"] = ",".join(
                    f"{name}:{'x'.join(str(d) for d in p[point])}" for name, p in profiles.items()
                )
            if trt.ep_context:  # a later start loads the engine from this model, skipping the builder
                opts["trt_dump_ep_context_model"] = "true"
                opts["trt_ep_context_file_path"] = f"{CACHE_PLACEHOLDER}/{CONTEXT_MODEL}"
                opts["trt_ep_context_embed_mode"] = "1"
        if ep == "OpenVINOExecutionProvider":  # the plugin reads its settings from load_config only
            ov = config.pack.openvino
            settings = {} if ov.precision == "auto" else {"INFERENCE_PRECISION_HINT": ov.precision}
            opts["load_config"] = json.dumps({ov.device: settings}, sort_keys=True)
        if "device_id" in opts:
            opts["device_id"] = str(config.pack.device_id)
        short = next((k for k, v in EP_NAMES.items() if v == ep), ep)
        for key in (ep, short):
            opts.update({k: _text(v) for k, v in config.pack.provider_options.get(key, {}).items()})
        out.append([ep, opts])
    return out


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _text(value: Any) -> str:
    return _flag(value) if isinstance(value, bool) else str(value)
