"""The fuzz harness: gpux.yml and model generators (hypothesis strategies and explicit recipes),
the one-line-error and Dockerfile-instruction checks, and the build run with no engine. The
tests that drive it: tests/unit/test_fuzz.py."""

from __future__ import annotations
import contextlib
import functools
import io
import os
import re
import resource
import signal
import tempfile
import time
import traceback
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
import yaml
from dockerfile_parse import DockerfileParser
from hypothesis import strategies as st
from gpux_pack.cli import main
from gpux_pack.project.config import model_name


ROOT = Path(__file__).resolve().parents[2]


EXAMPLE = ROOT / "examples" / "mlp"


BASE_IMAGE = "gpux-pack/debian-python:bookworm"


NO_ENGINE = "unix:///nonexistent.sock"


CLI_ARGS = ("--provider", "cpu", "--base-image", BASE_IMAGE)


CASE_SECONDS = 15  # one in-process case (CLI + render); a healthy one takes milliseconds


CHILD_SECONDS = 45  # one child process, imports included, several running at once


CHILD_PARALLEL = 2  # children at once: each may take CHILD_MEMORY before it fails


CHILD_MEMORY = 1 << 30  # address space of a child: a bomb must fail, not eat the machine


GENERATED_CASES = int(os.environ.get("GPUX_FUZZ_EXAMPLES", "500"))  # more for a deeper local run


MIN_CASES = 300


MLP_MODEL = (EXAMPLE / "model.onnx").read_bytes()


@dataclass(frozen=True)
class Rendered:
    dockerfile: str
    base_image: str  # what FROM must name
    port: int
    labels: dict[str, str]  # label key -> expected value, for the labels taken from the config
    user_labels: dict[str, str]  # pack.labels as loaded
    pack_base_image: bool  # pack.base_image is set: render again without --base-image
    model_path: Path  # the model file the context packages
    context_files: tuple[str, ...]  # every file of the build context, a layer tar's as model.tar/opt/...
    model_adds: tuple[str, ...] = ()  # the ADD values of the model's own layers, as the plan lays them out


@functools.lru_cache(maxsize=1)
def fixed_lock():
    """A lock written by hand (data, not a mock): rendering needs versions, not the network."""
    from gpux_pack import wheels

    def pin(name: str, version: str):
        return wheels.Pin(name, version, frozenset({"0" * 64}))

    return wheels.Lock(
        target=wheels.Target("3.11", "x86_64", (2, 36)),
        requirements=("onnxruntime==1.31.1", "numpy", "uvicorn"),
        pins=(pin("numpy", "2.3.4"), pin("onnxruntime", "1.31.1"), pin("uvicorn", "0.38.0")),
    )


def render_project(project: Path, override_base: bool = True) -> Rendered:
    """The cpu Dockerfile of a project, with no engine and no network. `override_base` gives
    --base-image (as the CLI calls do); without it pack.base_image reaches FROM."""
    from gpux_pack.pipeline.build import load, plan_for
    from gpux_pack.image.context import model_context
    from gpux_pack.image.dockerfile import dockerfile
    from gpux_pack.image.layout import LAYERS, model_layers
    from gpux_pack.plan import Options
    from tests.locks import with_lock
    from gpux_pack.ui import Reporter

    loaded = load(project)
    options = Options(base_image=BASE_IMAGE if override_base else None)
    plan = plan_for(loaded, "cpu", "fuzz", options, None, Reporter(quiet=True), pull=False)
    plan = with_lock(plan, fixed_lock())
    text = dockerfile(plan, "image")
    context = model_context(plan, None, text)  # writes gpux.json as build/render do
    cfg = loaded.project.config
    expected = {
        "org.opencontainers.image.title": cfg.name,
        "org.opencontainers.image.version": cfg.version,
        "org.opencontainers.image.base.name": plan.base.image,
        "io.gpux.model.name": model_name(cfg.name),  # the name as written is the title
        "io.gpux.model.version": cfg.model.version or cfg.version,
        "io.gpux.port": str(cfg.serving.port),
    }
    if cfg.description:
        expected["org.opencontainers.image.description"] = cfg.description
    return Rendered(text, plan.base.image, cfg.serving.port, expected, dict(cfg.pack.labels), bool(cfg.pack.base_image),
                    Path(plan.model.path),
                    tuple(e.name if e.members is None else f"{e.name}/{m.name}" for e in context.entries
                          for m in (e.members or (None,)) if m is None or not m.is_dir),
                    tuple(LAYERS[name].instruction.split(" ", 1)[1]
                          for name in model_layers(plan.carries_assets, plan.one_layer)))


class Hang(BaseException):
    """Raised by SIGALRM: a call ran past its time limit (BaseException: no `except
    Exception` in the packager can swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    def expired(signum, frame):
        raise Hang(f"no answer within {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Problem:
    kind: str
    signature: str  # what makes two problems the same bug
    detail: str = ""


@dataclass
class Case:
    """A generated project: the gpux.yml bytes and the model recipe."""

    yml: bytes
    model: "ModelRecipe"
    label: str = ""  # what was made hostile, for the report

    def reproducer(self) -> str:
        try:
            text = self.yml.decode("utf-8")
            shown = "".join(c if (c.isprintable() or c == "\n") else ascii(c)[1:-1] for c in text)
        except UnicodeDecodeError:
            shown = f"(bytes) {self.yml[:400]!r}"
        if len(shown) > 1500:
            shown = shown[:1500] + f"... ({len(shown)} chars)"
        return f"hostile: {self.label or '-'}\nmodel: {self.model.describe()}\n--- gpux.yml ---\n{shown}"


@dataclass
class Tally:
    cases: int = 0
    outcomes: dict[int, int] = field(default_factory=dict)
    rendered: int = 0
    late_rejections: dict[str, int] = field(default_factory=dict)
    failures: dict[tuple[str, str], tuple[int, Problem, str]] = field(default_factory=dict)

    def fail(self, problem: Problem, reproducer: str) -> None:
        key = (problem.kind, problem.signature)
        count, old, shortest = self.failures.get(key, (0, problem, reproducer))
        if len(reproducer) < len(shortest):
            old, shortest = problem, reproducer
        self.failures[key] = (count + 1, old, shortest)

    def log(self, result: "CliResult", problems: list[Problem], reproducer: Callable[[], str]) -> None:
        folder = os.environ.get("GPUX_FUZZ_REPORT")
        if not folder:
            return
        Path(folder).mkdir(parents=True, exist_ok=True)
        head = reproducer().split("--- gpux.yml ---")[0].replace("\n", " | ")
        line = result.stderr.split("\n")[0][:200] if result.error is None else f"raised {type(result.error).__name__}"
        with open(Path(folder) / "cases.txt", "a") as f:
            f.write(f"exit {result.code} problems={len(problems)} {head} => {ascii(line)}\n")

    def report(self) -> str:
        out = [f"{len(self.failures)} distinct failures in {self.cases} cases:"]
        for i, ((kind, sig), (count, problem, repro)) in enumerate(sorted(self.failures.items()), 1):
            out.append(f"\n[{i}] {kind}: {sig}  ({count} cases)\n    {problem.detail[:600]}\n{_indent(repro)}")
        if self.late_rejections:
            out.append("\nnotes: valid for `build` before the engine, rejected when planning:")
            out += [f"  {n}x {msg}" for msg, n in sorted(self.late_rejections.items())]
        text = "\n".join(out)
        folder = os.environ.get("GPUX_FUZZ_REPORT")
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / f"report-{os.getpid()}-{time.monotonic_ns()}.txt").write_text(text)
        return text


def _indent(text: str) -> str:
    return "\n".join("    | " + line for line in text.splitlines())


@dataclass
class CliResult:
    code: int | None
    stdout: str
    stderr: str
    error: BaseException | None


def run_build(target: Path, seconds: float = CASE_SECONDS) -> CliResult:
    out, err = io.StringIO(), io.StringIO()
    code, error = None, None
    try:
        with time_limit(seconds), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(["build", str(target), *CLI_ARGS])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - anything but SystemExit is the finding
        error = e
    return CliResult(code, out.getvalue(), err.getvalue(), error)


def where(e: BaseException) -> str:
    """Innermost frame, and the innermost frame of gpux_pack when that is not it."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return "?"

    def short(f) -> str:
        parts = Path(f.filename).parts
        tail = "/".join(parts[-2:])
        return f"{tail}:{f.name}"

    inner = frames[-1]
    ours = [f for f in frames if "gpux_pack" in f.filename]
    text = short(inner)
    if ours and ours[-1] is not inner:
        text += f" via {short(ours[-1])}"
    return text


