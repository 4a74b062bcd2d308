"""The base image read on the host: its exported root filesystem, its facts, symlinks resolved
inside it, and the link check against it. Tests marked e2e use the Docker engine and the
offline base image (they fail without them); the others build a root from the host's own
libraries."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import onnxruntime
import pytest

from gpux_pack import engine
from gpux_pack.engine import rootfs
from gpux_pack.errors import DockerError, UsageError
from gpux_pack.providers import PROVIDERS
from gpux_pack import linkcheck
from gpux_pack.linkcheck import ElfInfo, Resolver, Tree
from gpux_pack.staging import cache_dir
from tests.conftest import BASE_IMAGE

WHEELS = cache_dir() / "wheels"  # the user's wheel cache, before any test points the cache elsewhere
ROLE = "io.gpux.pack.role"
SITE = "/opt/gpux/site-packages"
HOST_ARCH = os.uname().machine  # x86_64 | aarch64
DOCKER_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}[HOST_ARCH]
TRIPLET = linkcheck.TRIPLETS[HOST_ARCH]
HOST_GLIBC = tuple(int(p) for p in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
HOST_CAPI = Path(onnxruntime.__file__).parent / "capi"
SHARED = "libonnxruntime_providers_shared.so"  # needs libstdc++, libm, libgcc_s, libc (and the loader)
LOADER = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}[HOST_ARCH]


def host_lib(name: str) -> Path:
    for folder in (f"/lib/{TRIPLET}", f"/usr/lib/{TRIPLET}", "/lib64", "/usr/lib64"):
        if Path(folder, name).is_file():
            return Path(folder, name)
    pytest.fail(f"this host has no {name}")


def put(root: Path, image_path: str, source: Path | None = None, text: str | None = None) -> Path:
    path = root / image_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    if source is not None:
        shutil.copyfile(source, path)
    else:
        path.write_text(text or "")
    return path


def link(root: Path, image_path: str, target: str) -> None:
    path = root / image_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def missing(problems: list[str]) -> list[str]:
    """The sonames a check names as missing (who needs them depends on the host's libraries)."""
    out = []
    for line in problems:
        m = re.fullmatch(r"(\S+) \(needed by \S+\) is not in the image", line)
        assert m, line
        out.append(m.group(1))
    return out


def retarget(path: Path, machine: int) -> None:
    """Make a copied library claim another architecture (its ELF e_machine)."""
    data = bytearray(path.read_bytes())
    data[18:20] = machine.to_bytes(2, "little")
    path.write_bytes(bytes(data))


@pytest.fixture
def root(tmp_path) -> Path:
    """A merged-/usr root made of the host's libraries: /lib is an absolute symlink to /usr/lib,
    libc.so.6 lives only in a folder that the root's own ld.so.conf names."""
    r = tmp_path / "root"
    for name in ("libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", LOADER):
        put(r, f"/usr/lib/{TRIPLET}/{name}", host_lib(name))
    put(r, "/opt/weird/lib/libc.so.6", host_lib("libc.so.6"))
    link(r, "/lib", "/usr/lib")
    put(r, "/etc/ld.so.conf", text="include /etc/ld.so.conf.d/*.conf\n")
    put(r, "/etc/ld.so.conf.d/weird.conf", text="# where libc is\n/opt/weird/lib\n")
    put(r, "/usr/bin/python3.11")
    link(r, "/usr/bin/python3", "python3.11")
    return r


@pytest.fixture
def site(tmp_path) -> Path:
    """The installed packages that go to /opt/gpux/site-packages: onnxruntime's CPU provider
    library, copied from this host's onnxruntime."""
    s = tmp_path / "site"
    put(s, f"/onnxruntime/capi/{SHARED}", HOST_CAPI / SHARED)
    put(s, "/onnxruntime/__init__.py", text='__version__ = "1.31.1"\n')
    return s


# ---------------------------------------------------------------------------------------------
# facts and the chroot resolver, on a root made here


def test_facts_of_a_root(root):
    assert rootfs.facts(root, DOCKER_ARCH) == ("3.11", HOST_GLIBC, HOST_ARCH)


def test_python3_and_glibc_are_required(tmp_path, root):
    (root / "usr/bin/python3").unlink()
    with pytest.raises(UsageError, match=r"^img has no python3; use a base with Python 3\.11\+"):
        rootfs.facts(root, DOCKER_ARCH, image="img")
    assert rootfs.facts(root, DOCKER_ARCH, require_python=False)[0] is None
    musl = tmp_path / "musl"
    put(musl, "/lib/ld-musl-x86_64.so.1", host_lib("libc.so.6"))
    link(musl, "/usr/bin/python3", "python3.12")
    put(musl, "/usr/bin/python3.12")
    with pytest.raises(UsageError, match=r"^img has no glibc \(musl/Alpine\?\)"):
        rootfs.facts(musl, DOCKER_ARCH, image="img")
    with pytest.raises(UsageError, match="images can be built for amd64 and arm64"):
        rootfs.facts(root, "s390x", image="img")


def test_resolver_follows_absolute_symlinks_inside_the_root(root):
    libm = root / f"usr/lib/{TRIPLET}/libm.so.6"
    assert rootfs.resolve_in(root, f"/lib/{TRIPLET}/libm.so.6") == libm  # /lib -> /usr/lib, in root
    link(root, "/usr/local/lib/libm.so", f"/lib/{TRIPLET}/libm.so.6")  # absolute, through another one
    assert rootfs.resolve_in(root, "/usr/local/lib/libm.so") == libm
    link(root, "/usr/local/lib/rel.so", f"../../lib/{TRIPLET}/./libm.so.6")
    assert rootfs.resolve_in(root, "/usr/local/lib/rel.so") == libm
    assert rootfs.resolve_in(root, "/usr/bin/python3") == root / "usr/bin/python3.11"


def test_resolver_refuses_escapes_and_loops(root):
    assert Path("/etc/passwd").exists()  # on the host, never looked at
    link(root, "/usr/lib/passwd", "/etc/passwd")
    assert rootfs.resolve_in(root, "/usr/lib/passwd") is None
    link(root, "/usr/lib/up", "../../../../..")
    assert rootfs.resolve_in(root, "/usr/lib/up/etc/passwd") is None
    assert rootfs.resolve_in(root, "/../etc/passwd") is None
    link(root, "/usr/lib/a", "b")
    link(root, "/usr/lib/b", "/usr/lib/a")
    assert rootfs.resolve_in(root, "/usr/lib/a") is None
    assert rootfs.resolve_in(root, f"/usr/lib/{TRIPLET}/libm.so.6/x") is None  # a file is no folder
    assert rootfs.resolve_in(root, "/nope") is None


def test_link_check_reads_the_roots_ld_so_conf_and_symlinks(root, site):
    overlays = {SITE: site}
    tree = Tree(root, overlays)
    resolver = Resolver([], set(), tree, env=[], arch=HOST_ARCH)
    resolver.walk(Path(f"{SITE}/onnxruntime/capi/{SHARED}"))
    assert resolver.missing == []
    assert resolver.seen["libc.so.6"] == Path("/opt/weird/lib/libc.so.6")  # the root's ld.so.conf
    assert resolver.seen["libm.so.6"] == Path(f"/lib/{TRIPLET}/libm.so.6")  # via /lib -> /usr/lib
    assert tree.file(f"/lib/{TRIPLET}/libm.so.6") == root / f"usr/lib/{TRIPLET}/libm.so.6"
    lines = []
    assert linkcheck.check_tree("CPUExecutionProvider", [SHARED], [], [], [], root, overlays, SITE, HOST_ARCH,
                                log=lines.append) == []
    assert lines == ["link check: CPUExecutionProvider: 5 libraries resolve"]
    # the host has libc.so.6 in its own folders and /etc: the image does not, once its conf is gone
    (root / "etc/ld.so.conf.d/weird.conf").unlink()
    assert missing(linkcheck.check_tree("CPUExecutionProvider", [SHARED], [], [], [], root, overlays, SITE,
                                        HOST_ARCH)) == ["libc.so.6"]


def test_library_globs_are_relative_to_site_packages(root, site):
    """NVIDIA's wheels: libraries preloaded from site-packages/nvidia/*/lib count as found."""
    (site / "nvidia/cu13/lib").mkdir(parents=True)
    shutil.move(root / "opt/weird/lib/libc.so.6", site / "nvidia/cu13/lib/libc.so.6")
    args = ("CPUExecutionProvider", [SHARED], [], ["nvidia/*/lib"], [], root, {SITE: site}, SITE, HOST_ARCH)
    assert linkcheck.check_tree(*args) == []
    assert missing(linkcheck.check_tree(*args[:3], [], *args[4:])) == ["libc.so.6"]


def test_a_foreign_architecture_is_checked_by_elf_machine(tmp_path, root, site):
    """An arm64 root (libraries claiming aarch64) read on this host: facts and the link check
    follow the image's architecture, and an x86_64 library does not count as found."""
    other, machine = ("aarch64", 183) if HOST_ARCH == "x86_64" else ("x86_64", 62)
    arm = tmp_path / "arm"
    shutil.copytree(root, arm, symlinks=True)
    (arm / "etc/ld.so.conf.d/weird.conf").unlink()
    os.rename(arm / f"usr/lib/{TRIPLET}", arm / f"usr/lib/{linkcheck.TRIPLETS[other]}")
    shutil.move(arm / "opt/weird/lib/libc.so.6", arm / f"usr/lib/{linkcheck.TRIPLETS[other]}/libc.so.6")
    for lib in (arm / f"usr/lib/{linkcheck.TRIPLETS[other]}").iterdir():
        retarget(lib, machine)
    other_docker = {"x86_64": "amd64", "aarch64": "arm64"}[other]
    assert rootfs.facts(arm, other_docker) == ("3.11", HOST_GLIBC, other)
    with pytest.raises(UsageError, match=f"says it is {DOCKER_ARCH} but its libc.so.6 is built for {other}"):
        rootfs.facts(arm, DOCKER_ARCH)

    def check() -> list[str]:
        return linkcheck.check_tree("CPUExecutionProvider", [SHARED], [], [], [], arm, {SITE: site}, SITE, other)

    assert check() == [f"{SHARED} is built for {HOST_ARCH}, but the image is {other}"]
    retarget(site / f"onnxruntime/capi/{SHARED}", machine)
    assert check() == []
    retarget(arm / f"usr/lib/{linkcheck.TRIPLETS[other]}/libm.so.6", 62 if machine == 183 else 183)
    assert missing(check()) == ["libm.so.6"]


def test_command_line_with_a_root(root, site, capsys):
    argv = ["--provider", "CPUExecutionProvider", "--lib", SHARED, "--root", str(root), "--overlay",
            f"{SITE}={site}", "--site", SITE, "--arch", HOST_ARCH]
    assert linkcheck.main(argv) == 0
    assert "CPUExecutionProvider: 5 libraries resolve" in capsys.readouterr().out
    (root / "etc/ld.so.conf").unlink()
    assert linkcheck.main([*argv, "--hint", "fix it"]) == 1
    assert re.fullmatch(r"link check failed: CPUExecutionProvider cannot load: libc\.so\.6 \(needed by \S+\) is not "
                        r"in the image; fix it", capsys.readouterr().err.splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# the export filter


def _tar(*members: tuple[str, str, str | bytes]) -> io.BytesIO:
    """(kind, name, content or link target) -> a tar archive, in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            data = b""
            if kind == "file":
                data = value if isinstance(value, bytes) else value.encode()
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, str(value)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, str(value)
            elif kind == "chr":
                info.type = tarfile.CHRTYPE
            tar.addfile(info, io.BytesIO(data) if data else None)
    buf.seek(0)
    return buf


def test_extract_writes_nothing_outside_and_never_follows_links(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    archive = _tar(
        ("file", "../evil.so", "x"),
        ("file", "/abs.so", "x"),
        ("file", "usr/lib/ok.so.1", "ok"),
        ("hardlink", "usr/lib/ok.so", "usr/lib/ok.so.1"),
        ("file", "usr/share/doc/readme", "not kept"),
        ("symlink", "usr/lib/out", "/"),
        ("file", "usr/lib/out/tmp/through-a-symlink.so", "x"),
        ("symlink", "lib", "usr/lib"),
        ("file", "lib/under-a-symlink.so", "x"),
        ("hardlink", "usr/lib/shadow.so", "etc/shadow"),
        ("hardlink", "usr/lib/up.so", "../outside.so"),
        ("chr", "usr/lib/device.so", ""),
        ("file", "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n"),
        ("file", "etc/ld.so.conf.d/x.conf", "/opt/x/lib\n"),
        ("file", "usr/bin/python3.11", b"\x7fELF" + b"\0" * 100),
        ("symlink", "usr/bin/python3", "python3.11"),
        ("dir", "usr/lib/python3.11", ""),
        ("file", "usr/lib/python3.11/os.py", "not kept"),
    )
    with tarfile.open(fileobj=archive, mode="r|") as tar:
        counts = rootfs.extract(tar, dest)
    assert not (tmp_path / "evil.so").exists() and not Path("/abs.so").exists()
    assert not Path("/tmp/through-a-symlink.so").exists()
    assert counts["refused"] == 6
    kept = sorted(os.path.relpath(os.path.join(d, n), dest) for d, dirs, files in os.walk(dest) for n in dirs + files)
    assert kept == ["etc", "etc/ld.so.conf", "etc/ld.so.conf.d", "etc/ld.so.conf.d/x.conf", "lib", "usr", "usr/bin",
                    "usr/bin/python3", "usr/bin/python3.11", "usr/lib", "usr/lib/ok.so", "usr/lib/ok.so.1",
                    "usr/lib/out", "usr/lib/python3.11"]
    assert os.readlink(dest / "usr/lib/out") == "/" and os.readlink(dest / "lib") == "usr/lib"
    assert (dest / "usr/lib/ok.so").read_text() == "ok"
    assert os.path.samefile(dest / "usr/lib/ok.so", dest / "usr/lib/ok.so.1")
    assert (dest / "usr/bin/python3.11").stat().st_size == 0  # its name is what counts


def test_compact_keeps_what_the_link_check_reads(tmp_path):
    big = next(HOST_CAPI.glob("libonnxruntime.so.*"))
    assert big.stat().st_size > rootfs.COMPACT_ABOVE
    copy = tmp_path / big.name
    shutil.copyfile(big, copy)
    kept = rootfs.compact(copy)
    assert copy.stat().st_size == big.stat().st_size  # same size, holes instead of code
    assert kept < 1 << 20 and copy.stat().st_blocks * 512 < 2 << 20
    before, after = ElfInfo(big), ElfInfo(copy, origin=str(big.parent))
    assert (after.machine, after.needed, after.rpath, after.runpath) == (before.machine, before.needed, before.rpath,
                                                                         before.runpath)
    text = tmp_path / "libtext.so"
    text.write_text("INPUT(-lfoo)\n" * 10)
    assert rootfs.compact(text) == text.stat().st_size and text.read_text().startswith("INPUT")


def test_library_path_from_the_image_config():
    attrs = {"Config": {"Env": ["PATH=/usr/bin", "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64:"]}}
    assert rootfs.library_path(attrs) == ["/usr/local/nvidia/lib", "/usr/local/nvidia/lib64"]
    assert rootfs.library_path({"Config": {"Env": None}}) == []


# ---------------------------------------------------------------------------------------------
# with the engine


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache of this test's own, so the export really happens."""
    monkeypatch.setenv("GPUX_PACK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _ours(client) -> set[str]:
    return {c.id for c in client.containers.list(all=True, filters={"label": ROLE})}


class _Spy:
    """The engine, with container creation swapped."""

    def __init__(self, client, create):
        self.images = client.images
        self.containers = SimpleNamespace(create=create)


@pytest.mark.e2e
def test_export_of_the_debian_base(docker_client, cache):
    before = _ours(docker_client)
    created = []

    def create(*args, **kwargs):
        container = docker_client.containers.create(*args, **kwargs)
        created.append((container.id, kwargs))
        return container

    started = time.monotonic()
    root = rootfs.export(_Spy(docker_client, create), BASE_IMAGE)
    seconds = time.monotonic() - started
    image = docker_client.images.get(BASE_IMAGE)
    assert root == cache / "rootfs" / f"{image.id.replace(':', '-')}-{rootfs.FORMAT}"
    assert rootfs.os_packages(root) and rootfs.os_release(root).get("ID") == "debian"  # what the SBOM reads
    assert len(created) == 1 and created[0][1]["labels"] == engine.container_labels("export")
    assert created[0][1]["labels"][ROLE] == "export"
    assert created[0][1]["entrypoint"] == ["/nonexistent"] and created[0][1]["network_disabled"] is True
    assert _ours(docker_client) <= before  # removed
    assert rootfs.facts(root, image.attrs["Architecture"], BASE_IMAGE) == ("3.11", (2, 36), "x86_64")
    assert (root / "etc/ld.so.conf").is_file() and not (root / "usr/bin/bash").exists()
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"export of {BASE_IMAGE}: {seconds:.2f} s, {size / 1e6:.1f} MB")
    assert size < 100e6
    assert not list(root.parent.glob(".*.tmp"))

    def refuse(*args, **kwargs):
        raise AssertionError("a cached root was exported again")

    assert rootfs.export(_Spy(docker_client, refuse), BASE_IMAGE) == root


def _entries(folder):
    """What a folder holds but the entries' lock files (kept: removing one would let two in)."""
    return [p for p in folder.iterdir() if not p.name.endswith(".lock")]


@pytest.mark.e2e
def test_an_interrupted_export_leaves_nothing(docker_client, cache):
    before = _ours(docker_client)
    made = []

    def create(*args, **kwargs):
        container = docker_client.containers.create(*args, **kwargs)
        made.append(container)

        def export(chunk_size):
            stream = container.export(chunk_size=chunk_size)
            yield next(stream)
            raise KeyboardInterrupt  # Ctrl-C in the middle of the stream

        return SimpleNamespace(export=export, remove=container.remove)

    with pytest.raises(KeyboardInterrupt):
        rootfs.export(_Spy(docker_client, create), BASE_IMAGE)
    assert made and _ours(docker_client) <= before
    assert _entries(cache / "rootfs") == []  # neither a tree nor a half of one (the lock file stays)


@pytest.mark.e2e
def test_a_killed_builds_export_container_is_removed_by_the_next_export_and_by_prune(docker_client, cache):
    """A build killed while it exported its base left a Created container that blocked `docker rmi`
    of the base for good; the next export removes it (and `cache prune`), never a live build's."""
    import socket

    from gpux_pack.commands import cache as cache_command

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    owner = {"gone": f"{socket.gethostname()}:{dead.stdout.strip()}", "live": f"{socket.gethostname()}:{os.getpid()}"}
    made = {k: docker_client.containers.create(BASE_IMAGE, entrypoint=["/nonexistent"], network_disabled=True,
                                               labels={ROLE: "export", engine.OWNER_LABEL: v})
            for k, v in owner.items()}
    try:
        rootfs.export(engine.connect(), BASE_IMAGE)
        left = _ours(docker_client)
        assert made["gone"].id not in left and made["live"].id in left
        made["gone"] = docker_client.containers.create(BASE_IMAGE, entrypoint=["/nonexistent"], network_disabled=True,
                                                       labels={ROLE: "export", engine.OWNER_LABEL: owner["gone"]})
        cache_command.prune(30 * 86400)
        left = _ours(docker_client)
        assert made["gone"].id not in left and made["live"].id in left
    finally:
        for container in made.values():
            engine.remove_container(container)


@pytest.mark.e2e
def test_engine_errors_are_one_line(docker_client, cache):
    with pytest.raises(DockerError, match=r"^base image gpux-test/no-such-image:0 is not present; ") as err:
        rootfs.export(engine.connect(), "gpux-test/no-such-image:0")
    assert "\n" not in str(err.value)

    def create(*args, **kwargs):
        container = docker_client.containers.create(*args, **kwargs)

        def export(chunk_size):
            yield b"this is no tar archive" * 100

        return SimpleNamespace(export=export, remove=container.remove)

    before = _ours(docker_client)
    with pytest.raises(DockerError, match=f"^cannot export base image {BASE_IMAGE}: ") as err:
        rootfs.export(_Spy(docker_client, create), BASE_IMAGE)
    assert "\n" not in str(err.value) and _ours(docker_client) <= before


def _build(client, context: Path, tag: str, platform: str | None = None):
    image, _ = client.images.build(path=str(context), tag=tag, rm=True, forcerm=True, platform=platform)
    return image


@pytest.mark.e2e
def test_a_scratch_image_has_no_python3(docker_client, tags, cache, tmp_path):
    put(tmp_path / "ctx", "/hello.txt", text="hello\n")
    put(tmp_path / "ctx", "/Dockerfile", text="FROM scratch\nCOPY hello.txt /hello.txt\n")
    tag = tags("scratch:one-file")
    image = _build(docker_client, tmp_path / "ctx", tag)
    root = rootfs.export(engine.connect(), tag)
    assert not [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]  # nothing the checks read
    with pytest.raises(UsageError, match=f"^{tag} has no python3; use a base with Python 3.11"):
        rootfs.facts(root, image.attrs["Architecture"], tag)


@pytest.mark.e2e
def test_a_foreign_architecture_base_is_read_without_running_it(docker_client, tags, cache, tmp_path, root):
    """An arm64 image on this host: created, exported and read, never started."""
    other, machine = ("aarch64", 183) if HOST_ARCH == "x86_64" else ("x86_64", 62)
    ctx = tmp_path / "ctx"
    shutil.copytree(root, ctx / "root", symlinks=True)
    (ctx / "root/etc/ld.so.conf.d/weird.conf").unlink()
    libdir = ctx / f"root/usr/lib/{linkcheck.TRIPLETS[other]}"
    os.rename(ctx / f"root/usr/lib/{TRIPLET}", libdir)
    shutil.move(ctx / "root/opt/weird/lib/libc.so.6", libdir / "libc.so.6")
    for lib in libdir.iterdir():
        retarget(lib, machine)
    put(ctx, "/Dockerfile", text="FROM scratch\nCOPY root/ /\n")
    platform = {"aarch64": "linux/arm64", "x86_64": "linux/amd64"}[other]
    tag = tags(f"foreign:{other}")
    image = _build(docker_client, ctx, tag, platform=platform)
    assert image.attrs["Architecture"] == platform.split("/")[1]
    before = _ours(docker_client)
    exported = rootfs.export(engine.connect(), tag)
    assert _ours(docker_client) <= before
    assert rootfs.facts(exported, image.attrs["Architecture"], tag) == ("3.11", HOST_GLIBC, other)


# ---------------------------------------------------------------------------------------------
# the link check on the host, with onnxruntime's real wheels, against the exported Debian base


def _wheel(pattern: str, requirement: str) -> Path:
    found = sorted(WHEELS.glob(pattern))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", requirement,
                        "-d", str(WHEELS)], check=True, capture_output=True)
        found = sorted(WHEELS.glob(pattern))
    assert found, f"no {pattern} in {WHEELS}"
    return found[-1]


