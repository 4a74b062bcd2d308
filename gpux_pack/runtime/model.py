"""The model inside the image: settings, the ONNX Runtime session, warmup.

Settings come from gpux.json (written by gpux-pack next to the model) and GPUX_* variables.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .dtypes import DTYPES, SHORT_NAMES
from .tensors import TensorSpec

log = logging.getLogger("gpux")



class StartupError(Exception):
    """The container cannot serve as configured: one line, non-zero exit."""


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

    @classmethod
    def load(cls, env: dict[str, str] | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        path = Path(env.get("GPUX_CONFIG", "/opt/gpux/gpux.json"))
        try:
            spec = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise StartupError(f"cannot read the model config {path}: {e}") from None
        serving = spec.get("serving", {})
        cache_dir = Path(env.get("GPUX_CACHE_DIR") or "/tmp/gpux-cache")
        providers = [(name, dict(opts)) for name, opts in spec["execution_providers"]]
        if env.get("GPUX_PROVIDERS"):
            providers = _reorder(providers, env["GPUX_PROVIDERS"])
        return cls(
            spec=spec,
            root=path.parent,
            host=env.get("GPUX_HOST") or serving.get("host", "0.0.0.0"),
            port=_int(env, "GPUX_PORT", serving.get("port", 8080)),
            log_level=(env.get("GPUX_LOG_LEVEL") or "info").lower(),
            providers=[(n, _expand(o, cache_dir)) for n, o in providers],
            require_provider=env.get("GPUX_REQUIRE_PROVIDER", "").lower() in ("1", "true", "yes"),
            cache_dir=cache_dir,
            max_body_bytes=_int(env, "GPUX_MAX_BODY_BYTES", 64 * 1024 * 1024),
            max_workers=_int(env, "GPUX_MAX_WORKERS", serving.get("max_workers", 4)),
            timeout=float(env.get("GPUX_TIMEOUT") or serving.get("timeout", 30)),
        )


def _int(env: dict[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if not raw:
        return int(default)
    try:
        return int(raw)
    except ValueError:
        raise StartupError(f"{key}={raw!r} is not a whole number") from None


def _reorder(configured: list[tuple[str, dict]], override: str) -> list[tuple[str, dict]]:
    """GPUX_PROVIDERS=cuda,cpu: these providers, in this order, with their configured options."""
    options = dict(configured)
    out = []
    for item in (i.strip() for i in override.split(",") if i.strip()):
        name = SHORT_NAMES.get(item.lower(), item)
        if name not in SHORT_NAMES.values():
            raise StartupError(f"GPUX_PROVIDERS: unknown provider '{item}' (use {', '.join(SHORT_NAMES)})")
        out.append((name, options.get(name, {})))
    if "CPUExecutionProvider" not in dict(out):
        out.append(("CPUExecutionProvider", {}))
    return out


def _expand(options: dict[str, Any], cache_dir: Path) -> dict[str, Any]:
    """`${GPUX_CACHE_DIR}` in provider options is the cache dir of this container."""
    out = {}
    for key, value in options.items():
        if isinstance(value, str) and "${GPUX_CACHE_DIR}" in value:
            value = value.replace("${GPUX_CACHE_DIR}", str(cache_dir))
            Path(value).mkdir(parents=True, exist_ok=True)
        out[key] = value
    return out


@dataclass
class Model:
    settings: Settings
    session: Any
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    requested: list[str]
    active: list[str]
    load_seconds: float
    warmup_state: dict[str, Any] = field(default_factory=lambda: {"state": "pending"})

    @property
    def spec(self) -> dict[str, Any]:
        return self.settings.spec

    @classmethod
    def load(cls, settings: Settings) -> "Model":
        import onnxruntime as ort

        spec = settings.spec
        path = settings.root / spec["model"]["path"]
        requested = [name for name, _ in settings.providers]
        _prepare_libraries(requested)
        opts = ort.SessionOptions()
        opts.log_severity_level = {"debug": 0, "info": 2, "warning": 2}.get(settings.log_level, 3)
        if spec.get("runtime", {}).get("enable_profiling"):
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path("/tmp") / "gpux-profile")
        available = set(ort.get_available_providers())
        usable = [(n, o) for n, o in settings.providers if n in available]
        if settings.log_level != "debug":
            ort.set_default_logger_severity(4)  # a failing provider is explained below, in one line
        started = time.perf_counter()
        try:
            session = ort.InferenceSession(
                str(path), opts, providers=[n for n, _ in usable], provider_options=[o for _, o in usable]
            )
        except Exception as e:  # an accelerator that cannot start: CPU, unless required
            if settings.require_provider or requested == ["CPUExecutionProvider"]:
                raise StartupError(f"cannot start {requested[0]}: {str(e).splitlines()[0]}") from None
            log.warning("cannot start %s (%s); serving on CPU", requested[0], str(e).splitlines()[0])
            session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        load_seconds = time.perf_counter() - started
        active = list(session.get_providers())
        primary = requested[0]
        if primary not in active:
            reason = "not in this onnxruntime build" if primary not in available else _diagnose(spec)
            message = f"{primary} is not active ({reason}); active providers: {', '.join(active)}"
            if settings.require_provider:
                raise StartupError(f"GPUX_REQUIRE_PROVIDER=1: {message}")
            log.warning("!" * 72)
            log.warning("FALLBACK: %s. Inference runs on CPU.", message)
            log.warning("Set GPUX_REQUIRE_PROVIDER=1 to refuse to start instead.")
            log.warning("!" * 72)
        inputs = [TensorSpec.from_json(t) for t in spec["inputs"]]
        outputs = [TensorSpec.from_json(t) for t in spec["outputs"]]
        return cls(settings, session, inputs, outputs, requested, active, load_seconds)

    def run(self, feeds: dict[str, np.ndarray], output_names: list[str] | None = None) -> dict[str, Any]:
        names = output_names or [o.name for o in self.outputs]
        values = self.session.run(names, feeds)
        return dict(zip(names, values))

    def warmup_feeds(self) -> list[dict[str, np.ndarray]]:
        """Inputs for warmup: every declared shape, dynamic dimensions at 1, plus the shapes
        of any configured profiles (min/opt/max), so compiled artefacts cover them."""
        feeds: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            if not spec.required:
                continue
            shape = [d if isinstance(d, int) and d >= 0 else 1 for d in (spec.shape or ())]
            feeds[spec.name] = _zeros(spec.dtype, shape)
        runs = [feeds]
        profiles: dict[str, dict[str, list[int]]] = self.spec.get("warmup_profiles") or {}
        for point in ("min", "opt", "max"):
            if profiles:
                extra = dict(feeds)
                for name, prof in profiles.items():
                    spec = next((s for s in self.inputs if s.name == name), None)
                    if spec is not None and point in prof:
                        extra[name] = _zeros(spec.dtype, prof[point])
                runs.append(extra)
        return runs

    def warmup(self) -> dict[str, Any]:
        self.warmup_state = {"state": "running"}
        started = time.perf_counter()
        try:
            runs = self.warmup_feeds()
            for feeds in runs:
                self.run(feeds)
        except Exception as e:  # the model may need real inputs; serving goes on
            self.warmup_state = {"state": "failed", "error": str(e).splitlines()[0][:300]}
            log.warning("warmup failed (%s); serving anyway", self.warmup_state["error"])
            return self.warmup_state
        self.warmup_state = {"state": "done", "runs": len(runs), "seconds": round(time.perf_counter() - started, 4)}
        return self.warmup_state

    def info(self) -> dict[str, Any]:
        import onnxruntime as ort

        spec = self.spec
        return {
            "name": spec["name"],
            "version": spec["version"],
            "description": spec.get("description"),
            "model": {k: spec["model"][k] for k in ("file", "sha256", "size_bytes", "opset") if k in spec["model"]},
            "inputs": spec["inputs"],
            "outputs": spec["outputs"],
            "provider": spec.get("provider"),
            "execution_providers": {"requested": self.requested, "active": self.active},
            "onnxruntime": ort.__version__,
            "warmup": {"mode": spec.get("warmup", "at-start"), **self.warmup_state},
            "load_seconds": round(self.load_seconds, 4),
            "metadata": spec.get("metadata", {}),
            "gpux_pack": spec.get("pack_version"),
        }


def _diagnose(spec: dict[str, Any]) -> str:
    """Why an available provider did not start: a missing library (the driver's ones included,
    which the build-time check leaves to the host), else no device."""
    from .linkcheck import check

    libs = spec.get("libraries") or {}
    try:
        problems = check(libs.get("libs", []), libs.get("dlopen", []), libs.get("dirs", []), [],
                         spec.get("execution_providers", [["?"]])[0][0], quiet=True)
    except Exception as e:  # diagnosis must never stop the server
        return f"cannot tell why: {e}"
    driver = set(libs.get("driver", []))
    flags = spec.get("run_flags")
    own = [p for p in problems if p.split(" ", 1)[0] not in driver]
    if own:  # the image itself lacks a library: no docker run flag fixes that
        return own[0]
    if problems:
        missing = problems[0].split(" ", 1)[0]
        return f"the GPU driver's {missing} is not in the container; start it with {flags}" if flags else missing
    return f"its libraries load but no device was found; start the container with {flags}" if flags else "no device"


def _zeros(dtype: str, shape: list[int]) -> np.ndarray:
    if dtype == "string":
        return np.full(shape, "", dtype=object)
    return np.zeros(shape, dtype=DTYPES[dtype][0])


def _prepare_libraries(requested: list[str]) -> None:
    """NVIDIA wheels put CUDA/cuDNN in site-packages with no RPATH: load them before the
    session, or the CUDA provider fails and ORT quietly falls back to CPU. preload_dlls() does
    not cover TensorRT's pip libraries (tensorrt_libs): those are loaded here by path."""
    if not {"CUDAExecutionProvider", "TensorrtExecutionProvider"} & set(requested):
        return
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        quiet = io.StringIO()
        try:  # it prints each library it cannot find; the provider check explains it once
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                ort.preload_dlls(directory="")
        except Exception as e:
            log.debug("preload_dlls: %s", e)
        log.debug("preload_dlls: %s", quiet.getvalue().strip())
    if "TensorrtExecutionProvider" in requested:
        import ctypes

        libs = Path(ort.__file__).parent.parent / "tensorrt_libs"
        for pattern in ("libnvinfer.so.*", "libnvinfer_plugin.so.*", "libnvonnxparser.so.*"):
            for lib in sorted(libs.glob(pattern)):
                try:
                    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                except OSError as e:
                    log.debug("cannot preload %s: %s", lib.name, e)
