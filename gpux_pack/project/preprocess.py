"""gpux.yml's `preprocessing` against the model: what the image does to a request before the
graph sees it.

Text: `tokenizer` names a Hugging Face tokenizer; when the graph has token inputs (input_ids,
and attention_mask / token_type_ids when it takes them, or the names `token_inputs` gives), the
image accepts a string input (gpux.yml's string input that the graph lacks, else `text`),
tokenizes it with the `tokenizers` library and feeds them. A request may still send the token
inputs themselves. GPUX's published files also set a tokenizer on models without token inputs:
there it is a note, not a refusal, as GPUX read them.

Where the tokenizer.json comes from is decided here (a file in the project, then the Hugging
Face cache); a download from the Hub, when neither has it, is the build's (never the image's)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpux_pack.errors import UsageError
from gpux_pack.project.config import TensorSpec
from gpux_pack.project.load import Project
from gpux_pack.runtime import contract

ROLES = ("input_ids", "attention_mask", "token_type_ids")  # the token inputs, by their usual names
TOKEN_TYPES = ("int64", "int32")
DEFAULT_INPUT = "text"
DEFAULT_MAX_LENGTH = 512  # BERT's, when neither gpux.yml nor the graph says
TOKENIZER_FILE = "tokenizer.json"
MAX_TOKENIZER_BYTES = 64 << 20  # a tokenizer.json is a few MB; a larger file is not one
# a Hugging Face repository id: [owner/]name, as the Hub allows them
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


@dataclass(frozen=True)
class Tokenizer:
    """Where the image's tokenizer.json comes from."""

    name: str  # as gpux.yml gives it
    path: Path | None = None  # a local file: the project's, or the Hugging Face cache's
    repo: str | None = None  # neither has it: the build downloads it from this Hub repository
    source: str = "project"  # project | huggingface-cache | download

    def shown(self) -> str:
        return f"{self.name} ({self.source}: {self.path})" if self.path else f"{self.name} (download from {self.repo})"


@dataclass(frozen=True)
class TextStep:
    """The text step: tokenize the request's string input into the graph's token inputs."""

    input: str  # the request's string input
    tokenizer: Tokenizer
    feeds: tuple[tuple[str, str, str], ...]  # (role, the graph's input, its type), input_ids first
    max_length: int  # tokens kept (truncation) and, with padding max_length, padded to
    padding: str  # longest (to the longest text of the request) | max_length | none
    truncation: bool
    length: int | None = None  # the graph fixes the sequence length: every text is padded to it
    batch: int | None = None  # the graph fixes the batch dimension: at most this many texts a request

    def served(self, file: str) -> contract.TextStep:
        """gpux.json's preprocessing.text; file: the tokenizer.json in the image (from the app folder)."""
        return contract.TextStep(self.input, file, self.max_length, self.padding, self.truncation,  # type: ignore[arg-type]
                                 self.length, self.batch, tuple(contract.Feed(*f) for f in self.feeds))


def text_step(project: Project, graph_inputs: tuple[TensorSpec, ...],
              notes: list[str]) -> tuple[TextStep | None, TensorSpec | None]:
    """The text step gpux.yml asks for and the graph allows (None, with a note, where it does not
    apply), and the string input requests send."""
    pre = project.config.preprocessing
    if pre is None or pre.tokenizer is None:
        return None, None
    by_name = {t.name: t for t in graph_inputs}
    names = {role: (pre.token_inputs or {}).get(role, role) for role in ROLES}
    ids = by_name.get(names["input_ids"])
    if ids is None:
        named = "preprocessing.token_inputs names it" if pre.token_inputs else "set preprocessing.token_inputs"
        notes.append(project.note(("preprocessing", "tokenizer"),
                                  f"not applied: the model has no token input '{names['input_ids']}' ({named} if "
                                  "it has another name); requests send the model's own inputs"))
        return None, None
    feeds = []
    for role in ROLES:
        spec = by_name.get(names[role])
        if spec is None:
            if role in (pre.token_inputs or {}):
                raise project.error(("preprocessing", "token_inputs", role),
                                    f"the model has no input '{names[role]}'")
            continue
        if spec.type not in TOKEN_TYPES or spec.shape is None or len(spec.shape) != 2:
            raise project.error(("preprocessing", "tokenizer"),
                                f"the model's token input '{spec.name}' is {spec.type} "
                                f"{list(spec.shape) if spec.shape is not None else 'of unknown shape'}; a tokenizer "
                                "feeds int64 or int32 inputs of shape [batch, sequence]")
        feeds.append((role, spec.name, spec.type))
    shapes = {by_name[n].shape for _, n, _ in feeds}
    if len(shapes) > 1:
        raise project.error(("preprocessing", "tokenizer"), "the model's token inputs differ in shape "
                                                            f"({', '.join(f'{n} {list(by_name[n].shape)}' for _, n, _ in feeds)})")
    batch, sequence = next(iter(shapes))
    length = sequence if isinstance(sequence, int) and sequence > 0 else None
    raw = _string_input(project, set(by_name))
    declared_length = raw.max_length if raw is not None else None
    max_length = pre.max_length or declared_length or length or DEFAULT_MAX_LENGTH
    if length is not None and max_length > length:
        where = ("preprocessing", "max_length") if pre.max_length else ("inputs",)
        raise project.error(where, f"{max_length} tokens, but the model's '{ids.name}' takes {length}")
    padding = {True: "longest", False: "none"}.get(pre.padding, pre.padding)  # type: ignore[arg-type]
    name = raw.name if raw is not None else DEFAULT_INPUT
    if name in by_name:
        raise project.error(("preprocessing", "tokenizer"),
                            f"the model has an input '{name}' already; declare the text input under another name")
    step = TextStep(input=name, tokenizer=Tokenizer(pre.tokenizer), feeds=tuple(feeds), max_length=max_length,
                    padding=padding, truncation=pre.truncation, length=length,
                    batch=batch if isinstance(batch, int) and batch > 0 else None)
    served = TensorSpec.model_construct(name=name, type="string", shape=None, required=False, max_length=max_length,
                                        labels=None, description=raw.description if raw is not None else
                                        "text, tokenized in the image")
    return step, served


