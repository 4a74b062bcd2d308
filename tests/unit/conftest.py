"""Fixtures the unit tests share: the example MLP and a tiny hand-written model, served in process."""

from __future__ import annotations

import pytest

from gpux_pack.runtime.server import App
from gpux_pack.runtime.session import Model
from tests.in_process import Client, settings, spec_dir, tiny_dir


@pytest.fixture
def mlp(tmp_path):
    model = Model.load(settings(spec_dir(tmp_path, "mlp")))
    app = App(model, "test")
    app.start_warmup()
    assert app.ready.wait(10)
    return Client(app)


@pytest.fixture
def tiny(tmp_path):
    app = App(Model.load(settings(tiny_dir(tmp_path))), "test")
    app.start_warmup()
    assert app.ready.wait(10)
    return Client(app)
