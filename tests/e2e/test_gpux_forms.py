"""GPUX's own published gpux.yml files build into images that serve GPUX's answers: every form in
tests/data/gpux_forms (GPUX's examples, README and docs: `timeout: 5s`, unknown keys, `type:
image`, a name with spaces, `serving: null`, ${VAR}s, a loopback serving.host, fixed [1, N]
shapes, other OSes' backends ...), each with a model made to match it, built with the cpu
provider (the backend each names is planned in tests/unit/test_gpux_forms.py) and served
read-only: /health, /info, and /predict with its declared inputs, one object and an array."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.conftest import build_image, serve
from tests.gpux_forms import BUILDABLE, project

_NUMPY = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "string": object,
          "bool": np.bool_, "uint8": np.uint8}
MAX_ANSWER = 1 << 20  # elements: a form declaring more (llm-chat's 2048 x 32000 logits) is checked up to /info


def _request(entry: dict) -> dict:
    out = {}
    for spec in entry["inputs"]:
        shape = [d if isinstance(d, int) else 1 for d in spec["shape"]]
        value = np.full(shape, "good" if spec["type"] == "string" else 1, dtype=_NUMPY[spec["type"]])
        out[spec["name"]] = value.tolist()
    return out


@pytest.mark.parametrize("entry", BUILDABLE, ids=[e["file"][:-4] for e in BUILDABLE])
def test_published_gpux_forms_build_and_serve_gpux_answers(entry, tmp_path, tags, docker_client):
    folder = project(entry, tmp_path / "p")
    image = build_image(folder, tags(f"form-{entry['file'][:2]}:cpu"), "--provider", "cpu",
                        env={"MODEL_PATH": ".", **entry["env"]})
    for key in entry["ignored_keys"]:
        assert any(f": {key}: " in note for note in image["notes"]), (key, image["notes"])
    port = int(docker_client.images.get(image["tag"]).labels["io.gpux.port"])  # serving.port, any host
    with serve(image["tag"], port=port, read_only=True, tmpfs={"/tmp": ""}) as server:
        health = server.get("/health").json()
        assert health["status"] == "healthy" and health["model"], health
        info = server.get("/info").json()
        assert {"name", "version", "format", "size_mb", "size_bytes", "path", "inputs", "outputs"} <= set(info)
        if sum(math.prod(d if isinstance(d, int) else 1 for d in o["shape"]) for o in entry["outputs"]) > MAX_ANSWER:
            return
        answer = server.post("/predict", json=_request(entry))
        assert answer.status_code == 200, answer.text
        # GPUX's labels beside an output that lists all of its labels (project/model.py checks the count)
        assert set(answer.json()) - {"labels", "predicted"} == {o["name"] for o in entry["outputs"]}, answer.text
        batch = server.post("/predict", json=[_request(entry), _request(entry)])
        assert batch.status_code == 200 and batch.json() == [answer.json()] * 2
        if all(i["type"] == "string" and i["shape"] == [1] for i in entry["inputs"]):  # GPUX's README request
            readme = server.post("/predict", json={i["name"]: "I love this product!" for i in entry["inputs"]})
            assert readme.status_code == 200 and set(readme.json()) == set(answer.json()), readme.text


def test_docs_render_in_a_headless_browser_from_a_read_only_container(mlp_image, tmp_path):
    """GPUX's /docs: Debian's chromium renders the page the image serves, read-only, from the image
    alone (the page loads nothing but /openapi.json from the same server)."""
    import subprocess

    with serve(mlp_image["tag"], read_only=True, tmpfs={"/tmp": ""}) as server:
        spec = server.get("/openapi.json").json()
        dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
                              "--dump-dom", server.url + "/docs"],
                             capture_output=True, text=True, timeout=120)
    assert 'data-loaded="yes"' in dom.stdout, (dom.stdout[-2000:], dom.stderr[-2000:])
    for path in spec["paths"]:
        assert f'data-path="{path}"' in dom.stdout, path
    assert "Try it" in dom.stdout and spec["info"]["title"] in dom.stdout
