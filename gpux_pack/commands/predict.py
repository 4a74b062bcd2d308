"""`gpux-pack predict IMAGE|PATH --input name=FILE`: one inference, printed or saved.

A PATH (a project folder or its gpux.yml) runs in this process on the image's runtime (the
folder `serve` stages, Model.load, the runtime's own input checks). An IMAGE is asked over KServe
v2 with binary tensors (every datatype, strings included): a container of it already running
with a published port, else a fresh one started as `gpux-pack run` starts it, removed after.
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gpux_pack import engine
from gpux_pack.engine import containers
from gpux_pack.engine.interface import Container, Engine
from gpux_pack.pipeline import local
from gpux_pack.engine import image_labels
from gpux_pack.errors import PackError, UsageError
from gpux_pack.runtime.contract import BINARY_ONLY, DTYPES, V2_TO_NAME
from gpux_pack.runtime.tensors import (RequestError, ServedTensor, bf16_to_float32, check_shape, float32_to_bf16,
                                       from_binary, labelled, to_array, to_binary)
from gpux_pack.runtime.warmup import generated_inputs
from gpux_pack.runtime.v2 import split_binary
from gpux_pack.ui import Reporter

MAX_RESPONSE_BYTES = 1 << 31  # what one answer may hold before it is refused (2 GiB)
MEDIA = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".wav"})  # name=FILE as its bytes
MAX_MEDIA_BYTES = 64 << 20  # an image's default request body limit (GPUX_MAX_BODY_BYTES)
ANSWERED_BESIDE = ("labels", "predicted", "letterbox")  # what /predict answers beside the outputs: JSON only


class PredictError(PackError):
    """The model or server refused the inputs: exit 2, like any bad input."""

    exit_code = 2


@dataclass(frozen=True)
class Given:
    """One --input: a tensor's values from a .npy file (an array) or a .json file (nested lists)."""

    name: str
    value: Any
    source: str


def read_inputs(items: list[str]) -> list[Given]:
    """`name=FILE.npy`, `name=FILE.json`, `FILE.json` or `@FILE.json` holding {"name": values, ...},
    and, as GPUX's `run -i` takes them, inline JSON: `{"name": values}` or `name=[[1, 2]]`."""
    given: list[Given] = []
    for item in items:
        what = f"--input {_shown(item)}"
        if item.lstrip().startswith("{"):  # GPUX: -i '{"x": [[1, 2]]}'
            given += _inline(item, "", what)
            continue
        name, sep, file = item.partition("=")
        if not sep:
            name, file = "", item.removeprefix("@")  # GPUX: -i @file.json
        path = Path(file)
        if sep and not name:
            raise UsageError(f"{what}: expected NAME=VALUES")
        if path.suffix.lower() in MEDIA:  # an image or a WAV file for the model's preprocessing, as it is
            if not name:
                raise UsageError(f"{what}: write NAME={file} (the input the image or audio is for)")
            given.append(Given(name, _media(path, what), what))
            continue
        if path.suffix.lower() not in (".npy", ".json"):
            if sep:
                given += _inline(file, name, what)  # name=[[1, 2]]: inline JSON values
                continue
            raise UsageError(f"{what}: expected NAME=FILE.npy, NAME=FILE.json, FILE.json, @FILE.json, inline JSON "
                             "({\"NAME\": values}) or NAME=[values]")
        try:
            if path.suffix.lower() == ".npy":
                if not name:
                    raise UsageError(f"{what}: a .npy file holds one tensor: write NAME={file}")
                given.append(Given(name, np.load(path, allow_pickle=False), what))
                continue
            value = json.loads(path.read_bytes())
        except OSError as e:
            raise UsageError(f"{what}: {e.strerror or e}") from None
        except ValueError as e:  # not JSON, not .npy, or a .npy of Python objects (pickles are refused)
            raise UsageError(f"{what}: cannot read it: {' '.join(str(e).split())[:200]}") from None
        if name:
            given.append(Given(name, value, what))
        elif isinstance(value, dict) and value:
            given += [Given(str(k), v, what) for k, v in value.items()]
        else:
            raise UsageError(f"{what}: a JSON file without NAME= must hold an object of input names to values")
    return _once(given)


