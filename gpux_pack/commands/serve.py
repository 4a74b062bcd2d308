"""`gpux-pack serve PATH`: the image's runtime on this machine, without Docker or an image.

The folder an image holds is staged from the same plan a build makes (gpux.json, with the
model read in place), then the image's own entrypoint (`python -m gpux_pack.runtime serve`)
runs it with this machine's onnxruntime: same endpoints, same settings and GPUX_* variables,
same readiness after warmup. A change to gpux.yml or the model's files is validated first and
then restarts the server; a change that does not validate leaves the running one serving.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpux_pack import providers
from gpux_pack.commands import build
from gpux_pack.errors import PackError, UsageError
from gpux_pack.plan import Options, with_lock
from gpux_pack.ui import Reporter
from gpux_pack.wheels import Lock, Pin

RUNTIME_MODULES = ("onnxruntime", "uvicorn", "orjson", "prometheus_client")  # what the image's runtime imports
POLL_SECONDS = 0.5  # how often the watched files are looked at
STOP_SECONDS = 15.0  # the server's drain (8 s by default) plus its shutdown


@dataclass(frozen=True)
class Staged:
    """What `serve` and `predict PATH` run: the folder holding gpux.json, and why that provider."""

    folder: Path
    provider: str
    reason: str
    watched: tuple[Path, ...]  # gpux.yml and the model's files: a change reloads
    spec: dict[str, Any]
    host: str = "127.0.0.1"  # gpux.yml's serving.host when it sets one: on this machine it applies

    def env(self, **extra: str) -> dict[str, str]:
        """The runtime's variables: this gpux.json, a private cache, this provider only."""
        return {"GPUX_CONFIG": str(self.folder / "gpux.json"), "GPUX_CACHE_DIR": str(self.folder / "cache"),
                "GPUX_PROVIDERS": self.provider, **extra}  # fmt: skip


def offered() -> tuple[set[str], str, str]:
    """The execution providers this machine's onnxruntime offers (plugin EPs whose module is
    installed included), its version and the distribution that installed it."""
    from importlib import metadata
    from importlib.util import find_spec

    missing = [m for m in RUNTIME_MODULES if find_spec(m) is None]
    if missing:
        raise UsageError(f"running the image's runtime here needs {', '.join(missing)}: pip install "
                         "'gpux-pack[serve]' (onnxruntime-gpu instead of onnxruntime for CUDA)")  # fmt: skip
    import onnxruntime as ort

    eps = set(ort.get_available_providers())
    eps |= {p.ep for p in providers.PROVIDERS.values() if p.plugin and find_spec(p.plugin) is not None}
    dist = "onnxruntime"
    for name in dict.fromkeys(p.ort for p in providers.PROVIDERS.values()):
        try:
            if metadata.version(name) == ort.__version__:
                dist = name
                break
        except metadata.PackageNotFoundError:
            continue
    return eps, ort.__version__, dist


def present(device: providers.Device, dev: Path = Path("/dev"), sys_drm: Path = Path("/sys/class/drm")) -> bool:
    """This machine has the device: its device files (/dev/kfd, /dev/dri), or for a device
    containers get through --gpus (NVIDIA's), its driver's control file. /dev/dri alone is any
    vendor's GPU (a virtual one too): an Intel GPU is one whose DRM card says vendor 0x8086, the
    rule `build` applies to the Docker host."""
    if device.devices:
        if not all((dev / Path(d).relative_to("/dev")).exists() for d in device.devices):
            return False
        if device.host_field == "intel_gpu":
            from gpux_pack.engine import host_from

            return host_from({}, dev, sys_drm).intel_gpu
        return True
    return (dev / "nvidiactl").exists() or os.path.exists("/proc/driver/nvidia/version")


def host_provider(loaded: build.Loaded, flag: str | None) -> tuple[providers.Provider, str, str]:
    """--provider, else gpux.yml's, else (auto) the first accelerator this machine's onnxruntime
    offers, in the device table's order. A provider it lacks is one line, never a silent CPU."""
    cfg = loaded.project.config
    decision = providers.decide(providers.parse_provider_list(flag), list(cfg.pack.providers),
                                cfg.runtime.gpu.backend, None)  # fmt: skip
    eps, version, dist = offered()
    if decision.from_host:
        for device in providers.DEVICES.values():
            row = providers.get(device.auto, cuda=cfg.pack.cuda)
            if row.ep in eps and present(device):
                return row, f"auto: this machine has an {device.name} device and its onnxruntime {version} " \
                            f"({dist}) offers {row.ep}", version  # fmt: skip
        return providers.get("cpu"), f"auto: no accelerator that this machine's onnxruntime {version} ({dist}) " \
                                     "can use, so cpu", version  # fmt: skip
    if len(decision.providers) > 1:
        raise UsageError(f"{decision.reason}: this machine serves one provider at a time; choose one with --provider")
    row = providers.get(decision.providers[0], cuda=cfg.pack.cuda)
    if row.ep not in eps:
        raise UsageError(f"{decision.reason}, but this machine's onnxruntime {version} ({dist}) has no {row.ep}; "
                         f"install {row.pip_requirement}{' and ' + row.plugin.replace('_', '-') if row.plugin else ''}"
                         f" here, or use --provider cpu")  # fmt: skip
    return row, decision.reason, version