_BREAKS = {"Cc", "Zl", "Zp"}


def _template(line: str, scrub: list[str]) -> str:
    for s in scrub:
        line = line.replace(s, "<dir>")
    line = re.sub(r"'[^']*('|$)", "'…'", line)
    line = re.sub(r"\d+", "N", line)
    return line[:110]


def cli_problems(r: CliResult, scrub: list[str]) -> list[Problem]:
    if r.error is not None:
        e = r.error
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        if isinstance(e, Hang):
            return [Problem("hang", f"build: {where(e)}", last)]
        return [Problem("traceback", f"build: {type(e).__name__} in {where(e)}", last[:300])]
    text, problems = r.stderr, []
    while text.startswith("warning: ") and "\n" in text:  # gpux.yml's notes: one line each, before the error
        warning, text = text.split("\n", 1)
        bad = sorted({c for c in warning if unicodedata.category(c) in _BREAKS and c != "\t"})
        if bad:
            problems.append(Problem("control character in a warning", _template(warning, scrub), repr(warning[:400])))
    first = text.split("\n", 1)[0]
    sig = _template(first, scrub)
    if "Traceback" in text:
        problems.append(Problem("traceback", f"printed: {sig}", text[-300:]))
    if r.code not in (1, 2):
        problems.append(Problem("exit code", f"exit {r.code}: {sig}", text[:300]))
    if text.count("\n") != 1 or not text.endswith("\n"):
        problems.append(Problem("not one line", f"{text.count(chr(10))} line feeds: {sig}", repr(text[:400])))
    else:
        bad = sorted({c for c in text[:-1] if unicodedata.category(c) in _BREAKS and c != "\t"})
        if bad:
            names = " ".join(f"U+{ord(c):04X}" for c in bad)
            problems.append(Problem("control character in the error line", sig, f"{names} in {text[:400]!r}"))
    if not text.startswith("error: "):
        problems.append(Problem("no 'error: ' line", sig, repr(text[:300])))
    if r.code == 1 and not text.startswith("error: cannot reach the Docker engine"):
        problems.append(Problem("exit 1 without the engine error", sig, repr(text[:300])))
    if r.stdout:
        problems.append(Problem("stdout not empty", sig, repr(r.stdout[:300])))
    return problems


@dataclass(frozen=True)
class Parsed:
    instructions: list[str]
    values: list[str]
    first_line: str


def parse_dockerfile(text: str, unicode_lines: bool) -> Parsed:
    """dockerfile-parse on a file splits lines at '\\n' only, as Docker does; with cached
    content it splits at every Unicode line boundary, as editors and Python tools do."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "Dockerfile"
        path.write_bytes(text.encode("utf-8"))
        parser = DockerfileParser(str(path), cache_content=unicode_lines)
        if unicode_lines:
            parser.cached_content = text  # read back through str.splitlines()
        structure = parser.structure
    items = [s for s in structure if s["instruction"] != "COMMENT"]
    first = text.splitlines()[0] if unicode_lines else text.split("\n", 1)[0]
    return Parsed([s["instruction"] for s in items], [s["value"] for s in items], first)


_DIRECTIVE = re.compile(r"^#\s*(syntax|escape|check)\s*=", re.IGNORECASE)


def docker_words(rest: str) -> list[str]:
    """buildkit's parseWords: words split at Unicode spaces outside quotes; escapes kept."""
    words, word, phase, quote, blank_ok, i = [], "", "spaces", "", False, 0
    while i <= len(rest):
        ch = rest[i] if i < len(rest) else ""
        if phase == "spaces":
            if i == len(rest):
                break
            if _go_space(ch):
                i += 1
                continue
            phase = "word"
        if i == len(rest):
            if blank_ok or word:
                words.append(word)
            break
        if phase == "word":
            if _go_space(ch):
                phase = "spaces"
                if blank_ok or word:
                    words.append(word)
                word, blank_ok = "", False
                i += 1
                continue
            if ch in "'\"":
                quote, blank_ok, phase = ch, True, "quote"
            if ch == "\\":
                if i + 1 == len(rest):
                    i += 1
                    continue
                word += ch
                i += 1
                ch = rest[i]
            word += ch
            i += 1
            continue
        # in a quote
        if ch == quote:
            phase = "word"
        if ch == "\\" and quote != "'":
            if i + 1 == len(rest):
                phase = "word"
                i += 1
                continue
            word += ch
            i += 1
            ch = rest[i]
        word += ch
        i += 1
    return words


def _go_space(ch: str) -> bool:
    """Go's unicode.IsSpace."""
    return ch in "\t\n\v\f\r \x85\xa0" or unicodedata.category(ch) == "Zs" or ch in "\u2028\u2029"


def shell_word(word: str) -> tuple[str, bool]:
    """buildkit's shell lexer on one word: quotes removed, escapes applied. Returns the text
    and whether a `$` would expand a variable (kept literally here)."""
    out, i, expands = [], 0, False

    def dollar(j: int) -> bool:
        nxt = word[j + 1] if j + 1 < len(word) else ""
        return nxt == "{" or nxt.isalnum() or nxt == "_"

    while i < len(word):
        ch = word[i]
        if ch == "'":
            j = word.find("'", i + 1)
            if j < 0:
                raise ValueError("unterminated single quote")
            out.append(word[i + 1 : j])
            i = j + 1
        elif ch == '"':
            i += 1
            while True:
                if i >= len(word):
                    raise ValueError("unterminated double quote")
                ch = word[i]
                if ch == '"':
                    i += 1
                    break
                if ch == "$":
                    expands |= dollar(i)
                    out.append(ch)
                    i += 1
                elif ch == "\\":
                    nxt = word[i + 1] if i + 1 < len(word) else ""
                    if nxt in ('"', "$", "\\") and nxt:
                        out.append(nxt)
                        i += 2
                    elif not nxt:
                        i += 1
                    else:
                        out.append(ch)
                        i += 1
                else:
                    out.append(ch)
                    i += 1
        elif ch == "\\":
            if i + 1 < len(word):
                out.append(word[i + 1])
            i += 2
        elif ch == "$":
            expands |= dollar(i)
            out.append(ch)
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out), expands


def docker_labels(value: str) -> tuple[list[tuple[str, str]], list[str]]:
    """A LABEL instruction's key=value pairs as Docker reads them; problems as text."""
    pairs, problems = [], []
    for word in docker_words(value):
        if "=" not in word:
            problems.append(f"LABEL word {word[:60]!r} has no '=' (Docker fails or reads the old `LABEL k v` form)")
            continue
        raw_key, raw_value = word.split("=", 1)
        try:
            key, key_expands = shell_word(raw_key)
            text, value_expands = shell_word(raw_value)
        except ValueError as e:
            problems.append(f"LABEL word {word[:60]!r}: {e}")
            continue
        if key_expands or value_expands:
            problems.append(f"LABEL {raw_key[:60]!r} expands a variable: {word[:80]!r}")
        pairs.append((key, text))
    return pairs, problems


def collapse(value: Any) -> str:
    return " ".join(str(value).split())


def _printable(value: Any) -> str:
    """A renderer may also turn control and format characters into spaces: still the value."""
    return "".join(c if c.isprintable() else " " for c in str(value))


@dataclass(frozen=True)
class Baseline:
    instructions: list[str]
    values: list[str]
    label_keys: frozenset[str]
    model_adds: tuple[str, ...] = ()

    def laid_out(self, adds: tuple[str, ...]) -> tuple[list[str], list[str]]:
        """The instructions and values a Dockerfile whose model layers are `adds` must have: the
        baseline's with its own model ADDs replaced (a small model shares gpux.json's layer)."""
        at = next(i for i, (ins, value) in enumerate(zip(self.instructions, self.values))
                  if ins == "ADD" and value == self.model_adds[0])
        end = at + len(self.model_adds)
        return ([*self.instructions[:at], *["ADD"] * len(adds), *self.instructions[end:]],
                [*self.values[:at], *adds, *self.values[end:]])


@functools.lru_cache(maxsize=1)
def baseline() -> Baseline:
    with time_limit(60):
        rendered = render_project(EXAMPLE)
    parsed = parse_dockerfile(rendered.dockerfile, unicode_lines=False)
    label = parsed.values[parsed.instructions.index("LABEL")]
    pairs, problems = docker_labels(label)
    assert not problems, problems
    return Baseline(parsed.instructions, parsed.values, frozenset(k for k, _ in pairs), rendered.model_adds)


_SAME_VALUE = {"ENV", "COPY", "USER", "WORKDIR", "HEALTHCHECK", "ENTRYPOINT", "CMD"}