def _string_input(project: Project, graph: set[str]) -> TensorSpec | None:
    """gpux.yml's input that the graph lacks: the text requests send (GPUX's top-level example)."""
    extra = [t for t in project.config.inputs or () if t.name not in graph]
    for t in extra:
        if t.type not in (None, "string"):
            index = (project.config.inputs or []).index(t)
            raise project.error(("inputs", index), f"the model has no input '{t.name}', and only a string input "
                                                   f"can be the text the tokenizer reads (this one is {t.type})")
    if len(extra) > 1:
        raise project.error(("inputs",), f"the model lacks {', '.join(t.name for t in extra)}; one string input "
                                         "(the text the tokenizer reads) may be declared beside its own inputs")
    return extra[0] if extra else None


def locate(project: Project, step: TextStep, contained: bool) -> TextStep:
    """Where its tokenizer.json is: preprocessing.tokenizer as a file (relative to gpux.yml),
    tokenizer.json beside the model, the user's Hugging Face cache; else downloaded at build."""
    name = step.tokenizer.name
    folder = project.config_path.parent
    as_path = Path(os.path.expanduser(name))
    candidates = []
    if name.endswith(".json") or as_path.is_absolute() or name.startswith("."):
        candidates.append((folder / as_path, ("preprocessing", "tokenizer")))
    else:
        candidates.append((project.model_path.parent / TOKENIZER_FILE, ("model", "source")))
    for path, where in candidates:
        if path.is_file():
            real = Path(os.path.realpath(path))
            if contained and not real.is_relative_to(Path(os.path.realpath(folder))):
                raise project.error(where, f"{path} resolves outside the project folder (--contained)")
            return replace(step, tokenizer=Tokenizer(name, real, source="project"))
        if where == ("preprocessing", "tokenizer"):
            raise project.error(where, f"file not found: {path}")
    if not _REPO_ID.match(name) or ".." in name:
        raise project.error(("preprocessing", "tokenizer"),
                            f"{name!r} is neither a tokenizer.json file nor a Hugging Face repository id")
    cached = huggingface_cached(name)
    if cached is not None:
        return replace(step, tokenizer=Tokenizer(name, cached, source="huggingface-cache"))
    return replace(step, tokenizer=Tokenizer(name, repo=name, source="download"))


def huggingface_cached(repo: str) -> Path | None:
    """tokenizer.json of this repository in the Hugging Face cache (HF_HOME, HF_HUB_CACHE), if there."""
    from huggingface_hub import try_to_load_from_cache  # only projects with a tokenizer pay for its import

    found = try_to_load_from_cache(repo, TOKENIZER_FILE)
    return Path(found) if isinstance(found, str) else None


