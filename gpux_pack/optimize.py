"""pack.optimize: the model made faster or smaller at build, and checked before it ships.

A packager holds the model at the one moment it knows the hardware it targets. Each step is
ONNX Runtime's own tool: `graph` its offline graph optimisation (saved, so the image's session
starts on a graph already folded and fused), `int8` its quantiser (dynamic; static with
calibration samples), `fp16` its float16 converter (inputs and outputs kept in their types).
After every step the result runs beside the original model on sample inputs (given, or made
from the graph's types and shapes with a fixed seed) in ONNX Runtime's CPU provider here, and
the largest error on each output is measured; the build stops, naming the output and the error,
when one exceeds its tolerance.

`decide` is the plan's part (what would be done for a provider, and what cannot be, in one line
each); `optimize` does it, cached by the model's digest, the steps, the samples and ONNX
Runtime's version, so a rebuild of the same model optimises nothing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gpux_pack import staging
from gpux_pack.errors import ConfigError
from gpux_pack.project.load import Project
from gpux_pack.project.model import ModelInfo, Signature, inspect_model
from gpux_pack.project.skeleton import read_skeleton
from gpux_pack.providers import Provider
from gpux_pack.staging import cache_dir, touch

FORMAT = "2"  # of the entries under the cache's optimized/ (2: static falls back to per-tensor weights)
# relative L2 errors (_error): graph's fusions reorder float arithmetic (1e-7 measured); int8
# weights, per channel, moved a BERT encoder's hidden state by 0.07-0.11 (pooled embedding cosine
# 0.994-0.998) where per-tensor weights moved it by 0.25 and a broken quantisation by 0.4 and more
DEFAULT_TOLERANCE = {"graph": 1e-4, "int8": 0.15, "fp16": 0.01}
GENERATED = 4  # inputs made when none are given
SEED = 0
DYNAMIC_SIZE = 32  # a dimension the graph and gpux.yml leave open, in generated inputs (axis 0: 1)
MAX_SAMPLES = 64
MAX_SAMPLE_BYTES = 256 << 20  # all given samples together
# what dynamic quantisation quantises: MatMul-heavy graphs (transformers, dense layers, RNNs) gain;
# Conv is left in float: ONNX Runtime's ConvInteger ran 3-6x slower than float convolution on
# the CPUs measured (docs/benchmarks.md), and static quantisation (samples) covers it instead
DYNAMIC_OPS = ("MatMul", "Gemm", "Attention", "LSTM", "GRU", "Gather", "EmbedLayerNormalization")
_MODEL = ("pack", "optimize")
# ONNX Runtime's graph transformers of the basic and extended levels, as its verbose log names
# them at a CPU session's creation (1.32). `graph` ran them at build, to a fixed point: an image
# whose last step was graph does not run them again at start (ONNX Runtime's disabled_optimizers;
# PP-OCRv4's session 0.54x -> 0.44x the original's creation time, same answers bit for bit). The
# layout level (NchwcTransformer, NhwcTransformer: blocked for the CPU that runs the image) and
# the CPU provider's own transpose pass still run; a name another version lacks is ignored, a
# pass it adds runs.
OFFLINE_TRANSFORMERS = (
    "CommonSubexpressionElimination", "ConstantFolding", "ConstantSharing", "DoubleQDQPairsRemover",
    "EnsureUniqueDQForNodeUnit", "FreeDimensionOverrideTransformer", "GeluFusionL1", "LayerNormFusionL1",
    "Level1_RuleBasedTransformer", "MatMulAddFusion", "QDQPropagationTransformer", "ReshapeFusion",
    "SliceConcatToSpaceToDepthFusion", "TransposeOptimizer", "WeightBiasQuantization", "WhereDummyDq",
    "AttentionFusion", "BiasDropoutFusion", "BiasGeluFusion", "BiasSkipLayerNormFusion", "BiasSoftmaxFusion",
    "ConvActivationFusion", "DynamicQuantizeMatMulFusion", "EmbedLayerNormFusion", "FastGeluFusion",
    "GatherSliceToSplitFusion", "GatherToSliceFusion", "GeluFusionL2", "GemmActivationFusion",
    "GroupQueryAttentionFusion", "GroupQueryAttentionPreNormFusion", "LayerNormFusionL2",
    "Level2_RuleBasedTransformer", "MatMulActivationFusion", "MatMulIntegerToFloatFusion", "MatMulNBitsFusion",
    "MatMulScaleFusion", "MatmulTransposeFusion", "QDQFinalCleanupTransformer", "QDQS8ToU8Transformer",
    "QDQSelectorActionTransformer", "QuickGeluFusion", "SimplifiedLayerNormFusion", "SkipLayerNormFusion",
    "SwiGluFusion",
)


@dataclass(frozen=True)
class Step:
    mode: str  # graph | int8 | fp16
    how: str  # what exactly: "extended" | "basic" | "dynamic" | "static" | "float16"


@dataclass(frozen=True)
class Decision:
    """What the build would do to the model for one provider, and what it cannot (one line each)."""

    steps: tuple[Step, ...] = ()
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Measured:
    """One step's result against the original model: the largest error on each output."""

    step: Step
    errors: tuple[tuple[str, float], ...]  # (output, error) in the model's output order
    tolerance: tuple[tuple[str, float], ...]  # (output, largest error allowed)