def dockerfile_problems(r: Rendered, base: Baseline, view_label: str = "") -> list[Problem]:
    problems: list[Problem] = []
    for unicode_lines in (False, True):
        view = ("unicode lines" if unicode_lines else "docker") + view_label
        p = parse_dockerfile(r.dockerfile, unicode_lines)
        if _DIRECTIVE.match(p.first_line):
            problems.append(Problem("parser directive", f"{view}: first line is a directive", p.first_line[:200]))
        instructions, values = base.laid_out(r.model_adds)
        if p.instructions != instructions:
            problems.append(Problem("injected instruction", f"{view}: {_diff(instructions, p.instructions)}",
                                    _offending(r.dockerfile, unicode_lines)))
            continue
        if unicode_lines:
            continue
        for ins, value, expected in zip(p.instructions, p.values, values):
            if ins in ("HEALTHCHECK", "ENTRYPOINT"):  # the base's interpreter, by its absolute path
                value, expected = (re.sub(r'"/usr(?:/local)?/bin/python3"', '"python3"', v) for v in (value, expected))
            if ins in _SAME_VALUE and value != expected:
                problems.append(Problem("instruction changed", f"{view}: {ins}", f"{value[:200]!r} != {expected[:200]!r}"))
            elif ins == "EXPOSE" and value.strip() != str(r.port):
                problems.append(Problem("instruction changed", f"{view}: EXPOSE", f"{value[:200]!r} != {r.port}"))
            elif ins == "FROM":
                want = expected.split()
                want[0] = r.base_image
                if value.split() != want:
                    problems.append(Problem("instruction changed", f"{view}: FROM", f"{value[:200]!r} != {' '.join(want)!r}"))
            elif ins == "LABEL":
                problems += _label_problems(r, base, value, view)
    return problems


_QUOTED = re.compile(r"['\"].*")


def _label_problems(r: Rendered, base: Baseline, value: str, view: str) -> list[Problem]:
    out: list[Problem] = []
    pairs, lexing = docker_labels(value)
    out += [Problem("label", f"{view}: {_QUOTED.sub('', m)[:60]}", m) for m in lexing]
    got: dict[str, str] = {}
    for key, text in pairs:
        if key in got:
            out.append(Problem("label", f"{view}: a key appears twice (the later one wins)", f"{key[:80]!r}"))
        got[key] = text
    allowed = base.label_keys | set(r.user_labels)
    for key in got:
        if key not in allowed:
            out.append(Problem("label", f"{view}: a key neither the contract nor pack.labels set", f"{key[:120]!r}"))
    expected = dict(r.labels)
    for key, v in r.user_labels.items():
        expected.setdefault(key, v)
    for key, v in expected.items():
        if key not in got:
            what = "contract" if key in base.label_keys else "pack.labels"
            out.append(Problem("label", f"{view}: a {what} label is missing", f"{key[:120]!r}"))
        elif got[key] not in (collapse(v), collapse(_printable(v))):
            which = key if key in base.label_keys else "pack.labels value"
            out.append(Problem("label", f"{view}: {which} differs from the configured value",
                               f"{got[key][:200]!r} != {collapse(v)[:200]!r}"))
    return out


def _diff(want: list[str], got: list[str]) -> str:
    i = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    before = want[i - 1] if i else "start"
    w = want[i] if i < len(want) else "end"
    g = got[i] if i < len(got) else "end"
    return f"after {before}#{i}: {g} instead of {w} ({len(got)} vs {len(want)} instructions)"


_KEYWORDS = re.compile(r"^\s*(FROM|RUN|CMD|LABEL|EXPOSE|ENV|ADD|COPY|ENTRYPOINT|VOLUME|USER|WORKDIR|ARG|"
                       r"ONBUILD|STOPSIGNAL|HEALTHCHECK|SHELL|MAINTAINER)\b", re.IGNORECASE)


def _offending(text: str, unicode_lines: bool) -> str:
    lines = text.splitlines() if unicode_lines else text.split("\n")
    odd = [ln for ln in lines if ln and not ln.startswith((" ", "#")) and not _KEYWORDS.match(ln)]
    odd += [ln for ln in lines if "pwned" in ln or "evil" in ln]
    return " | ".join(repr(ln[:120]) for ln in odd[:4])


FLOAT, INT64 = 1, 7


@dataclass(frozen=True)
class ModelRecipe:
    raw: str | None = None  # empty | text | garbage | truncated | trailing | tensor | onnx-as-text
    truncate_permille: int = 500
    opset: int = 17
    ir_version: int = 8
    input_name: str = "x"
    output_name: str = "y"
    elem_type: int = FLOAT
    dims: tuple[Any, ...] = ("batch", 4)
    input_kind: str = "tensor"  # tensor | sequence | none
    custom_domain: str | None = None
    initializer_as_input: bool = False
    external: tuple[str, str, str, int] | None = None  # location, offset, length, file size (-1: no file)
    sparse_external: bool = False
    no_outputs: bool = False

    @property
    def standard(self) -> bool:
        """Signature x: float32 [batch, 4] -> y: float32 [batch, 4] (configs can list it)."""
        return (self.raw is None and self.input_name == "x" and self.output_name == "y" and self.elem_type == FLOAT
                and self.dims == ("batch", 4) and self.input_kind == "tensor" and not self.no_outputs)

    def describe(self) -> str:
        if self.raw:
            return f"raw={self.raw}" + (f" ({self.truncate_permille}/1000 of a valid model)" if self.raw == "truncated" else "")
        default = ModelRecipe()
        diffs = [f"{k}={getattr(self, k)!r}" for k in self.__dataclass_fields__ if getattr(self, k) != getattr(default, k)]
        return "onnx.helper Relu/Add graph x -> y" + (": " + ", ".join(diffs) if diffs else " (valid)")


def _external(tensor, location: str, offset: str, length: str) -> None:
    from onnx import TensorProto

    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("float_data")
    tensor.ClearField("raw_data")
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value


def model_bytes(recipe: ModelRecipe, folder: Path, case_dir: Path) -> bytes:
    """The model file's bytes; external data files are written next to it."""
    import onnx
    from onnx import TensorProto, helper

    if recipe.raw == "empty":
        return b""
    if recipe.raw == "text":
        return b"this is not an onnx model\n"
    if recipe.raw == "garbage":
        return bytes((i * 97 + 13) % 256 for i in range(700))
    if recipe.raw == "tensor":
        return helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0]).SerializeToString()
    if recipe.raw in ("truncated", "trailing", "onnx-as-text"):
        valid = model_bytes(ModelRecipe(), folder, case_dir)
        if recipe.raw == "truncated":
            return valid[: len(valid) * recipe.truncate_permille // 1000]
        if recipe.raw == "trailing":
            return valid + b"\xff\xff\xff\x0f garbage"
        return str(onnx.load_from_string(valid)).encode()

    dims = [d if d is not None else None for d in recipe.dims]
    if recipe.input_kind == "sequence":
        x = helper.make_tensor_sequence_value_info(recipe.input_name, recipe.elem_type, dims)
    elif recipe.input_kind == "none":
        x = onnx.ValueInfoProto(name=recipe.input_name)
    else:
        x = helper.make_tensor_value_info(recipe.input_name, recipe.elem_type, dims)
    y = helper.make_tensor_value_info(recipe.output_name, recipe.elem_type, dims)
    inputs, inits, sparse = [x], [], []
    uses_w = recipe.initializer_as_input or recipe.external is not None or recipe.sparse_external
    if recipe.custom_domain is not None:
        nodes = [helper.make_node("FuzzOp", [recipe.input_name], [recipe.output_name], domain=recipe.custom_domain)]
    elif uses_w:
        nodes = [helper.make_node("Add", [recipe.input_name, "w"], [recipe.output_name])]
    else:
        nodes = [helper.make_node("Relu", [recipe.input_name], [recipe.output_name])]
    if uses_w:
        if recipe.sparse_external:
            values = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
            indices = helper.make_tensor("w_indices", TensorProto.INT64, [2], [0, 3])
            _external(values, "sparse.bin", "0", "8")
            (folder / "sparse.bin").write_bytes(b"\0" * 8)
            sparse.append(helper.make_sparse_tensor(values, indices, [4]))
        else:
            w = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
            if recipe.external is not None:
                location, offset, length, size = recipe.external
                _external(w, location, offset, length)
                _write_external(folder, case_dir, location, size)
            inits.append(w)
        if recipe.initializer_as_input:
            inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4]))
    graph = helper.make_graph(nodes, "fuzz", inputs, [] if recipe.no_outputs else [y], initializer=inits)
    graph.sparse_initializer.extend(sparse)
    opsets = [helper.make_opsetid("", recipe.opset)]
    if recipe.custom_domain is not None:
        opsets.append(helper.make_opsetid(recipe.custom_domain, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="gpux-fuzz")
    model.ir_version = recipe.ir_version
    return model.SerializeToString()


def _write_external(folder: Path, case_dir: Path, location: str, size: int) -> None:
    if size < 0 or not location or "\0" in location or len(location) > 200:
        return
    if location.startswith("/"):
        return  # absolute locations name case_dir/abs.bin (written by the case) or system files
    target = (folder / location).resolve()
    if case_dir.resolve() not in target.parents:
        return
    with contextlib.suppress(OSError):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bytes(range(256))[:size] if size <= 256 else b"\1" * size)


