"""Fuzz: generated gpux.yml files and ONNX models thrown at load and render, with no engine.

What must hold for every project, however hostile:
- `gpux-pack build` ends with exit 1 (the project is valid; only the Docker engine is missing)
  or exit 2 (the project is not), as exactly one line `error: ...` on stderr: no traceback, no
  second line, no control character, nothing on stdout, and no hang;
- a valid project renders a Dockerfile whose instructions are exactly those of the bundled
  example: no field adds, removes or reorders an instruction (read the way Docker reads the
  file, splitting at '\\n' only, and the way editors and Python tools read it, splitting at
  every Unicode line boundary), the first line is no parser directive, LABEL keys are the
  contract's or the ones the case set in pack.labels, every label value is the configured value
  with its whitespace collapsed (read with Docker's own quoting and escaping rules, no `$VAR`
  expansion), and the build context can be assembled (gpux.json written) with the model and
  every external data file the model names.

Tests: `test_generated_projects` (hypothesis: 500 generated gpux.yml + model pairs, a third or
more of them valid), and explicit, non-random matrices: every field x every line separator and
terminal control (`test_separator_matrix`), every field kind x YAML's special scalars and tags
(`test_yaml_specials_matrix`), every hostile model recipe (`test_model_matrix`), odd paths:
links, loops and over-long names (`test_odd_paths`), and FIFOs, devices and alias/size bombs in
a child process (`test_non_regular_files_and_bombs`).

Deterministic: hypothesis with derandomize=True, a fixed max_examples, no database, no
shrinking (every distinct failure is collected and reported with the shortest gpux.yml that
showed it). No network, no Docker: DOCKER_HOST points at a socket that does not exist. Every
in-process call runs under a SIGALRM time limit; FIFOs, devices and resource bombs run in a
child process with a time and memory limit, so a hang fails the test instead of blocking CI.

Set GPUX_FUZZ_REPORT=DIR to also write each distinct failure's reproducer (gpux.yml + model
recipe) and one line per generated case under DIR; GPUX_FUZZ_EXAMPLES=N runs N generated cases
instead of the default (still deterministic).
"""


from __future__ import annotations
from concurrent.futures import ThreadPoolExecutor
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from tests.fuzz.harness import (
    CHILD_PARALLEL,
    CHILD_SECONDS,
    CLI_ARGS,
    Case,
    CliResult,
    EXAMPLE,
    GENERATED_CASES,
    MATRIX,
    MATRIX_CONTROLS,
    MATRIX_SEPARATORS,
    MIN_CASES,
    MLP_MODEL,
    ModelRecipe,
    NO_ENGINE,
    Problem,
    RAW_SPECIALS,
    ROOT,
    Raw,
    SPECIAL_FIELDS,
    Tally,
    resource_limits,
    make_resource_cases,
    matrix_yml,
    odd_paths,
    baseline,
    cases,
    check_project,
    cli_problems,
    dockerfile_problems,
    dq,
    model_matrix,
    render_project,
    run_build,
    write_case,
)


@pytest.fixture(scope="module")
def no_engine(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", NO_ENGINE)
        mp.delenv("DOCKER_CONTEXT", raising=False)
        mp.setenv("GPUX_PACK_CACHE_DIR", str(tmp_path_factory.mktemp("gpux-cache")))
        mp.delenv("SOURCE_DATE_EPOCH", raising=False)
        yield


def test_baseline_is_the_example(no_engine):
    """The oracle itself: the bundled example renders, and its labels read back as configured."""
    base = baseline()
    assert base.instructions[0] == "FROM" and "LABEL" in base.instructions
    rendered = render_project(EXAMPLE)
    assert dockerfile_problems(rendered, base) == []
    result = run_build(EXAMPLE)
    assert result.code == 1 and cli_problems(result, []) == [], result


def test_generated_projects(no_engine, tmp_path):
    tally = Tally()
    started = time.monotonic()

    @settings(max_examples=GENERATED_CASES, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                     HealthCheck.large_base_example])
    @given(case=cases())
    def run(case: Case) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as d:
            project = write_case(case, Path(d))
            check_project(project, tally, case.reproducer, [str(Path(d).resolve()), d])

    run()
    seconds = time.monotonic() - started
    summary = (f"{tally.cases} cases in {seconds:.1f}s: exit 1 x{tally.outcomes.get(1, 0)}, "
               f"exit 2 x{tally.outcomes.get(2, 0)}, {tally.rendered} rendered, "
               f"{sum(tally.late_rejections.values())} rejected only when planning")
    print(summary)
    assert not tally.failures, summary + "\n" + tally.report()
    assert tally.cases >= MIN_CASES, summary
    assert tally.outcomes.get(1, 0) >= tally.cases // 4, summary  # enough valid ones to render
    assert tally.outcomes.get(2, 0) > 0, summary