def download(step: TextStep, cache_dir: Path | None = None) -> TextStep:
    """Fetch the tokenizer.json a build needs from the Hugging Face Hub into the user's Hugging
    Face cache (HF_ENDPOINT, HF_TOKEN and proxies as huggingface_hub reads them). Never at start."""
    from huggingface_hub import hf_hub_download  # only projects with a tokenizer pay for its import

    repo = step.tokenizer.repo or step.tokenizer.name
    try:
        path = hf_hub_download(repo, TOKENIZER_FILE, cache_dir=cache_dir, etag_timeout=10)
    except Exception as e:  # offline, a missing repository or file, a gated one: the same advice
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UsageError(f"preprocessing.tokenizer: cannot download {TOKENIZER_FILE} of '{repo}' from the "
                              f"Hugging Face Hub ({first}); put it beside the model, or set "
                              "preprocessing.tokenizer to its path") from None
    return replace(step, tokenizer=Tokenizer(step.tokenizer.name, Path(path), source="download"))


SAMPLE_TEXT = "Checking the tokenizer: Hello, World! 42 qzxjvk \u00fcn\u00efc\u00f8d\u00e9 \u2603"  # words outside any vocabulary too


def read_tokenizer(step: TextStep) -> bytes:
    """The tokenizer.json's bytes, checked: JSON with a tokenizer model in it, and within
    MAX_TOKENIZER_BYTES; loaded with the `tokenizers` library when this machine has it."""
    path = step.tokenizer.path
    if path is None:
        raise UsageError(f"preprocessing.tokenizer: {step.tokenizer.name} was not downloaded")
    try:
        size = path.stat().st_size
        if size > MAX_TOKENIZER_BYTES:
            raise UsageError(f"{path}: {size} bytes; a tokenizer.json of more than {MAX_TOKENIZER_BYTES} "
                                  "is not one")
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not a tokenizer.json (not JSON: {e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise UsageError(f"{path}: not a tokenizer.json of the `tokenizers` library (no \"model\")")
    try:
        from tokenizers import Tokenizer as Loader  # where the host has it, the image's own check
    except ImportError:
        return data
    try:
        loaded = Loader.from_str(data.decode())
    except Exception as e:
        raise UsageError(f"{path}: the tokenizers library cannot load it: "
                              f"{(str(e).splitlines() or [type(e).__name__])[0][:200]}") from None
    try:  # what every request does: a tokenizer that loads can still refuse each text (a WordLevel without its unk_token)
        loaded.encode_batch([SAMPLE_TEXT], add_special_tokens=True)
    except Exception as e:
        raise UsageError(f"{path}: the tokenizers library loads it but cannot encode a sample text "
                         f"({ascii(SAMPLE_TEXT)}): {(str(e).splitlines() or [type(e).__name__])[0][:200]}") from None
    return data


# ---------------------------------------------------------------------------------------------
# images

IMAGE_KEYS = ("resize", "crop", "normalize", "custom", "letterbox")
IMAGE_INPUT = "image"  # GPUX's documented request: {"image": "<base64>", "format": "jpeg"}
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # after / 255, as GPUX's guide computes
IMAGE_TYPES = ("float32", "float16", "float64", "uint8")
LETTERBOX_PAD = 114  # Ultralytics' gray: the value letterbox pads with, in every channel


@dataclass(frozen=True)
class ImageStep:
    """The image step: decode (Pillow), orient, RGB, resize or letterbox, crop, scale, normalize,
    lay out as the graph's image input takes it."""

    input: str  # the request's encoded-image input
    feed: str  # the graph's image input
    dtype: str
    layout: str  # NCHW | NHWC
    size: tuple[int, int]  # (width, height) fed
    resize: tuple[int, int] | None  # (width, height) before a crop
    crop: tuple[int, int] | None  # (width, height), centred
    letterbox: bool
    scale: float  # 1/255 for float inputs; 1 for uint8 ones (raw pixels)
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None
    batch: int | None = None  # the graph fixes the batch dimension

    def served(self) -> contract.ImageStep:
        """gpux.json's preprocessing.image."""
        return contract.ImageStep(self.input, self.feed, self.dtype, self.layout, self.size,  # type: ignore[arg-type]
                                  self.resize, self.crop, self.letterbox, LETTERBOX_PAD, self.scale, self.mean,
                                  self.std, self.batch)


def image_step(project: Project, graph_inputs: tuple[TensorSpec, ...], notes: list[str],
               taken: set[str]) -> tuple[ImageStep | None, TensorSpec | None]:
    """The image step gpux.yml asks for and the graph allows, and the input requests send images
    on: `image`, or `image_bytes` when the graph's own input is named image."""
    pre = project.config.preprocessing
    if pre is None or not any(getattr(pre, k) not in (None, False) for k in IMAGE_KEYS):
        return None, None
    where = next(("preprocessing", k) for k in IMAGE_KEYS if getattr(pre, k) not in (None, False))
    candidates = [t for t in graph_inputs if t.required and t.type in IMAGE_TYPES and t.shape is not None
                  and len(t.shape) == 4 and 3 in (t.shape[1], t.shape[3])]
    if not candidates:
        notes.append(project.note(where, "not applied: the model has no image input (rank 4 with 3 channels, "
                                         "NCHW or NHWC); requests send the model's own tensors"))
        return None, None
    feed = candidates[0]
    if len(candidates) > 1:
        notes.append(project.note(where, f"the model has {len(candidates)} image inputs; images feed "
                                         f"'{feed.name}'"))
    shape = feed.shape
    layout = "NCHW" if shape[1] == 3 else "NHWC"
    h, w = (shape[2], shape[3]) if layout == "NCHW" else (shape[1], shape[2])
    fixed = (w, h) if all(isinstance(d, int) and d > 0 for d in (w, h)) else None
    custom = pre.custom or {}
    unknown = set(custom) - {"mean", "std", "resize", "crop"}
    if unknown:
        raise project.error(("preprocessing", "custom"), f"unknown key {sorted(unknown)[0]!r} (expected mean, std, "
                                                         "resize, crop)")
    resize = _size(project, ("preprocessing", "resize"), pre.resize) or _size(project, ("preprocessing", "custom",
                                                                                        "resize"), custom.get("resize"))
    crop = _size(project, ("preprocessing", "crop"), pre.crop) or _size(project, ("preprocessing", "custom", "crop"),
                                                                       custom.get("crop"))
    if pre.letterbox and crop:
        raise project.error(("preprocessing", "letterbox"), "letterbox keeps the whole image: it cannot be cropped too")
    size = crop or resize or fixed
    if size is None:
        raise project.error(where, f"the model's '{feed.name}' does not fix its height and width: set "
                                   "preprocessing.resize: [width, height]")
    if fixed is not None and size != fixed:
        raise project.error(("preprocessing", "crop" if crop else "resize"),
                            f"{list(size)} (width, height), but the model's '{feed.name}' takes {list(fixed)}")
    if crop and resize and (crop[0] > resize[0] or crop[1] > resize[1]):
        raise project.error(("preprocessing", "crop"), f"{list(crop)} is larger than the resize {list(resize)}")
    normalize = (pre.normalize or ("custom" if "mean" in custom or "std" in custom else "none")).lower()
    if normalize not in ("imagenet", "none", "custom"):
        raise project.error(("preprocessing", "normalize"), f"{pre.normalize!r}: expected imagenet, none (pixels / 255 "
                                                            "only) or custom (preprocessing.custom's mean and std)")
    mean = std = None
    if normalize == "imagenet":
        mean, std = IMAGENET
    elif normalize == "custom":
        mean, std = _triple(project, "mean", custom.get("mean")), _triple(project, "std", custom.get("std"))
        if any(s <= 0 for s in std):
            raise project.error(("preprocessing", "custom", "std"), "every value must be above 0")
    if feed.type == "uint8" and mean is not None:
        raise project.error(("preprocessing", "normalize"), f"the model's '{feed.name}' is uint8 (raw pixels): it "
                                                            "cannot be normalized")
    name = IMAGE_INPUT if IMAGE_INPUT not in {t.name for t in graph_inputs} | taken else f"{IMAGE_INPUT}_bytes"
    batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else None
    step = ImageStep(input=name, feed=feed.name, dtype=feed.type, layout=layout, size=size,
                     resize=None if pre.letterbox else (resize or (size if not crop else None)),
                     crop=crop, letterbox=pre.letterbox, scale=1.0 if feed.type == "uint8" else 1 / 255,
                     mean=mean, std=std, batch=batch)
    served = TensorSpec.model_construct(name=name, type="string", shape=None, required=False, max_length=None,
                                        labels=None, description="an encoded image (JPEG, PNG, WebP, BMP, GIF, "
                                                                 "TIFF), decoded and preprocessed in the image")
    return step, served


def _size(project: Project, where: tuple[str, ...], value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 16384 for v in value)):
        raise project.error(where, f"{value!r}: expected [width, height], two sizes from 1 to 16384")
    return int(value[0]), int(value[1])


def _triple(project: Project, key: str, value: Any) -> tuple[float, float, float]:
    if (not isinstance(value, (list, tuple)) or len(value) != 3
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e6 for v in value)):
        raise project.error(("preprocessing", "custom", key), f"{value!r}: expected three numbers (R, G, B)")
    return float(value[0]), float(value[1]), float(value[2])