class Raw(str):
    """YAML text inserted as is: a tag, an alias, a flow collection, a special number."""


def dq(s: str) -> str:
    """A double-quoted YAML scalar holding exactly `s`."""
    out = []
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v", "\f": "\\f", "\0": "\\0", "\x1b": "\\e",
             "\x85": "\\N", "\u2028": "\\L", "\u2029": "\\P", '"': '\\"', "\\": "\\\\"}
    for ch in s:
        o = ord(ch)
        if ch in named:
            out.append(named[ch])
        elif 0x20 <= o <= 0x7E or 0xA0 <= o <= 0xD7FF or 0xE000 <= o <= 0xFFFD and o != 0xFEFF or o >= 0x10000:
            out.append(ch)
        elif o <= 0xFF:
            out.append(f"\\x{o:02x}")
        else:
            out.append(f"\\u{o:04x}")
    return '"' + "".join(out) + '"'


@functools.lru_cache(maxsize=4096)
def _plain_ok(s: str, flow: bool) -> bool:
    if not s or s != s.strip() or not s.isprintable():
        return False
    doc = f"k: [{s}]" if flow else f"k: {s}"
    try:
        return yaml.safe_load(doc) == {"k": [s] if flow else s}
    except yaml.YAMLError:
        return False


def scalar(v: Any, flow: bool, style: int) -> str:
    """style: 0 double quotes, 1 plain when that reads back the same, 2 single quotes when
    possible."""
    if isinstance(v, Raw):
        return v
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ".nan" if v != v else (".inf" if v == float("inf") else ("-.inf" if v == float("-inf") else repr(v)))
    s = str(v)
    if style == 1 and _plain_ok(s, flow):
        return s
    if style == 2 and s.isprintable() and "\ufeff" not in s:
        return "'" + s.replace("'", "''") + "'"
    return dq(s)


def inline(v: Any, style: int) -> str:
    if isinstance(v, dict) and not isinstance(v, Raw):
        return "{" + ", ".join(f"{scalar(k, True, style)}: {inline(x, style)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(inline(x, style) for x in v) + "]"
    return scalar(v, True, style)


def block(v: dict, style: int, indent: int = 0) -> str:
    pad, out = " " * indent, []
    for k, x in v.items():
        key = scalar(k, False, style)
        if isinstance(x, dict) and x and not isinstance(x, Raw):
            out.append(f"{pad}{key}:\n{block(x, style, indent + 2)}")
        elif isinstance(x, list) and x and all(isinstance(i, dict) and i for i in x):
            items = []
            for item in x:
                body = block(item, style, indent + 4)
                items.append(f"{pad}  - {body.lstrip()}")
            out.append(f"{pad}{key}:\n" + "".join(items))
        else:
            out.append(f"{pad}{key}: {inline(x, style) if isinstance(x, (dict, list)) else scalar(x, False, style)}\n")
    return "".join(out)


SEPARATORS = ("\n", "\r", "\r\n", "\v", "\f", "\u2028", "\u2029", "\x85")


PAYLOADS = ("RUN echo pwned", "# syntax=docker/dockerfile:1", "# escape=`", "LABEL evil=1", "FROM scratch AS evil",
            "USER root", "", "\\", " \\")


NASTY = (
    "$HOME", "${PATH}", "a$PATH", "$(id)", "`id`", '"', "'", "\\", "x\\", '\\"', 'a" evil="1', 'a\\" evil=\\"1',
    "a=b", "key with spaces", "\x1b[31mred\x1b[0m", "\x00", "\t", " ", "", "  padded  ", "é ü ß", "😀",
    "\u200b", "\ufeff", "\xa0", "x\xa0y", "\x1c\x1d\x1e\x1f", "a" * 300, "# syntax=docker/dockerfile:1",
    "#escape=`", "{name}", "{0}", "{", "%s", "--build-arg=x", "../../etc/passwd", "/dev/zero", "-",
    "evil\nRUN echo pwned", "x\r\nRUN echo pwned", "x\\\nRUN echo pwned", "\nRUN echo pwned\n",
    "x\u2028RUN echo pwned", "x\x85RUN echo pwned", "${x:-$(id)}", "\\$HOME", "$", "$$", "\ud800", "a\udfffb",
    "\u202eevil", "x\x7fy", "\x9b31m", "0", "-1", "1e3", "true", "null", "~", "x" * 5000,
)


RAW_SPECIALS = tuple(Raw(s) for s in (
    "!!binary aGVsbG8=", "!!set {a, b}", "!!timestamp 2001-12-14t21:59:43.10-05:00", "2024-01-01", ".nan",
    ".inf", "-.inf", "1" + "0" * 5000, "-" + "9" * 5000, "0x" + "f" * 5000, "1e400", "~", "[]", "{}", "yes",
    "!!python/object/apply:os.system ['id']", "!!int abc", "!!float abc", "!!bool maybe", "!!timestamp garbage",
    "!!timestamp 2024-13-45", "!!binary '@@@'", "!!str 1", "!!null x", "!!omap [a: 1]", "!!pairs [a: 1]",
    "!!set [a]", "!<tag:yaml.org,2002:int> '12'", "!local x", "[a, [b, [c]]]", "{a: {b: {c: 1}}}", "0o17",
    "1_000", "+.5", "0b1010", "12:30:00", "!!int 99999999999999999999999999999999", "'\\n'", '"\\x00"',
    '"\\ud800"', "&anc value", "!!merge <<", "? complex", "[1, {a: 2}]", "- item", "|\n  literal\n",
    "!!int ''", "!!float ''", "!!float .", "!!float 1e999999", "!!timestamp ''", "!!bool ''", "!!binary ''",
    "!!int 0x", "!!int 0o9", "!!int 1:2:3", "!!float 1:2:3.5", "!!str", "!!map {}", "!!seq []", "!!set {}",
    "2001-12-14 21:59:43.10 -5", "2024-02-30", "1:30", "190:20:30", "0.5e+3", "-0", "=", "<<",
))


NASTY = (*NASTY, "My Model", "team/model", "UPPER", "a..b", "-leading", "trailing-", "a" * 129)


WRONG_TYPES = ([], {}, [1, 2], {"a": 1}, 0, -1, 1.5, True, None, 2**70, -(2**70))


def hostile_text(benign: str = "x") -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from(NASTY),
        st.tuples(st.just(benign), st.sampled_from(SEPARATORS), st.sampled_from(PAYLOADS)).map("".join),
        st.tuples(st.just(benign), st.sampled_from(SEPARATORS)).map("".join),
        st.tuples(st.sampled_from(("", " ", "\t")), st.just(benign), st.sampled_from(("", " ", "\t", "\\", "$"))).map("".join),
        st.text(alphabet=st.sampled_from("ab1.:/-_=\"'\\$#{} \t\n\r\v\f\x00\x1b\x85\xa0\u2028\u2029\ufeff😀"), max_size=14),
        st.text(max_size=10),
    )


def hostile_value(benign: Any = "x") -> st.SearchStrategy:
    return st.one_of(
        hostile_text(str(benign)), hostile_text(str(benign)),
        st.sampled_from(RAW_SPECIALS), st.sampled_from(WRONG_TYPES),
    )


BENIGN_TEXT = st.sampled_from((
    "Three-class MLP", "costs $5, \"quoted\" and back\\slash", "tabs\tand  spaces", "ünïcödé ✓", "a = b",
    "100% sure; #not-a-comment", "{name}", "'single'", "multi\nline\ndescription", "trailing space ",
))


def _input_spec(recipe: ModelRecipe, form: str) -> dict:
    return {"type": "float32", "shape": ["batch", 4]} if form == "full" else {"type": "float32"}


def _encodable(text: str) -> str:
    """Protobuf strings are UTF-8: no lone surrogates in a model."""
    return "".join(c if not 0xD800 <= ord(c) <= 0xDFFF else "?" for c in text)


