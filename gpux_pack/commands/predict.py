"""`gpux-pack predict IMAGE|PATH --input name=FILE`: one inference, printed or saved.

A PATH (a project folder or its gpux.yml) is staged as `serve` stages it, then the image's
runtime runs as a program on this machine (`python -m gpux_pack.runtime predict --request FILE`,
or `bench` for --benchmark): the KServe v2 request made here, its checks, preprocessing and
answer the runtime's own, as /predict answers. An IMAGE is asked over KServe v2 with binary
tensors (every datatype, strings included): a container of it already running with a published
port, else a fresh one started as `gpux-pack run` starts it, removed after.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from gpux_pack import engine
from gpux_pack.engine import containers, image_labels
from gpux_pack.engine.interface import Container, Engine
from gpux_pack.errors import PackError, UsageError
from gpux_pack.inference import (Given, PredictError, Request, decode, encode, inputs_of, inputs_of_metadata, to_json,
                                 typed)
from gpux_pack.pipeline import local
from gpux_pack.ui import Reporter

MAX_RESPONSE_BYTES = 1 << 31  # what one answer may hold before it is refused (2 GiB)
MEDIA = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".wav"})  # name=FILE as its bytes
MAX_MEDIA_BYTES = 64 << 20  # an image's default request body limit (GPUX_MAX_BODY_BYTES)
ANSWERED_BESIDE = ("labels", "predicted", "letterbox")  # what /predict answers beside the outputs: JSON only


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


RUNTIME = (sys.executable, "-m", "gpux_pack.runtime")  # the image's entrypoint, run as the image runs it
_INPUT_NAMED = re.compile(r"^input '(?P<name>[^']*)': ")


def named(message: str, given: list[Given]) -> str:
    """The runtime's message with the input it names ("input 'x': ...") said as the --input that
    gave it, as the user wrote it."""
    m = _INPUT_NAMED.match(message)
    source = next((g.source for g in given if m and g.name == m["name"]), None)
    return message if source is None else f"{source}: {message[m.end():]}"


def _request(staged: local.Staged, given: list[Given]) -> list[str]:
    """The inputs as one v2 request, in a file beside the staged gpux.json: the runtime's
    arguments that name it."""
    request = encode(inputs_of(staged.spec), given)
    file = staged.folder / "request.bin"
    file.write_bytes(request.body)
    return ["--request", str(file), "--header-length", str(request.header_length)]


def _runtime(staged: local.Staged, args: list[str], given: list[Given], ui: Reporter) -> bytes:
    """The image's runtime run as a program on the staged project: its stdout. A refusal of the
    inputs (exit 2) is a PredictError with the runtime's line, any other failure a PackError."""
    env = {**os.environ, **staged.env(GPUX_LOG_LEVEL="warning")}
    proc = subprocess.run([*RUNTIME, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True)
    lines = [line for line in proc.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    if proc.returncode == 0:
        for line in lines:  # the runtime's warnings (a provider that fell back to CPU, ...)
            ui.info(line)
        return proc.stdout
    last = lines[-1].removeprefix("gpux: ") if lines else f"the image's runtime exited with {proc.returncode}"
    if proc.returncode == 2:
        raise PredictError(named(last, given))
    raise PackError(last)


def from_project(path: Path, flag: str | None, given: list[Given], ui: Reporter) -> dict[str, Any]:
    """The image's runtime on the project's model, on this machine: no Docker. Its answer is
    /predict's, each output an array of its declared type."""
    with tempfile.TemporaryDirectory(prefix="gpux-predict-") as tmp:
        staged = local.stage(path, flag, Path(tmp), ui)
        out = _runtime(staged, ["predict", *_request(staged, given)], given, ui)
        outputs = staged.spec.outputs
    try:
        answer = json.loads(out)
    except ValueError as e:
        raise PackError(f"the image's runtime printed no JSON answer: {e}") from None
    return typed(answer, outputs)


def predict(target: str, flag: str | None, given: list[Given], ui: Reporter, timeout: float, cpu_fallback: bool,
            pull: str) -> dict[str, Any]:
    """One inference: the image's runtime on this machine for a project (a folder or gpux.yml),
    else over KServe v2 for an image."""
    if not given:
        raise UsageError("--input: give the model's inputs (NAME=FILE, FILE.json or inline JSON)")
    if Path(target).exists():
        return from_project(Path(target), flag, given, ui)
    if target.startswith(("/", "./", "../", "~")) or target.endswith((".yml", ".yaml")):
        raise UsageError(f"{target}: no such file or folder")
    if flag:
        raise UsageError("--provider: an image serves with its own provider")
    return from_image(target, given, ui, timeout, cpu_fallback, pull)


def benchmark(target: str, flag: str | None, given: list[Given], runs: int, warmup: int,
              ui: Reporter) -> dict[str, Any]:
    """GPUX's `run --benchmark`: the project's model on this machine's onnxruntime and provider
    (the image's runtime, `bench`), `warmup` untimed runs, then `runs` timed ones (the --input
    given, else the inputs the image's warmup makes). GPUX's keys: <statistic>_time_ms and
    throughput_fps (1 / mean)."""
    if not Path(target).exists():
        raise UsageError(f"{target}: --benchmark times a project's model on this machine; for an image, "
                         "gpux-pack bench IMAGE")
    with tempfile.TemporaryDirectory(prefix="gpux-predict-") as tmp:
        staged = local.stage(Path(target), flag, Path(tmp), ui)
        args = ["bench", "--runs", str(runs), "--warmup", str(warmup), *(_request(staged, given) if given else ())]
        out = _runtime(staged, args, given, ui)
    try:
        result = json.loads(out)
        stats = {k: v for k, v in result.items() if k.endswith("_time_ms")}
        return {**stats, "throughput_fps": result["throughput_fps"], "runs": result["runs"], "warmup": result["warmup"],
                "provider": result["provider"] or staged.provider, "reason": staged.reason, "inputs": result["inputs"]}
    except (ValueError, KeyError, AttributeError) as e:
        raise PackError(f"the image's runtime printed no benchmark: {type(e).__name__}: {e}") from None


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
        where = f"{url}/v2/models/{image.model_name}"
        request = encode(inputs_of_metadata(_get(where), where), given)
        return infer(url, image.model_name, request, given, timeout)
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


def infer(url: str, name: str, request: Request, given: list[Given], timeout: float) -> dict[str, Any]:
    """One v2 infer, every input and output as binary data (KServe's binary extension)."""
    http = urllib.request.Request(f"{url}/v2/models/{name}/infer", data=request.body, method="POST",
                                  headers={"Content-Type": "application/octet-stream",
                                           "Inference-Header-Content-Length": str(request.header_length)})
    try:
        with urllib.request.urlopen(http, timeout=timeout) as r:
            body = r.read(MAX_RESPONSE_BYTES + 1)
            length = r.headers.get("Inference-Header-Content-Length")
    except urllib.error.HTTPError as e:
        raise _refused(e, given) from None
    except (OSError, ValueError) as e:
        raise PackError(f"{url}: {e}") from None
    if len(body) > MAX_RESPONSE_BYTES:
        raise PackError(f"{url}: the answer is larger than {MAX_RESPONSE_BYTES} bytes")
    return decode(body, length, url)


def _get(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise _refused(e, []) from None
    except (OSError, ValueError) as e:
        raise PackError(f"{url}: {e}") from None


def _refused(e: urllib.error.HTTPError, given: list[Given]) -> PackError:
    """The server's own one-line reason: a 4xx is the inputs' fault (exit 2)."""
    try:
        reason = json.loads(e.read(65536)).get("error") or e.reason
    except (ValueError, OSError, AttributeError):
        reason = e.reason
    message = f"the server answered {e.code}: {named(str(reason), given)}"
    return PredictError(message) if 400 <= e.code < 500 else PackError(message)


def save(outputs: dict[str, Any], output: Path | None) -> list[Path]:
    """Nothing (print as JSON), a .json file, or a folder of NAME.npy files."""
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