def stage(path: Path, flag: str | None, folder: Path, ui: Reporter) -> Staged:
    """gpux.json as the image would hold it, for this machine's onnxruntime, in `folder`; the
    model stays where it is."""
    loaded = build.load(path)
    row, reason, version = host_provider(loaded, flag)
    plan = build.plan_for(loaded, row.name, reason, Options(), None, Reporter(quiet=True), pull=False)  # no base: no news
    spec = with_lock(plan, Lock(plan.target, plan.requirements, (Pin(row.ort, version, frozenset()),))).gpux_json
    spec["model"]["path"] = str(loaded.model.path)  # absolute: the runtime joins it to gpux.json's folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpux.json").write_text(json.dumps(spec, indent=2, sort_keys=True, allow_nan=False))
    model_dir = loaded.model.path.parent
    watched = (loaded.project.config_path, *(model_dir / name for name in loaded.model.files))
    cfg = loaded.project.config
    host = cfg.serving.host if "host" in cfg.serving.model_fields_set else "127.0.0.1"
    return Staged(folder, row.name, reason, watched, spec, host)


def snapshot(paths: tuple[Path, ...]) -> tuple[Any, ...]:
    """What tells a file changed: an editor's atomic replace changes the inode, a write the
    size or mtime."""
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


class Server:
    """The runtime in a child process: a reload is a clean restart (ONNX Runtime's native state
    goes with the process), and Ctrl-C reaches it as it reaches an image's."""

    def __init__(self, staged: Staged, host: str, port: int | None):
        self.staged = staged
        env = {**os.environ, **staged.env(GPUX_HOST=host)}
        if port is not None:
            env["GPUX_PORT"] = str(port)
        self.port = port or int(staged.spec["serving"]["port"])
        self.process = subprocess.Popen([sys.executable, "-m", "gpux_pack.runtime", "serve"], env=env)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # drain in-flight requests, as `docker stop` does
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def serve(path: Path, flag: str | None, host: str | None, port: int | None, ui: Reporter) -> int:
    """Serve until Ctrl-C (or SIGTERM): 0 when stopped so, else the server's exit code. host:
    --host, else gpux.yml's serving.host, else 127.0.0.1."""
    with tempfile.TemporaryDirectory(prefix="gpux-serve-") as tmp:
        staged = stage(path, flag, Path(tmp) / "0", ui)
        host = host or staged.host
        server: Server | None = None
        seen, pending = snapshot(staged.watched), None
        idle = threading.Event()  # never set: a wait that a signal interrupts
        generation = 0
        try:  # from the child's start: a signal at any point after it stops it
            server = Server(staged, host, port)
            ui.info(f"serving {staged.spec['name']} with {staged.provider} ({staged.reason}) on "
                    f"http://{host if ':' not in host else f'[{host}]'}:{server.port}; reloads when "
                    f"{', '.join(p.name for p in staged.watched)} change; Ctrl-C stops")  # fmt: skip
            while True:
                if server is None:
                    idle.wait(POLL_SECONDS)
                else:
                    try:
                        code = server.process.wait(POLL_SECONDS)
                    except subprocess.TimeoutExpired:
                        code = None
                    if code is not None:  # it stopped by itself (a port in use, a model ORT refused): its line is above
                        if generation == 0:
                            return code
                        ui.warn(f"the server stopped (exit {code}); waiting for the next change")
                        server = None
                now = snapshot(staged.watched)
                if now == seen or now != pending:  # unchanged, or changed since the last look: still being written
                    pending = None if now == seen else now
                    continue
                changed = [p.name for p, a, b in zip(staged.watched, seen, now) if a != b]
                seen, pending = now, None
                generation += 1
                try:
                    fresh = stage(path, flag, Path(tmp) / str(generation), ui)
                except PackError as e:
                    ui.warn(f"not reloaded, still serving the last good version: {' '.join(str(e).splitlines())}")
                    continue
                ui.info(f"reloading: {', '.join(changed)} changed")
                if server is not None:
                    server.stop()
                if fresh.watched != staged.watched:  # else `now`, read before staging: a write since is news
                    seen = snapshot(fresh.watched)
                staged, server = fresh, Server(fresh, host, port)
        except KeyboardInterrupt:
            ui.info("stopping (in-flight requests drain)")
            if server is not None:
                server.stop()
            return 0