@st.composite
def model_recipes(draw) -> ModelRecipe:
    if draw(st.integers(0, 9)) < 6:
        return ModelRecipe(opset=draw(st.sampled_from((13, 17, 21))), ir_version=draw(st.sampled_from((7, 8, 9, 10))))
    which = draw(st.sampled_from((
        "raw", "raw", "opset", "ir", "domain", "names", "elem", "dims", "kind", "init-input", "external",
        "external", "external", "sparse", "no-outputs",
    )))
    if which == "raw":
        kind = draw(st.sampled_from(("empty", "text", "garbage", "truncated", "trailing", "tensor", "onnx-as-text")))
        return ModelRecipe(raw=kind, truncate_permille=draw(st.integers(0, 999)))
    if which == "opset":
        return ModelRecipe(opset=draw(st.integers(1, 99)))
    if which == "ir":
        return ModelRecipe(ir_version=draw(st.integers(1, 20)))
    if which == "domain":
        return ModelRecipe(custom_domain=draw(st.sampled_from(("com.example", "ai.onnx.ml", "x\ny", "", "com.microsoft"))))
    if which == "names":
        name = _encodable(draw(hostile_text("x")))
        return ModelRecipe(input_name=name) if draw(st.booleans()) else ModelRecipe(output_name=name)
    if which == "elem":
        return ModelRecipe(elem_type=draw(st.sampled_from((0, 2, 7, 8, 9, 10, 11, 14, 16, 17, 21, 23, 999, -1))))
    if which == "dims":
        dim = draw(st.one_of(hostile_text("batch").map(_encodable), st.sampled_from((-5, 0, 2**62, None, ""))))
        return ModelRecipe(dims=(dim, 4))
    if which == "kind":
        return ModelRecipe(input_kind=draw(st.sampled_from(("sequence", "none"))))
    if which == "init-input":
        return ModelRecipe(initializer_as_input=True)
    if which == "sparse":
        return ModelRecipe(sparse_external=True)
    if which == "no-outputs":
        return ModelRecipe(no_outputs=True)
    location = draw(st.sampled_from(("w.bin", "sub/../w.bin", "../x.bin", "ABS", "/etc/hostname", "w\x00.bin",
                                     "a" * 300, "", ".", "sub", "w\n.bin", "missing.bin", "model.onnx",
                                     "sub/w.bin", "./w.bin", "w.bin/", "~/w.bin", "$HOME/w.bin")))
    number = st.sampled_from(("0", "abc", "-1", "99999999999999999999999", "", "1e3", " 4", "0x10", "4", "16",
                              None, "٤", "1" * 5000))
    offset, length = draw(number), draw(number)
    size = draw(st.sampled_from((16, 16, 0, 8, 64, -1)))
    return ModelRecipe(external=(location, offset, length, size))


@st.composite
def cases(draw) -> Case:
    recipe = draw(model_recipes())
    style = draw(st.sampled_from((0, 1, 1, 2)))
    cfg: dict[str, Any] = {"name": draw(st.sampled_from(("iris-mlp", "m", "model_v2", "Iris.MLP", "x" * 40)))}
    if draw(st.booleans()):
        cfg["version"] = draw(st.sampled_from(("1.0.0", 1.0, 2, "2024.1", "v1", "1.0.0+build.5")))
    if draw(st.booleans()):
        cfg["description"] = draw(st.one_of(BENIGN_TEXT, st.text(max_size=40)))
    cfg["model"] = {"source": "./model.onnx", "format": "onnx"}
    if recipe.standard and draw(st.booleans()):
        if draw(st.booleans()):
            cfg["inputs"] = {"x": _input_spec(recipe, draw(st.sampled_from(("full", "type"))))}
        else:
            cfg["inputs"] = [{"name": "x", "type": "float32", "shape": ["batch", 4]}]
        if draw(st.booleans()):
            cfg["outputs"] = {"y": {"type": "float32", "labels": ["a", "b", "c", "d"]}}
    if draw(st.booleans()):
        cfg["runtime"] = {"gpu": {"memory": "2GB", "backend": draw(st.sampled_from(("auto", "cpu")))}, "timeout": 30}
    if draw(st.booleans()):
        cfg["serving"] = {"port": draw(st.integers(1, 65535)), "host": "0.0.0.0", "timeout": 5, "max_workers": 2}
    if draw(st.booleans()):
        cfg["metadata"] = {"author": "fuzz", "tags": ["a", "b"], "n": 1, "ok": True, "nested": {"x": None}}
    pack: dict[str, Any] = {}
    if draw(st.booleans()):
        pack["labels"] = {"team": "vision", "com.example.note": draw(st.one_of(BENIGN_TEXT, st.text(max_size=40)))}
    if draw(st.integers(0, 3)) == 0:
        pack["tag"] = draw(st.sampled_from(("{name}:{version}-{provider}", "registry.example.com:5000/team/{name}:{version}-{provider}")))
    if draw(st.integers(0, 3)) == 0:
        pack["base_image"] = draw(st.sampled_from(("python:3.11-slim", {"cpu": "python:3.12-slim"}, "debian:bookworm",
                                                   "registry.example.com:5000/team/base:1.0@sha256:" + "a" * 64)))
    if draw(st.integers(0, 3)) == 0:
        pack["requirements"] = ["numpy>=1.26"]
    if draw(st.integers(0, 3)) == 0:
        pack["provider_options"] = {"cuda": {"cudnn_conv_algo_search": "HEURISTIC"}}
    if draw(st.integers(0, 3)) == 0:
        pack["tensorrt"] = {"fp16": True, "workspace": "2GB", "profiles": {"x": {"min": [1, 4], "opt": [8, 4], "max": [32, 4]}}}
    if pack:
        cfg["pack"] = pack

    hostile: list[str] = []
    for _ in range(draw(st.sampled_from((0, 0, 0, 0, 1, 1, 2, 3)))):
        name, mutate = draw(st.sampled_from(FIELDS))
        mutate(draw, cfg)
        hostile.append(name)
    text = block(cfg, style)
    if draw(st.integers(0, 5)) == 0:
        name, doc = draw(st.sampled_from(DOCUMENTS))
        text = doc(draw, text, cfg)
        hostile.append(name)
    data = text.encode("utf-8")
    if draw(st.integers(0, 19)) == 0:
        name, enc = draw(st.sampled_from(ENCODINGS))
        data = enc(text)
        hostile.append(name)
    return Case(data, recipe, ", ".join(hostile))


def _at(cfg: dict, *path: str) -> dict:
    node = cfg
    for p in path:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    return node


def _inputs(cfg: dict, section: str = "inputs", name: str = "x") -> dict:
    node = cfg.get(section)
    if not isinstance(node, dict) or not node:
        node = cfg[section] = {name if section == "inputs" else "y": {"type": "float32", "shape": ["batch", 4]}}
    spec = next(iter(node.values()))
    if not isinstance(spec, dict):
        spec = node[next(iter(node))] = {}
    return spec


def _rename_key(node: dict, new: Any) -> None:
    old = next(iter(node))
    node[new] = node.pop(old)


def _f(path: tuple[str, ...], benign: Any) -> Callable:
    def mutate(draw, cfg):
        _at(cfg, *path[:-1])[path[-1]] = draw(hostile_value(benign))
    return mutate


def _input_field(section: str, key: str, benign: Any) -> Callable:
    def mutate(draw, cfg):
        spec = _inputs(cfg, section)
        if key == "shape":
            spec["shape"] = ["batch", 4]
            spec["shape"][draw(st.integers(0, 1))] = draw(hostile_value("batch"))
        else:
            spec[key] = draw(hostile_value(benign))
    return mutate


def _input_name(section: str) -> Callable:
    def mutate(draw, cfg):
        _inputs(cfg, section)
        _rename_key(cfg[section], draw(hostile_text("x" if section == "inputs" else "y")))
    return mutate


def _map_key(path: tuple[str, ...], benign_key: str, value: Any) -> Callable:
    def mutate(draw, cfg):
        _at(cfg, *path)[draw(hostile_text(benign_key))] = value
    return mutate


def _provider_option(draw, cfg):
    where = draw(st.sampled_from(("key", "value", "provider")))
    if where == "provider":
        _at(cfg, "pack", "provider_options")[draw(hostile_text("cuda"))] = {"a": 1}
    elif where == "key":
        _at(cfg, "pack", "provider_options", "cpu")[draw(hostile_text("intra_op_num_threads"))] = 2
    else:
        _at(cfg, "pack", "provider_options", "cpu")["opt"] = draw(hostile_value("HEURISTIC"))