# ---------------------------------------------------------------------------------------------
# audio

AUDIO_KEYS = ("sample_rate", "n_mels", "n_fft", "hop_length", "chunk_length")
AUDIO_INPUT = "audio"  # GPUX's documented request: {"audio": "<base64>", "sample_rate": 16000, "format": "wav"}
WHISPER = {"sample_rate": 16000, "n_mels": 80, "n_fft": 400, "hop_length": 160, "chunk_length": 30.0}
MEL_NAMES = ("mel", "input_features", "features", "log_mel")  # the graph's spectrogram input, by its usual names


@dataclass(frozen=True)
class AudioStep:
    """The audio step: decode WAV, down-mix, resample, pad or cut to chunk_length, and a
    Whisper-style log-mel spectrogram of the graph's [batch, n_mels, frames] input."""

    input: str
    feed: str
    dtype: str
    sample_rate: int
    n_mels: int
    n_fft: int
    hop_length: int
    samples: int  # chunk_length x sample_rate: every clip is padded with silence or cut to this
    frames: int  # samples // hop_length (Whisper drops the STFT's last frame)
    batch: int | None = None

    def served(self) -> contract.AudioStep:
        """gpux.json's preprocessing.audio."""
        return contract.AudioStep(self.input, self.feed, self.dtype, self.sample_rate, self.n_mels, self.n_fft,
                                  self.hop_length, self.samples, self.frames, self.batch)


