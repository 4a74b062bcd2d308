"""What decoding a request holds, counted before it is held: large all-number JSON arrays go
straight from the text to numpy (no Python object per number), anything else is charged what
orjson's objects cost, and a body that can never fit is 413, one that does not fit now 503."""

from __future__ import annotations

import gc
import time
import json
import tracemalloc

import numpy as np
import orjson
import pytest

from gpux_pack.runtime import tensors
from gpux_pack.runtime.tensors import RequestError
from gpux_pack.runtime.resources import Limits
from gpux_pack.runtime.resources import REQUEST_OVERHEAD
from gpux_pack.runtime.server import SEND_PIECE, App
from gpux_pack.runtime.session import Model
from gpux_pack.runtime.settings import Settings
from tests.in_process import Client, reference, spec_dir

MiB = 1024 * 1024


def _app(tmp_path, memory: int, **env: str) -> Client:
    folder = spec_dir(tmp_path, "mlp")
    env = {"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache"), **env}
    app = App(Model.load(Settings.load(env, limits=Limits(1, memory, "given"))), "test")
    app.start_warmup()
    assert app.ready.wait(10)
    return Client(app)


def _rows(n: int, seed: int = 0) -> np.ndarray:
    """Floats with every JSON spelling orjson writes: exponents, negatives, long mantissas."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 4)) * 10.0 ** rng.integers(-8, 8, size=(n, 4))).astype(np.float32)


@pytest.fixture
def mlp(tmp_path):
    return _app(tmp_path, 8 * 1024 * MiB)


def test_large_numeric_json_equals_the_small_path_bit_for_bit(mlp):
    x = _rows(20000)
    logits, probs = reference("mlp", {"features": x})
    body = orjson.dumps({"features": x.tolist()})
    assert len(body) > tensors.FAST_MIN and tensors.numeric_body(body) is not None
    status, answer, _ = mlp.request("POST", "/predict", body)
    assert status == 200
    np.testing.assert_array_equal(np.asarray(answer["probs"], np.float32), probs)
    v2 = orjson.dumps({"inputs": [{"name": "features", "shape": [20000, 4], "datatype": "FP32", "data": x.ravel().tolist()}]})
    status, answer, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", v2)
    assert status == 200
    np.testing.assert_array_equal(np.asarray(answer["outputs"][0]["data"], np.float32).reshape(20000, 3), logits)
    feeds, _, _ = mlp.app.plane.decode(mlp.app.plane.predict, body)
    np.testing.assert_array_equal(feeds["features"], np.array(orjson.loads(body)["features"], np.float32))


def test_decoding_12_mib_of_float_rows_holds_a_fraction_of_what_python_objects_would(mlp):
    """The reporter's body: orjson's objects peak at about 23x its size; this path at under 3x."""
    body = b'{"features": [' + b"[5.1,3.5,1.4,0.2]," * (12 * MiB // 18) + b"[5.1,3.5,1.4,0.2]]}"
    tracemalloc.start()
    try:
        feeds, _, _ = mlp.app.plane.decode(mlp.app.plane.predict, body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert feeds["features"].shape == (12 * MiB // 18 + 1, 4) and feeds["features"].dtype == np.float32
    assert peak < 3 * len(body), peak / len(body)
    assert mlp.app.budget.in_flight_bytes == 0


def test_a_body_that_can_never_fit_is_413_and_one_that_does_not_fit_now_is_503(tmp_path):
    client = _app(tmp_path, 64 * MiB, GPUX_MAX_REQUEST_BYTES=str(64 * MiB))  # 32 MiB may be in flight
    numbers = orjson.dumps({"features": _rows(40000).tolist()})  # ~1.3 MB: decoded from the text
    escaped = numbers[:-1] + b', "features2": "\\u0041"}'  # a backslash: parsed whole, 40x its size
    assert tensors.numeric_body(escaped) is None and len(escaped) * tensors.JSON_FACTOR > 32 * MiB
    status, answer, _ = client.request("POST", "/predict", escaped)
    assert status == 413 and "binary" in answer["error"] and "half its memory" in answer["error"], answer
    assert client.request("POST", "/predict", numbers)[0] == 200
    held = client.app.budget.hold(client.app.budget.room - MiB)  # another request holds most of the budget
    try:
        status, answer, headers = client.request("POST", "/predict", numbers)
        assert status == 503 and headers[b"retry-after"] == b"1", answer
    finally:
        client.app.budget.release(held)
    assert client.app.metrics.refused.values == {"memory": 2}  # each refusal counted once, as memory
    assert client.request("POST", "/predict", numbers)[0] == 200 and client.app.budget.in_flight_bytes == 0


def test_what_the_process_keeps_between_requests_is_taken_out_of_what_requests_may_hold(tmp_path, monkeypatch):
    """Under a container's limit the budget reads the process's resident memory once idle: what
    it grew since warmup (fragmentation, the image libraries' pools) comes out of the in-flight
    half, and requests never get more than the memory less that floor and a sixteenth."""
    from gpux_pack.runtime import budget as budget_module

    readings = {"now": 70 * MiB}
    monkeypatch.setattr(budget_module, "resident", lambda: readings["now"])
    folder = spec_dir(tmp_path, "mlp")
    env = {"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache")}
    app = App(Model.load(Settings.load(env, limits=Limits(1, 256 * MiB, "cgroup"))), "test")
    app.start_warmup()
    assert app.ready.wait(10)
    budget = app.budget
    assert budget.room == 128 * MiB  # half the memory: 70 MiB kept leaves more than that
    readings["now"] = 150 * MiB  # earlier requests left 80 MiB the process keeps
    budget.measure()
    assert budget.room == 48 * MiB
    with pytest.raises(RequestError) as refused:
        budget.hold(49 * MiB)
    assert refused.value.status == 503
    budget.release(budget.hold(48 * MiB))
    readings["now"] = 230 * MiB  # near the limit: the memory less the floor and a sixteenth is less still
    budget.measure()
    assert budget.room == 0
    client = Client(app)
    assert client.request("POST", "/predict", {"features": [[5.1, 3.5, 1.4, 0.2]]})[0] == 503
    held = budget.hold(0)
    budget.in_flight_bytes += 1  # something in flight: what is resident now is not the floor
    readings["now"] = 70 * MiB
    budget.measure()
    assert budget.room == 0
    budget.in_flight_bytes -= 1
    budget.release(held)
    budget.measure()
    assert budget.room == 128 * MiB


@pytest.mark.parametrize("rows, words", [
    (b"[1,2,3,4]," * 120000 + b"[1,2,3]", "ragged nested lists"),
    (b"[1,2,3,4]," * 120000 + b"[1,2,3,+4]", "malformed JSON number"),
    (b"[1,2,3,4]," * 120000 + b"[1,2,3,.4]", "malformed JSON number"),
    (b"[1,2,3,4]," * 120000 + b"[1,2,3,4],", "malformed JSON"),
    (b"[1,2,3,4]," * 120000 + b'[1,2,3,"4"]', "got strings"),
    (b"[1,2,3,4]," * 120000 + b"[1,2,3,null]", "or nulls"),
])
def test_large_bodies_are_refused_as_small_ones_are(mlp, rows, words):
    """Past WHOLE_PARSE (1 MiB) a body's arrays are read from its text: the same refusals."""
    status, answer, _ = mlp.request("POST", "/predict", b'{"features": [' + rows + b"]}")
    assert status == 400 and words in answer["error"], answer
    v2 = b'{"inputs": [{"name": "features", "shape": [120001, 4], "datatype": "FP32", "data": [' + rows + b"]}]}"
    status, answer, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", v2)
    assert status == 400 and words in answer["error"], answer


def test_arrays_inside_strings_or_elsewhere_are_not_taken_for_tensors(mlp):
    text = "[" + ",".join(["1.5"] * 30000) + "]"
    body = json.dumps({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32",
                                   "data": [1, 2, 3, 4]}], "id": text}).encode()
    status, answer, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", body)
    assert status == 200 and answer["id"] == text
    body = json.dumps({"inputs": [{"name": "features", "shape": [30000], "datatype": "FP32", "data": [1, 2, 3, 4]}],
                       "outputs": [{"name": "logits", "parameters": {"x": json.loads(text)}}]}).encode()
    status, answer, _ = mlp.request("POST", "/v2/models/iris-mlp/infer", body)
    assert status == 400 and "shape [30000] needs 30000 values" in answer["error"], answer
    status, answer, _ = mlp.request("POST", "/predict", {"features": [[1, 2, 3, 4]], "extra": json.loads(text)})
    assert status == 400 and "unknown input 'extra'" in answer["error"], answer