def _media(path: Path, what: str) -> bytes:
    """A media file's bytes, as a request would carry them (at most MAX_MEDIA_BYTES)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MEDIA_BYTES + 1)
    except OSError as e:
        raise UsageError(f"{what}: {e.strerror or e}") from None
    if len(data) > MAX_MEDIA_BYTES:
        raise UsageError(f"{what}: larger than {MAX_MEDIA_BYTES} bytes, an image's request body limit")
    return data


def _inline(text: str, name: str, what: str) -> list[Given]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{what}: expected NAME=FILE.npy, NAME=FILE.json or inline JSON such as NAME=[[1, 2]] "
                         f"(not JSON: {' '.join(str(e).split())[:120]})") from None
    if name:
        return [Given(name, value, what)]
    if not isinstance(value, dict) or not value:
        raise UsageError(f"{what}: inline JSON without NAME= must be an object of input names to values")
    return [Given(str(k), v, what) for k, v in value.items()]


def _shown(text: str) -> str:
    text = text if len(text) <= 300 else text[:280] + "..."  # a path in full; inline JSON may be long
    return text if text.isprintable() else ascii(text)


def _once(given: list[Given]) -> list[Given]:
    names = [g.name for g in given]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"--input: {', '.join(twice)} given more than once")
    return given


def feeds(specs: list[ServedTensor], given: list[Given]) -> dict[str, np.ndarray]:
    """The arrays to send, checked as the image's runtime checks a request (dtype, rank, fixed
    and named dimensions), so a mistake is found before any container starts."""
    by_name = {s.name: s for s in specs}
    out: dict[str, np.ndarray] = {}
    dims: dict[str, tuple[int, str]] = {}
    try:
        for g in given:
            spec = by_name.get(g.name)
            if spec is None:
                raise RequestError(f"{g.source}: the model has no input '{g.name}'; its inputs are: "
                                   f"{', '.join(by_name)}")
            arr = _array(spec, g.value, g.source)
            check_shape(spec, arr, g.source, dims)
            out[g.name] = arr
        missing = [s.name for s in specs if s.required and s.name not in out]
        if missing:
            raise RequestError(f"--input: missing {', '.join(missing)} (the model's inputs: {', '.join(by_name)})")
    except RequestError as e:
        raise PredictError(str(e)) from None
    return out


def _array(spec: ServedTensor, value: Any, what: str) -> np.ndarray:
    if spec.dtype in BINARY_ONLY:  # BF16: given as numbers, sent as its bit patterns
        try:
            floats = np.asarray(value, dtype=np.float32)
        except (ValueError, TypeError):
            raise RequestError(f"{what}: expected numbers for the {spec.datatype} input '{spec.name}'") from None
        return float32_to_bf16(floats)
    if isinstance(value, bytes):  # a media file for a preprocessing step's input
        if spec.dtype != "string":
            raise RequestError(f"{what}: '{spec.name}' takes {spec.dtype} values, not a file's bytes (the model "
                               "preprocesses no image or audio there)")
        return np.array([value], dtype=object)
    if not isinstance(value, np.ndarray):
        return to_array(spec, value, what)
    if spec.dtype == "string":
        if value.dtype.kind not in "USO":
            raise RequestError(f"{what}: the file holds {value.dtype} values; '{spec.name}' takes strings")
        return value.astype(object)
    target = np.dtype(DTYPES[spec.dtype][0])
    if value.dtype != target and not np.can_cast(value.dtype, target, "same_kind"):
        raise RequestError(f"{what}: the file holds {value.dtype} values; '{spec.name}' takes {spec.dtype}")
    return value.astype(target, copy=False)


@contextmanager
def _loaded(path: Path, flag: str | None, ui: Reporter) -> Iterator[tuple[Any, local.Staged]]:
    """The project staged as `serve` stages it, its model loaded by the image's runtime here."""
    from gpux_pack.runtime.session import Model, StartupError
    from gpux_pack.runtime.settings import Settings

    with tempfile.TemporaryDirectory(prefix="gpux-predict-") as tmp:
        staged = local.stage(path, flag, Path(tmp), ui)
        try:
            model = Model.load(Settings.load(staged.env(GPUX_LOG_LEVEL="warning")), warm_up=False)
        except StartupError as e:
            raise PackError(str(e)) from None
        yield model, staged


def in_process(path: Path, flag: str | None, given: list[Given], ui: Reporter) -> dict[str, Any]:
    """The image's runtime in this process on the project's model: no Docker."""
    with _loaded(path, flag, ui) as (model, _):
        arrays = feeds(model.inputs, given)
        try:
            arrays, extra = model.prepare(arrays)  # text tokenized, images decoded, as the image does
        except RequestError as e:
            raise PredictError(str(e)) from None
        try:
            outputs = readable(_run(model, arrays), model.outputs)
        except Exception as e:  # ONNX Runtime's own refusal of the values (an index out of range, ...)
            raise PredictError(f"the model refused the inputs: {' '.join(str(e).split())[:300]}") from None
        # as /predict answers: gpux.yml's labels and each row's top one, a letterbox's geometry
        return {**(labelled(outputs, model.labels) if model.labels else outputs), **extra}