def audio_step(project: Project, graph_inputs: tuple[TensorSpec, ...], notes: list[str],
               taken: set[str]) -> tuple[AudioStep | None, TensorSpec | None]:
    """The audio step gpux.yml asks for and the graph allows, and the input requests send WAV on."""
    pre = project.config.preprocessing
    if pre is None or not any(getattr(pre, k) is not None for k in AUDIO_KEYS):
        return None, None
    where = next(("preprocessing", k) for k in AUDIO_KEYS if getattr(pre, k) is not None)
    candidates = [t for t in graph_inputs if t.required and t.type in ("float32", "float16", "float64")
                  and t.shape is not None and len(t.shape) == 3
                  and (pre.n_mels is None or t.shape[1] in (pre.n_mels, -1) or isinstance(t.shape[1], str))]
    candidates.sort(key=lambda t: t.name not in MEL_NAMES)
    if not candidates:
        notes.append(project.note(where, "not applied: the model has no spectrogram input ([batch, n_mels, frames], "
                                         "float); requests send the model's own tensors"))
        return None, None
    feed = candidates[0]
    fixed_mels = feed.shape[1] if isinstance(feed.shape[1], int) and feed.shape[1] > 0 else None
    n_mels = pre.n_mels or fixed_mels or WHISPER["n_mels"]
    sample_rate = pre.sample_rate or WHISPER["sample_rate"]
    n_fft = pre.n_fft or WHISPER["n_fft"]
    hop = pre.hop_length or WHISPER["hop_length"]
    chunk = pre.chunk_length or WHISPER["chunk_length"]
    samples = round(chunk * sample_rate)
    if samples > 3600 * 48000 or samples < n_fft:
        raise project.error(("preprocessing", "chunk_length"), f"{chunk} s at {sample_rate} Hz is {samples} samples; "
                                                               f"expected from n_fft ({n_fft}) to an hour at 48 kHz")
    if n_fft // 2 + 1 < n_mels:
        raise project.error(("preprocessing", "n_mels"), f"{n_mels} mel bands from n_fft {n_fft} "
                                                         f"({n_fft // 2 + 1} frequencies): raise n_fft")
    frames = samples // hop
    fixed_frames = feed.shape[2] if isinstance(feed.shape[2], int) and feed.shape[2] > 0 else None
    if fixed_frames is not None and fixed_frames != frames:
        raise project.error(where, f"{chunk:g} s at {sample_rate} Hz with hop_length {hop} makes {frames} frames, "
                                   f"but the model's '{feed.name}' takes {fixed_frames}")
    name = AUDIO_INPUT if AUDIO_INPUT not in {t.name for t in graph_inputs} | taken else f"{AUDIO_INPUT}_bytes"
    batch = feed.shape[0] if isinstance(feed.shape[0], int) and feed.shape[0] > 0 else None
    step = AudioStep(input=name, feed=feed.name, dtype=feed.type, sample_rate=sample_rate, n_mels=n_mels,
                     n_fft=n_fft, hop_length=hop, samples=samples, frames=frames, batch=batch)
    served = TensorSpec.model_construct(name=name, type="string", shape=None, required=False, max_length=None,
                                        labels=None, description="a WAV file (PCM 8/16/24/32-bit or float), turned "
                                                                 "into a log-mel spectrogram in the image")
    return step, served
