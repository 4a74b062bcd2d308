"""The image's runtime on this machine, without Docker or an image (`serve PATH`, `predict PATH`):
the folder an image holds, staged from the same plan a build makes (gpux.json, the model read in
place), for the provider this machine's onnxruntime offers."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from gpux_pack import providers
from gpux_pack.errors import UsageError
from gpux_pack.pipeline import build
from gpux_pack.plan import Options, pinned
from gpux_pack.ui import Reporter
from gpux_pack.project.preprocess import download
from gpux_pack.runtime import contract
from gpux_pack.wheels import Pin

RUNTIME_MODULES = ("onnxruntime", "uvicorn", "orjson", "prometheus_client")  # what the image's runtime imports


@dataclass(frozen=True)
class Staged:
    """What `serve` and `predict PATH` run: the folder holding gpux.json, and why that provider."""

    folder: Path
    provider: str
    reason: str
    watched: tuple[Path, ...]  # gpux.yml and the model's files: a change reloads
    spec: contract.GpuxJson
    host: str = "127.0.0.1"  # gpux.yml's serving.host when it sets one: on this machine it applies

    def env(self, **extra: str) -> dict[str, str]:
        """The runtime's variables: this gpux.json, a private cache, this provider only."""
        return {"GPUX_CONFIG": str(self.folder / "gpux.json"), "GPUX_CACHE_DIR": str(self.folder / "cache"),
                "GPUX_PROVIDERS": self.provider, **extra}


def offered() -> tuple[set[str], str, str]:
    """The execution providers this machine's onnxruntime offers (plugin EPs whose module is
    installed included), its version and the distribution that installed it."""
    from importlib import metadata
    from importlib.util import find_spec

    missing = [m for m in RUNTIME_MODULES if find_spec(m) is None]
    if missing:
        raise UsageError(f"running the image's runtime here needs {', '.join(missing)}: pip install "
                         "'gpux-pack[serve]' (onnxruntime-gpu instead of onnxruntime for CUDA)")
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
                                cfg.runtime.gpu.backend, None)
    eps, version, dist = offered()
    if decision.from_host:
        for device in providers.DEVICES.values():
            row = providers.get(device.auto, cuda=cfg.pack.cuda)
            if row.ep in eps and present(device):
                return row, f"auto: this machine has an {device.name} device and its onnxruntime {version} " \
                            f"({dist}) offers {row.ep}", version
        return providers.get("cpu"), f"auto: no accelerator that this machine's onnxruntime {version} ({dist}) " \
                                     "can use, so cpu", version
    if len(decision.providers) > 1:
        raise UsageError(f"{decision.reason}: this machine serves one provider at a time; choose one with --provider")
    row = providers.get(decision.providers[0], cuda=cfg.pack.cuda)
    if row.ep not in eps:
        raise UsageError(f"{decision.reason}, but this machine's onnxruntime {version} ({dist}) has no {row.ep}; "
                         f"install {row.pip_requirement}{' and ' + row.plugin.replace('_', '-') if row.plugin else ''}"
                         f" here, or use --provider cpu")
    return row, decision.reason, version


def stage(path: Path, flag: str | None, folder: Path, ui: Reporter) -> Staged:
    """gpux.json as the image would hold it, for this machine's onnxruntime, in `folder`; the
    model stays where it is."""
    loaded = build.load(path)
    row, reason, version = host_provider(loaded, flag)
    done = build.optimized(loaded, row.name, Options(), ui)  # pack.optimize: the model the image would serve
    plan = build.plan_for(loaded, row.name, reason, Options(), None, Reporter(quiet=True), pull=False,  # no base: no news
                          resolve=pinned(Pin(row.ort, version, frozenset())), optimized=done)
    spec = plan.gpux_json
    # absolute: the runtime joins it to gpux.json's folder
    spec = spec._replace(model=spec.model._replace(path=str(plan.model.path)))
    text = loaded.signature.text
    if text is not None and spec.preprocessing and spec.preprocessing.text:
        # the tokenizer.json where it is (downloaded first when nothing here has it)
        text = text if text.tokenizer.path is not None else download(text)
        steps = spec.preprocessing
        spec = spec._replace(preprocessing=steps._replace(text=steps.text._replace(file=str(text.tokenizer.path))))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpux.json").write_text(json.dumps(spec.to_json(), indent=2, sort_keys=True, allow_nan=False))
    model_dir = loaded.model.path.parent
    watched = (loaded.project.config_path, *(model_dir / name for name in loaded.model.files))
    cfg = loaded.project.config
    host = cfg.serving.host if "host" in cfg.serving.model_fields_set else "127.0.0.1"
    return Staged(folder, row.name, reason, watched, spec, host)
