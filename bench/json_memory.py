"""What a JSON request body costs once decoded: orjson's Python objects (the runtime's ordinary
path) against the text-to-numpy path for large all-number arrays, as peak bytes per byte of
JSON (tracemalloc). The runtime charges JSON_FACTOR (tensors.py) from the worst line here.

    python bench/json_memory.py
"""

from __future__ import annotations

import tracemalloc

import orjson

from gpux_pack.runtime import tensors

SHAPES = {
    "float rows [5.1,3.5,1.4,0.2]": "[" + ",".join(["[5.1,3.5,1.4,0.2]"] * 200000) + "]",
    "floats 1e1": "[" + ",".join(["1e1"] * 800000) + "]",
    "ints 1": "[" + ",".join(["1"] * 1000000) + "]",
    "ints 123456": "[" + ",".join(["123456"] * 500000) + "]",
    "empty lists": "[" + ",".join(["[]"] * 800000) + "]",
    "one-element lists": "[" + ",".join(["[1]"] * 800000) + "]",
    "empty objects": "[" + ",".join(["{}"] * 800000) + "]",
    'objects {"a":1}': "[" + ",".join(['{"a":1}'] * 400000) + "]",
    'strings "a"': "[" + ",".join(['"a"'] * 800000) + "]",
    "true": "[" + ",".join(["true"] * 800000) + "]",
}


def peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    print(f"{'body':32s} {'bytes':>10s} {'orjson':>8s} {'from text':>10s}")
    for name, text in SHAPES.items():
        raw = text.encode()
        objects = peak(lambda: orjson.loads(raw)) / len(raw)
        numeric = ""
        if name.startswith(("float", "ints")):
            spec = tensors.ServedTensor("x", "float32", None)
            numeric = f"{peak(lambda: tensors.numeric_array(raw, 0, len(raw), spec)) / len(raw):9.1f}x"
        print(f"{name:32s} {len(raw):10d} {objects:7.1f}x {numeric:>10s}")
    print(f"charged for the ordinary path: JSON_FACTOR = {tensors.JSON_FACTOR}x")


if __name__ == "__main__":
    main()