@pytest.mark.parametrize("field_name", list(MATRIX))
def test_separator_matrix(no_engine, tmp_path, field_name):
    """Each field holding each line separator (inside a value, and at its end) or terminal control:
    exit 2 in one clean line naming the field, or a Dockerfile with exactly the example's
    instructions."""
    path, prefix, names = MATRIX[field_name]
    tally = Tally()
    variants = [(n, s, t) for n, s in MATRIX_SEPARATORS.items() for t in ("{p}{s}RUN echo pwned", "{p}{s}")]
    variants += [(n, s, "{p}{s}RUN echo pwned") for n, s in MATRIX_CONTROLS.items()]
    for i, (sep_name, sep, template) in enumerate(variants):
        value = template.format(p=prefix, s=sep)
        if field_name == "pack.base_image mapping":
            value = Raw("{cpu: " + dq(value) + "}")
        text = matrix_yml(path, value)
        case_dir = tmp_path / str(i)
        project = case_dir / "p"
        project.mkdir(parents=True)
        (project / "model.onnx").write_bytes(MLP_MODEL)
        (project / "gpux.yml").write_text(text, encoding="utf-8")
        case = Case(text.encode(), ModelRecipe(raw="examples/mlp/model.onnx"), f"{field_name} = {value!r}")
        result, problems = check_project(project, tally, case.reproducer, [str(case_dir.resolve()), str(case_dir)])
        line = result.stderr.strip()
        if result.code == 2 and not problems and f": {names}" not in line and f"{names}." not in line:
            tally.fail(Problem("error does not name the field", f"{field_name} with {sep_name}", line[:300]),
                       case.reproducer())
    assert not tally.failures, tally.report()


@pytest.mark.parametrize("field_name", list(SPECIAL_FIELDS))
def test_yaml_specials_matrix(no_engine, tmp_path, field_name):
    """Tags (!!binary, !!set, !!timestamp, !!bool, !!float, !!int with bad text), dates, .nan,
    .inf, 5000-digit integers, flow collections... in each field: exit 1 or 2, one line."""
    tally = Tally()
    for i, special in enumerate(RAW_SPECIALS):
        text = matrix_yml(SPECIAL_FIELDS[field_name], special)
        project = tmp_path / str(i) / "p"
        project.mkdir(parents=True)
        (project / "model.onnx").write_bytes(MLP_MODEL)
        (project / "gpux.yml").write_text(text, encoding="utf-8")
        case = Case(text.encode(), ModelRecipe(raw="examples/mlp/model.onnx"), f"{field_name} = {special[:60]}")
        check_project(project, tally, case.reproducer, [str(project.parent.resolve()), str(project.parent)])
    assert not tally.failures, tally.report()


def test_model_matrix(no_engine, tmp_path):
    """Every hostile model recipe (raw bytes, opsets, IR versions, domains, names, element types,
    dimensions, external data locations x offsets/lengths, sparse initializers): exit 1 or 2, one
    line; when valid, the context carries every external data file."""
    tally = Tally()
    for i, recipe in enumerate(model_matrix()):
        yml = "name: m\nmodel:\n  source: ./model.onnx\n"
        case = Case(yml.encode(), recipe, "model")
        project = write_case(case, tmp_path / str(i))
        check_project(project, tally, case.reproducer, [str((tmp_path / str(i)).resolve()), str(tmp_path / str(i))])
    assert tally.cases > 250
    assert not tally.failures, tally.report()


def test_odd_paths(no_engine, tmp_path):
    """Links, loops and names too long for the file system, as model.source or as PATH: exit 1
    or 2, one line, no traceback."""
    tally = Tally()
    for name, target in odd_paths(tmp_path).items():
        case = Case(name.encode(), ModelRecipe(raw="examples/mlp/model.onnx"), name)
        check_project(target, tally, case.reproducer, [str(tmp_path.resolve()), str(tmp_path)])
    assert not tally.failures, tally.report()


def test_non_regular_files_and_bombs(no_engine, tmp_path):
    """Each in a child process (time and memory limits): exit 1 or 2, one line, in time."""
    cases = make_resource_cases(tmp_path)
    env = {**os.environ, "DOCKER_HOST": NO_ENGINE, "PYTHONPATH": str(ROOT)}
    code = "import sys; from gpux_pack.cli import main; main(sys.argv[1:])"
    def one(name: str, target: Path) -> str | None:
        began = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-c", code, "build", str(target), *CLI_ARGS], cwd=tmp_path,
                                  env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=CHILD_SECONDS,
                                  preexec_fn=resource_limits)
        except subprocess.TimeoutExpired:  # run() kills the child
            return f"{name}: no answer within {CHILD_SECONDS}s (hang)"
        stderr = proc.stderr.decode(errors="replace")
        result = CliResult(proc.returncode, proc.stdout.decode(errors="replace"), stderr, None)
        problems = cli_problems(result, [str(tmp_path)])
        if proc.returncode < 0:
            problems.append(Problem("killed", f"signal {-proc.returncode}"))
        if not problems:
            return None
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        kinds = ", ".join(dict.fromkeys(p.kind for p in problems))
        return f"{name}: exit {proc.returncode} ({kinds}) after {time.monotonic() - began:.1f}s: {last[:200]}"

    with ThreadPoolExecutor(max_workers=CHILD_PARALLEL) as pool:
        failures = [f for f in pool.map(lambda item: one(*item), cases.items()) if f]
    assert not failures, "\n".join(failures)