def _profile(draw, cfg):
    profiles = _at(cfg, "pack", "tensorrt", "profiles")
    if draw(st.booleans()):
        profiles[draw(hostile_text("x"))] = {"min": [1, 4], "opt": [8, 4], "max": [32, 4]}
    else:
        profiles["x"] = {"min": [1, 4], "opt": [draw(hostile_value(8)), 4], "max": [32, 4]}


def _requirements(draw, cfg):
    _at(cfg, "pack")["requirements"] = [draw(hostile_value("numpy>=1.26"))]


def _unknown_key(draw, cfg):
    cfg[draw(hostile_text("servng"))] = 1


def _output_labels(draw, cfg):
    _inputs(cfg, "outputs")["labels"] = [draw(hostile_value("setosa"))]


FIELDS: tuple[tuple[str, Callable], ...] = (
    ("name", _f(("name",), "iris-mlp")),
    ("version", _f(("version",), "1.0.0")),
    ("description", _f(("description",), "a model")),
    ("model.source", _f(("model", "source"), "./model.onnx")),
    ("model.version", _f(("model", "version"), "3")),
    ("inputs key", _input_name("inputs")),
    ("inputs type", _input_field("inputs", "type", "float32")),
    ("inputs shape", _input_field("inputs", "shape", "batch")),
    ("inputs description", _input_field("inputs", "description", "features")),
    ("outputs key", _input_name("outputs")),
    ("outputs type", _input_field("outputs", "type", "float32")),
    ("outputs shape", _input_field("outputs", "shape", "batch")),
    ("outputs labels", _output_labels),
    ("pack.labels key", _map_key(("pack", "labels"), "team", "vision")),
    ("pack.labels value", _f(("pack", "labels", "team"), "vision")),
    ("pack.base_image", _f(("pack", "base_image"), "python:3.11-slim")),
    ("pack.base_image.cpu", _f(("pack", "base_image", "cpu"), "python:3.11-slim")),
    ("pack.base_image key", _map_key(("pack", "base_image"), "cpu", "python:3.11-slim")),
    ("pack.tag", _f(("pack", "tag"), "{name}:{version}-{provider}")),
    ("pack.requirements", _requirements),
    ("pack.provider_options", _provider_option),
    ("pack.tensorrt.profiles", _profile),
    ("pack.tensorrt.workspace", _f(("pack", "tensorrt", "workspace"), "2GB")),
    ("pack.python", _f(("pack", "python"), "3.11")),
    ("pack.providers", _f(("pack", "providers"), "cpu")),
    ("pack.warmup", _f(("pack", "warmup"), "auto")),
    ("pack.cuda", _f(("pack", "cuda"), "13")),
    ("pack.device_id", _f(("pack", "device_id"), 0)),
    ("serving.host", _f(("serving", "host"), "0.0.0.0")),
    ("serving.port", _f(("serving", "port"), 8080)),
    ("serving.timeout", _f(("serving", "timeout"), 5)),
    ("serving.max_workers", _f(("serving", "max_workers"), 2)),
    ("runtime.timeout", _f(("runtime", "timeout"), 30)),
    ("runtime.gpu.memory", _f(("runtime", "gpu", "memory"), "2GB")),
    ("runtime.gpu.backend", _f(("runtime", "gpu", "backend"), "auto")),
    ("metadata key", _map_key(("metadata",), "author", "fuzz")),
    ("metadata value", _f(("metadata", "author"), "fuzz")),
    ("preprocessing", _f(("preprocessing", "tokenizer"), "bert")),
    ("unknown key", _unknown_key),
)


