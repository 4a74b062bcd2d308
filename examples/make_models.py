"""Regenerate the example models (deterministic: fixed seeds, fixed opset).

    python examples/make_models.py
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).parent
OPSET = 17


def save(graph: onnx.GraphProto, path: Path, ml: bool = False) -> None:
    opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid("ai.onnx.ml", 2)] if ml else [])
    model = helper.make_model(graph, opset_imports=opsets, producer_name="gpux-pack-examples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def mlp() -> None:
    """features [batch, 4] -> Linear(4, 16) -> Relu -> Linear(16, 3) -> logits, probs."""
    rng = np.random.default_rng(7)
    w1 = rng.normal(0, 0.5, (4, 16)).astype(np.float32)
    b1 = rng.normal(0, 0.1, (16,)).astype(np.float32)
    w2 = rng.normal(0, 0.5, (16, 3)).astype(np.float32)
    b2 = rng.normal(0, 0.1, (3,)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["features", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Gemm", ["a", "w2", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "iris-mlp",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
    )
    save(graph, HERE / "mlp" / "model.onnx")


def text_classifier() -> None:
    """input_ids, attention_mask [batch, seq] int64 -> embedding, masked mean, Linear -> logits [batch, 2]."""
    rng = np.random.default_rng(11)
    vocab, dim = 1000, 32
    emb = rng.normal(0, 0.3, (vocab, dim)).astype(np.float32)
    w = rng.normal(0, 0.3, (dim, 2)).astype(np.float32)
    b = np.array([0.05, -0.05], dtype=np.float32)
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["tok"]),            # [b, s, d]
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis_last"], ["mask3"]),            # [b, s, 1]
        helper.make_node("Mul", ["tok", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis_seq"], ["summed"], keepdims=0),  # [b, d]
        helper.make_node("ReduceSum", ["maskf", "axis_seq"], ["count"], keepdims=1),   # [b, 1]
        helper.make_node("Max", ["count", "one"], ["count1"]),
        helper.make_node("Div", ["summed", "count1"], ["pooled"]),
        helper.make_node("Gemm", ["pooled", "w", "b"], ["logits"]),
    ]
    inits = [
        numpy_helper.from_array(emb, "embedding"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis_last"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis_seq"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
    ]
    graph = helper.make_graph(
        nodes, "text-classifier",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        inits,
    )
    save(graph, HERE / "text-classifier" / "model.onnx")


def strings() -> None:
    """text [batch] strings -> kind [batch] strings (cat feline, dog canine, else unknown), label
    [batch] int64 (cat 0, dog 1, else -1). LabelEncoder needs no locale (StringNormalizer does)."""
    nodes = [
        helper.make_node("LabelEncoder", ["text"], ["kind"], domain="ai.onnx.ml", keys_strings=["cat", "dog"],
                         values_strings=["feline", "canine"], default_string="unknown"),
        helper.make_node("LabelEncoder", ["text"], ["label"], domain="ai.onnx.ml",
                         keys_strings=["cat", "dog"], values_int64s=[0, 1], default_int64=-1),
    ]
    graph = helper.make_graph(
        nodes, "strings",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("kind", TensorProto.STRING, ["batch"]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])],
    )
    (HERE / "strings").mkdir(exist_ok=True)
    save(graph, HERE / "strings" / "model.onnx", ml=True)


if __name__ == "__main__":
    mlp()
    text_classifier()
    strings()