def _run(model: Any, arrays: Any) -> dict[str, Any]:
    """One run, or one per item where the model takes one per run (Items), joined as one batch."""
    from gpux_pack.runtime.session import Items

    if not isinstance(arrays, Items):
        return model.run(arrays)
    answers = [model.run(one) for one in arrays]
    return {name: np.concatenate([a[name] for a in answers]) for name in answers[0]}


STATISTICS = ("mean", "std", "min", "max", "median", "p95", "p99")  # GPUX's `run --benchmark`, in ms


def predict(target: str, flag: str | None, given: list[Given], ui: Reporter, timeout: float, cpu_fallback: bool,
            pull: str) -> dict[str, Any]:
    """One inference: in this process for a project (a folder or gpux.yml), else over KServe v2 for an image."""
    if not given:
        raise UsageError("--input: give the model's inputs (NAME=FILE, FILE.json or inline JSON)")
    if Path(target).exists():
        return in_process(Path(target), flag, given, ui)
    if target.startswith(("/", "./", "../", "~")) or target.endswith((".yml", ".yaml")):
        raise UsageError(f"{target}: no such file or folder")
    if flag:
        raise UsageError("--provider: an image serves with its own provider")
    return from_image(target, given, ui, timeout, cpu_fallback, pull)


def benchmark(target: str, flag: str | None, given: list[Given], runs: int, warmup: int,
              ui: Reporter) -> dict[str, Any]:
    """GPUX's `run --benchmark`: the model in this process on this machine's onnxruntime and
    provider, `warmup` untimed runs, then `runs` timed ones (the --input given, else the inputs
    the image's warmup makes). GPUX's keys: <statistic>_time_ms and throughput_fps (1 / mean)."""
    import time

    if not Path(target).exists():
        raise UsageError(f"{target}: --benchmark times a project's model in this process; for an image, "
                         "gpux-pack bench IMAGE")
    with _loaded(Path(target), flag, ui) as (model, staged):
        arrays = feeds(model.inputs, given) if given else generated_inputs(model)[0]
        times = np.empty(runs)
        try:
            for _ in range(warmup):
                model.run(arrays)
            for i in range(runs):
                started = time.perf_counter()
                model.run(arrays)
                times[i] = time.perf_counter() - started
        except Exception as e:
            raise PredictError(f"the model refused the inputs: {' '.join(str(e).split())[:300]}") from None
    ms = times * 1000
    values = (ms.mean(), ms.std(), ms.min(), ms.max(), np.median(ms), np.percentile(ms, 95), np.percentile(ms, 99))
    out: dict[str, Any] = {f"{name}_time_ms": round(float(v), 4) for name, v in zip(STATISTICS, values)}
    out["throughput_fps"] = round(1000 / max(float(ms.mean()), 1e-9), 2)
    return {**out, "runs": runs, "warmup": warmup, "provider": model.active[0] if model.active else staged.provider,
            "reason": staged.reason, "inputs": {name: list(a.shape) for name, a in arrays.items()}}


def from_image(ref: str, given: list[Given], ui: Reporter, timeout: float,
               cpu_fallback: bool = False, pull: str = "missing") -> dict[str, Any]:
    """KServe v2 binary request to a running container of the image, or to a fresh one (the
    image pulled first as `docker run --pull` would)."""
    client = engine.connect()
    engine.ensure_image(client, ref, pull, ui.info)
    image = image_labels.read(client, ref)
    running = _running(client, image)
    started = None
    if running is None:
        ui.info(f"starting {ref} (no running container of it publishes port {image.port})")
        started = containers.start_container(client, ref, ui, cpu_fallback=cpu_fallback, timeout=timeout)
        url = started.url
    else:
        container, url = running
        containers.wait_ready(container, url, timeout)  # it may still be warming up
    try:
        meta = _get(f"{url}/v2/models/{image.model_name}")
        specs = [ServedTensor(t["name"], V2_TO_NAME.get(t["datatype"], t["datatype"]),
                            tuple(t["shape"])) for t in meta["inputs"]]
        return infer(url, image.model_name, feeds(specs, given), specs, timeout)
    finally:
        if started is not None:
            try:
                started.container.stop(timeout=15)
            finally:
                engine.remove_container(started.container)


def _running(client: Engine, image: image_labels.GpuxImage) -> tuple[Container, str] | None:
    """A running container of this image that publishes its port on this host, and its URL."""
    for container in client.containers.list(filters={"ancestor": image.id, "status": "running"}):
        for binding in (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).get(f"{image.port}/tcp") or ():
            if binding.get("HostIp") in ("", "0.0.0.0", "127.0.0.1", "::") and binding.get("HostPort"):
                return container, f"http://127.0.0.1:{binding['HostPort']}"
    return None


