"""A BERT-shaped project made in the test: a tokenizer.json written with the `tokenizers` library
(a BERT-style word-level vocabulary: lower-cased, [CLS] text [SEP], [PAD] 0), and a model taking
input_ids, attention_mask and token_type_ids [batch, sequence] int64 that answers sentiment
logits [batch, 2] (labelled negative/positive) and echoes its token inputs (Identity outputs),
so a test sees exactly what the image fed the graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "i", "love", "hate", "this", "product", "it", "is", "great", "bad",
         "not", "the", "a", "movie", "!", ".", ","]
POSITIVE = {"love": 2.0, "great": 1.5}
NEGATIVE = {"hate": 2.0, "bad": 1.5, "not": 0.5}


def tokenizer():
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return tok


def model(sequence: int | str = "sequence", batch: int | str = "batch"):
    """logits = sum over the sequence of a word's [negative, positive] weight, where the mask is 1."""
    import onnx
    from onnx import TensorProto, helper

    weights = np.zeros((len(WORDS), 2), np.float32)
    for word, w in POSITIVE.items():
        weights[WORDS.index(word), 1] = w
    for word, w in NEGATIVE.items():
        weights[WORDS.index(word), 0] = w
    shape = [batch, sequence]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, shape)
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 2]),
               *(helper.make_tensor_value_info(f"{n}_seen", TensorProto.INT64, shape)
                 for n in ("input_ids", "attention_mask", "token_type_ids"))]
    nodes = [
        helper.make_node("Gather", ["weights", "input_ids"], ["per_token"]),  # [b, s, 2]
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last"], ["mask3"]),  # [b, s, 1]
        helper.make_node("Mul", ["per_token", "mask3"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "one"], ["logits"], keepdims=0),
        *(helper.make_node("Identity", [n], [f"{n}_seen"]) for n in ("input_ids", "attention_mask", "token_type_ids")),
    ]
    graph = helper.make_graph(nodes, "sentiment", inputs, outputs, initializer=[
        helper.make_tensor("weights", TensorProto.FLOAT, weights.shape, weights.flatten().tolist()),
        helper.make_tensor("last", TensorProto.INT64, [1], [2]),
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
    ])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


GPUX_YML = """\
name: sentiment
version: 1.0.0
model:
  source: ./model.onnx
inputs:
  text:
    type: string
    max_length: {max_length}
outputs:
  logits:
    type: float32
    labels: [negative, positive]
  input_ids_seen: {{}}
  attention_mask_seen: {{}}
  token_type_ids_seen: {{}}
preprocessing:
  tokenizer: bert-base-uncased
  max_length: {max_length}
"""


def make(folder: Path, max_length: int = 16, sequence: int | str = "sequence", extra: str = "",
         batch: int | str = "batch") -> Path:
    """The project: gpux.yml (GPUX's top-level example's form, tokenizer named as on the Hub),
    model.onnx and tokenizer.json beside it (which the build takes before any download)."""
    import onnx

    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model(sequence, batch), str(folder / "model.onnx"))
    tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "gpux.yml").write_text(GPUX_YML.format(max_length=max_length) + extra)
    return folder


def expected(texts: list[str], length: int | None, max_length: int) -> dict[str, np.ndarray]:
    """What the `tokenizers` library itself gives for these texts, padded as the image pads."""
    tok = tokenizer()
    tok.enable_truncation(max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=length)
    encodings = tok.encode_batch(texts)
    return {"input_ids": np.array([e.ids for e in encodings], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], np.int64)}
