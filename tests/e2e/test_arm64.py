"""arm64 images built on this x86_64 host with no emulation at build time: wheels resolved and
installed for aarch64 on the host, the base image's facts and the link check read from its
files. onnxruntime's aarch64 build segfaults under Debian's qemu 7.2, so the image is checked
statically (architecture, no RUN, the ELF machine of every shared library) and numpy, which
works under qemu, is imported in it."""

import json
import os
import re
import struct
import tarfile

import pytest

from tests.conftest import BASE_IMAGE, EXAMPLES, copy_example, run_cli

pytestmark = pytest.mark.e2e

ARM64_BASE = os.environ.get("GPUX_TEST_ARM64_BASE_IMAGE", "gpux-pack/debian-python:bookworm-arm64")
EM_AARCH64 = 183


@pytest.fixture(scope="module")
def arm64_base(docker_client):
    try:
        image = docker_client.images.get(ARM64_BASE)
    except Exception:
        pytest.fail(f"arm64 base image {ARM64_BASE} is missing; run `bash scripts/dev test`")
    assert image.attrs["Architecture"] == "arm64"
    return ARM64_BASE


@pytest.fixture(scope="module")
def arm64_image(docker_client, tags, arm64_base):
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--platform", "linux/arm64", "--base-image", arm64_base,
                   "--tag", tags("mlp:arm64"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    image = json.loads(proc.stdout)["images"][0]
    assert image["platform"] == "linux/arm64"
    assert "resolving wheels for cp311 aarch64-manylinux_2_36" in proc.stderr
    return image


def _shared_libraries(docker_client, image: str):
    """(path, ELF machine) of every shared library in the image, from a created, never-started
    container's export."""
    container = docker_client.containers.create(image, entrypoint=["/nonexistent"])
    try:
        stream = container.export()
        with tarfile.open(fileobj=_Stream(stream), mode="r|") as tar:
            for member in tar:
                name = member.name.rsplit("/", 1)[-1]
                if member.isreg() and (name.endswith(".so") or ".so." in name):
                    head = tar.extractfile(member).read(20)
                    if head[:4] == b"\x7fELF":
                        yield member.name, struct.unpack_from("<H", head, 18)[0]
    finally:
        container.remove(force=True)


class _Stream:
    def __init__(self, chunks):
        self.chunks, self.buffer = iter(chunks), b""

    def read(self, n=-1):
        while n < 0 or len(self.buffer) < n:
            try:
                self.buffer += next(self.chunks)
            except StopIteration:
                break
        out, self.buffer = (self.buffer, b"") if n < 0 else (self.buffer[:n], self.buffer[n:])
        return out


def test_arm64_image_is_arm64_and_ran_nothing(arm64_image, docker_client, arm64_base):
    image = docker_client.images.get(arm64_image["tag"])
    runtime = docker_client.images.get(arm64_image["runtime_base"])
    assert image.attrs["Architecture"] == "arm64" and runtime.attrs["Architecture"] == "arm64"
    assert image.attrs["Config"]["Entrypoint"] == ["/usr/bin/python3", "-m", "gpux_runtime"]
    # every step above the base image ran nothing: assembled on the host (or, with the builder,
    # #(nop) instructions only); no RUN
    base_steps = len(docker_client.images.get(arm64_base).history())
    ours = [h["CreatedBy"] for h in image.history()][: -base_steps]
    assert arm64_image["assembled"] and len(ours) == 12, ours  # 9 runtime + 3 model lines (no WORKDIR; one ADD: app.tar)
    assert all(step.startswith("gpux-pack (assembled, nothing ran): ") for step in ours), ours
    assert not any("RUN" in step for step in ours)


def test_every_shared_library_is_aarch64(arm64_image, docker_client):
    libraries = list(_shared_libraries(docker_client, arm64_image["tag"]))
    ours = [name for name, _ in libraries if name.startswith("opt/gpux/site-packages/")]
    assert any("onnxruntime_pybind11_state" in name for name in ours), ours[:20]
    assert any("numpy" in name for name in ours)
    wrong = [(name, machine) for name, machine in libraries if machine != EM_AARCH64]
    assert not wrong, wrong[:10]


def test_numpy_imports_in_the_arm64_image_under_qemu(arm64_image, docker_client):
    probe = "import platform, numpy; print(platform.machine(), numpy.__version__, float(numpy.arange(4).sum()))"
    out = docker_client.containers.run(arm64_image["tag"], entrypoint=["python3", "-c", probe], remove=True,
                                       platform="linux/arm64", read_only=True)
    machine, version, total = out.decode().split()
    assert machine == "aarch64" and version.startswith("2.") and total == "6.0"


def test_render_for_arm64_writes_no_run(tmp_path, arm64_base):
    out = tmp_path / "ctx"
    proc = run_cli("render", str(EXAMPLES / "mlp"), "--provider", "cpu", "--platform", "linux/arm64",
                   "--base-image", arm64_base, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "link check: CPUExecutionProvider: " in proc.stderr  # on the host, over the arm64 base's files
    dockerfile = (out / "Dockerfile").read_text()
    assert "\nRUN " not in dockerfile and f"\nFROM {arm64_base}\n" in dockerfile
    with tarfile.open(out / "packages.tar") as packages:
        [pybind] = [m for m in packages if re.fullmatch(r"opt/gpux/site-packages/onnxruntime/capi/"
                                                        r"onnxruntime_pybind11_state[^/]*\.so", m.name)]
        head = packages.extractfile(pybind).read(20)  # type: ignore[union-attr]
    assert struct.unpack_from("<H", head, 18)[0] == EM_AARCH64


def test_link_check_fails_an_arm64_cuda_build_naming_cublas(tmp_path, tags, docker_client, arm64_base):
    project = copy_example("mlp", tmp_path)
    (project / "gpux.yml").write_text((project / "gpux.yml").read_text() + "pack:\n  nvidia_libs: base\n")
    tag = tags("linkcheck:arm64")
    proc = run_cli("build", str(project), "--provider", "cuda", "--platform", "linux/arm64",
                   "--base-image", arm64_base, "--tag", tag)
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("error: "))
    assert line.startswith("error: link check failed: CUDAExecutionProvider cannot load: libcublasLt.so.13"), line
    assert "Traceback" not in proc.stderr and "aarch64" in proc.stderr


def test_platform_and_base_image_must_agree(tmp_path):
    proc = run_cli("build", str(EXAMPLES / "mlp"), "--platform", "linux/arm64", "--base-image", BASE_IMAGE,
                   "--tag", "never:arm64")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --platform linux/arm64: base image {BASE_IMAGE} is for x86_64; "
        "give a base image of that platform with --base-image")
