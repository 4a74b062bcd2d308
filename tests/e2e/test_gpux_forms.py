"""GPUX's own published gpux.yml files build into images that serve GPUX's answers: a selection
of tests/data/gpux_forms covering what GPUX writes and gpux-pack once refused (`timeout: 5s`,
unknown keys, `type: image`, a name with spaces, `serving: null`, ${VAR}s, a loopback
serving.host, fixed [1, N] shapes). Every form is planned in tests/unit/test_gpux_forms.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import build_image, serve
from tests.gpux_forms import MANIFEST, project

CHOSEN = {
    "01-root-gpux-yml-timeout-5s.yml",  # GPUX's top-level example: timeout 5s, a string input
    "02-example-image-classification.yml",  # [1, 3, 224, 224] float32 over JSON
    "05-example-sentiment-analysis.yml",  # int64 token ids, preprocessing declared
    "15-tutorial-image-classifier.yml",  # serving.host 127.0.0.1, port 9000
    "21-schema-env-vars.yml",  # ${MODEL_PATH}, ${GPU_MEMORY:-2GB}, ${PORT:-8080}
    "91-synthetic-serving-null-name-spaces.yml",  # `serving: null`, a display name
    "92-synthetic-type-image-unknown-keys.yml",  # tags, serving.cors, type: image
}
FORMS = [e for e in MANIFEST if e["file"] in CHOSEN]
_NUMPY = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "string": object}


def _request(entry: dict) -> dict:
    out = {}
    for spec in entry["inputs"]:
        shape = [d if isinstance(d, int) else 1 for d in spec["shape"]]
        value = np.full(shape, "good" if spec["type"] == "string" else 1, dtype=_NUMPY[spec["type"]])
        out[spec["name"]] = value.tolist()
    return out


@pytest.mark.parametrize("entry", FORMS, ids=[e["file"][:-4] for e in FORMS])
def test_published_gpux_forms_build_and_serve_gpux_answers(entry, tmp_path, tags):
    folder = project(entry, tmp_path / "p")
    env = {"MODEL_PATH": ".", **entry["env"]}
    image = build_image(folder, tags(f"form-{entry['file'][:2]}:cpu"), "--provider", "cpu", env=env)
    for key in entry["ignored_keys"]:
        assert any(f": {key}: " in note for note in image["notes"]), (key, image["notes"])
    port = 9000 if entry["file"].startswith("15-") else 8080  # serving.port; the host is every interface
    with serve(image["tag"], port=port, read_only=True, tmpfs={"/tmp": ""}) as server:
        health = server.get("/health").json()
        assert health["status"] == "healthy" and health["model"], health
        info = server.get("/info").json()
        assert {"name", "version", "format", "size_mb", "size_bytes", "path", "inputs", "outputs"} <= set(info)
        answer = server.post("/predict", json=_request(entry))
        assert answer.status_code == 200, answer.text
        assert set(answer.json()) == {o["name"] for o in entry["outputs"]}, answer.text
        batch = server.post("/predict", json=[_request(entry), _request(entry)])
        assert batch.status_code == 200 and batch.json() == [answer.json()] * 2
