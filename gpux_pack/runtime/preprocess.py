"""What the image does to a request before the graph sees it, and adds to /predict's answer
after, as gpux.json says (the packager decided it: gpux_pack/project/preprocess.py).

Text: the request's string input, tokenized with Hugging Face's `tokenizers` (Rust; imported
only by an image that tokenizes) into the graph's token inputs: truncated at max_length,
padded to the graph's fixed length, or to max_length, or to the longest text of the request,
on the right with the tokenizer's pad token. Labels: an output with labels answers them, and
per row the top label and its score."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .tensors import RequestError

PAD_TOKENS = ("[PAD]", "<pad>", "<|endoftext|>")  # when tokenizer.json sets no padding: the usual names
MAX_TEXTS = 4096  # texts in one request (each is a row of every token input)


class Text:
    """The text step: one tokenizer, loaded at start from the image's assets."""

    def __init__(self, spec: dict[str, Any], root: Path):
        from tokenizers import Tokenizer  # only an image that tokenizes imports it

        self.input: str = spec["input"]
        self.feeds: list[tuple[str, str, np.dtype]] = [(f["role"], f["name"], np.dtype(f["type"]))
                                                       for f in spec["feeds"]]
        self.max_length: int = spec["max_length"]
        self.truncation: bool = spec["truncation"]
        self.batch: int | None = spec.get("batch")
        tokenizer = Tokenizer.from_file(str(root / spec["file"]))
        padding = tokenizer.padding or {}
        pad_id = padding.get("pad_id")
        pad_token = padding.get("pad_token")
        if pad_token is None:
            pad_token, pad_id = next(((t, i) for t in PAD_TOKENS if (i := tokenizer.token_to_id(t)) is not None),
                                     ("[PAD]", 0))
        length = spec.get("length") or (self.max_length if spec["padding"] == "max_length" else None)
        if spec["padding"] == "none" and not spec.get("length"):
            tokenizer.no_padding()
        else:
            tokenizer.enable_padding(direction="right", pad_id=pad_id, pad_token=pad_token, length=length)
        if self.truncation:
            tokenizer.enable_truncation(self.max_length)
        else:
            tokenizer.no_truncation()
        self.tokenizer = tokenizer

    def apply(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """feeds with the text replaced by the token inputs; a request that sends the token
        inputs itself passes as it is."""
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
        if self.batch is not None and len(texts) > self.batch:
            raise RequestError(f"input '{self.input}': {len(texts)} texts, but the model takes {self.batch} per run "
                               "(send a JSON array of requests, one text each)")
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=True)
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


def load(spec: dict[str, Any], root: Path) -> Text | None:
    """The preprocessing gpux.json asks for, ready to apply (None when none)."""
    text = (spec.get("preprocessing") or {}).get("text")
    return Text(text, root) if text else None


def labelled(outputs: dict[str, Any], labels: dict[str, list[str]]) -> dict[str, Any]:
    """/predict's answer with GPUX's "labels" and, per row, the top label and its score
    ("predicted"); keyed by output when several outputs have labels. An output whose last
    dimension does not match its labels (a dynamic one) answers without them."""
    found: dict[str, tuple[list[str], list[dict[str, Any]]]] = {}
    for name, names in labels.items():
        value = outputs.get(name)
        if not isinstance(value, np.ndarray) or value.ndim == 0 or value.shape[-1] != len(names) or not names:
            continue
        if value.dtype.kind not in "fiub":
            continue
        rows = value.reshape(-1, value.shape[-1])
        top = rows.argmax(axis=1)
        found[name] = (names, [{"label": names[int(j)], "score": float(rows[i, j])} for i, j in enumerate(top)])
    if not found or "labels" in outputs or "predicted" in outputs:
        return outputs
    if len(found) == 1:
        names, predicted = next(iter(found.values()))
        return {**outputs, "labels": names, "predicted": predicted}
    return {**outputs, "labels": {k: v[0] for k, v in found.items()}, "predicted": {k: v[1] for k, v in found.items()}}
