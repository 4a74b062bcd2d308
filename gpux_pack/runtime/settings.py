"""The container's settings: gpux.json (written by gpux-pack next to the model) and GPUX_*
variables.

Standard library only, so `healthcheck` and a mistyped variable cost no numpy import. Every
variable is checked before anything loads: a typo is one line naming it and exit 2, not a
traceback, nor a surprise minutes into a model load.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .contract import BAKED_DIR, DRAIN_SECONDS, FALLBACK_CACHE_DIR, ContractError, GpuxJson, parse


DEFAULT_CONFIG = "/opt/gpux/gpux.json"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
MAX_TIMEOUT = 86400  # a day: anything longer is a typo, and asyncio's timer would overflow on inf
MAX_WORKERS = 256

_WHOLE = re.compile(r"[+-]?[0-9]{1,20}")
_FLAGS = {"1": True, "true": True, "yes": True, "": False, "0": False, "false": False, "no": False}


class StartupError(Exception):
    """The container cannot serve as configured: one line, exit 1."""

    exit_code = 1


class ConfigurationError(StartupError):
    """A GPUX_* variable is wrong: one line naming it, exit 2 like a bad command line."""

    exit_code = 2

    def __init__(self, key: str, raw: str, problem: str):
        super().__init__(f"{key}={_shown(raw)}: {problem}")
        self.key = key


VARIABLES = ("GPUX_CACHE_DIR", "GPUX_CONFIG", "GPUX_DRAIN_SECONDS", "GPUX_HOST", "GPUX_LOG_FORMAT", "GPUX_LOG_LEVEL",
             "GPUX_MAX_BODY_BYTES", "GPUX_MAX_HEADER_BYTES", "GPUX_MAX_IMAGE_PIXELS", "GPUX_MAX_QUEUE",
             "GPUX_MAX_REQUEST_BYTES", "GPUX_MAX_WORKERS", "GPUX_MODEL_PUBLIC_KEY", "GPUX_PORT", "GPUX_PROVIDERS",
             "GPUX_READ_TIMEOUT", "GPUX_REQUIRE_PROVIDER", "GPUX_THREADS", "GPUX_TIMEOUT", "GPUX_VERIFY_MODEL")


# gpux-pack's own variables, read by the packager and its tests: `gpux-pack serve` runs this
# runtime in a shell that may set them
PACKAGER_VARIABLES = ("GPUX_PACK_", "GPUX_TEST_", "GPUX_SIGN_PASSWORD", "GPUX_UPDATE_GOLDEN")


def unknown_variables(env: dict[str, str]) -> list[str]:
    """A warning line for each GPUX_* variable the image does not read: a misspelt limit
    (GPUX_MAX_BODY_BYTE) would otherwise be dropped without a word."""
    import difflib

    out = []
    for name in sorted(env):
        if name.startswith("GPUX_") and name not in VARIABLES and not name.startswith(PACKAGER_VARIABLES):
            close = difflib.get_close_matches(name, VARIABLES, 1, 0.75)
            out.append(f"{_shown(name)[:80]}: not a variable this image reads; ignored"
                       + (f" (did you mean {close[0]}?)" if close else ""))
    return out


@dataclass
class Settings:
    spec: GpuxJson
    root: Path
    host: str
    port: int
    log_level: str
    providers: list[tuple[str, dict[str, Any]]]
    require_provider: bool
    cache_dir: Path
    max_body_bytes: int
    max_workers: int  # inference workers (threads calling session.run)
    timeout: float
    baked_dir: Path = Path(BAKED_DIR)
    log_format: str = "text"  # text | json (one JSON object per line, access logs included)
    threads: int = 1  # ONNX Runtime intra-op threads per worker
    threads_set: bool = False  # GPUX_THREADS was given: warmup does not measure another count
    max_queue: int = 64  # requests waiting for a worker; beyond: 503
    max_request_bytes: int = 1 << 30  # tensor bytes one request may hold; beyond: 413
    max_in_flight_bytes: int = 1 << 31  # request bytes all requests in flight may hold; beyond: 503
    drain_seconds: float = DRAIN_SECONDS  # SIGTERM: time in-flight requests get to finish (docker stop waits 10 s)
    batching: tuple[int, float] | None = None  # (max_batch_size, max_delay_ms)
    limits: Any = None  # resources.Limits: what the cgroup gives
    grpc_port: int | None = None  # KServe v2 gRPC (serving.grpc_port; the image then has grpcio)
    max_header_bytes: int = 64 * 1024  # a request's line and headers; beyond: 431 and closed
    read_timeout: float = 15.0  # headers not complete, or a body silent, this long: the connection is closed
    max_image_pixels: int = 40_000_000  # an image with more (width x height) is refused (413) before it is decoded
    verify_model: bool | None = None  # GPUX_VERIFY_MODEL: check the model's signature first (None: gpux.json says)
    model_public_key: Path | None = None  # GPUX_MODEL_PUBLIC_KEY: the key to check it with instead of the image's
    config_path: Path | None = None  # the gpux.json read (GPUX_CONFIG's, else the image's): model signing covers it
    unknown: tuple[str, ...] = ()  # a warning for each GPUX_* variable set that the image does not read

    @classmethod
    def load(cls, env: dict[str, str] | None = None, limits: Any = None) -> "Settings":
        """The variables first (they need no file), then gpux.json and the container's CPUs and
        memory (its cgroup) for the defaults."""
        from . import resources

        env = dict(os.environ if env is None else env)
        lim = limits or resources.limits()
        port = _whole(env, "GPUX_PORT", 1, 65535, "a port number from 1 to 65535")
        host = _host(env)
        log_level = _choice(env, "GPUX_LOG_LEVEL", LOG_LEVELS)
        require_provider = _flag(env, "GPUX_REQUIRE_PROVIDER")
        cache_dir = _cache_dir(env)
        max_body_bytes = _whole(env, "GPUX_MAX_BODY_BYTES", 1, None, "a positive whole number of bytes")
        max_workers = _whole(env, "GPUX_MAX_WORKERS", 1, MAX_WORKERS, f"a whole number from 1 to {MAX_WORKERS}")
        timeout = _seconds(env, "GPUX_TIMEOUT")
        log_format = _choice(env, "GPUX_LOG_FORMAT", ("text", "json"))
        threads = _whole(env, "GPUX_THREADS", 1, 1024, "a whole number of threads from 1 to 1024")
        max_queue = _whole(env, "GPUX_MAX_QUEUE", 1, 1 << 20, "a positive whole number of requests")
        max_request = _whole(env, "GPUX_MAX_REQUEST_BYTES", 1, None, "a positive whole number of bytes")
        drain = _seconds(env, "GPUX_DRAIN_SECONDS")
        max_header = _whole(env, "GPUX_MAX_HEADER_BYTES", 1024, 1 << 24, "a whole number of bytes from 1024 to 16777216")
        read_timeout = _seconds(env, "GPUX_READ_TIMEOUT")
        max_pixels = _whole(env, "GPUX_MAX_IMAGE_PIXELS", 1, 1 << 32, "a positive whole number of pixels")
        verify_model = _flag(env, "GPUX_VERIFY_MODEL") if env.get("GPUX_VERIFY_MODEL", "").strip() else None
        public_key = Path(env["GPUX_MODEL_PUBLIC_KEY"]) if env.get("GPUX_MODEL_PUBLIC_KEY") else None
        path, spec = _read_config(env)
        wanted = _provider_names(env, spec.provider_names)

        serving = spec.serving
        providers = [(name, dict(opts)) for name, opts in spec.execution_providers]
        if wanted:
            options = dict(providers)
            providers = [(name, options.get(name, {})) for name in wanted]
            if "CPUExecutionProvider" not in wanted:
                providers.append(("CPUExecutionProvider", {}))
        primary = providers[0][0] if providers else "CPUExecutionProvider"
        on_cpu = primary in spec.cpu_providers
        # on CPUs one run already uses every core: more workers only contend; a GPU overlaps two
        workers = max_workers or min(serving.max_workers, 1 if on_cpu else 2)
        batching = serving.batching
        batch = (batching.max_batch_size, batching.max_delay_ms) if batching else None
        return cls(
            spec=spec,
            root=path.parent,
            config_path=path,
            host=host or serving.host,
            port=port or serving.port,
            log_level=log_level or "info",
            providers=providers,
            require_provider=require_provider,
            cache_dir=cache_dir,
            max_body_bytes=max_body_bytes or resources.default_body_bytes(lim),
            max_workers=workers,
            timeout=timeout or serving.timeout,
            log_format=log_format or "text",
            threads=threads or max(1, lim.cpus // workers) if on_cpu else (threads or lim.cpus),
            threads_set=threads is not None,
            max_queue=max_queue or max(16, 4 * workers * (batch[0] if batch else 4)),
            max_request_bytes=max_request or resources.default_request_bytes(lim),
            max_in_flight_bytes=resources.default_in_flight_bytes(lim),
            drain_seconds=drain or DRAIN_SECONDS,
            batching=batch,
            limits=lim,
            grpc_port=serving.grpc_port,
            max_header_bytes=max_header or 64 * 1024,
            max_image_pixels=max_pixels or 40_000_000,
            verify_model=verify_model,
            model_public_key=public_key,
            read_timeout=read_timeout or 15.0,
            unknown=tuple(unknown_variables(env)),
        )


def _shown(raw: str) -> str:
    """The value as typed, unless it would break the one line (newlines, NULs): then quoted."""
    return raw if raw.isprintable() else repr(raw)


def _whole(env: dict[str, str], key: str, low: int, high: int | None, expected: str) -> int | None:
    """None when unset or empty: the config's default applies."""
    raw = env.get(key, "")
    text = raw.strip()
    if not text:
        return None
    if not _WHOLE.fullmatch(text):
        raise ConfigurationError(key, raw, f"expected {expected}")
    value = int(text)
    if value < low or (high is not None and value > high):
        raise ConfigurationError(key, raw, f"expected {expected}")
    return value


