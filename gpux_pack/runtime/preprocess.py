"""What the image does to a request before the graph sees it, as gpux.json says (the packager
decided it: gpux_pack/project/preprocess.py). Imported only by an image that preprocesses; the
libraries each step needs (tokenizers, Pillow) only by an image that takes that step.

Text: the request's string input, tokenized with Hugging Face's `tokenizers` (Rust) into the
graph's token inputs: truncated at max_length, padded to the graph's fixed length, or to
max_length, or to the longest text of the request, on the right with the tokenizer's pad token.
Images and audio: see Picture and Audio. docs/preprocessing.md spells every step."""

from __future__ import annotations

import base64
import binascii
import io
import struct
from pathlib import Path
from typing import Any

import numpy as np

from . import contract
from .tensors import RequestError

PAD_TOKENS = ("[PAD]", "<pad>", "<|endoftext|>")  # when tokenizer.json sets no padding: the usual names
MAX_TEXTS = 4096  # texts in one request (each is a row of every token input)
# A tokenizer encodes a whole text before it truncates: 6.4 MB of text held 780 MB for 5 s
# (measured with a word-level tokenizer). Each text is cut to this many characters per token of
# max_length first, which no tokenizer's max_length tokens reach in real text, and charged at:
CHARS_PER_TOKEN = 100
BYTES_PER_CHAR = 128  # what encoding holds per character read (measured: 122)


class Text:
    """The text step: one tokenizer, loaded at start from the image's assets."""

    def __init__(self, spec: contract.TextStep, root: Path):
        from tokenizers import Tokenizer  # only an image that tokenizes imports it

        self.input = spec.input
        self.feeds: list[tuple[str, str, np.dtype]] = [(f.role, f.name, np.dtype(f.type)) for f in spec.feeds]
        self.max_length = spec.max_length
        self.truncation = spec.truncation
        self.batch = spec.batch
        tokenizer = Tokenizer.from_file(str(root / spec.file))
        padding = tokenizer.padding or {}
        pad_id = padding.get("pad_id")
        pad_token = padding.get("pad_token")
        if pad_token is None:
            pad_token, pad_id = next(((t, i) for t in PAD_TOKENS if (i := tokenizer.token_to_id(t)) is not None),
                                     ("[PAD]", 0))
        length = spec.length or (self.max_length if spec.padding == "max_length" else None)
        if spec.padding == "none" and not spec.length:
            tokenizer.no_padding()
        else:
            tokenizer.enable_padding(direction="right", pad_id=pad_id, pad_token=pad_token, length=length)
        if self.truncation:
            tokenizer.enable_truncation(self.max_length)
        else:
            tokenizer.no_truncation()
        self.tokenizer = tokenizer

    def apply(self, feeds: dict[str, Any], charge: Any = None) -> dict[str, Any]:
        """feeds with the text replaced by the token inputs; a request that sends the token
        inputs itself passes as it is. charge(n): the bytes tokenizing holds."""
        value = feeds.pop(self.input, None)
        names = [name for _, name, _ in self.feeds]
        if value is None:
            missing = [n for n in names if n not in feeds]
            if missing:
                raise RequestError(f"missing input '{self.input}' (the text to tokenize), or the model's own "
                                   f"{', '.join(names)}")
            return feeds
        sent = [n for n in names if n in feeds]
        if sent:
            raise RequestError(f"input '{self.input}' and {', '.join(sent)}: send the text or the token inputs, "
                               "not both")
        texts = _texts(self.input, value)
        if self.batch not in (None, 1) and len(texts) > self.batch:  # 1: run one by one (Model.preprocess)
            raise RequestError(f"input '{self.input}': {len(texts)} texts, but the model takes {self.batch} per run "
                               "(send a JSON array of requests)")
        cap = self.max_length * CHARS_PER_TOKEN
        for i, text in enumerate(texts):
            if len(text) > cap:
                if not self.truncation:
                    raise RequestError(f"input '{self.input}'[{i}]: {len(text)} characters, more than {cap} "
                                       f"({CHARS_PER_TOKEN} per token of max_length {self.max_length}; "
                                       "preprocessing.truncation is off)", 413)
                texts[i] = text[:cap]  # past what max_length tokens can reach
        if charge is not None:
            charge(BYTES_PER_CHAR * sum(len(t) for t in texts))
        try:
            encodings = self.tokenizer.encode_batch(texts, add_special_tokens=True)
        except Exception:  # the tokenizer refuses a text (its own error type): say which, as the request's fault
            raise self._refused(texts) from None
        if not self.truncation:
            for i, e in enumerate(encodings):
                if len(e.overflowing) or sum(e.attention_mask) > self.max_length:
                    raise RequestError(f"input '{self.input}'[{i}]: {sum(e.attention_mask)} tokens, more than "
                                       f"max_length {self.max_length} (preprocessing.truncation is off)", 413)
        if len({len(e.ids) for e in encodings}) > 1:  # padding off: the texts must tokenize alike
            raise RequestError(f"input '{self.input}': the texts tokenize to different lengths and "
                               "preprocessing.padding is off; send one text per request")
        out = dict(feeds)
        for role, name, dtype in self.feeds:
            rows = [getattr(e, {"input_ids": "ids", "attention_mask": "attention_mask",
                                "token_type_ids": "type_ids"}[role]) for e in encodings]
            out[name] = np.array(rows, dtype=dtype).reshape(len(encodings), -1)
        return out


    def _refused(self, texts: list[str]) -> RequestError:
        """The first text the tokenizer refuses, and why, in one line."""
        for i, text in enumerate(texts):
            try:
                self.tokenizer.encode(text, add_special_tokens=True)
            except Exception as e:
                return RequestError(f"input '{self.input}'[{i}]: the model's tokenizer cannot encode this text "
                                    f"({_first(e)})")
        return RequestError(f"input '{self.input}': the model's tokenizer cannot encode these texts together")