@dataclass(frozen=True)
class Optimized:
    """What pack.optimize did: the image's model is `model`; the original's digest and size, each
    step with its measured errors, and what was left out and why."""

    model: ModelInfo
    original_sha256: str
    original_bytes: int
    measured: tuple[Measured, ...]
    skipped: tuple[str, ...]
    samples: str  # where the checked inputs came from
    onnxruntime: str  # the version that made and checked it here

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(m.step for m in self.measured)

    @property
    def errors(self) -> tuple[tuple[str, float], ...]:
        """The image's model against the original: the last step's errors."""
        return self.measured[-1].errors if self.measured else ()

    def to_json(self) -> dict[str, Any]:
        return {"steps": [{"mode": m.step.mode, "how": m.step.how, "errors": dict(m.errors),
                           "tolerance": dict(m.tolerance)} for m in self.measured],
                "skipped": list(self.skipped), "samples": self.samples, "onnxruntime": self.onnxruntime,
                "original": {"sha256": self.original_sha256, "bytes": self.original_bytes},
                "optimized": {"sha256": self.model.sha256, "bytes": self.model.size_bytes}}


def decide(steps: tuple[str, ...], provider: Provider, samples: bool) -> Decision:
    """The steps for this provider's image (in graph, int8, fp16 order as run: int8 first, on the
    standard graph, then graph), and a line for each that cannot run for it."""
    out: list[Step] = []
    skipped: list[str] = []
    gpu = provider.device is not None
    if "int8" in steps:
        if provider.name == "cpu":
            out.append(Step("int8", "static" if samples else "dynamic"))
        else:
            skipped.append(f"optimize int8: quantised operators run on the CPU provider; the {provider.name} image keeps "
                           "the model's float weights" + (" (TensorRT's own: pack.tensorrt.int8)"
                                                          if provider.name == "tensorrt" else ""))
    if "fp16" in steps:
        if gpu:
            out.append(Step("fp16", "float16"))
        else:
            skipped.append(f"optimize fp16: the {provider.name} provider has few float16 kernels (slower than "
                           "float32); its image keeps float32")
    if "graph" in steps:
        if provider.name == "cpu":
            out.append(Step("graph", "extended"))
        else:
            out.append(Step("graph", "basic"))
            skipped.append(f"optimize graph: {provider.name}'s own fusions need its device; the basic optimisations "
                           "(constant folding, redundant nodes) are saved, the rest happen at start")
    return Decision(tuple(out), tuple(skipped))