def _seconds(env: dict[str, str], key: str) -> float | None:
    raw = env.get(key, "")
    if not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT):
        raise ConfigurationError(key, raw, f"expected a number of seconds, more than 0 and at most {MAX_TIMEOUT}")
    return value


def _host(env: dict[str, str]) -> str | None:
    """An address literal: uvicorn would otherwise try to resolve a typo at bind time."""
    raw = env.get("GPUX_HOST", "")
    text = raw.strip()
    if not text:
        return None
    if text.lower() == "localhost":
        return "localhost"
    try:
        ipaddress.ip_address(text)
    except ValueError:
        problem = "expected an IP address (0.0.0.0, ::, 127.0.0.1, ...) or localhost"
        raise ConfigurationError("GPUX_HOST", raw, problem) from None
    return text


def _choice(env: dict[str, str], key: str, choices: tuple[str, ...]) -> str | None:
    raw = env.get(key, "")
    text = raw.strip().lower()
    if not text:
        return None
    if text not in choices:
        raise ConfigurationError(key, raw, f"expected one of {', '.join(choices)}")
    return text


def _flag(env: dict[str, str], key: str) -> bool:
    raw = env.get(key, "")
    value = _FLAGS.get(raw.strip().lower())
    if value is None:
        raise ConfigurationError(key, raw, "expected 1 or 0 (true/false, yes/no)")
    return value