def _texts(name: str, value: Any) -> list[str]:
    """A string, a list of strings, or a BYTES/string tensor of rank 1 or [n, 1]: the texts."""
    arr = np.asarray(value, dtype=object) if not isinstance(value, np.ndarray) else value
    if arr.ndim > 2 or (arr.ndim == 2 and arr.shape[1] != 1):
        raise RequestError(f"input '{name}': shape {list(arr.shape)}; send a string, a list of strings, "
                           "or a tensor of shape [n] or [n, 1]")
    items = arr.reshape(-1).tolist()
    if not items:
        raise RequestError(f"input '{name}': no text")
    if len(items) > MAX_TEXTS:
        raise RequestError(f"input '{name}': {len(items)} texts, more than {MAX_TEXTS} a request", 413)
    out = []
    for i, item in enumerate(items):
        if isinstance(item, (bytes, bytearray)):
            try:
                item = bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                raise RequestError(f"input '{name}'[{i}]: not UTF-8 text") from None
        if not isinstance(item, str):
            raise RequestError(f"input '{name}'[{i}]: expected text, got {type(item).__name__}")
        out.append(item)
    return out


# ---------------------------------------------------------------------------------------------
# images

IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")  # what Pillow may decode here
FORMAT_NAMES = {"jpeg": "JPEG", "jpg": "JPEG", "png": "PNG", "webp": "WEBP", "bmp": "BMP", "gif": "GIF",
                "tiff": "TIFF", "tif": "TIFF"}  # GPUX's "format" hint, and raw bodies' image/<subtype>
DEFAULT_MAX_PIXELS = 40_000_000  # GPUX_MAX_IMAGE_PIXELS: a 40 MP photo decodes to 160 MB of RGB (4 bytes a pixel)
ORIENTATION = 0x0112  # EXIF's Orientation tag
DECODE_OVERHEAD = 1 << 20  # what decoding holds besides the pixels, whatever the size (a codec's tables and rows)


def pixel_bytes(mode: str) -> int:
    """What Pillow stores a pixel of this mode in: one byte for 1, L and P, two for 16-bit grey,
    four for every other mode (RGB too: Pillow keeps RGB as 32-bit pixels)."""
    return 1 if mode in ("1", "L", "P") else 2 if mode.startswith("I;16") else 4


