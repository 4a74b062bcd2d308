"""gpux-pack: an ONNX model plus its gpux.yml -> a production container image."""

__version__ = "0.1.0"
