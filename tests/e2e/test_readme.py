"""The README's and the docs' transcripts are what the images answer: each `curl -s
localhost:PORT/predict -d 'BODY'` followed by its answer (a console line, or a `# {...}`
comment) is sent to the example it names (port 8080: examples/mlp, 9000: examples/text-classifier)
and the answers compared, numbers to 1e-4 (another CPU's SIMD may move the last digits)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import serve

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
CURL = re.compile(r"^\$?\s*curl -s localhost:(\d+)/predict -d '(.+?)'")
FILES = ("README.md", "docs/preprocessing.md", "docs/runtime.md")


def transcripts() -> list[tuple[str, int, str, str]]:
    """(where, port, body, answer) of every /predict transcript with its answer."""
    found = []
    for name in FILES:
        lines = (ROOT / name).read_text().splitlines()
        for i, line in enumerate(lines[:-1]):
            m = CURL.match(line.strip())
            answer = lines[i + 1].strip().removeprefix("# ")
            if m and answer.startswith("{"):
                found.append((f"{name}:{i + 1}", int(m.group(1)), m.group(2), answer))
    return found


def _close(got, want, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (where, got, want)
        for k in want:
            _close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6), (where, got, want)
    else:
        assert got == want, (where, got, want)


def test_the_transcripts_are_what_the_examples_answer(mlp_image, text_image):
    found = transcripts()
    assert {port for _, port, _, _ in found} == {8080, 9000} and len(found) >= 3, found
    images = {8080: (mlp_image["tag"], 8080), 9000: (text_image["tag"], 9000)}
    for port in (8080, 9000):
        tag, served_port = images[port]
        with serve(tag, port=served_port) as server:
            for where, _, body, answer in (t for t in found if t[1] == port):
                got = server.post("/predict", data=body.encode(), headers={"Content-Type": "application/json"})
                assert got.status_code == 200, (where, got.text)
                _close(got.json(), json.loads(answer), where)