def _provider_names(env: dict[str, str], short_names: dict[str, str]) -> list[str]:
    """GPUX_PROVIDERS=cuda,cpu: these providers, in this order (short or ONNX Runtime names, as
    the packager's provider table gives them in gpux.json)."""
    raw = env.get("GPUX_PROVIDERS", "")
    if not raw.strip():
        return []
    full = {name.lower(): name for name in short_names.values()}
    names: list[str] = []
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        name = short_names.get(item.lower()) or full.get(item.lower())
        if name is None:
            raise ConfigurationError("GPUX_PROVIDERS", raw, f"unknown provider '{item}' (use {', '.join(short_names)})")
        if name in names:
            raise ConfigurationError("GPUX_PROVIDERS", raw, f"'{item}' is named twice")
        names.append(name)
    if not names:
        raise ConfigurationError("GPUX_PROVIDERS", raw, f"names no provider (use {', '.join(short_names)})")
    return names


def _cache_dir(env: dict[str, str]) -> Path:
    raw = env.get("GPUX_CACHE_DIR", "")
    if not raw:
        return Path(FALLBACK_CACHE_DIR)
    if "\0" in raw:
        raise ConfigurationError("GPUX_CACHE_DIR", raw, "contains a NUL byte")
    if not os.path.isabs(raw):
        raise ConfigurationError("GPUX_CACHE_DIR", raw, "expected an absolute path")
    return Path(raw)


def _read_config(env: dict[str, str]) -> tuple[Path, GpuxJson]:
    """gpux.json. Set by the user (GPUX_CONFIG), a bad file is their mistake: exit 2; the
    image's own file being bad is exit 1."""
    raw = env.get("GPUX_CONFIG", "")
    path = Path(raw or DEFAULT_CONFIG)

    def fail(problem: str) -> StartupError:
        if raw:
            return ConfigurationError("GPUX_CONFIG", raw, problem)
        return StartupError(f"cannot read the model config {path}: {problem}")

    if "\0" in raw:
        raise fail("contains a NUL byte")
    try:
        if path.exists() and not path.is_file():  # a folder, or a FIFO that would block forever
            raise fail("not a regular file")
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    except (ValueError, RecursionError) as e:
        raise fail(f"not valid JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    try:
        return path, parse(data)
    except ContractError as e:
        raise fail(f"not this runtime's gpux.json: {e}") from None
