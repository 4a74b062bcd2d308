"""engine/local.py, the standard library's engine client, and sdk.py's wrapper of the SDK's:
against a stand-in engine on a unix socket (the request body sent in chunks, events split
anywhere, the engine's refusals worded as the SDK words them), and, marked e2e, against the real
engine beside the SDK's answers: images, inspect, history, info, `docker load` of an archive
written here. And a build's modules with connect() import neither the Docker SDK nor requests."""

from __future__ import annotations

import hashlib
import io
import json
import socketserver
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from gpux_pack import engine
from gpux_pack.engine import interface, local, sdk
from gpux_pack.errors import DockerError, PackError
from gpux_pack.image import assembler
from gpux_pack.image.archive import Loadable
from tests.conftest import BASE_IMAGE, ROOT, RUN_ID


# ---------------------------------------------------------------------------------------------
# against a stand-in engine: what goes over the socket


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding") != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = b""
        while True:
            size = int(self.rfile.readline().strip(), 16)
            chunk = self.rfile.read(size + 2)[:size]
            self.server.chunks.append(size)
            if not size:
                return data
            data += chunk

    def _answer(self, status: int, body: bytes, pieces: list[bytes] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if pieces is None:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in pieces:
            self.wfile.write(b"%X\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        if self.path == "/v1.41/images/gpux-test/m:1/json":
            self._answer(200, json.dumps({"Id": "sha256:" + "a" * 64, "RepoTags": ["gpux-test/m:1", "<none>:<none>"]})
                         .encode())
        elif self.path == "/v1.41/info":
            self._answer(500, b'{"message":"engine busy"}')
        else:
            self._answer(404, b'{"message":"No such image: gpux-test/none:1"}')

    def do_POST(self) -> None:
        self.server.paths.append(self.path)
        self.server.bodies.append(self._body())
        text = '{"stream":"Loaded image: gpux-test/m:1 \u00e9\\n"}\r\n{"stream":"done"}'.encode()
        at = text.index("\u00e9".encode()) + 1  # inside the two bytes of é
        self._answer(200, b"", [text[:5], text[5:at], text[at:at + 1], text[at + 1:]])


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str):
        super().__init__(path, _Handler)
        self.paths: list[str] = []
        self.bodies: list[bytes] = []
        self.chunks: list[int] = []


@pytest.fixture
def stand_in(tmp_path):
    server = _Server(str(tmp_path / "engine.sock"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, local.LocalEngine(str(tmp_path / "engine.sock"), "1.41")
    server.shutdown()
    server.server_close()


def test_images_and_refusals_are_worded_as_the_sdk_words_them(stand_in):
    server, client = stand_in
    image = client.images.get("gpux-test/m:1")
    assert image.id == "sha256:" + "a" * 64 and image.tags == ["gpux-test/m:1"]
    with pytest.raises(interface.ImageNotFound) as err:
        client.images.get("gpux-test/none:1")
    assert str(err.value) == ("404 Client Error for http+docker://localhost/v1.41/images/gpux-test/none:1/json: "
                              'Not Found ("No such image: gpux-test/none:1")')
    assert (err.value.status_code, err.value.explanation) == (404, "No such image: gpux-test/none:1")
    with pytest.raises(interface.EngineError) as failed:
        client.info()
    assert not isinstance(failed.value, interface.ImageNotFound)
    assert str(failed.value) == ('500 Server Error for http+docker://localhost/v1.41/info: Internal Server Error '
                                 '("engine busy")')
    assert engine.image_exists(client, "gpux-test/m:1") and not engine.image_exists(client, "gpux-test/none:1")
    with pytest.raises(DockerError, match=r"^docker info failed: 500 Server Error"):
        engine.host_info(client)


def test_a_load_streams_the_body_in_chunks_and_decodes_events_split_anywhere(stand_in):
    server, client = stand_in
    pieces = [b"h" * 512, b"", b"x" * 100, b"L" * (local.SMALL + 1), b"t" * 10]
    events = list(client.api.load_image(iter(pieces), quiet=True))
    assert events == [{"stream": "Loaded image: gpux-test/m:1 \u00e9\n"}, {"stream": "done"}]
    assert server.paths == ["/v1.41/images/load?quiet=1"]
    assert server.bodies == [b"".join(pieces)]
    assert server.chunks == [612, local.SMALL + 1, 10, 0]  # small pieces gathered, a large one on its own
    assert list(client.api.load_image(b"whole", quiet=False))[-1] == {"stream": "done"}  # bytes, as the SDK takes
    assert server.bodies[-1] == b"whole" and server.paths[-1] == "/v1.41/images/load?quiet=0"


def test_a_failure_reading_the_body_is_that_failure_and_no_engine_means_gone(stand_in, tmp_path):
    _, client = stand_in

    def body():
        yield b"x" * 1000
        raise FileNotFoundError(2, "No such file or directory", "model.onnx")

    image = Loadable("gpux-test/m:1", b"{}", [], [])
    with pytest.raises(FileNotFoundError):
        list(client.api.load_image(body(), quiet=True))
    with pytest.raises(PackError, match="^cannot read the assembled image's files: No such file or directory$"):
        assembler.load(_Loading(client, body()), [image])
    gone = local.LocalEngine(str(tmp_path / "none.sock"), "1.41")
    with pytest.raises(interface.EngineGone) as err:
        gone.version()
    assert isinstance(err.value, ConnectionError) and engine.short_error(err.value) == "no such file or directory"
    with pytest.raises(DockerError, match=r"^lost the Docker engine while loading the assembled image \(\[Errno 2\]"):
        assembler.load(gone, [image])


class _Loading:
    """A client whose load sends this body instead of the archive."""

    def __init__(self, client: local.LocalEngine, body):
        self.client, self.body = client, body
        self.api = self

    def load_image(self, data, *, quiet=None):
        return self.client.api.load_image(self.body, quiet=quiet)


def test_connect_outside_a_local_socket_takes_the_sdk_and_says_why_it_cannot(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    with pytest.raises(DockerError, match=r"^cannot reach the Docker engine at tcp://127.0.0.1:1 \(connection refused\); "
                                          "start Docker, or set DOCKER_HOST$"):
        engine.connect()


# ---------------------------------------------------------------------------------------------
# a build imports neither the Docker SDK nor requests


@pytest.mark.e2e
def test_a_builds_modules_and_connect_import_no_docker_sdk():
    code = ("import sys\n"
            "import gpux_pack.commands.build, gpux_pack.pipeline.build\n"
            "from gpux_pack import engine\n"
            "client = engine.connect()\n"
            f"client.images.get({BASE_IMAGE!r}); client.version(); client.info()\n"
            "print(type(client).__name__, sorted(m for m in sys.modules\n"
            "      if m.split('.')[0] in ('docker', 'requests', 'urllib3', 'charset_normalizer')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["LocalEngine", "[]"]


# ---------------------------------------------------------------------------------------------
# against the real engine, beside the SDK


@pytest.fixture
def client():
    connected = engine.connect()
    assert isinstance(connected, local.LocalEngine)
    return connected


@pytest.mark.e2e
def test_images_inspect_and_history_as_the_sdk_reads_them(client, docker_client):
    ours, theirs = client.images.get(BASE_IMAGE), docker_client.images.get(BASE_IMAGE)
    assert (ours.id, ours.tags, ours.attrs) == (theirs.id, theirs.tags, theirs.attrs)
    assert client.api.inspect_image(ours.id) == docker_client.api.inspect_image(ours.id)
    assert client.api.history(BASE_IMAGE) == docker_client.api.history(BASE_IMAGE)
    absent = f"gpux-test-{RUN_ID}/absent:1"
    with pytest.raises(interface.ImageNotFound) as err:
        client.images.get(absent)
    with pytest.raises(Exception) as sdk_err:
        docker_client.images.get(absent)
    assert str(err.value) == str(sdk_err.value) and err.value.status_code == 404
    with pytest.raises(interface.ImageNotFound):
        client.api.history(absent)


@pytest.mark.e2e
def test_info_version_ping_and_containers(client, docker_client):
    assert client.ping() is True
    assert client.version()["ApiVersion"] == docker_client.version()["ApiVersion"]
    assert client.info()["ID"] == docker_client.info()["ID"]
    assert {c["Id"] for c in client.api.containers(all=True)} >= {c["Id"] for c in docker_client.api.containers()}
    assert engine.host_info(client) == engine.host_info(sdk.SdkEngine(docker_client))


def _archive(tag: str) -> tuple[bytes, str]:
    """A docker-save archive of one image of one layer (a text file), written with tarfile: its
    bytes and the image id."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        data = f"{tag}\n".encode()
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mtime = len(data), 1700000000
        tar.addfile(info, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(layer.getvalue()).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "created": "2024-01-01T00:00:00Z",
                         "config": {"Labels": {"io.gpux.test": RUN_ID}},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                         "history": [{"created": "2024-01-01T00:00:00Z", "created_by": "ADD hello.txt /"}]}).encode()
    image_id = hashlib.sha256(config).hexdigest()
    files = {f"{image_id}.json": config, "layer/layer.tar": layer.getvalue(),
             "manifest.json": json.dumps([{"Config": f"{image_id}.json", "RepoTags": [tag],
                                           "Layers": ["layer/layer.tar"]}]).encode()}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue(), f"sha256:{image_id}"


@pytest.mark.e2e
def test_a_load_tag_list_and_remove(client, docker_client):
    tag = f"gpux-test-{RUN_ID}/local-load:1"
    archive, image_id = _archive(tag)
    try:
        events = list(client.api.load_image(iter([archive[:700], archive[700:]])))
        assert events == [{"stream": f"Loaded image: {tag}\n"}]
        image = client.images.get(tag)
        assert image.id == image_id == docker_client.images.get(tag).id
        assert image.attrs["Config"]["Labels"] == {"io.gpux.test": RUN_ID}
        assert image.tag(f"gpux-test-{RUN_ID}/local-load", "2") is True
        listed = client.images.list(filters={"reference": f"gpux-test-{RUN_ID}/local-load*"})
        assert [sorted(i.tags) for i in listed] == [[tag, f"gpux-test-{RUN_ID}/local-load:2"]]
        assert engine.last_tagged(listed[0].attrs) > 0  # the listed images are inspected: LastTagTime
        client.images.remove(f"gpux-test-{RUN_ID}/local-load:2")
        assert client.images.get(tag).tags == [tag]
        bad = [b"this is no tar archive" * 100]  # refused in the stream, as the SDK reads it
        refused = list(client.api.load_image(iter(bad), quiet=True))
        assert refused == list(docker_client.api.load_image(iter(bad), quiet=True))
        assert "invalid tar header" in refused[-1]["error"]
    finally:
        client.images.remove(tag, force=True)
    with pytest.raises(interface.ImageNotFound):
        client.images.get(image_id)
    with pytest.raises(interface.ImageNotFound):
        client.images.remove(tag)


@pytest.mark.e2e
def test_the_sdk_wrapper_raises_the_same_errors(monkeypatch):
    """Outside a local socket (here: a Docker context named) connect() gives the SDK, wrapped: the
    same error types and words come out of the same calls."""
    monkeypatch.setenv("DOCKER_CONTEXT", "default")
    wrapped = engine.connect()
    assert isinstance(wrapped, sdk.SdkEngine)
    absent = f"gpux-test-{RUN_ID}/absent:1"
    with pytest.raises(interface.ImageNotFound) as err:
        wrapped.images.get(absent)
    assert str(err.value).startswith("404 Client Error for http+docker://localhost/") and err.value.status_code == 404
    with pytest.raises(interface.ImageNotFound):
        wrapped.api.inspect_image(absent)
    assert not engine.image_exists(wrapped, absent) and engine.image_exists(wrapped, BASE_IMAGE)
    assert BASE_IMAGE in wrapped.images.get(BASE_IMAGE).tags
