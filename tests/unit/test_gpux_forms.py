"""Every gpux.yml form GPUX publishes (its examples, README and docs; tests/data/gpux_forms) loads
and plans against a model made to match it: what gpux-pack does not act on is one warning each
naming the key, and --strict refuses the same file naming it."""

from __future__ import annotations

import pytest

from gpux_pack import providers
from gpux_pack.pipeline import build
from gpux_pack.errors import ConfigError
from gpux_pack.plan import Options, gpux_json
from tests.locks import with_lock
from gpux_pack.project.config import model_name
from gpux_pack.ui import Reporter
from gpux_pack.wheels import Lock, Pin
from tests.gpux_forms import BUILDABLE, FORMS, MANIFEST, REFUSED, project


def _plan(folder, strict=False):
    loaded = build.load(folder, strict=strict)
    cfg = loaded.project.config
    decision = providers.decide([], list(cfg.pack.providers), cfg.runtime.gpu.backend, None)
    plan = build.plan_for(loaded, decision.providers[0], decision.reason, Options(), None, Reporter(quiet=True),
                          pull=False)
    plan = with_lock(plan, Lock(plan.target, plan.requirements, (Pin(plan.provider.ort, plan.provider.version,
                                                                     frozenset({"0" * 64})),)))
    return loaded, plan


@pytest.mark.parametrize("entry", BUILDABLE, ids=[e["file"][:-4] for e in BUILDABLE])
def test_every_published_form_plans_and_names_what_it_leaves_out(entry, tmp_path, monkeypatch):
    for key, value in entry["env"].items():
        monkeypatch.setenv(key, value)
    folder = project(entry, tmp_path / "p")
    monkeypatch.chdir(folder)
    loaded, plan = _plan(folder)
    spec = gpux_json(plan).to_json()
    assert spec["name"] == model_name(loaded.project.config.name) and spec["serving"]["host"] in ("0.0.0.0", "::")
    declared = {i["name"] for i in entry["inputs"]}
    raw = {step["input"] for step in (spec["preprocessing"] or {}).values() if step}  # text or images, preprocessed
    assert {i["name"] for i in spec["inputs"]} - raw <= declared
    for key in entry["ignored_keys"]:
        assert any(f": {key}: " in note for note in plan.notes), (key, plan.notes)
    if entry["ignored_keys"]:
        with pytest.raises(ConfigError) as err:
            _plan(folder, strict=True)
        assert err.value.field in entry["ignored_keys"], str(err.value)


def test_a_memory_size_without_a_unit_is_bytes_and_a_small_one_is_a_note(tmp_path, monkeypatch):
    """GPUX's tutorial writes `memory: 4096  # Bytes`; its docs also show `memory: 2` (form 36)."""
    [entry] = [e for e in BUILDABLE if e["file"].startswith("36-")]
    folder = project(entry, tmp_path / "p")
    monkeypatch.chdir(folder)
    loaded, plan = _plan(folder)
    assert loaded.project.config.runtime.gpu.memory == 2
    assert any("runtime.gpu.memory: 2 bytes" in note and "2GB" in note for note in plan.notes), plan.notes


@pytest.mark.parametrize("entry", [e for e in MANIFEST if e["file"] in REFUSED], ids=lambda e: e["file"][:-4])
def test_what_gpux_refuses_too_is_one_line_naming_the_field(entry, tmp_path):
    (tmp_path / "gpux.yml").write_text((FORMS / entry["file"]).read_text())
    with pytest.raises(ConfigError) as err:
        build.load(tmp_path)
    assert err.value.field == REFUSED[entry["file"]] and "\n" not in str(err.value), str(err.value)
