"""/predict bodies read by simdjson (runtime/number_arrays.py) give what the general decoder
gives: the same array, or None and then the general decoder's answer. Hand-picked bodies at the
edges of the rule (ragged rows, an array among numbers, repeated keys, brackets in a key, what
simdjson will not read), then random mutations of a good body, each served by the app both ways."""

from __future__ import annotations

import json
import random

import numpy as np
import orjson
import pytest

from gpux_pack.runtime import dataplane, number_arrays
from tests.in_process import Client

F32 = {"features": np.dtype(np.float32)}


def _general(body: bytes) -> np.ndarray:
    return np.array(orjson.loads(body)["features"], np.float32)


@pytest.mark.parametrize("body", [
    b'{"features": [[5.1, 3.5, 1.4, 0.2]]}',
    b'{"features": [[1, 2, 3, 4], [5e-3, -6E+2, 0, -0.0]]}',
    b'{ "features" :\n [ [1,2,3,4] ] }',
    b'{"features": []}',
    b'{"features": [[]]}',
    b'{"features": [[1e38, 3.5e38, 1e-50, 2]]}',  # past float32's range: inf, as NumPy casts it
])
def test_the_arrays_equal_the_general_decoder_s(body):
    got = number_arrays.arrays(body, F32)
    assert got is not None and list(got) == ["features"]
    want = _general(body)
    assert got["features"].dtype == np.float32 and got["features"].shape == want.shape
    np.testing.assert_array_equal(got["features"], want)


@pytest.mark.parametrize("body", [
    b'{"features": [[1, 2], [3]]}',  # ragged
    b'{"features": [[1, 2], [3], [4, 5, 6]]}',  # ragged, the count of a regular shape
    b'{"features": [[1, 2], [[3], 4]]}',  # an array where a number belongs
    b'{"features": [[1, 2], 3]}',
    b'{"features": [1, "2"]}',
    b'{"features": [1, true]}',
    b'{"features": [1, null]}',
    b'{"features": [1, {"a": 1}]}',
    b'{"features": [+4]}',
    b'{"features": [.4]}',
    b'{"features": [NaN]}',
    b'{"features": [1e400]}',
    b'{"features": [1, 2]',
    b'{"features": [1], "features": [2]}',  # orjson keeps the last, simdjson the first
    b'{"features": [1], "other[": [2]}',
    b'{"other": [1]}',
    b'{"features": 1}',
    b'[{"features": [1]}]',
    b'{}',
    b'not json',
])
def test_anything_else_is_left_to_the_general_decoder(body):
    assert number_arrays.arrays(body, F32) is None


def test_a_parser_left_with_live_proxies_is_replaced():
    import simdjson

    number_arrays._local.parser = parser = simdjson.Parser()
    held = parser.parse(b'{"features": [1]}')  # noqa: F841 (alive: that parser cannot parse again)
    got = number_arrays.arrays(b'{"features": [[1, 2]]}', F32)
    assert got is not None and got["features"].tolist() == [[1.0, 2.0]]
    assert number_arrays._local.parser is not parser


def test_served_answers_are_the_same_with_and_without_it(mlp, monkeypatch):
    """The app's answer (status and body) for good and mutated bodies, number_arrays on and off."""
    client: Client = mlp
    rng = random.Random(7)
    base = json.dumps({"features": np.round(np.random.default_rng(3).normal(size=(40, 4)), 4).tolist()})
    bodies = [base.encode()]
    alphabet = '0123456789.,-+eE[]{}" :tnulfasr'
    for _ in range(300):
        text = list(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(text))
            op = rng.random()
            if op < 0.4:
                text[at] = rng.choice(alphabet)
            elif op < 0.7:
                del text[at]
            else:
                text.insert(at, rng.choice(alphabet))
        bodies.append("".join(text).encode())
    fast = [client.request("POST", "/predict", b) for b in bodies]
    monkeypatch.setattr(dataplane.number_arrays, "arrays", lambda raw, dtypes: None)
    general = [client.request("POST", "/predict", b) for b in bodies]
    assert [(s, a) for s, a, _ in fast] == [(s, a) for s, a, _ in general]
    assert sum(s == 200 for s, _, _ in fast) > 20  # some mutations stay valid requests