def decode_cost(image: Any) -> int:
    """Bytes decoding this opened image holds at its peak, read from its header before any pixel
    is decoded (measured per format and mode by bench/decode_memory.py, with a margin): the
    pixels as Pillow stores them, and the decoder's own buffers: a progressive JPEG keeps every
    DCT coefficient (2 bytes a pixel per component), libwebp's animation decoder two canvases,
    its decoder's own buffer (lossless: 32-bit pixels) and the frame it hands over as bytes
    (16, measured 17.4 in all for a lossy RGB WebP and 24.5 with an RGBA one's conversion),
    libtiff may read a whole image before Pillow unpacks it."""
    width, height = image.size
    extra = 1.0
    if image.format == "JPEG" and (image.info.get("progressive") or image.info.get("progression")):
        extra += 2 * len(image.getbands())
    elif image.format == "WEBP":
        extra += 17
    elif image.format == "TIFF":
        extra += 4
    return int(width * height * (pixel_bytes(image.mode) + extra)) + DECODE_OVERHEAD


class Picture:
    """The image step: Pillow decodes (never more than max_pixels), EXIF orientation applied, any
    mode converted to RGB (alpha dropped), then resized with Pillow's bilinear filter (antialiased
    when it shrinks) or letterboxed, centre-cropped, scaled (/ 255), normalized ((x - mean) / std
    per channel) and laid out as the graph takes it."""

    def __init__(self, spec: contract.ImageStep, max_pixels: int = DEFAULT_MAX_PIXELS):
        from PIL import Image as pil  # only an image that decodes images imports Pillow

        self.pil = pil
        pil.MAX_IMAGE_PIXELS = None  # ours replaces Pillow's check: the header is read, the size refused, one line
        self.input, self.feed, self.dtype, self.layout = spec.input, spec.feed, np.dtype(spec.type), spec.layout
        self.size, self.resize, self.crop = spec.size, spec.resize, spec.crop
        self.letterbox, self.pad, self.scale = spec.letterbox, spec.pad, np.float32(spec.scale)
        self.mean = np.array(spec.mean, np.float32) if spec.mean else None
        self.std = np.array(spec.std, np.float32) if spec.std else None
        self.batch = spec.batch
        self.max_pixels = max_pixels

    def apply(self, feeds: dict[str, Any], charge: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """feeds with the encoded images replaced by the graph's tensor, and what /predict also
        answers (letterbox: each image's scale and offset). charge(n): the bytes decoding holds."""
        value = feeds.pop(self.input, None)
        if value is None:
            if self.feed not in feeds:
                raise RequestError(f"missing input '{self.input}' (an encoded image), or the model's own "
                                   f"'{self.feed}'")
            return feeds, {}
        if self.feed in feeds:
            raise RequestError(f"input '{self.input}' and '{self.feed}': send the image or the tensor, not both")
        items = _encoded(self.input, value)
        if self.batch not in (None, 1) and len(items) > self.batch:  # 1: run one by one (Model.preprocess)
            raise RequestError(f"input '{self.input}': {len(items)} images, but the model takes {self.batch} per run")
        arrays, boxes = [], []
        for i, data in enumerate(items):
            what = f"input '{self.input}'" + (f"[{i}]" if len(items) > 1 else "")
            pixels, box = self.one(data, what, charge)
            arrays.append(pixels)
            if box is not None:
                boxes.append(box)
        out = dict(feeds)
        out[self.feed] = np.stack(arrays)
        return out, ({"letterbox": boxes} if boxes else {})

    def decode(self, data: bytes, what: str, charge: Any = None) -> Any:
        """Pillow's RGB image of these bytes, oriented; refused before decoding past max_pixels.
        charge(n) is called before each step that holds memory with what it holds (decode_cost:
        the decoder's own buffers and the pixels; a rotation's and a conversion's copy), and the
        steps hold one image more at a time at most (the orientation applied in place, no
        conversion of what is RGB already)."""
        from PIL import ImageOps, UnidentifiedImageError

        pil = self.pil
        try:
            image = pil.open(io.BytesIO(data), formats=IMAGE_FORMATS)
        except UnidentifiedImageError:
            raise RequestError(f"{what}: not an image ({', '.join(f.lower() for f in IMAGE_FORMATS)})") from None
        except pil.DecompressionBombError as e:
            raise RequestError(f"{what}: {e}", 413) from None
        except (OSError, ValueError, SyntaxError) as e:
            raise RequestError(f"{what}: cannot read the image ({_first(e)})") from None
        width, height = image.size
        if width * height > self.max_pixels:
            raise RequestError(f"{what}: {width}x{height} is {width * height} pixels, more than "
                               f"{self.max_pixels} (GPUX_MAX_IMAGE_PIXELS)", 413)
        charge = charge or (lambda n: None)
        charge(decode_cost(image))
        try:
            image.load()
            if image.getexif().get(ORIENTATION, 1) not in (1, None):  # rotated: the new pixels beside the old
                charge(width * height * pixel_bytes(image.mode))
                ImageOps.exif_transpose(image, in_place=True)
            if image.mode == "RGB":
                return image
            charge(width * height * pixel_bytes("RGB"))
            return image.convert("RGB")
        except pil.DecompressionBombError as e:
            raise RequestError(f"{what}: {e}", 413) from None
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise RequestError(f"{what}: cannot decode the image ({_first(e)})") from None

    def one(self, data: bytes, what: str, charge: Any = None) -> tuple[np.ndarray, dict[str, Any] | None]:
        image = self.decode(data, what, charge)
        pil, box = self.pil, None
        if self.letterbox:
            image, box = self._letterbox(image)
        else:
            if self.resize is not None and image.size != self.resize:
                image = image.resize(self.resize, pil.Resampling.BILINEAR)
            if self.crop is not None:
                image = self._centre_crop(image, what)
        return self.tensor(np.asarray(image)), box

    def tensor(self, rgb: np.ndarray) -> np.ndarray:
        """HWC uint8 RGB -> the graph's layout and type: scaled, then normalized."""
        if self.dtype == np.uint8:
            out = rgb
        else:
            out = rgb.astype(np.float32) * self.scale
            if self.mean is not None:
                out = (out - self.mean) / self.std
        if self.layout == "NCHW":
            out = out.transpose(2, 0, 1)
        return np.ascontiguousarray(out, dtype=self.dtype)

    def _letterbox(self, image: Any) -> tuple[Any, dict[str, Any]]:
        """Scaled to fit (aspect kept), centred on a pad-valued canvas; the scale and the offset
        map a box back: x_original = (x - offset_x) / scale."""
        width, height = self.size
        w, h = image.size
        scale = min(width / w, height / h)
        new = (max(1, round(w * scale)), max(1, round(h * scale)))
        if new != image.size:
            image = image.resize(new, self.pil.Resampling.BILINEAR)
        left, top = (width - new[0]) // 2, (height - new[1]) // 2
        canvas = self.pil.new("RGB", (width, height), (self.pad,) * 3)
        canvas.paste(image, (left, top))
        return canvas, {"scale": scale, "offset": [left, top], "size": [w, h]}

    def _centre_crop(self, image: Any, what: str) -> Any:
        w, h = image.size
        cw, ch = self.crop
        if cw > w or ch > h:
            raise RequestError(f"{what}: {w}x{h} is smaller than the crop {cw}x{ch}")
        left, top = (w - cw) // 2, (h - ch) // 2
        return image.crop((left, top, left + cw, top + ch))


def _encoded(name: str, value: Any) -> list[bytes]:
    """The encoded images of a request: base64 text (a data: URL too), {"b64": ...}, raw bytes
    (v2 binary and gRPC BYTES, a raw body), one or a list."""
    if isinstance(value, dict):
        value = [value]
    arr = value if isinstance(value, np.ndarray) else np.array(value if isinstance(value, list) else [value],
                                                               dtype=object)
    items = arr.reshape(-1).tolist() if arr.ndim else [arr.item()]
    if not items:
        raise RequestError(f"input '{name}': no image")
    out = []
    for i, item in enumerate(items):
        where = f"input '{name}'" + (f"[{i}]" if len(items) > 1 else "")
        if isinstance(item, dict):
            if set(item) != {"b64"}:
                raise RequestError(f"{where}: expected {{\"b64\": \"<base64>\"}}")
            item = item["b64"]
        if isinstance(item, (bytes, bytearray, memoryview)):
            out.append(bytes(item))
            continue
        if not isinstance(item, str):
            raise RequestError(f"{where}: expected an encoded image (base64 text), got {type(item).__name__}")
        if item.startswith("data:"):
            item = item.split(",", 1)[-1]
        try:
            out.append(base64.b64decode(item, validate=True))
        except (binascii.Error, ValueError):
            raise RequestError(f"{where}: not base64 text") from None
    return out


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


# ---------------------------------------------------------------------------------------------
# audio

WAVE_PCM, WAVE_FLOAT, WAVE_EXTENSIBLE = 1, 3, 0xFFFE
WAV_TYPES = ("wav", "x-wav", "wave", "vnd.wave")  # raw bodies: audio/<one of these>
MAX_CHANNELS = 64


class Audio:
    """The audio step, in NumPy (no ffmpeg, no librosa): WAV decoded (PCM 8/16/24/32-bit, float
    32/64; channels averaged), resampled to sample_rate when it differs (FFT method: the spectrum
    truncated or zero-padded, as scipy.signal.resample does), padded with silence or cut to
    `samples`, then Whisper's log-mel: periodic Hann window of n_fft, centred frames every
    hop_length (reflect padding), the last frame dropped, power spectrum, Slaney-scale mel filters
    with Slaney (area) normalization, log10 of max(mel, 1e-10), floored at its maximum - 8, then
    (x + 4) / 4."""

    def __init__(self, spec: contract.AudioStep):
        self.input, self.feed, self.dtype = spec.input, spec.feed, np.dtype(spec.type)
        self.sample_rate, self.n_fft, self.hop = spec.sample_rate, spec.n_fft, spec.hop_length
        self.samples, self.frames, self.batch = spec.samples, spec.frames, spec.batch
        self.filters = mel_filters(self.sample_rate, self.n_fft, spec.n_mels)
        n = np.arange(self.n_fft)
        self.window = 0.5 - 0.5 * np.cos(2 * np.pi * n / self.n_fft)  # periodic Hann (torch.hann_window's)

    def apply(self, feeds: dict[str, Any], charge: Any = None) -> dict[str, Any]:
        value = feeds.pop(self.input, None)
        if value is None:
            if self.feed not in feeds:
                raise RequestError(f"missing input '{self.input}' (a WAV file), or the model's own '{self.feed}'")
            return feeds
        if self.feed in feeds:
            raise RequestError(f"input '{self.input}' and '{self.feed}': send the audio or the spectrogram, not both")
        items = _encoded(self.input, value)
        if self.batch not in (None, 1) and len(items) > self.batch:  # 1: run one by one (Model.preprocess)
            raise RequestError(f"input '{self.input}': {len(items)} clips, but the model takes {self.batch} per run")
        mels = []
        for i, data in enumerate(items):
            what = f"input '{self.input}'" + (f"[{i}]" if len(items) > 1 else "")
            if charge is not None:  # before decoding: the samples as floats (8 per byte at most), the STFT's frames
                charge(8 * (len(data) * 3 + self.samples * 2 + (self.frames + 1) * self.n_fft * 3))
            samples, rate = read_wav(data, what)
            mels.append(self.log_mel(self.resample(samples, rate)))
        out = dict(feeds)
        out[self.feed] = np.stack(mels).astype(self.dtype, copy=False)
        return out

    def resample(self, x: np.ndarray, rate: int) -> np.ndarray:
        """To sample_rate, then padded with silence or cut to `samples`."""
        if rate != self.sample_rate and x.size:
            n = min(x.size, int(np.ceil(self.samples * rate / self.sample_rate)) + 1)  # what is kept, and no more
            x = x[:n]
            m = max(1, round(n * self.sample_rate / rate))
            spectrum = np.fft.rfft(x)
            out = np.zeros(m // 2 + 1, np.complex128)
            k = min(spectrum.size, out.size)
            out[:k] = spectrum[:k]
            if m < n and m % 2 == 0:
                out[m // 2] = out[m // 2].real  # the new Nyquist bin of a real signal
            x = np.fft.irfft(out, m) * (m / n)
        if x.size >= self.samples:
            return x[: self.samples]
        return np.pad(x, (0, self.samples - x.size))

    def log_mel(self, x: np.ndarray) -> np.ndarray:
        pad = self.n_fft // 2
        padded = np.pad(x, pad, mode="reflect")
        count = 1 + (padded.size - self.n_fft) // self.hop
        frames = np.lib.stride_tricks.as_strided(padded, (count, self.n_fft),
                                                 (padded.strides[0] * self.hop, padded.strides[0]))
        power = np.abs(np.fft.rfft(frames * self.window, axis=1)) ** 2  # [count, n_fft/2 + 1]
        mel = self.filters @ power[: self.frames].T  # Whisper drops the last frame
        log = np.log10(np.maximum(mel, 1e-10))
        log = np.maximum(log, log.max() - 8.0)
        return (log + 4.0) / 4.0


def mel_filters(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """[n_mels, n_fft/2 + 1] triangular filters on the Slaney mel scale (linear below 1 kHz,
    logarithmic above), from 0 Hz to sample_rate / 2, each scaled to unit area (2 / bandwidth)."""
    def to_mel(hz: np.ndarray) -> np.ndarray:
        hz = np.asarray(hz, np.float64)
        linear = hz / (200.0 / 3)
        return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), linear)

    def to_hz(mel: np.ndarray) -> np.ndarray:
        return np.where(mel >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0)), mel * (200.0 / 3))

    frequencies = np.linspace(0, sample_rate / 2, 1 + n_fft // 2)
    edges = to_hz(np.linspace(to_mel(0.0), to_mel(sample_rate / 2), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - frequencies[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    return weights * (2.0 / (edges[2: n_mels + 2] - edges[:n_mels]))[:, None]


def read_wav(data: bytes, what: str) -> tuple[np.ndarray, int]:
    """(mono float64 samples in [-1, 1], sample rate) of a RIFF/WAVE file; a 400 naming the problem."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise RequestError(f"{what}: not a WAV file (no RIFF/WAVE header)")
    pos, fmt, payload = 12, None, None
    while pos + 8 <= len(data):
        kind, size = data[pos:pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = data[pos + 8: pos + 8 + size]
        if kind == b"fmt ":
            if len(body) < 16:
                raise RequestError(f"{what}: a WAV 'fmt ' chunk of {len(body)} bytes")
            fmt = struct.unpack_from("<HHIIHH", body)
            if fmt[0] == WAVE_EXTENSIBLE:
                if len(body) < 26:
                    raise RequestError(f"{what}: a WAV extensible 'fmt ' chunk of {len(body)} bytes")
                fmt = (struct.unpack_from("<H", body, 24)[0], *fmt[1:])  # the sub-format's code
        elif kind == b"data":
            payload = body  # a stream's data chunk may claim more than was sent: what arrived is read
            break
        pos += 8 + size + (size & 1)
    if fmt is None or payload is None:
        raise RequestError(f"{what}: a WAV file without {'a fmt' if fmt is None else 'a data'} chunk")
    code, channels, rate, _, _, bits = fmt
    if not 1 <= channels <= MAX_CHANNELS or not 1 <= rate <= 768000:
        raise RequestError(f"{what}: a WAV file with {channels} channels at {rate} Hz")
    kinds = {(WAVE_PCM, 8): "u1", (WAVE_PCM, 16): "<i2", (WAVE_PCM, 24): "i3", (WAVE_PCM, 32): "<i4",
             (WAVE_FLOAT, 32): "<f4", (WAVE_FLOAT, 64): "<f8"}
    kind = kinds.get((code, bits))
    if kind is None:
        raise RequestError(f"{what}: WAV format {code} with {bits}-bit samples; expected PCM 8, 16, 24 or 32-bit, "
                           "or float 32 or 64-bit")
    width = bits // 8 * channels
    usable = len(payload) - len(payload) % width
    raw = np.frombuffer(payload[:usable], np.uint8)
    if kind == "i3":  # 24-bit little-endian: into the top of an int32
        triples = raw.reshape(-1, 3).astype(np.int32)
        samples = ((triples[:, 0] << 8) | (triples[:, 1] << 16) | (triples[:, 2] << 24)).astype(np.float64) / 2**31
    elif kind == "u1":
        samples = (raw.astype(np.float64) - 128.0) / 128.0
    elif kind[1] == "i":
        samples = np.frombuffer(raw, kind).astype(np.float64) / float(2 ** (bits - 1))
    else:
        samples = np.frombuffer(raw, kind).astype(np.float64)
        if not np.isfinite(samples).all():
            raise RequestError(f"{what}: the WAV file holds samples that are not finite numbers")
    return samples.reshape(-1, channels).mean(axis=1), rate


# ---------------------------------------------------------------------------------------------
# the steps together

class Steps:
    """The steps gpux.json asks for, in order, applied to one decoded request."""

    def __init__(self, spec: contract.GpuxJson, root: Path, max_pixels: int = DEFAULT_MAX_PIXELS):
        steps = spec.preprocessing or contract.Preprocessing()
        self.text = Text(steps.text, root) if steps.text else None
        self.image = Picture(steps.image, max_pixels) if steps.image else None
        self.audio = Audio(steps.audio) if steps.audio else None
        self.fed = steps.fed  # the graph's inputs a step feeds: a request may send them instead
        names = {t.name for t in (*spec.inputs, *spec.overridable_inputs)}
        # GPUX's {"image": ..., "format": "jpeg"} and {"audio": ..., "sample_rate": 16000, "format": "wav"}:
        # hints beside the media, not inputs (unless the graph has inputs of those names)
        self.hints = {"format", "sample_rate"} - names

    def body_input(self, content_type: str) -> str:
        """The input a raw /predict body of this Content-Type carries (image/png, audio/wav ...); 415
        for a media type this model does not take."""
        kind, _, subtype = content_type.partition("/")
        if kind == "image" and self.image is not None and subtype in FORMAT_NAMES:
            return self.image.input
        if kind == "audio" and self.audio is not None and subtype in WAV_TYPES:
            return self.audio.input
        takes = [*(f"image/{f}" for f in ("jpeg", "png", "webp", "bmp", "gif", "tiff") if self.image),
                 *(("audio/wav",) if self.audio else ())]
        raise RequestError(f"Content-Type {content_type[:60]}: this model takes {', '.join(takes) or 'JSON'}", 415)

    @property
    def one_per_run(self) -> set[str]:
        """The graph's inputs a step feeds whose model takes one item per run (a fixed batch of 1):
        several items in one request are run one by one (Model.preprocess)."""
        out = {name for _, name, _ in self.text.feeds} if self.text and self.text.batch == 1 else set()
        return out | {step.feed for step in (self.image, self.audio) if step and step.batch == 1}

    def apply(self, feeds: dict[str, Any], charge: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        extra: dict[str, Any] = {}
        if self.text is not None:
            feeds = self.text.apply(feeds, charge)
        if self.image is not None:
            feeds, extra = self.image.apply(feeds, charge)
        if self.audio is not None:
            feeds = self.audio.apply(feeds, charge)
        return feeds, extra

    def gpux_form(self, body: Any) -> Any:
        """/predict's media forms, as the checker takes them: {"<input>": {"b64": ...}} and a
        base64 string under the graph's own input name become the encoded input; GPUX's
        "format" and "sample_rate" hints are checked and dropped (the bytes say both)."""
        media = [step for step in (self.image, self.audio) if step is not None]
        if not media or not isinstance(body, dict):
            return body
        out = dict(body)
        if "format" in self.hints and "format" in out:
            hint = out.pop("format")
            formats = sorted({*(FORMAT_NAMES if self.image else ()), *(("wav",) if self.audio else ())})
            if not isinstance(hint, str) or hint.lower() not in formats:
                raise RequestError(f"format: {str(hint)[:40]!r} is not a format this model takes ({', '.join(formats)})")
        if "sample_rate" in self.hints and self.audio and "sample_rate" in out:
            rate = out.pop("sample_rate")  # the WAV header says the rate: the hint is checked, not used
            if not isinstance(rate, int) or isinstance(rate, bool) or not 1 <= rate <= 768000:
                raise RequestError(f"sample_rate: {str(rate)[:40]!r} is not a sample rate in Hz")
        for step in media:
            for key in (step.input, step.feed):
                value = out.get(key)
                if _encoded_form(value):
                    out.pop(key)
                    if step.input in out:
                        raise RequestError(f"input '{step.input}' and '{step.feed}': send one of them")
                    out[step.input] = _b64_text(value)
        return out


def _encoded_form(value: Any) -> bool:
    """A base64 string or {"b64": ...}, or a list of them: not a tensor of numbers."""
    if isinstance(value, list) and value:
        return all(isinstance(v, (str, dict)) for v in value)
    return isinstance(value, (str, dict))


def _b64_text(value: Any) -> Any:
    if isinstance(value, list):
        return [_b64_text(v) for v in value]
    if isinstance(value, dict):
        if set(value) != {"b64"} or not isinstance(value["b64"], str):
            raise RequestError('an image is {"b64": "<base64>"} or the base64 text itself')
        return value["b64"]
    return value