def done_at_build(optimized: Optimized | None, image_onnxruntime: str) -> tuple[str, ...]:
    """The graph transformers the image's session need not run at start: those `graph` ran at
    build to the extended level (a cpu image's) as the model's last step, by the onnxruntime the
    image runs (another version may have other passes, or fuse differently)."""
    if optimized is None or not optimized.measured or optimized.onnxruntime != image_onnxruntime:
        return ()
    return OFFLINE_TRANSFORMERS if optimized.measured[-1].step == Step("graph", "extended") else ()


def describe(decision: Decision) -> str:
    """The steps as `plan` and the build say them."""
    return ", ".join(f"{s.mode} ({s.how})" for s in decision.steps) or "none"


# ---------------------------------------------------------------------------------------------
# doing it


def optimize(project: Project, model: ModelInfo, signature: Signature, decision: Decision, vocab: int | None,
             log: Callable[[str], None], warn: Callable[[str], None]) -> Optimized | None:
    """The optimised model (cached), each step checked against the original; None when no step
    applies. A step over its tolerance is a UsageError naming the output and the error (exit 2);
    a step ONNX Runtime's tool refuses is left out, with a warning saying why."""
    settings = project.config.pack.optimize
    if not decision.steps:
        return None
    if len(model.files) > 1:
        warn(f"optimize: {model.files[0]} keeps its weights in external data files, which the optimisation does not "
             "write yet; the image keeps the model as given")
        return None
    ort = _onnxruntime(project)
    given = samples_path(project)
    feeds_key = _file_digest(given) if given else f"generated-{GENERATED}-{SEED}-{DYNAMIC_SIZE}"
    key = hashlib.sha256(json.dumps([FORMAT, model.sha256, [(s.mode, s.how) for s in decision.steps],
                                     ort.__version__, feeds_key]).encode()).hexdigest()[:32]
    root = cache_dir() / "optimized" / key
    done = root / "optimized.json"
    if not done.is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        with staging.locked(root):
            if not done.is_file():
                staging.remove_leftovers(root)
                log(f"optimizing the model: {describe(decision)}, each step checked on "
                    f"{'the samples given' if given else f'{GENERATED} generated inputs'}")
                with staging.staged(root) as tmp:
                    tmp.mkdir()
                    try:
                        feeds = (_read_samples(project, given, model) if given
                                 else generated(model, signature, vocab))
                    except ValueError as e:
                        raise project.error(_MODEL, str(e)) from None
                    record = _run(project, model, decision, feeds, tmp / model.files[0], ort, log)
                    (tmp / "optimized.json").write_text(json.dumps(record))
    touch(root)
    record = json.loads(done.read_text())
    done_modes = [m["mode"] for m in record["measured"]]
    measured = tuple(Measured(Step(m["mode"], m["how"]), tuple((o, e) for o, e in m["errors"]),
                              tolerance_for(project, done_modes[:i + 1], [o for o, _ in m["errors"]]))
                     for i, m in enumerate(record["measured"]))
    for line in record["skipped"]:
        warn(line)
    for m in measured:
        _gate(project, m)
    if not measured:  # every step was left out: the image keeps the model as given
        return None
    optimized_model = inspect_model(root / model.files[0], f"{model.files[0]} (optimized)", checker=False)
    samples = str(settings.samples) if given else f"{GENERATED} generated (seed {SEED})"
    return Optimized(optimized_model, model.sha256, model.size_bytes, measured,
                     (*decision.skipped, *record["skipped"]), samples, ort.__version__)


def tolerance_for(project: Project, modes: list[str], outputs: list[str]) -> tuple[tuple[str, float], ...]:
    """Each output's tolerance after the steps done so far (each is measured against the original
    model): gpux.yml's (one number, or by output name), else the loosest default of those steps."""
    given = project.config.pack.optimize.tolerance
    default = max(DEFAULT_TOLERANCE[mode] for mode in modes)
    if isinstance(given, dict):
        return tuple((o, given.get(o, default)) for o in outputs)
    return tuple((o, default if given is None else given) for o in outputs)


