"""An image project made in the test: a model taking `input` float32 [batch, 3, H, W] (NCHW) that
answers each channel's mean (labelled red, green, blue) and echoes its input (`seen`), and
images written with Pillow; plus the NumPy reference of the documented steps on Pillow's
decoded pixels, which the image's answers must equal."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

IMAGENET = (np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32))


def model(height: int | str = 32, width: int | str = 32, layout: str = "NCHW", dtype: str = "float32"):
    import onnx
    from onnx import TensorProto, helper

    shape = ["batch", 3, height, width] if layout == "NCHW" else ["batch", height, width, 3]
    axes = [2, 3] if layout == "NCHW" else [1, 2]
    kind = TensorProto.UINT8 if dtype == "uint8" else TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input"], ["x"], to=TensorProto.FLOAT),
         helper.make_node("ReduceMean", ["x", "axes"], ["channels"], keepdims=0),
         helper.make_node("Identity", ["input"], ["seen"])],
        "image", [helper.make_tensor_value_info("input", kind, shape)],
        [helper.make_tensor_value_info("channels", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("seen", kind, shape)],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [2], axes)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


GPUX_YML = """\
name: colours
model:
  source: ./model.onnx
outputs:
  channels:
    labels: [red, green, blue]
  seen: {{}}
preprocessing:
{preprocessing}
"""


def make(folder: Path, preprocessing: str = "  resize: [32, 32]\n  normalize: imagenet", extra: str = "",
         **shape) -> Path:
    import onnx

    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model(**shape), str(folder / "model.onnx"))
    (folder / "gpux.yml").write_text(GPUX_YML.format(preprocessing=preprocessing) + extra)
    return folder


def picture(width: int = 48, height: int = 40, fmt: str = "PNG", mode: str = "RGB", seed: int = 0,
            orientation: int | None = None) -> bytes:
    """A deterministic picture: a gradient with noise, so resizing has something to do."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1),
                    rng.integers(0, 256, (height, width))], axis=-1).astype(np.uint8)
    image = Image.fromarray(rgb).convert(mode)
    out = io.BytesIO()
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        image.save(out, fmt, exif=exif.tobytes())
    else:
        image.save(out, fmt)
    return out.getvalue()


def reference(data: bytes, size: tuple[int, int] = (32, 32), normalize: bool = True, letterbox: bool = False,
              crop: tuple[int, int] | None = None, resize: tuple[int, int] | None = None) -> np.ndarray:
    """docs/preprocessing.md's steps, written out with NumPy on Pillow's decoded pixels: [1, 3, H, W]."""
    from PIL import Image, ImageOps

    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    if letterbox:
        w, h = image.size
        scale = min(size[0] / w, size[1] / h)
        new = (max(1, round(w * scale)), max(1, round(h * scale)))
        resized = np.asarray(image.resize(new, Image.Resampling.BILINEAR) if new != image.size else image)
        canvas = np.full((size[1], size[0], 3), 114, np.uint8)
        left, top = (size[0] - new[0]) // 2, (size[1] - new[1]) // 2
        canvas[top:top + new[1], left:left + new[0]] = resized
        pixels = canvas
    else:
        target = resize or (size if crop is None else None)
        if target is not None and image.size != target:
            image = image.resize(target, Image.Resampling.BILINEAR)
        pixels = np.asarray(image)
        if crop is not None:
            h, w = pixels.shape[:2]
            left, top = (w - crop[0]) // 2, (h - crop[1]) // 2
            pixels = pixels[top:top + crop[1], left:left + crop[0]]
    x = pixels.astype(np.float32) / 255
    if normalize:
        x = (x - IMAGENET[0]) / IMAGENET[1]
    return x.transpose(2, 0, 1)[None]
