"""A Whisper-shaped project made in the test: a model taking `mel` float32 [batch, 80, 3000] and
`decoder_input_ids` int64 [batch, 1] that echoes the spectrogram (`seen`) and answers its mean,
WAV files written here (PCM 8/16/24/32-bit, float 32, stereo), and the reference log-mel made with
librosa's STFT and mel filters and scipy's resampling: an implementation independent of the image's."""

from __future__ import annotations

import io
import struct
import wave
from pathlib import Path

import numpy as np

GPUX_YML = """\
name: whisper-shaped
model:
  source: ./model.onnx
preprocessing:
  sample_rate: 16000
  n_mels: 80
  n_fft: 400
  hop_length: 160
  chunk_length: 30
"""


def model():
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["mel"], ["seen"]),
         helper.make_node("ReduceMean", ["mel"], ["level"], keepdims=0),
         helper.make_node("Identity", ["decoder_input_ids"], ["tokens"])],
        "whisper", [helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["batch", 80, 3000]),
                    helper.make_tensor_value_info("decoder_input_ids", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("seen", TensorProto.FLOAT, ["batch", 80, 3000]),
         helper.make_tensor_value_info("level", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", 1])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def make(folder: Path) -> Path:
    import onnx

    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model(), str(folder / "model.onnx"))
    (folder / "gpux.yml").write_text(GPUX_YML)
    return folder


def tone(rate: int = 16000, seconds: float = 2.0, channels: int = 1) -> np.ndarray:
    """A chirp and a tone in [-0.8, 0.8], [samples, channels]."""
    t = np.arange(int(rate * seconds)) / rate
    mono = 0.5 * np.sin(2 * np.pi * (200 + 300 * t) * t) + 0.3 * np.sin(2 * np.pi * 1000 * t)
    return np.stack([mono * (1 - 0.2 * c) for c in range(channels)], axis=1)


def wav(samples: np.ndarray, rate: int, bits: int = 16, float_: bool = False) -> bytes:
    """A WAV file of [samples, channels] in [-1, 1]: PCM of `bits`, or IEEE float 32."""
    channels = samples.shape[1]
    if float_:
        data = samples.astype("<f4").tobytes()
        fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * channels * 4, channels * 4, 32)
        return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE" + b"fmt " +
                struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)
    if bits == 8:
        data = np.round(samples * 127 + 128).astype(np.uint8).tobytes()
    elif bits == 24:
        ints = np.round(samples * (2**23 - 1)).astype("<i4")
        data = ints.view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    else:
        data = np.round(samples * (2 ** (bits - 1) - 1)).astype(f"<i{bits // 8}").tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(bits // 8)
        w.setframerate(rate)
        w.writeframes(data)
    return out.getvalue()


def decoded(samples: np.ndarray, bits: int = 16, float_: bool = False) -> np.ndarray:
    """What a WAV file of these samples holds, as floats: the quantization the file applies, mono."""
    if float_:
        x = samples.astype(np.float32).astype(np.float64)
    elif bits == 8:
        x = (np.round(samples * 127 + 128) - 128) / 128
    else:
        x = np.round(samples * (2 ** (bits - 1) - 1)) / 2 ** (bits - 1)
    return x.mean(axis=1)


def reference(mono: np.ndarray, rate: int, sample_rate: int = 16000, n_fft: int = 400, hop: int = 160,
              n_mels: int = 80, seconds: float = 30.0) -> np.ndarray:
    """Whisper's log-mel of these samples, [n_mels, frames], with librosa and scipy."""
    import librosa
    import scipy.signal

    if rate != sample_rate:
        mono = scipy.signal.resample(mono, round(mono.size * sample_rate / rate))
    n = round(seconds * sample_rate)
    mono = np.pad(mono, (0, max(0, n - mono.size)))[:n]
    power = np.abs(librosa.stft(mono, n_fft=n_fft, hop_length=hop, window="hann", center=True,
                                pad_mode="reflect")) ** 2
    mel = librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels) @ power[:, :-1]
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    return (log + 4.0) / 4.0
