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

from .dtypes import SHORT_NAMES

DEFAULT_CONFIG = "/opt/gpux/gpux.json"
DEFAULT_CACHE_DIR = "/tmp/gpux-cache"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
MAX_TIMEOUT = 86400  # a day: anything longer is a typo, and asyncio's timer would overflow on inf
MAX_WORKERS = 256
SPEC_KEYS = ("name", "version", "model", "inputs", "outputs", "execution_providers")

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


@dataclass
class Settings:
    spec: dict[str, Any]
    root: Path
    host: str
    port: int
    log_level: str
    providers: list[tuple[str, dict[str, Any]]]
    require_provider: bool
    cache_dir: Path
    max_body_bytes: int
    max_workers: int
    timeout: float
    baked_dir: Path = Path("/opt/gpux/warm")  # caches baked into the image (warm.BAKED_DIR)

    @classmethod
    def load(cls, env: dict[str, str] | None = None) -> "Settings":
        """The variables first (they need no file), then gpux.json for the defaults."""
        env = dict(os.environ if env is None else env)
        port = _whole(env, "GPUX_PORT", 1, 65535, "a port number from 1 to 65535")
        host = _host(env)
        log_level = _choice(env, "GPUX_LOG_LEVEL", LOG_LEVELS)
        wanted = _provider_names(env)
        require_provider = _flag(env, "GPUX_REQUIRE_PROVIDER")
        cache_dir = _cache_dir(env)
        max_body_bytes = _whole(env, "GPUX_MAX_BODY_BYTES", 1, None, "a positive whole number of bytes")
        max_workers = _whole(env, "GPUX_MAX_WORKERS", 1, MAX_WORKERS, f"a whole number from 1 to {MAX_WORKERS}")
        timeout = _seconds(env, "GPUX_TIMEOUT")
        path, spec = _read_config(env)

        serving = spec.get("serving") or {}
        providers = [(name, dict(opts)) for name, opts in spec["execution_providers"]]
        if wanted:
            options = dict(providers)
            providers = [(name, options.get(name, {})) for name in wanted]
            if "CPUExecutionProvider" not in wanted:
                providers.append(("CPUExecutionProvider", {}))
        return cls(
            spec=spec,
            root=path.parent,
            host=host or serving.get("host", "0.0.0.0"),
            port=port or int(serving.get("port", 8080)),
            log_level=log_level or "info",
            providers=providers,
            require_provider=require_provider,
            cache_dir=cache_dir,
            max_body_bytes=max_body_bytes or 64 * 1024 * 1024,
            max_workers=max_workers or int(serving.get("max_workers", 4)),
            timeout=timeout or float(serving.get("timeout", 30)),
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


def _provider_names(env: dict[str, str]) -> list[str]:
    """GPUX_PROVIDERS=cuda,cpu: these providers, in this order (short or ONNX Runtime names)."""
    raw = env.get("GPUX_PROVIDERS", "")
    if not raw.strip():
        return []
    full = {name.lower(): name for name in SHORT_NAMES.values()}
    names: list[str] = []
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        name = SHORT_NAMES.get(item.lower()) or full.get(item.lower())
        if name is None:
            raise ConfigurationError("GPUX_PROVIDERS", raw, f"unknown provider '{item}' (use {', '.join(SHORT_NAMES)})")
        if name in names:
            raise ConfigurationError("GPUX_PROVIDERS", raw, f"'{item}' is named twice")
        names.append(name)
    if not names:
        raise ConfigurationError("GPUX_PROVIDERS", raw, f"names no provider (use {', '.join(SHORT_NAMES)})")
    return names


def _cache_dir(env: dict[str, str]) -> Path:
    raw = env.get("GPUX_CACHE_DIR", "")
    if not raw:
        return Path(DEFAULT_CACHE_DIR)
    if "\0" in raw:
        raise ConfigurationError("GPUX_CACHE_DIR", raw, "contains a NUL byte")
    if not os.path.isabs(raw):
        raise ConfigurationError("GPUX_CACHE_DIR", raw, "expected an absolute path")
    return Path(raw)


def _read_config(env: dict[str, str]) -> tuple[Path, dict[str, Any]]:
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
        spec = json.loads(path.read_bytes())
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    except (ValueError, RecursionError) as e:
        raise fail(f"not valid JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(spec, dict):
        raise fail("not a gpux.json (expected a JSON object)")
    missing = [k for k in SPEC_KEYS if k not in spec]
    if missing or not isinstance(spec["model"], dict) or "path" not in spec["model"]:
        raise fail(f"not a gpux.json (it lacks {', '.join(missing) or 'model.path'})")
    return path, spec