def _bomb(levels: int, width: int) -> str:
    lines = ["  l0: &l0 lol"]
    for i in range(1, levels + 1):
        lines.append(f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "metadata:\n" + "\n".join(lines) + "\n"


def _without(text: str, key: str) -> str:
    """The document without a top-level key and its block."""
    out, skip = [], False
    for line in text.splitlines(keepends=True):
        if not line.startswith(" "):
            skip = line.startswith((f"{key}:", f'"{key}":', f"'{key}':"))
        if not skip:
            out.append(line)
    return "".join(out)


def _doc_duplicate(draw, text, cfg):
    key = draw(st.sampled_from(("name", "model", "serving", "pack", "metadata")))
    return text + {"name": "name: other\n", "model": "model:\n  source: ./model.onnx\n", "serving": "serving: {port: 1}\n",
                   "pack": "pack: {labels: {a: b}}\n", "metadata": "metadata: {}\n"}[key]


def _doc_nested_duplicate(draw, text, cfg):
    return _without(text, "serving") + "serving: {port: 8080, port: 8081}\n"


def _doc_anchor_name(draw, text, cfg):
    value = draw(hostile_text("iris"))
    return "metadata:\n  n: &n " + dq(value) + "\n" + _without(_without(text, "metadata"), "name") + "name: *n\n"


def _doc_anchor_labels(draw, text, cfg):
    value = draw(hostile_text("vision"))
    body = _without(_without(text, "metadata"), "pack")
    return f"metadata:\n  v: &v {dq(value)}\n  m: &m {{team: *v}}\n" + body + "pack:\n  labels: *m\n"


def _doc_self_reference(draw, text, cfg):
    form = draw(st.sampled_from(("metadata: &m {a: 1, self: *m}\n", "metadata: &l [1, *l]\n",
                                 "metadata:\n  a: &a\n    b: *a\n", "metadata: {a: &x [*x]}\n")))
    return _without(text, "metadata") + form


def _doc_merge(draw, text, cfg):
    return _without(text, "serving") + "x-base: &base {port: 9000, host: 0.0.0.0}\nserving:\n  <<: *base\n  timeout: 3\n"


def _doc_bomb(draw, text, cfg):
    levels, width = draw(st.sampled_from(((3, 5), (4, 9), (5, 10), (6, 10))))
    return _without(text, "metadata") + _bomb(levels, width)


def _doc_deep(draw, text, cfg):
    depth = draw(st.sampled_from((100, 500, 1000)))
    if draw(st.booleans()):
        value = "[" * depth + "]" * depth
        return _without(text, "metadata") + f"metadata: {{deep: {value}}}\n"
    lines = "".join(" " * (2 * i + 2) + f"k{i}:\n" for i in range(depth)) + " " * (2 * depth + 2) + "leaf\n"
    return _without(text, "metadata") + "metadata:\n" + lines


def _doc_multi(draw, text, cfg):
    return text + "---\n" + text


def _doc_directive(draw, text, cfg):
    return draw(st.sampled_from(("%YAML 1.1\n---\n", "%YAML 1.2\n---\n", "%TAG ! tag:evil,2024:\n---\n", "--- !!map\n"))) + text


def _doc_tag_field(draw, text, cfg):
    key = draw(st.sampled_from(("name", "version", "description")))
    return _without(text, key) + f"{key}: {draw(st.sampled_from(RAW_SPECIALS))}\n"


def _doc_tabs(draw, text, cfg):
    return text.replace("\n  ", "\n\t", 1)


def _doc_comment_only(draw, text, cfg):
    return draw(st.sampled_from(("# nothing\n", "", "---\n", "...\n", "[]\n", "- a\n", "just text\n", "null\n", "42\n")))


def _doc_complex_key(draw, text, cfg):
    return text + draw(st.sampled_from(("? [a, b]\n: 1\n", "? {a: 1}\n: 2\n", "~: x\n", "1: x\n", "true: x\n",
                                        "!!binary aGk=: x\n", "2024-01-01: x\n")))


DOCUMENTS = (
    ("duplicate key", _doc_duplicate),
    ("nested duplicate key", _doc_nested_duplicate),
    ("anchor used as name", _doc_anchor_name),
    ("anchor used as labels", _doc_anchor_labels),
    ("self-referencing alias", _doc_self_reference),
    ("merge key", _doc_merge),
    ("alias bomb", _doc_bomb),
    ("deep nesting", _doc_deep),
    ("two documents", _doc_multi),
    ("YAML directive", _doc_directive),
    ("tag on a top-level field", _doc_tag_field),
    ("tab indentation", _doc_tabs),
    ("no mapping", _doc_comment_only),
    ("complex key", _doc_complex_key),
)


ENCODINGS = (
    ("BOM", lambda t: "\ufeff".encode() + t.encode()),
    ("CRLF", lambda t: t.replace("\n", "\r\n").encode()),
    ("CR only", lambda t: t.replace("\n", "\r").encode()),
    ("latin-1 byte", lambda t: t.encode() + b"description: caf\xe9\n"),
    ("UTF-16", lambda t: t.encode("utf-16")),
    ("NUL byte", lambda t: t.encode() + b"\x00\n"),
)


def write_case(case: Case, case_dir: Path) -> Path:
    project = case_dir / "p"
    project.mkdir(parents=True)
    (case_dir / "abs.bin").write_bytes(bytes(range(64)))
    recipe = case.model
    if recipe.external and recipe.external[0] == "ABS":
        recipe = ModelRecipe(external=(str(case_dir / "abs.bin"), *recipe.external[1:]))
    (project / "model.onnx").write_bytes(model_bytes(recipe, project, case_dir))
    (project / "gpux.yml").write_bytes(case.yml)
    return project


def check_project(
    project: Path, tally: Tally, reproducer: Callable[[], str], scrub: list[str]
) -> tuple[CliResult, list[Problem]]:
    """CLI, then (when valid) render; problems go to the tally too."""
    result = run_build(project)
    problems = cli_problems(result, scrub)
    if result.code == 1 and not problems:
        problems += render_problems(project, tally, scrub)
    for p in problems:
        tally.fail(p, reproducer())
    tally.log(result, problems, reproducer)
    tally.cases += 1
    if result.code is not None:
        tally.outcomes[result.code] = tally.outcomes.get(result.code, 0) + 1
    return result, problems


def render_problems(project: Path, tally: Tally, scrub: list[str]) -> list[Problem]:
    from gpux_pack.errors import PackError

    problems: list[Problem] = []
    base = baseline()
    for override in (True, False):
        try:
            with time_limit(CASE_SECONDS):
                rendered = render_project(project, override_base=override)
        except PackError as e:
            text = str(e)
            if e.exit_code != 2 or "\n" in text:
                problems.append(Problem("render: bad error", _template(text, scrub), repr(text[:300])))
            else:
                msg = _template(text, scrub)
                tally.late_rejections[msg] = tally.late_rejections.get(msg, 0) + 1
            continue
        except Hang as e:
            problems.append(Problem("hang", f"render: {where(e)}", str(e)))
            continue
        except Exception as e:  # noqa: BLE001
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            problems.append(Problem("render traceback", f"{type(e).__name__} in {where(e)}", last[:300]))
            continue
        if override:
            tally.rendered += 1
            problems += context_problems(rendered)
        problems += dockerfile_problems(rendered, base, "" if override else " (pack.base_image)")
        if not rendered.pack_base_image:
            break  # FROM would name the provider's default: nothing new to render
    return problems


def external_locations(model: Path) -> set[str]:
    """Every external data location the model names: initializers, sparse ones, attributes,
    subgraphs (read here with onnx, independently of the packager)."""
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    found: set[str] = set()

    def tensors(graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from (sparse.values, sparse.indices)
        for node in graph.node:
            for attr in node.attribute:
                yield from [attr.t] if attr.HasField("t") else []
                yield from attr.tensors
                if attr.HasField("sparse_tensor"):
                    yield from (attr.sparse_tensor.values, attr.sparse_tensor.indices)
                for sparse in attr.sparse_tensors:
                    yield from (sparse.values, sparse.indices)
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from tensors(sub)

    for t in tensors(proto.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            found |= {e.value for e in t.external_data if e.key == "location"}
    return found


def context_problems(r: Rendered) -> list[Problem]:
    """The build context carries the model and every external data file it names."""
    from gpux_pack.image.layout import LAYERS

    names = set(r.context_files)
    # a small model lies in the layer it shares with gpux.json (app.tar), a larger one in model.tar
    MODEL = next((layer.source + LAYERS["model"].lands for layer in (LAYERS["app"], LAYERS["model"])
                  if any(n.startswith(layer.source + "/") for n in names)), LAYERS["model"].source)
    problems = []
    if f"{MODEL}/{r.model_path.name}" not in names:
        problems.append(Problem("context", "the model file is not in the build context", r.model_path.name))
    for location in sorted(external_locations(r.model_path)):
        if f"{MODEL}/{location}" not in names and f"{MODEL}/{os.path.normpath(location)}" not in names:
            problems.append(Problem("context", "an external data file is not in the build context",
                                    f"{location!r}; context has {sorted(n for n in names if n.startswith(MODEL))}"))
    return problems


def matrix_yml(path: tuple[Any, ...], value: str) -> str:
    cfg: dict[str, Any] = {
        "name": "iris-mlp", "version": "1.0.0", "description": "d",
        "model": {"source": "./model.onnx", "version": "3"},
        "inputs": {"features": {"type": "float32", "shape": ["batch", 4], "description": "f"}},
        "outputs": {"logits": {"type": "float32", "shape": ["batch", 3]}, "probs": {"type": "float32"}},
        "runtime": {"gpu": {"memory": "2GB"}, "timeout": 30},
        "serving": {"host": "0.0.0.0", "port": 8080, "timeout": 5},
        "metadata": {"author": "a"},
        "pack": {"labels": {"team": "vision"}, "base_image": "python:3.11-slim", "tag": "{name}:{version}-{provider}",
                 "requirements": ["numpy>=1.26"], "provider_options": {"cpu": {"opt": "a"}},
                 "tensorrt": {"profiles": {"features": {"min": [1, 4], "opt": [1, 4], "max": [1, 4]}}}},
    }
    node = cfg
    for p in path[:-1]:
        if isinstance(node[p], str):  # pack.base_image: the mapping form
            node[p] = {"cpu": node[p]}
        node = node[p]
    last = path[-1]
    if last == "<key>":
        node[value] = node.pop(next(iter(node)))
    elif isinstance(last, int):
        node[last] = value
    else:
        node[last] = value
    return block(cfg, 0)


MATRIX: dict[str, tuple[tuple[Any, ...], str, str]] = {  # field -> (path, valid prefix, what the error names)
    "name": (("name",), "iris-mlp", "name"),
    "version": (("version",), "1.0.0", "version"),
    "description": (("description",), "a model", "description"),
    "model.source": (("model", "source"), "./model.onnx", "model.source"),
    "model.version": (("model", "version"), "3", "model.version"),
    "inputs name": (("inputs", "<key>"), "features", "inputs"),
    "inputs type": (("inputs", "features", "type"), "float32", "inputs"),
    "inputs shape": (("inputs", "features", "shape", 0), "batch", "inputs"),
    "inputs description": (("inputs", "features", "description"), "f", "inputs"),
    "outputs name": (("outputs", "<key>"), "logits", "outputs"),
    "outputs type": (("outputs", "logits", "type"), "float32", "outputs"),
    "outputs shape": (("outputs", "logits", "shape", 0), "batch", "outputs"),
    "pack.labels key": (("pack", "labels", "<key>"), "team", "pack.labels"),
    "pack.labels value": (("pack", "labels", "team"), "vision", "pack.labels"),
    "pack.base_image": (("pack", "base_image"), "python:3.11-slim", "pack.base_image"),
    "pack.base_image mapping": (("pack", "base_image"), "python:3.11-slim", "pack.base_image"),
    "pack.tag": (("pack", "tag"), "{name}:{version}-{provider}", "pack.tag"),
    "pack.requirements": (("pack", "requirements", 0), "numpy>=1.26", "pack.requirements"),
    "pack.provider_options key": (("pack", "provider_options", "cpu", "<key>"), "opt", "pack.provider_options"),
    "pack.provider_options value": (("pack", "provider_options", "cpu", "opt"), "a", "pack.provider_options"),
    "pack.tensorrt.profiles": (("pack", "tensorrt", "profiles", "<key>"), "features", "pack.tensorrt.profiles"),
    "pack.base_image key": (("pack", "base_image", "<key>"), "cpu", "pack.base_image"),
    "pack.provider_options provider": (("pack", "provider_options", "<key>"), "cpu", "pack.provider_options"),
    "pack.providers": (("pack", "providers"), "cpu", "pack.providers"),
    "pack.warmup": (("pack", "warmup"), "auto", "pack.warmup"),
    "pack.cuda": (("pack", "cuda"), "13", "pack.cuda"),
    "pack.python": (("pack", "python"), "3.11", "pack.python"),
    "runtime.gpu.backend": (("runtime", "gpu", "backend"), "auto", "runtime.gpu.backend"),
    "serving.host": (("serving", "host"), "0.0.0.0", "serving.host"),
    "serving.port": (("serving", "port"), "8080", "serving.port"),
    "serving.timeout": (("serving", "timeout"), "5", "serving.timeout"),
    "runtime.timeout": (("runtime", "timeout"), "30", "runtime.timeout"),
    "runtime.gpu.memory": (("runtime", "gpu", "memory"), "2GB", "runtime.gpu.memory"),
    "metadata key": (("metadata", "<key>"), "author", "metadata"),
    "metadata value": (("metadata", "author"), "a", "metadata"),
}


MATRIX_SEPARATORS = {"\\n": "\n", "\\r": "\r", "\\r\\n": "\r\n", "\\v": "\v", "\\f": "\f", "U+2028": "\u2028",
                     "U+2029": "\u2029", "U+0085": "\x85"}


# Not line breaks, but terminal controls: an error line echoing them raw can still rewrite the
# terminal (ESC [ 1 A moves up a line, CSI is ESC [ in one byte); checked inside a value only.
MATRIX_CONTROLS = {"ESC": "\x1b[1A", "NUL": "\x00", "CSI": "\x9b2K"}


SPECIAL_FIELDS: dict[str, tuple[Any, ...]] = {
    "name": ("name",),
    "version": ("version",),
    "description": ("description",),
    "model.source": ("model", "source"),
    "inputs shape": ("inputs", "features", "shape", 0),
    "serving.port": ("serving", "port"),
    "runtime.gpu.memory": ("runtime", "gpu", "memory"),
    "pack.labels key": ("pack", "labels", "<key>"),
    "pack.labels value": ("pack", "labels", "team"),
    "pack.base_image": ("pack", "base_image"),
    "metadata key": ("metadata", "<key>"),
    "metadata value": ("metadata", "author"),
}


EXTERNAL_LOCATIONS = ("w.bin", "sub/../w.bin", "../x.bin", "ABS", "/etc/hostname", "w\x00.bin", "a" * 300,
                      "a/" * 2100 + "w.bin", "", ".", "sub", "w\n.bin", "missing.bin", "model.onnx", "./w.bin",
                      "w.bin/", "$HOME/w.bin", "C:\\w.bin", "w.bin\u2028x")


EXTERNAL_RANGES = (("0", "16"), ("abc", "16"), ("-1", "16"), ("99999999999999999999999", "16"), ("0", "abc"),
                   ("0", "-1"), ("", ""), (None, None), ("1" * 5000, "16"), ("\u0664", "16"), ("8", "16"))


def model_matrix() -> list[ModelRecipe]:
    out = [ModelRecipe(raw=k) for k in ("empty", "text", "garbage", "trailing", "tensor", "onnx-as-text")]
    out += [ModelRecipe(raw="truncated", truncate_permille=n) for n in (1, 100, 500, 900, 999)]
    out += [ModelRecipe(opset=n) for n in (1, 6, 22, 23, 99)]
    out += [ModelRecipe(ir_version=n) for n in (1, 2, 3, 11, 12, 13, 20)]
    out += [ModelRecipe(custom_domain=d) for d in ("com.example", "ai.onnx.ml", "x\ny", "", "com.microsoft")]
    names = ("x\ny", "x\rRUN echo pwned", "", "a b", "$x", "0", "x" * 300, "\x1b[1A", "x\u2028y")
    out += [ModelRecipe(input_name=n) for n in names] + [ModelRecipe(output_name=n) for n in names]
    out += [ModelRecipe(elem_type=t) for t in (0, 2, 7, 8, 9, 10, 11, 14, 16, 17, 21, 23, 999, -1)]
    out += [ModelRecipe(dims=(d, 4)) for d in (-5, 0, 2**62, None, "", "b\nRUN x", "\x1b[1A", "x" * 300)]
    out += [ModelRecipe(input_kind=k) for k in ("sequence", "none")]
    out += [ModelRecipe(initializer_as_input=True), ModelRecipe(sparse_external=True), ModelRecipe(no_outputs=True)]
    out += [ModelRecipe(external=(loc, off, ln, 16)) for loc in EXTERNAL_LOCATIONS for off, ln in EXTERNAL_RANGES]
    out += [ModelRecipe(external=("w.bin", "0", "16", size)) for size in (0, 8, 15, -1)]
    return out


def odd_paths(tmp: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    long_name = "a" * 300

    def project(name: str, source: str = "./model.onnx") -> Path:
        p = tmp / name
        p.mkdir()
        (p / "gpux.yml").write_text(f"name: m\nmodel:\n  source: {dq(source)}\n")
        (p / "model.onnx").write_bytes(MLP_MODEL)
        return p

    p = project("source-loop", "./loop.onnx")
    (p / "loop.onnx").symlink_to("loop.onnx")
    out["model.source is a symlink loop"] = p
    p = project("source-cycle", "./a.onnx")
    (p / "a.onnx").symlink_to("b.onnx")
    (p / "b.onnx").symlink_to("a.onnx")
    out["model.source is a two-link cycle"] = p
    out["model.source is a 300-character name"] = project("source-long", f"./{long_name}.onnx")
    out["model.source has a 300-character folder"] = project("source-long-dir", f"./{long_name}/model.onnx")
    out["model.source is 2100 folders deep"] = project("source-deep", "a/" * 2100 + "model.onnx")
    p = project("source-dangling", "./gone.onnx")
    (p / "gone.onnx").symlink_to("nowhere.onnx")
    out["model.source is a dangling link"] = p
    p = project("source-dir-link", "./d.onnx")
    (p / "d.onnx").symlink_to(p)
    out["model.source is a link to its folder"] = p
    out["model.source names the folder with a trailing slash"] = project("source-slash", "./model.onnx/")
    out["model.source is the folder"] = project("source-dot", ".")
    out["model.source is /proc/self/mem"] = project("source-proc", "/proc/self/mem")
    p = tmp / "yml-loop"
    p.mkdir()
    (p / "gpux.yml").symlink_to("gpux.yml")
    out["gpux.yml is a symlink loop"] = p
    (tmp / "path-loop").symlink_to(tmp / "path-loop")
    out["PATH is a symlink loop"] = tmp / "path-loop"
    out["PATH is a 300-character name"] = tmp / long_name
    out["PATH is 2100 folders deep"] = tmp / ("a/" * 2100)
    out["PATH is a dangling link"] = tmp / "dangling"
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    return out


def resource_limits() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def make_resource_cases(tmp: Path) -> dict[str, Path]:
    good = "name: m\nmodel:\n  source: ./model.onnx\n"
    out: dict[str, Path] = {}

    def project(name: str, yml: str | None = good, model: bytes | None = MLP_MODEL) -> Path:
        p = tmp / name
        p.mkdir()
        if yml is not None:
            (p / "gpux.yml").write_text(yml)
        if model is not None:
            (p / "model.onnx").write_bytes(model)
        return p

    fifo = tmp / "fifo.yml"
    os.mkfifo(fifo)
    out["PATH is a FIFO"] = fifo
    out["PATH is /dev/zero"] = Path("/dev/zero")
    out["PATH is /dev/null"] = Path("/dev/null")
    p = project("yml-fifo", yml=None)
    os.mkfifo(p / "gpux.yml")
    out["gpux.yml is a FIFO"] = p
    p = project("yml-zero", yml=None)
    (p / "gpux.yml").symlink_to("/dev/zero")
    out["gpux.yml is a link to /dev/zero"] = p
    p = project("yml-dir", yml=None)
    (p / "gpux.yml").mkdir()
    out["gpux.yml is a folder"] = p
    p = project("model-fifo", model=None)
    os.mkfifo(p / "model.onnx")
    out["model.onnx is a FIFO"] = p
    out["model.source is /dev/zero"] = project("model-zero", yml="name: m\nmodel:\n  source: /dev/zero\n")
    out["model.source is /dev/urandom"] = project("model-urandom", yml="name: m\nmodel:\n  source: /dev/urandom\n")
    p = project("model-link-zero", model=None)
    (p / "model.onnx").symlink_to("/dev/zero")
    out["model.onnx is a link to /dev/zero"] = p
    p = project("external-fifo", model=None)
    os.mkfifo(p / "w.bin")
    (p / "model.onnx").write_bytes(model_bytes(ModelRecipe(external=("w.bin", "0", "16", -1)), p, tmp))
    out["external data is a FIFO"] = p
    out["billion laughs (10^9)"] = project("bomb", yml=good + _bomb(9, 10))
    out["alias bomb wide (10^8)"] = project("bomb-wide", yml=good + _bomb(4, 100))
    out["nesting 100000 deep"] = project("deep", yml=good + "metadata: " + "[" * 100_000 + "]" * 100_000 + "\n")
    big = project("big", yml=None)
    with open(big / "gpux.yml", "w") as f:
        f.write(good)
        f.write("description: " + "x" * (30 << 20) + "\n")
    out["gpux.yml of 30 MB"] = big
    return out
