"""The code's structure, checked: the layering contract (pyproject's [tool.importlinter]), no
import cycle (imports inside functions included), no module reaching into another's private
names, and one provider-table row being all it takes for a new provider."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import grimp
import pytest

from gpux_pack import providers

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpux_pack"


def test_the_layering_contract_holds():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "3 kept, 0 broken" in proc.stdout


def test_the_packager_runtime_contract_names_every_module():
    """The forbidden contract lists every runtime module but contract, and every packager module
    as a source: a new module on either side is named there, or this fails."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in contracts if c["type"] == "forbidden" and "runtime but its contract" in c["name"]]
    runtime = PACKAGE / "runtime"
    assert sorted(contract["forbidden_modules"]) == sorted(
        f"gpux_pack.runtime.{p.stem}" for p in runtime.glob("*.py") if p.stem not in ("__init__", "contract"))
    # the package's own module holds its docstring alone: nothing there to import
    assert [type(node) for node in ast.parse((runtime / "__init__.py").read_text()).body] == [ast.Expr]
    packager = {f"gpux_pack.{p.stem if p.suffix else p.name}" for p in PACKAGE.iterdir()
                if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").is_file())}
    assert sorted(contract["source_modules"]) == sorted(packager - {"gpux_pack.runtime"})


def test_no_import_cycle_not_even_inside_a_function():
    graph = grimp.build_graph("gpux_pack", cache_dir=None)
    modules = sorted(graph.modules)
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other == "gpux_pack":  # the package's face (__version__): imports nothing
                continue
            if state.get(other) == 1:
                cycles.append(path[path.index(other):] + [other])
            elif other not in state:
                visit(other)
        path.pop()
        state[module] = 2

    for module in modules:
        if module not in state:
            visit(module)
    assert not cycles, cycles


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_another_modules_private_names():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        here = _module_of(path)
        modules: set[str] = set()  # local names bound to gpux_pack modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and (node.module.startswith("gpux_pack") or node.level):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{here}: from {node.module} import {alias.name}")
                    modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                modules.update(a.asname or a.name for a in node.names if a.name.startswith("gpux_pack"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.append(f"{here}: {node.value.id}.{node.attr}")
    assert not found, found


def test_no_module_is_imported_under_another_name():
    """One name per concept: a module is called what it is (no `plan as planning`)."""
    aliased = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = getattr(node, "module", None) or ""
                for alias in node.names:
                    if alias.asname and (module.startswith("gpux_pack") or alias.name.startswith("gpux_pack")):
                        aliased.append(f"{_module_of(path)}: {alias.name} as {alias.asname}")
    assert not aliased, aliased


@pytest.fixture
def fake_provider(monkeypatch):
    """A new provider as one table row: an accelerator-backed EP that no ONNX Runtime has."""
    row = replace(providers.PROVIDERS["rocm"], name="fakeep", title="A fake accelerator",
                  execution_providers=("FakeepExecutionProvider", "CPUExecutionProvider"),
                  options={"FakeepExecutionProvider": {"device_id": "0"}})
    table = {**providers.PROVIDERS, "fakeep": row}
    monkeypatch.setattr(providers, "PROVIDERS", table)
    monkeypatch.setitem(providers.EP_NAMES, "fakeep", "FakeepExecutionProvider")
    return row


def test_one_table_row_is_a_new_provider(fake_provider, tmp_path):
    """providers, plan, the --provider help, the runtime's provider names and the device flags
    all follow the row."""
    from gpux_pack.pipeline.build import load, plan_for
    from gpux_pack.plan import Options
    from tests.locks import with_lock
    from gpux_pack.runtime.settings import Settings
    from gpux_pack.ui import Reporter
    from gpux_pack.wheels import Lock, Pin

    assert providers.parse_provider_list("fakeep,cpu") == ["fakeep", "cpu"]
    assert "fakeep" in providers.names_help()
    assert providers.devices_for(fake_provider) == providers.Devices(None, ("/dev/kfd", "/dev/dri"), ("video",))
    assert fake_provider.run_flags == "--device /dev/kfd --device /dev/dri --group-add video"
    host = providers.HostInfo(amd=True)
    assert host.can_run(fake_provider) == (True, "has an AMD GPU (/dev/kfd)")

    plan = plan_for(load(ROOT / "examples" / "mlp"), "fakeep", "test", Options(), None, Reporter(quiet=True),
                    pull=False)
    plan = with_lock(plan, Lock(plan.target, plan.requirements, (Pin("onnxruntime-rocm", "1.22.2.post3",
                                                                      frozenset({"0" * 64})),)))
    assert plan.tag.endswith("-fakeep") and plan.runtime_base.tag.startswith("gpux-pack/runtime-fakeep:")
    spec = plan.gpux_json.to_json()
    assert spec["execution_providers"][0] == ["FakeepExecutionProvider", {"device_id": "0"}]
    assert spec["provider_names"]["fakeep"] == "FakeepExecutionProvider"

    # the image's runtime takes the names from gpux.json: GPUX_PROVIDERS=fakeep works there
    config = tmp_path / "gpux.json"
    config.write_text(json.dumps(spec))
    settings = Settings.load({"GPUX_CONFIG": str(config), "GPUX_PROVIDERS": "fakeep"})
    assert [name for name, _ in settings.providers] == ["FakeepExecutionProvider", "CPUExecutionProvider"]

    from gpux_pack.cli import app
    from typer.testing import CliRunner

    listed = json.loads(CliRunner().invoke(app, ["providers", "--json"]).output)
    row = next(r for r in listed["providers"] if r["name"] == "fakeep")
    assert row["docker_run"] == fake_provider.run_flags and row["execution_providers"][0] == "FakeepExecutionProvider"


def test_help_strings_come_from_the_table():
    """--provider's help is read from the table when the CLI is imported (a fresh process)."""
    script = ("from dataclasses import replace\n"
              "from gpux_pack import providers\n"
              "providers.PROVIDERS['fakeep'] = replace(providers.PROVIDERS['cpu'], name='fakeep')\n"
              "from gpux_pack.cli import main\n"
              "main(['build', '--help'])\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    text = " ".join(proc.stdout.split())
    assert "auto, cpu, cuda, tensorrt, rocm, migraphx, openvino, fakeep" in text, proc.stdout + proc.stderr
