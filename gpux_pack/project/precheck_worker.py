"""`python -P -m gpux_pack.project.precheck_worker`: the second process of prechecks.py. Imports
onnx at once, then reads a model's path from standard input (all of it, to its end), checks the
model as graph.inspect_graph does and writes one JSON object: the fingerprint of the bytes it
read, and what it found or the problem it refused the model for. Anything else (an unreadable or
changing file) it leaves to the build, which checks the model itself."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.nice(10)  # the build's own process and the engine come first: this one only uses what they leave

import onnx  # noqa: E402, F401  (what this process is for: the import, ahead of the build's need)

from gpux_pack.errors import ModelError  # noqa: E402
from gpux_pack.project.graph import fingerprint, inspect_graph  # noqa: E402
from gpux_pack.project.skeleton import read_skeleton  # noqa: E402


def main() -> int:
    data = sys.stdin.buffer.read()
    if not data:
        return 1
    path = Path(os.fsdecode(data))
    try:
        skeleton = read_skeleton(path)
        said: dict = {"fingerprint": fingerprint(skeleton)}
        try:
            said["doc"] = inspect_graph(path, str(path), skeleton)
        except ModelError as e:
            said["problem"] = e.problem
    except Exception:  # the build's own read says what is wrong, once
        return 1
    sys.stdout.write(json.dumps(said))
    return 0


if __name__ == "__main__":
    sys.exit(main())
