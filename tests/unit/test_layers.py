"""Layer tars written on the host must be the bytes the Docker engine writes for the same
files: then an assembled image has the diff ids of a plain `docker build`. The end-to-end
tests compare with the engine itself; these pin the format without one."""

import tarfile
import io

import pytest

from gpux_pack import assemble
from gpux_pack import layers as tars
from gpux_pack.layers import Member, Unsupported

# The diff id Docker 20.10.24's classic builder gave `FROM scratch` + `COPY probe/ /` of
# assemble.probe_context() (the engine check builds exactly that).
ENGINE_DIFF_ID = "sha256:ddadb28832ed1148556fd5108513e94a2707d841cefdf48116036629e521cab8"


def test_probe_layer_is_byte_for_byte_the_engines():
    layer = assemble.layer(assemble.probe_context(), "probe", "", b"root")
    assert layer.diff_id == ENGINE_DIFF_ID
    # newer engines leave the owner name empty: another diff id, found by the engine check
    assert assemble.layer(assemble.probe_context(), "probe", "", b"").diff_id != ENGINE_DIFF_ID


def test_walk_order_is_by_path_component():
    names = [m.name for m in tars.walk_order([Member("a-b", 0o644, 0, data=b""), Member("a", 0o755, 0),
                                                Member("a/b", 0o644, 0, data=b"")])]  # fmt: skip
    assert names == ["a", "a/b", "a-b"]  # plain string order would put a-b before a/b


def test_long_names_split_as_go_does():
    assert tars._split("x" * 100) == (b"", b"x" * 100)
    # the prefix ends at the last '/' within 155 bytes, not the first that fits (Python's tarfile)
    name = "opt/" + "p" * 40 + "/" + "q" * 40 + "/" + "r" * 30
    assert tars._split(name) == (("opt/" + "p" * 40 + "/" + "q" * 40).encode(), b"r" * 30)
    with pytest.raises(Unsupported, match="too long"):
        tars._split("opt/" + "r" * 101)
    with pytest.raises(Unsupported, match="not ASCII"):
        tars._split("opt/caf\u00e9.py")


def test_sizes_and_a_readable_tar():
    members = tars.walk_order([
        Member("opt", 0o755, 315532800), Member("opt/x.so", 0o755, 315532800, data=b"\x7fELF" * 300),
        Member("opt/" + "d" * 80 + "/" + "f" * 60, 0o644, 315532800, data=b"hello"),
    ])  # fmt: skip
    data = b"".join(tars.chunks(members, b"root"))
    assert len(data) == tars.size_of(members) and len(data) % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        got = [(m.name, m.mode & 0o7777, m.uid, m.uname, m.mtime, m.size) for m in tar.getmembers()]
    assert got == [("opt", 0o755, 0, "root", 315532800, 0), ("opt/" + "d" * 80 + "/" + "f" * 60, 0o644, 0, "root",
                                                             315532800, 5), ("opt/x.so", 0o755, 0, "root", 315532800, 1200)]