def infer(url: str, name: str, arrays: dict[str, np.ndarray], specs: list[ServedTensor],
          timeout: float) -> dict[str, Any]:
    """One v2 infer with every input and output as binary data (KServe's binary extension)."""
    kinds = {s.name: s for s in specs}
    blobs, inputs = [], []
    for key, arr in arrays.items():
        datatype = DTYPES[kinds[key].dtype][1]
        blob = to_binary(arr, datatype)
        blobs.append(blob)
        inputs.append({"name": key, "datatype": datatype, "shape": list(arr.shape),
                       "parameters": {"binary_data_size": len(blob)}})
    head = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    request = urllib.request.Request(f"{url}/v2/models/{name}/infer", data=head + b"".join(blobs), method="POST",
                                     headers={"Content-Type": "application/octet-stream",
                                              "Inference-Header-Content-Length": str(len(head))})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            body = r.read(MAX_RESPONSE_BYTES + 1)
            length = r.headers.get("Inference-Header-Content-Length")
    except urllib.error.HTTPError as e:
        raise _refused(e) from None
    except (OSError, ValueError) as e:
        raise PackError(f"{url}: {e}") from None
    if len(body) > MAX_RESPONSE_BYTES:
        raise PackError(f"{url}: the answer is larger than {MAX_RESPONSE_BYTES} bytes")
    doc, data = split_binary(body, length)
    out: dict[str, Any] = {}
    offset = 0
    for o in doc.get("outputs", []):
        shape = tuple(int(d) for d in o["shape"])
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is None:
            out[o["name"]] = np.asarray(o.get("data")).reshape(shape)
            continue
        spec = ServedTensor(o["name"], V2_TO_NAME.get(o["datatype"], o["datatype"]), shape)
        count = int(np.prod(shape, dtype=np.int64))
        out[o["name"]] = from_binary(spec, data[offset: offset + size], count, o["name"]).reshape(shape)
        offset += size
        if spec.dtype in BINARY_ONLY:
            out[o["name"]] = bf16_to_float32(out[o["name"]])
    return out


def readable(outputs: dict[str, Any], specs: list[ServedTensor]) -> dict[str, Any]:
    """The outputs as a user reads them: BF16 bit patterns as their float32 values."""
    kinds = {s.name: s.dtype for s in specs}
    return {k: bf16_to_float32(v) if kinds.get(k) in BINARY_ONLY else v for k, v in outputs.items()}


def _get(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise _refused(e) from None
    except (OSError, ValueError) as e:
        raise PackError(f"{url}: {e}") from None


def _refused(e: urllib.error.HTTPError) -> PackError:
    """The server's own one-line reason: a 4xx is the inputs' fault (exit 2)."""
    try:
        reason = json.loads(e.read(65536)).get("error") or e.reason
    except (ValueError, OSError, AttributeError):
        reason = e.reason
    message = f"the server answered {e.code}: {reason}"
    return PredictError(message) if 400 <= e.code < 500 else PackError(message)


def save(outputs: dict[str, Any], output: Path | None) -> list[Path]:
    """Nothing (print as JSON), a .json file, or a folder of NAME.npy files."""
    from gpux_pack.runtime.tensors import to_json

    if output is None:
        return []
    try:  # a folder that is a file, a parent that cannot be made: one line, not a traceback
        if output.suffix.lower() == ".json":
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(to_json(outputs), allow_nan=False))
            return [output]
        output.mkdir(parents=True, exist_ok=True)
        written = []
        for name, value in outputs.items():
            if name in ANSWERED_BESIDE and not isinstance(value, np.ndarray):
                continue  # labels, top labels, a letterbox's geometry: not tensors (--output FILE.json has them)
            safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).lstrip(".") or "output"
            target = output / f"{safe}.npy"
            arr = np.asarray(value)
            np.save(target, arr.astype(str) if arr.dtype == object else arr, allow_pickle=False)
            written.append(target)
        return written
    except OSError as e:
        raise UsageError(f"--output {output}: {e.strerror or e}") from None


def benchmark_lines(result: dict[str, Any]) -> list[str]:
    """`predict --benchmark` without --json."""
    out = [f"{result['runs']} runs after {result['warmup']} warmup runs on {result['provider']} ({result['reason']})"]
    out += [f"  {key[:-8]:<10} {value:>12.4f} ms" for key, value in result.items() if key.endswith("_time_ms")]
    out.append(f"  {'throughput':<10} {result['throughput_fps']:>12.2f} runs/s")
    return out
