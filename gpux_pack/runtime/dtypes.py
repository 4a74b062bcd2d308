"""Tensor element types, shared by the packager and the image's runtime. Pure data (no numpy/onnx import) so the packager reads it without the runtime's libraries.
"""

from __future__ import annotations

# canonical name: (numpy dtype name, KServe v2 datatype, ONNX TensorProto enum value)
# bfloat16: numpy has none, so it is carried as its uint16 bit patterns (2 bytes, little-endian,
# as KServe v2 binary data and gRPC raw contents hold it) and handed to ONNX Runtime as bfloat16.
# JSON cannot carry it: binary data and gRPC raw contents only (BINARY_ONLY).
DTYPES: dict[str, tuple[str, str, int]] = {
    "float32": ("float32", "FP32", 1),
    "uint8": ("uint8", "UINT8", 2),
    "int8": ("int8", "INT8", 3),
    "uint16": ("uint16", "UINT16", 4),
    "int16": ("int16", "INT16", 5),
    "int32": ("int32", "INT32", 6),
    "int64": ("int64", "INT64", 7),
    "string": ("object", "BYTES", 8),
    "bool": ("bool", "BOOL", 9),
    "float16": ("float16", "FP16", 10),
    "float64": ("float64", "FP64", 11),
    "uint32": ("uint32", "UINT32", 12),
    "uint64": ("uint64", "UINT64", 13),
    "bfloat16": ("uint16", "BF16", 16),
}

# Types a request or an answer carries only as binary data (a uint16 in JSON would be bits, not a number).
BINARY_ONLY: frozenset[str] = frozenset({"bfloat16"})

# What people write in gpux.yml besides the canonical names (GPUX, numpy, KServe and ONNX spellings).
ALIASES: dict[str, str] = {
    "float": "float32", "fp32": "float32", "tensor(float)": "float32",
    "double": "float64", "fp64": "float64", "tensor(double)": "float64",
    "half": "float16", "fp16": "float16", "tensor(float16)": "float16",
    "bf16": "bfloat16", "tensor(bfloat16)": "bfloat16",
    "long": "int64", "tensor(int64)": "int64", "tensor(int32)": "int32",
    "str": "string", "bytes": "string", "tensor(string)": "string",
    "boolean": "bool", "tensor(bool)": "bool", "tensor(uint8)": "uint8", "tensor(int8)": "int8",
}

ONNX_TO_NAME: dict[int, str] = {onnx_type: name for name, (_, _, onnx_type) in DTYPES.items()}
V2_TO_NAME: dict[str, str] = {v2: name for name, (_, v2, _) in DTYPES.items()}


def canonical(name: str) -> str | None:
    """The canonical dtype for a spelling, or None when it is not a tensor type we serve."""
    key = str(name).strip().lower()
    if key in DTYPES:
        return key
    if key in ALIASES:
        return ALIASES[key]
    return V2_TO_NAME.get(str(name).strip().upper())
