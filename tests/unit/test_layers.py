"""Layer tars written on the host must be the bytes the Docker engine writes for the same
files: then an assembled image has the diff ids of a plain `docker build`. The end-to-end
tests compare with the engine itself; these pin the format without one."""

import io
import json
import tarfile

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
                                                Member("a/b", 0o644, 0, data=b"")])]
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
    ])
    data = b"".join(layer_tar.chunks(members, b"root"))
    assert len(data) == layer_tar.size_of(members) and len(data) % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        got = [(m.name, m.mode & 0o7777, m.uid, m.uname, m.mtime, m.size) for m in tar.getmembers()]
    assert got == [("opt", 0o755, 0, "root", 315532800, 0), ("opt/" + "d" * 80 + "/" + "f" * 60, 0o644, 0, "root",
                                                             315532800, 5), ("opt/x.so", 0o755, 0, "root", 315532800, 1200)]


def test_a_parents_history_keeps_one_entry_per_layer_even_of_size_0():
    """`docker history` gives a layer of folders only (the runtime base's `ADD cache.tar /`)
    size 0, as it does an entry that adds no layer: the layer count decides (issue 18)."""
    history = [  # docker history of a runtime base image made by the builder, oldest first
        {"CreatedBy": "", "Size": 155_000_000},  # imported
        {"CreatedBy": '/bin/sh -c #(nop)  CMD ["python3"]', "Size": 0},
        {"CreatedBy": "/bin/sh -c #(nop)  ENV PYTHONPATH=/opt/gpux/site-packages", "Size": 0},
        {"CreatedBy": "/bin/sh -c #(nop) COPY dir:0a1b in / ", "Size": 101_000_000},
        {"CreatedBy": "/bin/sh -c #(nop) COPY dir:2c3d in / ", "Size": 185_000},
        {"CreatedBy": "/bin/sh -c #(nop) ADD file:4e5f in / ", "Size": 0},
        {"CreatedBy": "/bin/sh -c #(nop)  USER 10001:10001", "Size": 0},
        {"CreatedBy": "/bin/sh -c #(nop)  WORKDIR /tmp", "Size": 0},
    ]
    assert assembler.adds_layer(history, 4) == [True, False, False, True, True, True, False, False]
    assert assembler.adds_layer(history, 5) == [True, False, False, True, True, True, False, True]
    # assembled: our own lines, BuildKit's, a RUN that only made folders
    ours = [{"CreatedBy": "ENV A=1", "Size": 0}, {"CreatedBy": "RUN /bin/sh -c mkdir /x", "Size": 0},
            {"CreatedBy": f"{assembler.ASSEMBLED}ADD cache.tar /", "Size": 0},
            {"CreatedBy": f"{assembler.ASSEMBLED}USER 10001:10001", "Size": 0}]
    assert assembler.adds_layer(ours, 1) == [False, False, True, False]
    assert assembler.adds_layer(ours, 2) == [False, True, True, False]
    image = assembler.Image(tag=None, parent={"RootFS": {"Layers": ["sha256:a"] * 4}},
                            parent_history=list(reversed(history)), layers=[], config={}, history=[],
                            created="2026-01-01T00:00:00Z")
    written = json.loads(image.config_json())["history"]
    assert sum(not h.get("empty_layer") for h in written) == 4
    assert [h["created_by"] for h in written if not h.get("empty_layer")][-1].startswith("/bin/sh -c #(nop) ADD")


def test_losing_the_engine_mid_load_says_so_and_a_refusal_says_refused():
    """An engine gone while `docker load` read the archive was reported as "the engine refused the
    assembled image"; what the user must do differs (start the engine, not fix the image)."""
    from types import SimpleNamespace

    from gpux_pack.engine.interface import EngineError, EngineGone
    from gpux_pack.errors import DockerError, PackError
    from gpux_pack.image.archive import Loadable

    def client(error: Exception) -> SimpleNamespace:
        def load_image(data, quiet):
            next(iter(data))  # the engine read a little of the archive, then this
            raise error
        return SimpleNamespace(api=SimpleNamespace(load_image=load_image))

    image = Loadable("gpux-test/x:1", b"{}", [], [], 0)
    for error, words in ((EngineGone("Connection aborted."), "lost the Docker engine while loading"),
                         (BrokenPipeError(32, "Broken pipe"), "lost the Docker engine while loading"),
                         (EngineError("500 Server Error: invalid tar header", 500), "refused the assembled image")):
        with pytest.raises(DockerError, match=words) as err:
            assembler.load(client(error), [image])
        assert "\n" not in str(err.value)
    with pytest.raises(PackError, match="cannot read the assembled image's files") as err:  # this host's, not the engine
        assembler.load(client(FileNotFoundError(2, "No such file or directory")), [image])
    assert not isinstance(err.value, DockerError)