@pytest.mark.parametrize("numbers", [b"1", b"5.1,3.5,1.4,0.2", b"-1.2345678e-05"])
def test_what_is_charged_covers_what_decoding_holds(numbers):
    body = b'{"x": [' + b",".join([numbers] * (2 * MiB // len(numbers))) + b"]}"
    found = tensors.numeric_body(body)
    tracemalloc.start()
    try:
        found.fill(lambda path: tensors.ServedTensor("x", "float32", (-1,)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= found.decode_cost(4), (peak, found.decode_cost(4))


def test_a_large_body_is_freed_when_its_request_ends_not_at_the_next_full_collection(mlp):
    """Nothing a request leaves in a reference cycle may hold its text, its arrays or its answer:
    a cycle lives until the collector's next full pass, and a burst of large bodies held 40-75 MB
    longer (a recursive closure in the hole filling held each body; a job pointing at its batch,
    which held the job, kept each request's inputs and outputs: 1.9 MB a request for 46,000 rows)."""
    x = _rows(20000)
    bodies = [("/predict", orjson.dumps({"features": x.tolist()})),
              ("/v2/models/iris-mlp/infer", orjson.dumps({"inputs": [
                  {"name": "features", "shape": [20000, 4], "datatype": "FP32", "data": x.ravel().tolist()}]})),
              ("/predict", orjson.dumps({"features": x[:, :3].tolist()}))]
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for path, body in bodies:
            status, _, _ = mlp.request("POST", path, body)
            assert status in (200, 400)
        gc.collect()
        held = _large_reachable(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not held, [type(r).__name__ for r in held]


def _large_reachable(roots: list) -> list[str]:
    """Large bytes and arrays reachable from `roots`, through containers the collector does not
    track too (a dict of arrays is untracked, so it is never in gc.garbage itself)."""
    seen, found, todo = set(), [], list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type) or type(obj).__name__ == "module":
            continue
        seen.add(id(obj))
        if isinstance(obj, (bytes, bytearray, np.ndarray)):
            if (obj.nbytes if isinstance(obj, np.ndarray) else len(obj)) >= 64 * 1024:
                found.append(type(obj).__name__)
            continue
        todo.extend(gc.get_referents(obj))
    return found


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int8", "uint8"])
def test_the_text_path_agrees_with_orjson_on_every_array_well_formed_or_not(monkeypatch, dtype):
    """Arrays of every shape (empty ones too), then with characters inserted, deleted or
    replaced (signs, dots, exponents, brackets, commas, blanks): read from the text in pieces of
    7 bytes, the answer is orjson's (the same array, or a 400 where orjson or the input's checks
    refuse it), never another array."""
    monkeypatch.setattr(tensors, "CHUNK", 7)
    spec = tensors.ServedTensor("x", dtype, None)
    rng = np.random.default_rng(7)
    alphabet = b"0123456789.eE+-[], "
    disagreements = []
    for i in range(3000):
        shape = tuple(rng.integers(0, 4, size=rng.integers(1, 4)))
        values = np.round(rng.normal(size=shape) * 10.0 ** rng.integers(-3, 4), int(rng.integers(0, 4)))
        if dtype[0] in "iu" and i % 5:
            values = values.astype(np.int64)
        text = bytearray(orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY))
        for _ in range(int(rng.integers(0, 3))):
            at, op = int(rng.integers(0, len(text))), rng.random()
            char = alphabet[int(rng.integers(0, len(alphabet)))]
            if op < 0.4:
                text.insert(at, char)
            elif op < 0.7:
                del text[at]
            else:
                text[at] = char
        text = bytes(text)
        if not text.startswith(b"[") or not text.endswith(b"]"):
            continue
        with np.errstate(over="ignore"):  # 1e300 as float32 is inf on both paths
            try:
                expected = tensors.to_array(spec, orjson.loads(text), "x", fast=True)
            except (orjson.JSONDecodeError, tensors.RequestError):
                expected = None
            try:
                got = tensors.numeric_array(text, 0, len(text), spec)
            except tensors.RequestError:
                got = None
        same = expected is None and got is None or expected is not None and got is not None and \
            expected.shape == got.shape and expected.dtype == got.dtype and np.array_equal(expected, got, equal_nan=True)
        if not same:
            disagreements.append(text)
    assert not disagreements, disagreements[:5]


def test_a_255_kb_body_decodes_within_a_small_multiple_of_orjson():
    """The text path was 20x orjson's time on this body (a regex over every number); it must stay
    near it. The two are timed in turns, in this process; the best of each is compared."""
    x = np.random.default_rng(3).random((3072, 4), dtype=np.float32)
    body = json.dumps({"features": x.tolist()}).encode()  # 255 KB, as a Python client writes it
    assert 240_000 < len(body) < 270_000
    found = tensors.numeric_body(body)
    spec = tensors.ServedTensor("features", "float32", ("batch", 4))
    assert found is not None and tensors.hole_inputs(found, [spec], [], v2=False) is not None

    def ours() -> np.ndarray:
        return tensors.numeric_body(body).fill(lambda path: spec)["features"]

    def floor() -> np.ndarray:
        return np.asarray(orjson.loads(body)["features"], np.float32)

    np.testing.assert_array_equal(ours(), floor())
    best = {ours: float("inf"), floor: float("inf")}
    for _ in range(15):
        for fn in best:
            started = time.perf_counter()
            fn()
            best[fn] = min(best[fn], time.perf_counter() - started)
    assert best[ours] <= 3 * best[floor], (best[ours] * 1000, best[floor] * 1000)


def _chain(path, reshape: bool = False) -> None:
    """x [batch, 4] -> MatMul [4, 100] -> Relu -> MatMul [100, 2] -> Relu -> y, or a Reshape to [-1, 2]."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.ones((4, 100), np.float32), "w1"),
             numpy_helper.from_array(np.ones((100, 2), np.float32), "w2"),
             numpy_helper.from_array(np.array([-1, 2], np.int64), "shape")]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])] if reshape else [
        helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("MatMul", ["b", "w2"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])], inits)
    import onnx

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_the_graphs_intermediate_tensors_are_charged_at_their_peak(tmp_path):
    """a, [batch, 100] floats (400 bytes a row), then c (8) beside it: Relu writes b over a, as
    ONNX Runtime does, so 408 bytes a row, not 808; y is the outputs' charge, not this. A Reshape
    is a view of its input (the request's own here: nothing), and the Relu after it makes a
    buffer whose first dimension inference cannot tie to the batch: it counts once (8 bytes)."""
    from gpux_pack.project.model import inspect_model

    _chain(tmp_path / "chain.onnx")
    assert inspect_model(tmp_path / "chain.onnx").working_memory == (((("x", 0),), 408),)
    _chain(tmp_path / "reshape.onnx", reshape=True)
    assert inspect_model(tmp_path / "reshape.onnx").working_memory == (((), 8),)
    assert inspect_model(tensors_root() / "examples/mlp/model.onnx").working_memory == (((("features", 0),), 64),)


def tensors_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[2]


def test_a_binary_request_whose_model_tensors_exceed_the_budget_is_413_before_it_runs(tmp_path):
    """200,000 rows of the mlp: 3.2 MB in, 4.8 MB out and as much again in the answer, and 12.8 MB
    of the graph's own tensors. A 16 MiB budget per request takes the tensors and the answer but
    not the model's: a 413 that counts them, where it used to run (and, several at once, be
    OOM-killed in a small container)."""
    client = _app(tmp_path, 8 * 1024 * MiB, GPUX_MAX_REQUEST_BYTES=str(16 * MiB))
    assert client.app.budget.working == [((("features", 0),), 64)]
    x = np.ones((200000, 4), np.float32)
    head = orjson.dumps({"inputs": [{"name": "features", "shape": [200000, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}})
    status, answer, _ = client.request("POST", "/v2/models/iris-mlp/infer", head + x.tobytes(),
                                       [(b"inference-header-content-length", str(len(head)).encode())])
    assert status == 413 and f"about {25600000 + REQUEST_OVERHEAD} bytes" in answer["error"], answer
    small = head.replace(b"200000", b"20000").replace(str(x.nbytes).encode(), str(x[:20000].nbytes).encode())
    sent = client.raw("POST", "/v2/models/iris-mlp/infer", small + x[:20000].tobytes(),
                      [(b"inference-header-content-length", str(len(small)).encode())])
    assert sent[0]["status"] == 200 and client.app.budget.in_flight_bytes == 0


def _in_pieces(app, path: str, body: bytes, pieces: int, declared: bool) -> tuple[int, list[bytes]]:
    """The body as uvicorn hands a large one over: several messages (Content-Length or chunked)."""
    import asyncio

    size = -(-len(body) // pieces)
    messages = [{"type": "http.request", "body": body[i: i + size], "more_body": i + size < len(body)}
                for i in range(0, len(body), size)]
    headers = [(b"content-length", str(len(body)).encode())] if declared else []
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    sent: list[dict] = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], [bytes(m.get("body", b"")) for m in sent[1:]]


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_body_in_pieces_is_read_into_one_buffer_and_answered_as_in_one(mlp, declared):
    x = _rows(20000)
    body = orjson.dumps({"features": x.tolist()})
    whole = mlp.raw("POST", "/predict", body)
    status, answer = _in_pieces(mlp.app, "/predict", body, 7, declared)
    assert status == 200 and b"".join(answer) == whole[1]["body"] and mlp.app.budget.in_flight_bytes == 0
    assert len(answer) > 1 and max(map(len, answer)) <= SEND_PIECE  # the answer goes out in pieces too
