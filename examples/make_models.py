"""Regenerate the example models (deterministic: fixed seeds, fixed opset); examples/mlp's is
trained on the iris data in mlp/iris.csv.

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


def iris() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Fisher's iris data (150 flowers, 4 measurements in cm, 3 species) from mlp/iris.csv, which
    is scikit-learn's copy (sklearn.datasets.load_iris) written out once."""
    rows = [line.split(",") for line in (HERE / "mlp" / "iris.csv").read_text().splitlines()[1:]]
    species = sorted({r[4] for r in rows})
    features = np.array([[float(v) for v in r[:4]] for r in rows])
    return features, np.array([species.index(r[4]) for r in rows]), species


def train_iris(steps: int = 3000, rate: float = 0.1) -> list[np.ndarray]:
    """A 4-16-3 MLP fitted to the iris data by full-batch gradient descent on the cross-entropy
    (fixed seed; NumPy only), on standardized features whose scaling is then folded into the
    first layer: the model takes the measurements as they are."""
    x, y, _ = iris()
    mean, std = x.mean(axis=0), x.std(axis=0)
    z = (x - mean) / std
    onehot = np.eye(3)[y]
    rng = np.random.default_rng(7)
    w1, b1 = rng.normal(0, 0.5, (4, 16)), np.zeros(16)
    w2, b2 = rng.normal(0, 0.5, (16, 3)), np.zeros(3)
    for _ in range(steps):
        h = z @ w1 + b1
        a = np.maximum(h, 0)
        logits = a @ w2 + b2
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        grad = (p - onehot) / len(x)
        da = grad @ w2.T * (h > 0)
        w2 -= rate * (a.T @ grad + 1e-4 * w2)
        b2 -= rate * grad.sum(axis=0)
        w1 -= rate * (z.T @ da + 1e-4 * w1)
        b1 -= rate * da.sum(axis=0)
    return [(w1 / std[:, None]).astype(np.float32), (b1 - (mean / std) @ w1).astype(np.float32),
            w2.astype(np.float32), b2.astype(np.float32)]


def mlp() -> None:
    """features [batch, 4] -> Linear(4, 16) -> Relu -> Linear(16, 3) -> logits, probs: trained on iris."""
    w1, b1, w2, b2 = train_iris()
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
    x, y, species = iris()
    h = np.maximum(x.astype(np.float32) @ w1 + b1, 0)
    accuracy = float(((h @ w2 + b2).argmax(axis=1) == y).mean())
    print(f"examples/mlp: trained on {len(y)} flowers ({', '.join(species)}): {accuracy:.1%} classified right")


POSITIVE = ["love", "like", "enjoy", "recommend"], ["great", "excellent", "wonderful", "amazing", "good", "fantastic"]
NEGATIVE = ["hate", "dislike", "regret", "return"], ["bad", "terrible", "awful", "poor", "boring", "disappointing"]
THINGS = ["product", "movie", "book", "phone", "service", "food", "game", "song", "hotel", "app"]


def reviews() -> list[tuple[str, int]]:
    """Short reviews made from templates (1 positive, 0 negative): the text example's corpus."""
    out = []
    for label, (verbs, words) in ((1, POSITIVE), (0, NEGATIVE)):
        for thing in THINGS:
            out += [(f"I {verb} this {thing}!", label) for verb in verbs]
            out += [(f"This {thing} is {word}.", label) for word in words]
            out += [(f"What a {word} {thing}", label) for word in words]
    return out


def text_tokenizer():
    """A WordPiece tokenizer trained on the corpus (BERT's normalizer and special tokens, [PAD] 0)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import WordPiece

    tok = Tokenizer(WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator([text for text, _ in reviews()], trainers.WordPieceTrainer(
        vocab_size=1000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return tok


def train_text(tok, vocab: int = 1000, dim: int = 32, steps: int = 400, rate: float = 2.0) -> list[np.ndarray]:
    """The embedding, dense weights and bias, fitted to the corpus by full-batch gradient descent
    on the cross-entropy of the masked mean of the token embeddings (fixed seed; NumPy only)."""
    texts, labels = zip(*reviews())
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    encodings = tok.encode_batch(list(texts))
    ids = np.array([e.ids for e in encodings])
    mask = np.array([e.attention_mask for e in encodings], np.float64)
    onehot = np.eye(2)[list(labels)]
    rng = np.random.default_rng(11)
    emb, w, b = rng.normal(0, 0.1, (vocab, dim)), rng.normal(0, 0.1, (dim, 2)), np.zeros(2)
    count = mask.sum(axis=1, keepdims=True)
    for _ in range(steps):
        pooled = (emb[ids] * mask[..., None]).sum(axis=1) / count
        logits = pooled @ w + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        grad = (p - onehot) / len(ids)
        d_pooled = grad @ w.T
        w -= rate * (pooled.T @ grad)
        b -= rate * grad.sum(axis=0)
        d_tok = (d_pooled / count)[:, None, :] * mask[..., None]
        np.add.at(emb, ids, -rate * d_tok)
    return [emb.astype(np.float32), w.astype(np.float32), b.astype(np.float32)]


def text_classifier() -> None:
    """input_ids, attention_mask [batch, seq] int64 -> embedding, masked mean, Linear -> logits
    [batch, 2]: trained on reviews(), with the tokenizer trained on them (tokenizer.json beside)."""
    tok = text_tokenizer()
    tok.save(str(HERE / "text-classifier" / "tokenizer.json"))
    emb, w, b = train_text(tok)
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
    texts, labels = zip(*reviews())
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(list(texts))
    ids, mask = np.array([e.ids for e in enc]), np.array([e.attention_mask for e in enc], np.float32)
    pooled = (emb[ids] * mask[..., None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
    right = float(((pooled @ w + b).argmax(axis=1) == np.array(labels)).mean())
    print(f"examples/text-classifier: trained on {len(texts)} reviews, a {tok.get_vocab_size()}-token vocabulary: "
          f"{right:.1%} classified right")


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
