"""What preprocessing costs (issue 33), one run:

    python bench/preprocess.py [--runs 200] [--requests 400] [--no-images]

1. Per request, in this process on the image's runtime code (gpux_pack/runtime/preprocess.py, the
   CPU provider): the step's median time against the median session.run of a model of that
   modality's shape, interleaved run by run:
     text   a 12-word sentence -> BERT-shaped token inputs [1, L], a model with a 30522 x 256
            embedding, 4 MatMul + Relu layers and a 2-way head;
     image  a 640 x 480 JPEG -> [1, 3, 224, 224] (resize + imagenet), a small CNN (3 strided
            convolutions, global pooling, 1000-way head);
     audio  a 5 s 44.1 kHz stereo WAV -> Whisper's [1, 80, 3000] log-mel, a model with Whisper's
            first convolutions (80 -> 384, k3; 384 -> 384, k3 s2, GELU as x * sigmoid(1.702x)).
2. With --images (default on): the image path's throughput against the same model fed the
   preprocessed float32 tensor over KServe v2 binary: both built as images (cpu provider, the
   offline base), served on 127.0.0.1, `--requests` requests at 8 concurrent clients each,
   alternating twice; and each modality's image size against the same model without preprocessing.
Writes bench/results-preprocess.json and prints Markdown tables. A measurement, never a timed test.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpux_pack.pipeline.build import load, plan_for  # noqa: E402
from gpux_pack.plan import Options  # noqa: E402
from gpux_pack.runtime.session import Model  # noqa: E402
from gpux_pack.runtime.settings import Settings  # noqa: E402
from gpux_pack.ui import Reporter  # noqa: E402
from tests import audio_project, text_project  # noqa: E402

BASE = os.environ.get("GPUX_TEST_BASE_IMAGE", "gpux-pack/debian-python:bookworm")


def _init(name: str, shape: list[int], rng: np.random.Generator) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.FLOAT, shape, (rng.standard_normal(shape) * 0.05).astype(np.float32)
                              .tobytes(), raw=True)


def text_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["h0"])]
    inits = [_init("emb", [30522, 256], rng)]
    for i in range(4):
        inits.append(_init(f"w{i}", [256, 256], rng))
        nodes += [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"h{i + 1}"])]
    inits += [_init("head", [256, 2], rng), helper.make_tensor("axis", TensorProto.INT64, [1], [1])]
    nodes += [helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
              helper.make_node("Unsqueeze", ["mask", "last"], ["mask3"]),
              helper.make_node("Mul", ["h4", "mask3"], ["kept"]),
              helper.make_node("ReduceSum", ["kept", "axis"], ["pooled"], keepdims=0),
              helper.make_node("MatMul", ["pooled", "head"], ["logits"])]
    inits.append(helper.make_tensor("last", TensorProto.INT64, [1], [2]))
    graph = helper.make_graph(nodes, "text", [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def image_model() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    nodes, inits, prev, channels = [], [], "input", 3
    for i, out in enumerate((32, 64, 128)):
        inits += [_init(f"k{i}", [out, channels, 3, 3], rng), _init(f"b{i}", [out], rng)]
        nodes += [helper.make_node("Conv", [prev, f"k{i}", f"b{i}"], [f"c{i}"], strides=[2, 2], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        prev, channels = f"r{i}", out
    inits += [_init("fc", [1000, 128], rng), _init("fb", [1000], rng)]
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "fc", "fb"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "image", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                              ["batch", 3, 224, 224])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1000])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def audio_model() -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    inits = [_init("k0", [384, 80, 3], rng), _init("k1", [384, 384, 3], rng),
             helper.make_tensor("g", TensorProto.FLOAT, [], [1.702])]
    nodes = []
    for i, (src, stride) in enumerate((("mel", 1), ("a0", 2))):
        nodes += [helper.make_node("Conv", [src, f"k{i}"], [f"c{i}"], strides=[stride], pads=[1, 1]),
                  helper.make_node("Mul", [f"c{i}", "g"], [f"s{i}"]),
                  helper.make_node("Sigmoid", [f"s{i}"], [f"t{i}"]),
                  helper.make_node("Mul", [f"c{i}", f"t{i}"], [f"a{i}"])]
    graph = helper.make_graph(nodes, "audio", [helper.make_tensor_value_info("mel", TensorProto.FLOAT,
                                                                            ["batch", 80, 3000])],
                              [helper.make_tensor_value_info("a1", TensorProto.FLOAT, ["batch", 384, 1500])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


PROJECTS = {
    "text": (text_model, "preprocessing:\n  tokenizer: ./tokenizer.json\n  max_length: 128\n"),
    "image": (image_model, "preprocessing:\n  resize: [224, 224]\n  normalize: imagenet\n"),
    "audio": (audio_model, "preprocessing:\n  sample_rate: 16000\n  chunk_length: 30\n"),
}


def project(folder: Path, modality: str, preprocess: bool = True) -> Path:
    make, pre = PROJECTS[modality]
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(make(), str(folder / "model.onnx"))
    if modality == "text":
        text_project.tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "gpux.yml").write_text(f"name: bench-{modality}\nmodel:\n  source: ./model.onnx\n"
                                     + (pre if preprocess else ""))
    return folder


def request(modality: str) -> dict:
    if modality == "text":
        return {"text": np.array(["I love this product, it is great and not bad at all, a good one !"], object)}
    if modality == "image":
        from PIL import Image

        y, x = np.mgrid[0:480, 0:640]
        rgb = np.stack([x % 256, y % 256, (x * y) % 256], axis=-1).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(rgb).save(out, "JPEG", quality=90)
        return {"image": np.array([out.getvalue()], object)}
    return {"audio": np.array([audio_project.wav(audio_project.tone(44100, 5.0, 2), 44100)], object)}


def loaded(folder: Path, tmp: Path) -> Model:
    plan = plan_for(load(folder), "cpu", "bench", Options(), None, Reporter(quiet=True), pull=False)
    image = tmp / "image"
    (image / "model").mkdir(parents=True)
    (image / "assets").mkdir()
    shutil.copy(folder / "model.onnx", image / "model" / "model.onnx")
    for name, path in plan.assets:
        shutil.copy(path, image / "assets" / name)
    (image / "gpux.json").write_text(json.dumps(plan.gpux_json.to_json()))
    return Model.load(Settings.load({"GPUX_CONFIG": str(image / "gpux.json"), "GPUX_CACHE_DIR": str(tmp / "c")}),
                      warm_up=False)


def per_request(runs: int) -> dict:
    out = {}
    for modality in PROJECTS:
        with tempfile.TemporaryDirectory() as tmp:
            model = loaded(project(Path(tmp) / "p", modality), Path(tmp))
            raw = request(modality)
            feeds, _ = model.preprocess(dict(raw))
            for _ in range(5):
                model.preprocess(dict(raw))
                model.run(feeds)
            pre, run = [], []
            for _ in range(runs):
                t = time.perf_counter()
                model.preprocess(dict(raw))
                pre.append(time.perf_counter() - t)
                t = time.perf_counter()
                model.run(feeds)
                run.append(time.perf_counter() - t)
            out[modality] = {"preprocess_ms": round(statistics.median(pre) * 1e3, 3),
                             "session_run_ms": round(statistics.median(run) * 1e3, 3),
                             "ratio": round(statistics.median(pre) / statistics.median(run), 3),
                             "input_bytes": len(next(iter(raw.values()))[0].encode()
                                                if modality == "text" else next(iter(raw.values()))[0]),
                             "fed": {k: list(v.shape) for k, v in feeds.items()}}
            print(modality, out[modality], flush=True)
    return out


def _cli(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "gpux_pack", *args], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return json.loads(proc.stdout)


def _size(tag: str) -> int:
    return int(subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", tag], capture_output=True,
                              text=True, check=True).stdout)


def served(tag: str):
    name = f"bench-pre-{os.getpid()}-{tag.split(':')[-1]}"
    subprocess.run(["docker", "run", "-d", "--rm", "--name", name, "-p", "127.0.0.1::8080", "--read-only",
                    "--tmpfs", "/tmp", tag], check=True, capture_output=True)
    port = subprocess.run(["docker", "port", name, "8080"], capture_output=True, text=True,
                          check=True).stdout.split(":")[-1].strip()
    import requests

    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if requests.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                return name, url
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{tag} never became ready")


def throughput(url: str, body: bytes, headers: dict, path: str, count: int) -> float:
    import requests

    session = requests.Session()

    def one(_: int) -> None:
        r = session.post(url + path, data=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text[:300]

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(8)))  # warm
        started = time.perf_counter()
        list(pool.map(one, range(count)))
        return count / (time.perf_counter() - started)


def images(requests_count: int) -> dict:
    out: dict = {"sizes": {}, "throughput": {}}
    tmp = Path(tempfile.mkdtemp())
    tags = []
    try:
        for modality in PROJECTS:
            sizes = {}
            for pre in (True, False):
                tag = f"gpux-bench/pre-{modality}:{'on' if pre else 'off'}"
                _cli("build", str(project(tmp / f"{modality}-{pre}", modality, pre)), "--provider", "cpu",
                     "--base-image", BASE, "--tag", tag, "--json")
                tags.append(tag)
                sizes["on" if pre else "off"] = _size(tag)
            out["sizes"][modality] = {**sizes, "added_mb": round((sizes["on"] - sizes["off"]) / 1e6, 1)}
            print(modality, out["sizes"][modality], flush=True)
        jpeg = bytes(request("image")["image"][0])
        with tempfile.TemporaryDirectory() as t:
            tensor = loaded(project(Path(t) / "p", "image"), Path(t)).preprocess({"image": np.array([jpeg], object)})[0]
        x = tensor["input"].astype("<f4")
        header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                         "parameters": {"binary_data_size": x.nbytes}}],
                             "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
        a_name, a_url = served("gpux-bench/pre-image:on")
        b_name, b_url = served("gpux-bench/pre-image:off")
        try:
            rounds = {"jpeg_predict": [], "float32_v2_binary": []}
            for _ in range(2):
                rounds["jpeg_predict"].append(throughput(a_url, jpeg, {"Content-Type": "image/jpeg"}, "/predict",
                                                         requests_count))
                rounds["float32_v2_binary"].append(throughput(
                    b_url, header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))},
                    "/v2/models/bench-image/infer", requests_count))
            out["throughput"] = {k: round(statistics.mean(v), 1) for k, v in rounds.items()}
            out["throughput"]["ratio"] = round(out["throughput"]["jpeg_predict"] /
                                               out["throughput"]["float32_v2_binary"], 3)
            out["throughput"]["bytes"] = {"jpeg": len(jpeg), "float32_v2_binary": len(header) + x.nbytes}
            print(out["throughput"], flush=True)
        finally:
            subprocess.run(["docker", "rm", "-f", a_name, b_name], capture_output=True)
    finally:
        subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--no-images", action="store_true")
    args = parser.parse_args()
    result = {"cpus": os.cpu_count(), "per_request": per_request(args.runs)}
    if not args.no_images:
        result.update(images(args.requests))
    (ROOT / "bench" / "results-preprocess.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n| modality | preprocess ms | session.run ms | ratio |\n|---|---:|---:|---:|")
    for name, r in result["per_request"].items():
        print(f"| {name} | {r['preprocess_ms']} | {r['session_run_ms']} | {r['ratio']} |")


if __name__ == "__main__":
    main()
