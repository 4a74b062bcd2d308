"""Layer tars written on the host must be the bytes the Docker engine writes for the same
files: then an assembled image has the diff ids of a plain `docker build`. The end-to-end
tests compare with the engine itself; these pin the format without one."""

import tarfile
import io

import pytest

from gpux_pack.image import assembler, layer_tar
from gpux_pack.image.layer_tar import Member, Unsupported
from gpux_pack.image.layout import Layer

PROBE = Layer("probe", "/")

# The diff id Docker 20.10.24's classic builder gave `FROM scratch` + `COPY probe/ /` of
# assembler.probe_context() (the engine check builds exactly that).
ENGINE_DIFF_ID = "sha256:ddadb28832ed1148556fd5108513e94a2707d841cefdf48116036629e521cab8"


def test_probe_layer_is_byte_for_byte_the_engines():
    layer = assembler.layer_of(assembler.probe_context(), PROBE, b"root")
    assert layer.diff_id == ENGINE_DIFF_ID
    # newer engines leave the owner name empty: another diff id, found by the engine check
    assert assembler.layer_of(assembler.probe_context(), PROBE, b"").diff_id != ENGINE_DIFF_ID


def test_walk_order_is_by_path_component():
    names = [m.name for m in layer_tar.walk_order([Member("a-b", 0o644, 0, data=b""), Member("a", 0o755, 0),
                                                Member("a/b", 0o644, 0, data=b"")])]  # fmt: skip
    assert names == ["a", "a/b", "a-b"]  # plain string order would put a-b before a/b


def test_long_names_split_as_go_does():
    assert layer_tar._split("x" * 100) == (b"", b"x" * 100)
    # the prefix ends at the last '/' within 155 bytes, not the first that fits (Python's tarfile)
    name = "opt/" + "p" * 40 + "/" + "q" * 40 + "/" + "r" * 30
    assert layer_tar._split(name) == (("opt/" + "p" * 40 + "/" + "q" * 40).encode(), b"r" * 30)
    with pytest.raises(Unsupported, match="too long"):
        layer_tar._split("opt/" + "r" * 101)
    with pytest.raises(Unsupported, match="not ASCII"):
        layer_tar._split("opt/caf\u00e9.py")


def test_sizes_and_a_readable_tar():
    members = layer_tar.walk_order([
        Member("opt", 0o755, 315532800), Member("opt/x.so", 0o755, 315532800, data=b"\x7fELF" * 300),
        Member("opt/" + "d" * 80 + "/" + "f" * 60, 0o644, 315532800, data=b"hello"),
    ])  # fmt: skip
    data = b"".join(layer_tar.chunks(members, b"root"))
    assert len(data) == layer_tar.size_of(members) and len(data) % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        got = [(m.name, m.mode & 0o7777, m.uid, m.uname, m.mtime, m.size) for m in tar.getmembers()]
    assert got == [("opt", 0o755, 0, "root", 315532800, 0), ("opt/" + "d" * 80 + "/" + "f" * 60, 0o644, 0, "root",
                                                             315532800, 5), ("opt/x.so", 0o755, 0, "root", 315532800, 1200)]