def _site_from(wheel: Path, dest: Path) -> Path:
    """Only what the check reads: onnxruntime/capi/*.so and the version in __init__.py."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if (name.startswith("onnxruntime/capi/") and name.endswith(".so")) or name == "onnxruntime/__init__.py":
                z.extract(name, dest)
    return dest


@pytest.fixture(scope="module")
def debian_root(docker_client, tmp_path_factory) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUX_PACK_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        return rootfs.export(engine.connect(), BASE_IMAGE)


def _check(provider_name: str, root: Path, site: Path, log=None) -> list[str]:
    p = PROVIDERS[provider_name]
    return linkcheck.check_tree(p.execution_providers[0], list(p.libraries), list(p.dlopen), list(p.library_dirs),
                                list(p.driver_libs), root, {SITE: site}, SITE, "x86_64", log=log)


@pytest.mark.e2e
def test_host_link_check_names_cublas_for_the_cuda_wheel(debian_root, tmp_path):
    if HOST_ARCH != "x86_64":
        pytest.fail("the onnxruntime-gpu wheel is x86_64 only")
    site = _site_from(_wheel("onnxruntime_gpu-1.31.1-*x86_64.whl", "onnxruntime-gpu==1.31.1"), tmp_path / "site")
    started = time.monotonic()
    problems = _check("cuda", debian_root, site)
    assert time.monotonic() - started < 10
    assert problems[0] == "libcublasLt.so.13 (needed by libonnxruntime_providers_cuda.so) is not in the image"
    assert "libcudnn.so.9 (needed by CUDAExecutionProvider at run time) is not in the image" in problems
    assert linkcheck.failure("CUDAExecutionProvider", problems, PROVIDERS["cuda"].link_hint).startswith(
        "link check failed: CUDAExecutionProvider cannot load: libcublasLt.so.13 (needed by "
        "libonnxruntime_providers_cuda.so) is not in the image (and 4 more); take CUDA and cuDNN"
    )


@pytest.mark.e2e
def test_host_link_check_passes_for_the_cpu_wheel(debian_root, tmp_path):
    cpu = PROVIDERS["cpu"]
    site = _site_from(_wheel(f"onnxruntime-{cpu.version}-*x86_64.whl", cpu.pip_requirement), tmp_path / "site")
    lines = []
    assert _check("cpu", debian_root, site, lines.append) == []
    assert lines and lines[0].startswith("link check: CPUExecutionProvider: ") and "libraries resolve" in lines[0]


@pytest.mark.e2e
def test_concurrent_exports_share_one_complete_tree(docker_client, cache):
    """Two builds exporting the same base at once: each sees a whole tree, the same one."""
    from concurrent.futures import ThreadPoolExecutor

    key = f"{docker_client.images.get(BASE_IMAGE).id.replace(':', '-')}-{rootfs.FORMAT}"
    stale = cache / "rootfs" / f".{key}.999999999.x.tmp"
    stale.mkdir(parents=True)  # left by a build that was killed
    before = _ours(docker_client)
    with ThreadPoolExecutor(2) as pool:
        roots = list(pool.map(lambda _: rootfs.export(engine.connect(), BASE_IMAGE), range(2)))
    assert roots[0] == roots[1] and (roots[0] / "etc/ld.so.conf").is_file()
    assert [p.name for p in _entries(cache / "rootfs")] == [roots[0].name]  # no temporary trees left
    assert _ours(docker_client) <= before
