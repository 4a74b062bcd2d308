import hashlib

import pytest

from gpux_pack import wheels
from gpux_pack.runtime.contract import SITE
from gpux_pack.wheels import Lock, Pin, Target

UV_OUTPUT = """click==8.5.1 \\
    --hash=sha256:aaa \\
    --hash=sha256:bbb
onnxruntime-gpu==1.31.1 \\
    --hash=sha256:ccc
nvidia-cudnn-cu13==9.13.0.50 ; platform_machine == 'x86_64' \\
    --hash=sha256:ddd
pip==26.3 \\
    --hash=sha256:eee
"""


def test_parse_uv_lock():
    pins = wheels._parse_compiled(UV_OUTPUT)
    assert [(p.name, p.version) for p in pins] == [
        ("click", "8.5.1"), ("onnxruntime-gpu", "1.31.1"), ("nvidia-cudnn-cu13", "9.13.0.50"), ("pip", "26.3")]
    assert pins[0].hashes == {"aaa", "bbb"}


def _wheel(folder, filename, content: bytes) -> str:
    (folder / filename).write_bytes(content)
    return hashlib.sha256(content).hexdigest()


def test_cached_wheels_need_no_network(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUX_PACK_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "wheels"
    folder.mkdir()
    h_np = _wheel(folder, "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", b"np-x86")
    # same release, other architecture: right name and version, wrong platform
    h_arm = _wheel(folder, "numpy-2.4.6-cp311-cp311-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl", b"np-arm")
    target = Target("3.11", "x86_64", (2, 36))
    lock = Lock(target, ("numpy",), (Pin("numpy", "2.4.6", frozenset({h_np, h_arm})),))

    def no_network(*a, **k):
        raise AssertionError("pip was called although every wheel is cached")

    monkeypatch.setattr(wheels, "_pip_download", no_network)
    house = wheels.fetch(lock)
    assert [w.path.name for w in house.wheels] == ["numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"]
    assert house.lock_text().splitlines()[-1] == f"numpy==2.4.6 --hash=sha256:{h_np}"


def test_tampered_cache_is_not_trusted(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUX_PACK_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "wheels"
    folder.mkdir()
    _wheel(folder, "pip-26.3-py3-none-any.whl", b"evil")
    lock = Lock(Target("3.11", "x86_64", (2, 36)), (), (Pin("pip", "26.3", frozenset({"0" * 64})),))
    calls = []
    monkeypatch.setattr(wheels, "_pip_download", lambda pins, target, folder: calls.append(pins))
    with pytest.raises(wheels.WheelError, match="no wheel of pip==26.3 fits cp311"):
        wheels.fetch(lock)
    assert calls and calls[0][0].name == "pip"


@pytest.mark.network  # uv asks the package index
def test_resolve_failure_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUX_PACK_CACHE_DIR", str(tmp_path))
    with pytest.raises(wheels.WheelError, match="cannot resolve the image's wheels for cp311") as err:
        wheels.resolve(("onnxruntime==0.0.0.999",), Target("3.11", "x86_64", (2, 36)))
    assert "\n" not in str(err.value) and "onnxruntime" in str(err.value)


def test_bytecode_is_the_same_whichever_folder_it_was_compiled_in(tmp_path):
    """Installs are staged under a temporary name: the .pyc must name the image's path, not that
    one, or two installs of one lock give two packages layers (render + docker build != build)."""
    from gpux_pack import wheels

    made = []
    for name in (".key.123-abcd.tmp", ".key.456-ef01.tmp"):
        site = tmp_path / name / "site-packages" / "pkg"
        site.mkdir(parents=True)
        (site / "__init__.py").write_text("def f():\n    raise ValueError('x')\n")
        wheels._compile(site.parent)
        made.append(next(site.rglob("*.pyc")).read_bytes())
    assert made[0] == made[1] and SITE.encode() in made[0]


def test_an_install_keeps_no_fact_of_the_host(tmp_path):
    """direct_url.json (the wheel's path here) and uv_cache.json go, and RECORD forgets them."""
    from gpux_pack import wheels

    info = tmp_path / "demo-1.0.dist-info"
    info.mkdir()
    (info / "direct_url.json").write_text('{"url": "file:///home/someone/.cache/gpux-pack/wheels/demo.whl"}')
    (info / "uv_cache.json").write_text('{"timestamp": 1}')
    (info / "METADATA").write_text("Name: demo\n")
    (info / "RECORD").write_text("demo-1.0.dist-info/METADATA,sha256=x,10\ndemo-1.0.dist-info/direct_url.json,,\n"
                                 "demo-1.0.dist-info/uv_cache.json,,\ndemo/__init__.py,sha256=y,0\n"
                                 "bin/demo,sha256=z,300\ndemo-1.0.dist-info/RECORD,,\n")
    (tmp_path / "bin").mkdir()  # a console script: its first line names this host's interpreter
    (tmp_path / "bin" / "demo").write_text("#!/home/someone/.cache/gpux-pack/python\n")
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "__init__.py").write_text("")
    removed = wheels._trim(tmp_path)
    assert sorted(p for p in removed if "dist-info" in p) == ["demo-1.0.dist-info/direct_url.json",
                                                              "demo-1.0.dist-info/uv_cache.json"]
    assert sorted(p.name for p in info.iterdir()) == ["METADATA", "RECORD"]
    assert (info / "RECORD").read_text() == ("demo-1.0.dist-info/METADATA,sha256=x,10\ndemo/__init__.py,sha256=y,0\n"
                                             "demo-1.0.dist-info/RECORD,,\n")  # bin/ is trimmed: no line for it


def test_runtime_byte_code_does_not_depend_on_what_the_building_process_imported():
    """marshal's bytes depended on reference counts: this process (which imported the runtime and
    half of PyPI) and a bare one must compile the runtime to the same .pyc bytes."""
    import subprocess
    import sys

    import gpux_pack.runtime.server  # noqa: F401 (its constants now referenced here too)
    from gpux_pack.sources import runtime_files
    from gpux_pack.wheels import bytecode

    here = bytecode(runtime_files(), "/opt/gpux/runtime/gpux_runtime")
    script = ("import hashlib, json; from gpux_pack.sources import runtime_files; from gpux_pack.wheels import bytecode; "
              "print(json.dumps([(n, hashlib.sha256(d).hexdigest()) for n, d in "
              "bytecode(runtime_files(), '/opt/gpux/runtime/gpux_runtime')]))")
    bare = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    import hashlib
    import json

    assert json.loads(bare) == [[n, hashlib.sha256(d).hexdigest()] for n, d in here]


def test_an_interrupted_compile_leaves_none_of_its_processes_writing(tmp_path):
    """compileall's workers are the compiling Python's children: an interrupted build kills them
    too before it removes the folder they write into (test_concurrency's interrupted builds)."""
    import os
    import signal
    import threading

    from gpux_pack import wheels

    pid_file = tmp_path / "worker.pid"
    script = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
              "'import os, sys, time; open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(60)', "
              "sys.stdin.read()]).wait()")

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted

    def when_started():
        while not (pid_file.is_file() and pid_file.read_text()):
            threading.Event().wait(0.01)  # the worker has started: now interrupt the build
        os.kill(os.getpid(), signal.SIGUSR1)

    before = signal.signal(signal.SIGUSR1, interrupt)
    try:
        threading.Thread(target=when_started, daemon=True).start()
        with pytest.raises(Interrupted):
            wheels._fresh_python(script, str(pid_file))
    finally:
        signal.signal(signal.SIGUSR1, before)
    worker = int(pid_file.read_text())
    stat = tmp_path.joinpath("/proc", str(worker), "stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # gone, or a corpse
