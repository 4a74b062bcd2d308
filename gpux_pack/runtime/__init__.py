"""The in-image runtime. Copied into every image as the `gpux_runtime` package.

Nothing here may import the packager (gpux_pack.*): the image holds this folder alone, with
numpy, onnxruntime and uvicorn. Imports inside the folder are relative for that reason.
"""