def _gate(project: Project, measured: Measured) -> None:
    allowed = dict(measured.tolerance)
    for output, error in measured.errors:
        if error > allowed[output]:
            raise project.error(_MODEL, f"{measured.step.mode} moved output '{output}' by {error:.4g} (relative L2 "
                                        f"error against the original model), over its tolerance "
                                        f"{allowed[output]:g}: raise pack.optimize.tolerance or leave "
                                        f"{measured.step.mode} out")


def _onnxruntime(project: Project) -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise project.error(_MODEL, "needs ONNX Runtime here (its optimiser and quantiser): "
                                    "pip install 'gpux-pack[optimize]'") from None
    return onnxruntime


def _run(project: Project, model: ModelInfo, decision: Decision, feeds: list[dict[str, Any]], out: Path,
         ort: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Each step on the result of the one before (a standard graph for the quantiser and the
    float16 converter; the graph optimisation last), checked against the original after each."""
    import numpy as np

    original = model.path
    reference = _answers(ort, original, feeds, project, "the original model")
    current = original
    measured: list[dict[str, Any]] = []
    skipped: list[str] = []
    for step in decision.steps:
        made = out.with_name(f"{step.mode}-{out.name}")
        how, why = _apply(step, current, made, feeds, ort)
        if why:
            skipped.append(f"optimize {step.mode}: {why}; left out")
            continue
        try:
            answers = _answers(ort, made, feeds, project, f"the {step.mode} model")
        except _CannotRun as e:
            skipped.append(f"optimize {step.mode}: cannot run the result here to check it ({e}); left out")
            made.unlink()
            continue
        errors = [(name, max(_error(np, a[i], r[i]) for a, r in zip(answers, reference)))
                  for i, name in enumerate(o.name for o in model.outputs)]
        measured.append({"mode": step.mode, "how": how, "errors": errors})
        if current != original:
            current.unlink()
        current = made
        log(f"optimize {step.mode} ({how}): largest error " +
            ", ".join(f"{name} {error:.3g}" for name, error in errors))
    if current == original:
        return {"measured": [], "skipped": skipped}
    os.replace(current, out)
    return {"measured": measured, "skipped": skipped}


class _CannotRun(Exception):
    pass


def _apply(step: Step, src: Path, dst: Path, feeds: list[dict[str, Any]], ort: Any) -> tuple[str, str | None]:
    """Write src with the step applied to dst: how it was done, and the reason in a few words
    when the tool refuses. The quantiser logs advice through the root logger: not the build's."""
    import logging

    how = step.how
    logging.disable(logging.WARNING)
    try:
        if step.mode == "graph":
            level = (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED if step.how == "extended"
                     else ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
            _offline(ort, src, dst, level)
        elif step.mode == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            standard = dst.with_name(f"basic-{dst.name}")  # constants folded into initializers: what the quantiser reads
            _offline(ort, src, standard, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
            try:
                if step.how == "static":
                    how = _static(standard, dst, feeds)
                else:
                    quantize_dynamic(str(standard), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                                     op_types_to_quantize=list(DYNAMIC_OPS))
            finally:
                standard.unlink(missing_ok=True)
        else:
            import onnx
            from onnxruntime.transformers.float16 import convert_float_to_float16

            converted = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
            onnx.save(converted, str(dst))
    except Exception as e:  # the tools raise what they raise (ValueError, RuntimeError, Fail)
        return how, f"ONNX Runtime's tool refused the model ({_first_line(e)})"
    finally:
        logging.disable(logging.NOTSET)
    return how, None


def _static(src: Path, dst: Path, feeds: list[dict[str, Any]]) -> str:
    """Static QDQ quantisation calibrated on the samples: weights per channel where the quantiser
    can (it refused Magika's graph in ONNX Runtime 1.32: a per-channel bias scale check), else
    per tensor; a graph below opset 13 is converted first (per-channel QDQ needs its axis)."""
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self.left, None)

    model = onnx.load(str(src))
    if next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13) < 13:
        onnx.save(version_converter.convert_version(model, 13), str(src))
    try:
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
        return "static"
    except Exception:
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=False,
                        weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
        return "static per tensor"


def _offline(ort: Any, src: Path, dst: Path, level: Any) -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(dst)
    options.log_severity_level = 3
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])


