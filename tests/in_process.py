"""The image's runtime in this process, for the unit tests: a model folder staged from an example
(gpux.json as a build writes it), its settings, an ASGI client, gRPC calls made over a real
channel on 127.0.0.1, and ONNX Runtime's own answers to compare with."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort

from gpux_pack.pipeline.build import load, plan_for
from gpux_pack.plan import Options
from gpux_pack.providers import EP_NAMES
from gpux_pack.ui import Reporter
from gpux_pack.runtime import contract
from gpux_pack.runtime.settings import Settings
from gpux_pack.runtime.server import App


ROOT = Path(__file__).resolve().parents[1]


def spec_dir(tmp_path: Path, example: str, provider: str = "cpu", warmup: str | None = None) -> Path:
    """gpux.json + model as the image holds them, from the real planning code."""
    loaded = load(ROOT / "examples" / example)
    plan = plan_for(loaded, provider, "test", Options(warmup=warmup), None, Reporter(quiet=True), pull=False)
    spec = plan.gpux_json.to_json()
    (tmp_path / "model").mkdir()
    for name in loaded.model.files:
        shutil.copy(loaded.model.path.parent / name, tmp_path / "model" / name)
    if plan.assets:  # a tokenizer
        (tmp_path / "assets").mkdir()
        for name, path in plan.assets:
            shutil.copy(path, tmp_path / "assets" / name)
    (tmp_path / "gpux.json").write_text(json.dumps(spec))
    return tmp_path


def settings(folder: Path, **env: str) -> Settings:
    return Settings.load({"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache"), **env})


class Client:
    """Drives the ASGI app directly: no sockets, same code paths as uvicorn."""

    def __init__(self, app: App):
        self.app = app

    def request(self, method: str, path: str, body: bytes | str | object = b"", headers=None):
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        sent = self.raw(method, path, body.encode() if isinstance(body, str) else body, headers)
        return sent[0]["status"], json.loads(sent[1]["body"]), dict(sent[0]["headers"])

    def raw(self, method: str, path: str, body: bytes, headers=None) -> list[dict]:
        scope = {"type": "http", "method": method, "path": path, "headers": headers or []}
        sent: list[dict] = []

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            if message["type"] == "http.response.body" and len(sent) > 1:  # an answer sent in pieces: one
                assert sent[-1]["more_body"], "a piece after the last"
                sent[-1] = {**message, "body": bytes(sent[-1]["body"]) + bytes(message["body"])}
            else:
                sent.append(message)

        asyncio.run(self.app(scope, receive, send))
        return sent


def reference(example: str, feeds: dict) -> list:
    return ort.InferenceSession(str(ROOT / "examples" / example / "model.onnx")).run(None, feeds)


def tiny_dir(tmp_path: Path, ir_version: int = 7) -> Path:
    """y = x * scale + bias, written by hand: `scale` is an initializer listed in "inputs" with
    required: false, `bias` one listed only in "overridable_inputs" (what the packager writes
    for the weights an old exporter lists as graph inputs)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["xs"]), helper.make_node("Add", ["xs", "bias"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(np.ones(3, np.float32), "scale"),
         numpy_helper.from_array(np.array([1, 2, 3], np.float32), "bias")])
    opset = 9 if ir_version == 3 else 13
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    (tmp_path / "model").mkdir()
    onnx.save(model, str(tmp_path / "model" / "tiny.onnx"))
    t = contract.Tensor
    spec = contract.GpuxJson(
        name="tiny", title="tiny", version="1", description=None,
        model=contract.ModelFiles("model/tiny.onnx", "tiny.onnx", ("tiny.onnx",), False, "", 0, opset, 2),
        inputs=(t("x", "float32", ("batch", 3)), t("scale", "float32", (3,), required=False)),
        overridable_inputs=(t("bias", "float32", (3,), required=False),),
        outputs=(t("y", "float32", ("batch", 3)),),
        provider="cpu", execution_providers=(("CPUExecutionProvider", {}),), provider_names=dict(EP_NAMES),
        pack_version="test", onnxruntime=ort.__version__,
    ).to_json()
    (tmp_path / "gpux.json").write_text(json.dumps(spec))
    return tmp_path


def grpc_calls(app: App, calls: list[tuple[str, bytes]]) -> list[tuple[str, str]]:
    """Raw request bytes to gRPC methods of a server started on `app`, as a client that sends
    whatever it likes: (status code name, details) of each answer."""
    import socket

    import grpc

    from gpux_pack.runtime import grpc_v2

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def run() -> list[tuple[str, str]]:
        server = await grpc_v2.start(app, port, "127.0.0.1")
        out = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                for method, raw in calls:
                    call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}",
                                               request_serializer=None, response_deserializer=None)
                    try:
                        answer = await call(raw, timeout=30)
                        out.append(("OK", answer))
                    except grpc.aio.AioRpcError as e:
                        out.append((e.code().name, e.details()))
        finally:
            await server.stop(None)
        return out

    return asyncio.run(run())


def infer_request(**fields) -> bytes:
    from gpux_pack.runtime import grpc_v2

    request = grpc_v2.message_classes()["ModelInferRequest"](model_name=fields.pop("model_name", "iris-mlp"))
    x = fields.pop("x", np.ones((2, 4), np.float32))
    request.inputs.add(name=fields.pop("name", "features"), datatype="FP32", shape=fields.pop("shape", x.shape))
    request.raw_input_contents.append(x.tobytes())
    return request.SerializeToString()
