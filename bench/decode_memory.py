"""What decoding an image really holds, per format and mode: the peak resident memory of the
image step (runtime/preprocess.py's Image.one, the code the server runs) over a fresh process's
baseline, in bytes per pixel, next to what the step charges the request budget for it.

    .venv/bin/python bench/decode_memory.py [--pixels 4194304] [--json bench/results-decode-memory.json]

Each case runs in a process of its own, its high-water mark reset just before (clear_refs); the images are made
here with Pillow (noise, so no codec compresses them away), EXIF-rotated where the case says."""

from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PROBE = r"""
import json, sys
import numpy as np
from gpux_pack.runtime.contract import ImageStep
from gpux_pack.runtime.preprocess import Picture
step = Picture(ImageStep("image", "x", "float32", "NCHW", (224, 224), (224, 224), None, False, 114, 1 / 255, None, None,
                         None))
small = open(sys.argv[2], "rb").read()
step.one(small, "warm")  # the libraries' own first-use memory is not the image's
data = open(sys.argv[1], "rb").read()
charged = []
def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))
open("/proc/self/clear_refs", "w").write("5")  # the high-water mark starts again from here
before = status("VmRSS")
step.one(data, "x", charged.append)
print(json.dumps({"peak": status("VmHWM") - before, "charged": sum(charged)}))
"""


def noise(side: int, mode: str) -> object:
    from PIL import Image

    rng = np.random.default_rng(0)
    bands = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "CMYK": 4, "P": 1, "I;16": 1}[mode]
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65535, (side, side), dtype=np.uint16))
    array = rng.integers(0, 256, (side, side, bands) if bands > 1 else (side, side), dtype=np.uint8)
    base = Image.fromarray(array, {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}[bands])
    return base.convert(mode) if mode in ("CMYK", "P") else base


def cases(side: int):
    """(name, bytes) of each image: every format the step decodes, its usual and worst modes."""
    from PIL import Image, ImageFile

    ImageFile.MAXBLOCK = 1 << 28  # a progressive JPEG of noise is written in one block

    def saved(image, fmt, **kw) -> bytes:
        out = io.BytesIO()
        image.save(out, fmt, **kw)
        return out.getvalue()

    rotated = Image.Exif()
    rotated[0x0112] = 6  # orientation: rotate 90
    rgb = noise(side, "RGB")
    yield "jpeg baseline 4:2:0", saved(rgb, "JPEG", quality=90)
    yield "jpeg progressive 4:4:4", saved(rgb, "JPEG", quality=100, subsampling=0, progressive=True)
    yield "jpeg progressive 4:4:4 rotated", saved(rgb, "JPEG", quality=100, subsampling=0, progressive=True,
                                                 exif=rotated)
    yield "jpeg cmyk progressive", saved(noise(side, "CMYK"), "JPEG", quality=95, progressive=True)
    yield "png rgb", saved(rgb, "PNG", compress_level=1)
    yield "png rgba rotated", saved(noise(side, "RGBA"), "PNG", compress_level=1, exif=rotated)
    yield "png 16-bit grey", saved(noise(side, "I;16"), "PNG", compress_level=1)
    yield "png palette interlaced", saved(noise(side, "P"), "PNG", optimize=False, interlace=1)
    yield "webp lossy", saved(rgb, "WEBP", quality=90)
    yield "webp lossless rgba", saved(noise(side, "RGBA"), "WEBP", lossless=True)
    frames = [noise(side, "RGBA")] + [Image.new("RGBA", (side, side), (i, 0, 0, 255)) for i in (1, 2)]
    yield "webp animated lossless (3 frames)", saved(frames[0], "WEBP", lossless=True, save_all=True,
                                                     append_images=frames[1:], duration=10)
    yield "bmp rgb", saved(rgb, "BMP")
    yield "gif palette", saved(noise(side, "P"), "GIF")
    yield "tiff rgb", saved(rgb, "TIFF")
    yield "tiff rgb deflate rotated", saved(rgb, "TIFF", compression="tiff_adobe_deflate", exif=rotated)
    yield "tiff cmyk", saved(noise(side, "CMYK"), "TIFF")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pixels", type=int, default=2048 * 2048)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    side = int(math.sqrt(args.pixels))
    pixels = side * side
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "small.png"
        noise(64, "RGB").save(small)
        for name, data in cases(side):
            path = Path(tmp) / "image"
            path.write_bytes(data)
            out = subprocess.run([sys.executable, "-c", PROBE, str(path), str(small)], capture_output=True, text=True,
                                 check=True)
            got = json.loads(out.stdout)
            row = {"case": name, "bytes": len(data), "pixels": pixels, "peak_per_pixel": round(got["peak"] / pixels, 1),
                   "charged_per_pixel": round(got["charged"] / pixels, 1)}
            rows.append(row)
            print(f"{name:36} {len(data) / 1e6:7.1f} MB  peak {row['peak_per_pixel']:5.1f} B/px  "
                  f"charged {row['charged_per_pixel']:5.1f} B/px", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"pixels": pixels, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