def _answers(ort: Any, path: Path, feeds: list[dict[str, Any]], project: Project, what: str) -> list[list[Any]]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        if what == "the original model":
            raise project.error(_MODEL, f"ONNX Runtime cannot load the model here to check it ({_first_line(e)})") \
                from None
        raise _CannotRun(_first_line(e)) from None
    out = []
    for i, feed in enumerate(feeds):
        try:
            out.append(session.run(None, feed))
        except Exception as e:
            if what == "the original model":
                raise project.error(_MODEL, f"the model did not run on sample input {i + 1} "
                                            f"({_first_line(e)}); give inputs it runs in pack.optimize.samples") \
                    from None
            raise _CannotRun(_first_line(e)) from None
    return out


def _error(np: Any, got: Any, want: Any) -> float:
    """Floats: the difference's root mean square over the original answer's (the relative L2
    error: 0.01 is an answer 40 dB above its noise). A single largest difference over the largest
    value punished int8 for one outlier in a BERT hidden state (0.20 where the root mean square
    says 0.04). Any other type: the share of elements that differ. A shape or a non-finite value
    that differs is the largest error."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    if want.dtype.kind in "fc":
        a, b = got.astype(np.float64), want.astype(np.float64)
        finite = np.isfinite(b)
        if not (np.isfinite(a) == finite).all() or not (a[~finite] == b[~finite]).all():
            return float("inf")  # a NaN or an infinity where the original had none, or another one
        a, b = a[finite], b[finite]
        norm = float(np.sqrt(np.sum(b * b)))
        diff = float(np.sqrt(np.sum((a - b) ** 2)))
        return diff / norm if norm > 0 else diff
    return float(np.mean(got != want))


# ---------------------------------------------------------------------------------------------
# the inputs it is checked on


def generated(model: ModelInfo, signature: Signature, vocab: int | None) -> list[dict[str, Any]]:
    """GENERATED inputs from the graph's types and shapes (gpux.yml's sizes where it fixes them),
    seeded: floats uniform in [0, 1); token ids within the vocabulary (the tokenizer's, else the
    embedding table's rows), attention masks all ones, token type ids zeros (by the text step's
    roles, else by the input's name). A type no input can be made for is a ValueError."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    declared = dict(signature.declared)
    roles = {name: role for role, name, _ in signature.text.feeds} if signature.text else {}
    tables = _embedding_rows(model)
    out = []
    for _ in range(GENERATED):
        feed = {}
        for spec in model.inputs:
            if not spec.required:
                continue
            shape = tuple(_size(d, axis, declared.get(spec.name)) for axis, d in enumerate(spec.shape or ()))
            rows = (vocab if roles.get(spec.name) == "input_ids" else None) or tables.get(spec.name)
            feed[spec.name] = _values(np, rng, spec.name, roles.get(spec.name), spec.type or "float32", shape, rows)
        out.append(feed)
    return out


def _size(dim: Any, axis: int, declared: tuple[int | str, ...] | None) -> int:
    if isinstance(dim, int) and dim > 0:
        return dim
    if declared and axis < len(declared) and isinstance(declared[axis], int) and declared[axis] > 0:
        return int(declared[axis])
    return 1 if axis == 0 else DYNAMIC_SIZE


def _values(np: Any, rng: Any, name: str, role: str | None, dtype: str, shape: tuple[int, ...],
            rows: int | None) -> Any:
    lowered = name.lower()
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith(("int", "uint")):
        if role == "attention_mask" or (role is None and "mask" in lowered):
            return np.ones(shape, dtype)
        if role == "token_type_ids" or (role is None and ("type" in lowered or "segment" in lowered)):
            return np.zeros(shape, dtype)
        return rng.integers(0, rows or 2, shape).astype(dtype)
    if dtype in ("float16", "float32", "float64"):
        return rng.random(shape).astype(dtype)
    raise ValueError(f"input '{name}' is {dtype}, for which no input can be generated: give inputs in "
                     "pack.optimize.samples")


def _embedding_rows(model: ModelInfo) -> dict[str, int]:
    """Integer inputs that index an embedding table (a Gather of an initializer): its rows."""
    import onnx

    proto = onnx.ModelProto.FromString(read_skeleton(model.path).model)
    shapes = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    rows: dict[str, int] = {}
    for node in proto.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in shapes and shapes[node.input[0]]:
            rows[node.input[1]] = min(rows.get(node.input[1], 1 << 62), shapes[node.input[0]][0])
    return rows


def vocabulary_size(tokenizer_json: Path | None) -> int | None:
    """How many token ids a tokenizer.json gives (its model's vocabulary and the added tokens)."""
    if tokenizer_json is None:
        return None
    try:
        doc = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    vocab = (doc.get("model") or {}).get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab or [])))
    ids += [t.get("id", 0) for t in doc.get("added_tokens") or [] if isinstance(t, dict)]
    return max((int(i) for i in ids if isinstance(i, int)), default=-1) + 1 or None


def samples_path(project: Project) -> Path | None:
    """pack.optimize.samples, relative to gpux.yml (a contained build checks it is inside: load)."""
    given = project.config.pack.optimize.samples
    if given is None:
        return None
    path = (project.config_path.parent / given).resolve()
    if not path.exists():
        raise project.error((*_MODEL, "samples"), f"no such file or folder: {given}")
    return path


def _sample_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.npz")) if path.is_dir() else [path]


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in _sample_files(path):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as src:
            while chunk := src.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def _read_samples(project: Project, path: Path, model: ModelInfo) -> list[dict[str, Any]]:
    """Each .npz one input: arrays named by the model's inputs (no pickles), in its types."""
    import numpy as np

    where = (*_MODEL, "samples")
    files = _sample_files(path)
    if not files:
        raise project.error(where, f"{path} holds no .npz file")
    if len(files) > MAX_SAMPLES:
        raise project.error(where, f"{len(files)} samples; at most {MAX_SAMPLES}")
    if sum(f.stat().st_size for f in files) > MAX_SAMPLE_BYTES:
        raise project.error(where, f"the samples hold more than {MAX_SAMPLE_BYTES >> 20} MiB")
    wanted = {t.name: t for t in model.inputs if t.required}
    feeds = []
    unpacked = 0
    for f in files:
        try:
            with zipfile.ZipFile(f) as zf:  # what the arrays hold once unpacked, before any is
                unpacked += sum(info.file_size for info in zf.infolist())
            if unpacked > MAX_SAMPLE_BYTES:
                raise project.error(where, f"{f.name}: the samples unpack to more than {MAX_SAMPLE_BYTES >> 20} MiB")
            with np.load(f, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
        except ConfigError:
            raise
        except Exception as e:
            raise project.error(where, f"{f.name}: not a readable .npz ({_first_line(e)})") from None
        missing = sorted(set(wanted) - set(arrays))
        if missing:
            raise project.error(where, f"{f.name}: no array for input '{missing[0]}' (it has "
                                       f"{', '.join(sorted(arrays)) or 'none'})")
        feed = {}
        for name, spec in wanted.items():
            try:
                feed[name] = arrays[name].astype(spec.type or "float32", casting="same_kind")
            except TypeError:
                raise project.error(where, f"{f.name}: '{name}' is {arrays[name].dtype}, the input is "
                                           f"{spec.type}") from None
        feeds.append(feed)
    return feeds


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    return (text or type(e).__name__)[:200]


def summary_lines(optimized: Optimized) -> list[str]:
    """What the build says it did."""
    return [f"optimized the model: {', '.join(f'{s.mode} ({s.how})' for s in optimized.steps)}; "
            f"{optimized.original_bytes / 1e6:.1f} MB -> {optimized.model.size_bytes / 1e6:.1f} MB; largest error "
            + ", ".join(f"{name} {error:.3g}" for name, error in optimized.errors)]

