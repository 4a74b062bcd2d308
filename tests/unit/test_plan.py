"""The planner (gpux_pack/plan.py): every decision of a build, checked without Docker or network.

Plans come from the mlp example through `build.plan_for` with no engine (the table's base image
facts are assumed); locks are built by hand (no wheel resolution). Most tests run over every
provider row and the CUDA 12 flavour of the NVIDIA rows.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gpux_pack import __version__, providers
from gpux_pack.pipeline.build import load, plan_for
from gpux_pack.errors import UsageError
from gpux_pack.plan import (
    Options,
    RuntimeBase,
    assumed_base,
    check_base,
    choose_base,
    label_value,
    link_check_mode,
    plan_runtime_base,
    tensorrt_profiles,
    warmup_mode,
)
from gpux_pack.providers import DEVICES, BaseImage, Devices, HostInfo, devices_for
from gpux_pack.runtime import contract
from gpux_pack.ui import Reporter
from gpux_pack.wheels import Lock, Pin
from tests.locks import with_lock

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp"  # name iris-mlp, version 1.0.0, port 8080, input features [batch, 4]

# (provider name, CUDA flavour): every row, plus the CUDA 12 rows that replace cuda/tensorrt
ROWS = [pytest.param(n, "13", id=n) for n in providers.PROVIDERS] + [
    pytest.param(n, "12", id=f"{n}-cuda12") for n in providers.CUDA12
]
GPU_ROWS = [r for r in ROWS if providers.PROVIDERS[r.values[0]].device]
SETTINGS = ("auto", "always", "never")

# Written out here, not read from the table, so a wrong table entry fails a test.
EPS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
}
MEMORY_KEY = {  # provider -> EP -> the option runtime.gpu.memory sets
    "cpu": {},
    "cuda": {"CUDAExecutionProvider": "gpu_mem_limit"},
    "tensorrt": {"CUDAExecutionProvider": "gpu_mem_limit"},
    "rocm": {"ROCMExecutionProvider": "gpu_mem_limit"},
    "migraphx": {"MIGraphXExecutionProvider": "migraphx_mem_limit"},
    "openvino": {},
}
DEVICE_ID_EPS = {"CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider",
                 "MIGraphXExecutionProvider"}
RUN_FLAGS = {"nvidia": "--gpus all", "amd": "--device /dev/kfd --device /dev/dri --group-add video"}


def row(name: str, cuda: str = "13") -> providers.Provider:
    return providers.get(name, cuda=cuda)


def merge(into: dict, changes: dict) -> dict:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


@pytest.fixture
def make(tmp_path):
    """make(provider, cuda, config={...gpux.yml changes...}, **Options) -> Plan (no lock)."""
    count = itertools.count()

    def make(name: str, cuda: str = "13", config: dict | None = None, **options):
        changes = copy.deepcopy(config or {})
        if cuda != "13":
            merge(changes, {"pack": {"cuda": cuda}})
        path = MLP
        if changes:
            path = tmp_path / f"project{next(count)}"
            shutil.copytree(MLP, path)
            data = merge(yaml.safe_load((path / "gpux.yml").read_text()), changes)
            (path / "gpux.yml").write_text(yaml.safe_dump(data, sort_keys=False))
        return plan_for(load(path), name, "test", Options(**options), None, Reporter(quiet=True), pull=False)

    return make


def lock_for(plan, version: str | None = None, more: tuple[Pin, ...] = ()) -> Lock:
    """A lock as resolve() would return it, without the network."""
    pin = Pin(plan.provider.ort, version or plan.provider.version, frozenset({"0" * 64}))
    return Lock(plan.target, plan.requirements, (pin, *more))


def host_with(provider) -> HostInfo:
    """A host that has the provider's device (for a CPU provider: every device)."""
    if provider.device is None:
        return HostInfo(nvidia=True, amd=True, intel_gpu=True)
    return HostInfo(**{DEVICES[provider.device].host_field: True})


def host_without(provider) -> HostInfo:
    """A host with every device but the provider's."""
    flags = {"nvidia": True, "amd": True, "intel_gpu": True}
    if provider.device is not None:
        flags[DEVICES[provider.device].host_field] = False
    return HostInfo(**flags)


# ---------------------------------------------------------------------------------------------
# Tags


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_default_tag_is_name_version_provider(make, name, cuda):
    plan = make(name, cuda)
    assert plan.tag == f"iris-mlp:1.0.0-{name}"
    assert plan.index_tag is None


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_cli_tag_fills_placeholders(make, name, cuda):
    plan = make(name, cuda, tag="reg.example:5000/team/{name}:{version}-{provider}-x")
    assert plan.tag == f"reg.example:5000/team/iris-mlp:1.0.0-{name}-x"


def test_pack_tag_is_used_and_cli_tag_wins(make):
    assert make("cpu", config={"pack": {"tag": "team/{name}:v{version}"}}).tag == "team/iris-mlp:v1.0.0"
    assert make("cpu", config={"pack": {"tag": "team/{name}:v{version}"}}, tag="other:{provider}").tag == "other:cpu"


@pytest.mark.parametrize("tag", ["{nope}:1", "m:{0}", "m@sha256:" + "a" * 64])
def test_bad_cli_tag_is_a_usage_error(make, tag):
    """An unknown placeholder, or a digest (a tag names what is built), is refused."""
    with pytest.raises(UsageError, match="--tag"):
        make("cpu", tag=tag)


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_multi_platform_tags_each_platform_and_the_index(make, name, cuda):
    plan = make(name, cuda, platform="linux/amd64", multi_platform=True)
    assert plan.tag == f"iris-mlp:1.0.0-{name}-amd64"
    assert plan.index_tag == f"iris-mlp:1.0.0-{name}"
    assert plan.platform == "linux/amd64"


def test_multi_platform_arm64_with_a_cli_tag(make):
    plan = make("cpu", tag="reg.example:5000/m:{version}", platform="linux/arm64", multi_platform=True)
    assert (plan.tag, plan.index_tag) == ("reg.example:5000/m:1.0.0-arm64", "reg.example:5000/m:1.0.0")
    assert plan.base.arch == "aarch64" and plan.target.arch == "aarch64"


# ---------------------------------------------------------------------------------------------
# Warmup


def test_only_tensorrt_rows_bake_their_warmup():
    assert {n for n in providers.PROVIDERS if row(n).warmup_bakes} == {"tensorrt"}
    assert row("tensorrt", "12").warmup_bakes


@pytest.mark.parametrize(("name", "cuda"), ROWS)
@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("host", ["none", "with", "without"])
def test_warmup_mode(name, cuda, setting, host):
    """never -> none, always -> baked, auto -> baked only for TensorRT on a host with its GPU."""
    provider = row(name, cuda)
    info = {"none": None, "with": host_with(provider), "without": host_without(provider)}[host]
    has_device = host == "with" and provider.device is not None
    expected = {"never": "none", "always": "baked",
                "auto": "baked" if name == "tensorrt" and has_device else "at-start"}[setting]
    assert warmup_mode(setting, provider, info) == expected


@pytest.mark.parametrize(("name", "cuda"), ROWS)
@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("has_device", [True, False])
def test_plan_warmup_and_the_devices_a_baked_warmup_gets(make, name, cuda, setting, has_device):
    """A baked warmup's container gets the provider's devices only where the host has them."""
    provider = row(name, cuda)
    host = host_with(provider) if has_device else host_without(provider)
    plan = make(name, cuda, warmup=setting, host=host)
    assert plan.warmup == warmup_mode(setting, provider, host)
    if plan.warmup == "baked" and has_device and provider.device:
        assert plan.warm_devices == devices_for(provider) != Devices()
    else:
        assert plan.warm_devices == Devices()


def test_tensorrt_auto_bakes_on_an_nvidia_host_with_the_gpu(make):
    plan = make("tensorrt", host=HostInfo(nvidia=True))
    assert plan.warmup == "baked"
    assert plan.warm_devices == Devices(gpus="all")
    assert plan.labels["io.gpux.warmup"] == "baked"


def test_pack_warmup_applies_and_the_option_wins(make):
    assert make("cpu", config={"pack": {"warmup": "never"}}).warmup == "none"
    assert make("cpu", config={"pack": {"warmup": "never"}}, warmup="always").warmup == "baked"
    assert make("cpu").warmup == "at-start"


# ---------------------------------------------------------------------------------------------
# Link check and whether the runtime base Dockerfile runs anything


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_link_check_mode_of_default_bases(make, name, cuda):
    """MIGraphX's default base installs system packages, so its link check runs in the image."""
    provider = row(name, cuda)
    expected = "image" if name == "migraphx" else "host"
    assert link_check_mode(True, provider.bases["default"]) == expected
    assert link_check_mode(False, provider.bases["default"]) == "off"
    assert make(name, cuda).link_check == expected
    assert make(name, cuda, config={"pack": {"link_check": False}}).link_check == "off"


@pytest.mark.parametrize(("name", "cuda"), ROWS)
@pytest.mark.parametrize("link_check", [True, False])
def test_runs_nothing_exactly_without_apt_or_an_image_link_check(make, name, cuda, link_check):
    plan = make(name, cuda, config={"pack": {"link_check": link_check}})
    base = plan.runtime_base
    assert base.runs_nothing == (not base.apt_packages and base.link_check != "image")
    assert base.runs_nothing == (name != "migraphx")  # migraphx: apt migraphx even without the check


@pytest.mark.parametrize("cuda", ["13", "12"])
def test_cuda_vendor_base_installs_python3_so_it_runs_something(make, cuda):
    plan = make("cuda", cuda, base_image="vendor")
    assert plan.base.image.startswith("nvidia/cuda:") and not plan.base.has_python
    assert plan.runtime_base.apt_packages == ("python3",)
    assert plan.link_check == "host"  # python3 alone does not move the link check into the image
    assert not plan.runtime_base.runs_nothing
    assert plan.nvidia_libs == "base"


def test_migraphx_apt_packages():
    rb = plan_runtime_base(row("migraphx"), row("migraphx").bases["default"], None, True)
    assert rb.apt_packages == ("migraphx",)
    assert rb.link_check == "image" and not rb.runs_nothing


# ---------------------------------------------------------------------------------------------
# Base image checks


def refusals(provider) -> list[tuple[str, BaseImage, str | None, str]]:
    """(what, base image, platform, message pattern) the provider's base must be refused for."""
    base = replace(provider.bases["default"], image="example.org/base:probe")
    low, (first, last) = provider.min_glibc, provider.python
    above = f"3.{int(last.split('.')[1]) + 1}"
    out = [
        ("python 3.10", replace(base, python="3.10"), None, "Python 3.10.*3.11 or newer"),
        ("python above range", replace(base, python=above), None, f"Python {above}.*{first} to {last}"),
        ("old glibc", replace(base, glibc=(low[0], low[1] - 1)), None, f"glibc {low[0]}.{low[1] - 1}"),
        ("probed arch", replace(base, arch="aarch64", probed=True), "linux/amd64", "is for aarch64"),
    ]
    return [(what, b, platform, re.escape("example.org/base:probe") + ".*" + msg) for what, b, platform, msg in out]


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_check_base_accepts_the_default_base(name, cuda):
    provider = row(name, cuda)
    assert check_base(provider, provider.bases["default"], None) == "linux/amd64"
    for platform in provider.platforms:
        arch = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}[platform]
        probed = replace(provider.bases["default"], arch=arch, probed=True)
        assert check_base(provider, probed, platform) == platform


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_check_base_refusals_name_the_base_image(name, cuda):
    provider = row(name, cuda)
    for what, base, platform, pattern in refusals(provider):
        with pytest.raises(UsageError, match=pattern):
            check_base(provider, base, platform)


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_plan_runtime_base_applies_the_same_checks(name, cuda):
    provider = row(name, cuda)
    for what, base, platform, pattern in refusals(provider):
        with pytest.raises(UsageError, match=pattern):
            plan_runtime_base(provider, base, platform, True)


def test_rocm_wheels_exist_for_310_but_the_runtime_needs_311():
    provider = row("rocm")
    assert provider.python[0] == "3.10"
    with pytest.raises(UsageError, match="3.11 or newer"):
        check_base(provider, replace(provider.bases["default"], python="3.10"), None)


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_platform_not_offered_is_refused(name, cuda):
    provider = row(name, cuda)
    missing = [p for p in ("linux/amd64", "linux/arm64") if p not in provider.platforms]
    for platform in missing:
        with pytest.raises(UsageError, match=f"--platform {platform}: {name} images exist for"):
            check_base(provider, provider.bases["default"], platform)
        with pytest.raises(UsageError, match=f"--platform {platform}"):
            plan_runtime_base(provider, provider.bases["default"], platform, True)


def test_which_rows_offer_arm64():
    arm = {(n, c) for n, c in (r.values for r in ROWS) if "linux/arm64" in row(n, c).platforms}
    assert arm == {("cpu", "13"), ("cuda", "13")}
    with pytest.raises(UsageError, match="tensorrt images exist for linux/amd64"):
        check_base(row("tensorrt"), row("tensorrt").bases["default"], "linux/arm64")


def test_unprobed_base_takes_the_platform_asked_for_and_a_probed_one_its_own():
    cpu = row("cpu")
    assert check_base(cpu, cpu.bases["default"], "linux/arm64") == "linux/arm64"  # assumed, not known
    assert check_base(cpu, replace(cpu.bases["default"], arch="aarch64"), None) == "linux/arm64"


def test_make_plan_refuses_a_platform_not_offered(make):
    with pytest.raises(UsageError, match="tensorrt images exist"):
        make("tensorrt", platform="linux/arm64")


def test_plan_runtime_base_nvidia_libs_override():
    cuda = row("cuda")
    wheels = plan_runtime_base(cuda, cuda.bases["default"], None, True)
    base = plan_runtime_base(cuda, cuda.bases["default"], None, True, nvidia_libs="base")
    assert (wheels.nvidia_libs, base.nvidia_libs, base.base.nvidia_libs) == ("wheels", "base", "base")
    assert wheels.requirements[0] == f"onnxruntime-gpu[cuda,cudnn]=={cuda.version}"
    assert base.requirements[0] == f"onnxruntime-gpu=={cuda.version}"
    assert plan_runtime_base(cuda, cuda.bases["default"], None, False).link_check == "off"


def test_assumed_base_and_choose_base(make):
    cpu = row("cpu")
    assumed = assumed_base(BaseImage("python:3.13-slim", "3.11", (2, 36), probed=True), "linux/arm64")
    assert (assumed.python, assumed.arch, assumed.probed) == ("3.13", "aarch64", False)
    assert assumed_base(cpu.bases["default"], None, "3.12").python == "3.12"
    plan = make("cpu", config={"pack": {"base_image": {"cpu": "a/b:1", "*": "c/d:1"}}})
    project = plan.project
    assert choose_base(project, cpu, Options()).image == "a/b:1"
    assert choose_base(project, row("openvino"), Options()).image == "c/d:1"
    assert choose_base(project, cpu, Options(base_image="e/f:1")).image == "e/f:1"
    assert choose_base(make("cuda").project, row("cuda"), Options(base_image="vendor")).has_python is False


# ---------------------------------------------------------------------------------------------
# Locks, the runtime base image and its tag


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_runtime_base_tag_is_content_addressed(make, name, cuda):
    provider = row(name, cuda)
    first, second = make(name, cuda), make(name, cuda)
    tag = with_lock(first, lock_for(first)).runtime_base.tag
    assert re.fullmatch(rf"gpux-pack/runtime-{name}:{re.escape(provider.version)}-[0-9a-f]{{12}}", tag)
    assert with_lock(second, lock_for(second)).runtime_base.tag == tag  # same lock, same tag
    assert with_lock(first, lock_for(first, "9.9.9")).runtime_base.tag.startswith(f"gpux-pack/runtime-{name}:9.9.9-")
    numpy = Pin("numpy", "2.4.6", frozenset({"1" * 64}))
    assert with_lock(first, lock_for(first, more=(numpy,))).runtime_base.tag != tag
    # a runtime base planned on its own, with the same lock, is the one the model image builds on
    alone = plan_runtime_base(provider, provider.bases["default"], None, True)
    assert with_lock(alone, lock_for(first)).tag == tag
    off = plan_runtime_base(provider, provider.bases["default"], None, False)
    assert with_lock(off, lock_for(first)).tag != tag  # the link check's place is part of it


def test_runtime_base_tag_needs_a_lock(make):
    with pytest.raises(AssertionError, match="plan with a resolver"):
        make("cpu").runtime_base.tag


def test_a_plan_is_made_once_with_its_lock(make, tmp_path):
    """The resolver is asked once, with the plan's own requirements, target and excludes, and
    the plan is made with what it answers: nothing amends it later."""
    asked = []

    def resolve(requirements, target, excludes):
        asked.append((requirements, target, excludes))
        return Lock(target, requirements, (Pin("onnxruntime", "9.9.9", frozenset({"0" * 64})),))

    plan = plan_for(load(MLP), "cpu", "test", Options(), None, Reporter(quiet=True), pull=False, resolve=resolve)
    assert asked == [(plan.requirements, plan.target, plan.excludes)]
    assert plan.lock.pins[0].version == plan.ort_version == plan.gpux_json.onnxruntime == "9.9.9"
    rb = plan_runtime_base(row("cpu"), row("cpu").bases["default"], None, True, resolve=resolve)
    assert isinstance(rb, RuntimeBase) and rb.lock is not None and rb.tag == plan.runtime_base.tag
    assert asked[-1] == (rb.requirements, rb.target, ())


def test_runtime_base_present_means_only_the_model_is_made(make):
    from gpux_pack.pipeline.build import runtime_base_present
    from tests.fake_engine import FakeEngine

    plan = with_lock(make("cpu"), lock_for(make("cpu")))
    fake = FakeEngine()
    assert not runtime_base_present(fake, plan) and not runtime_base_present(None, plan)
    fake.add_image(plan.runtime_base.tag)
    assert runtime_base_present(fake, plan)


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_ort_version_unknown_before_the_lock_and_pinned_after(make, name, cuda):
    plan = make(name, cuda)
    assert plan.ort_version == "unknown"
    assert plan.labels["io.gpux.onnxruntime.version"] == "unknown"
    assert plan.gpux_json.onnxruntime == "unknown"
    assert plan.runtime_base.ort_version == row(name, cuda).version  # the table's, before the lock
    locked = with_lock(plan, lock_for(plan, "9.9.9"))
    assert locked.ort_version == locked.runtime_base.ort_version == "9.9.9"
    assert locked.labels["io.gpux.onnxruntime.version"] == "9.9.9"
    assert locked.gpux_json.onnxruntime == "9.9.9"


# ---------------------------------------------------------------------------------------------
# Requirements and ports


def test_requirements_grpc_and_pack_requirements(make):
    plain = make("cpu")
    assert plain.ports == (8080,)
    assert not any(r.startswith("grpcio") for r in plain.requirements)
    plan = make("cpu", config={"serving": {"grpc_port": 8081}, "pack": {"requirements": ["scipy>=1.0"]}})
    assert plan.ports == (8080, 8081)
    assert plan.requirements[0] == f"onnxruntime=={row('cpu').version}"
    assert {"grpcio>=1.60", "protobuf>=4.25"} <= set(plan.requirements)
    assert plan.requirements[-1] == "scipy>=1.0"


@pytest.mark.parametrize("cuda", ["13", "12"])
def test_nvidia_libs_follow_the_base_unless_pack_says(make, cuda):
    version = row("cuda", cuda).version
    assert make("cuda", cuda).requirements[0] == f"onnxruntime-gpu[cuda,cudnn]=={version}"
    plan = make("cuda", cuda, config={"pack": {"nvidia_libs": "base"}})
    assert plan.nvidia_libs == "base" and plan.requirements[0] == f"onnxruntime-gpu=={version}"
    assert make("tensorrt", cuda).nvidia_libs == "base"  # NVIDIA's TensorRT container brings them


# ---------------------------------------------------------------------------------------------
# Labels


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_model_labels(make, name, cuda):
    plan = make(name, cuda)
    labels = plan.labels
    assert labels["io.gpux.provider"] == name
    assert labels["io.gpux.port"] == "8080"
    assert labels["io.gpux.warmup"] == plan.warmup == "at-start"
    assert labels["io.gpux.pack.version"] == __version__
    assert labels["io.gpux.model.name"] == "iris-mlp"
    assert labels["io.gpux.model.sha256"] == plan.model.sha256
    assert labels["org.opencontainers.image.base.name"] == row(name, cuda).bases["default"].image
    assert "io.gpux.grpc_port" not in labels


def test_user_labels_never_override_the_contract(make):
    plan = make("cuda", config={"serving": {"grpc_port": 9001}, "pack": {"labels": {
        "io.gpux.provider": "cpu", "io.gpux.port": "1", "io.gpux.warmup": "baked", "com.example.team": "ml\tops\n"}}})
    labels = plan.labels
    assert labels["io.gpux.provider"] == "cuda"
    assert labels["io.gpux.port"] == "8080"
    assert labels["io.gpux.warmup"] == "at-start"
    assert labels["io.gpux.grpc_port"] == "9001"
    assert labels["com.example.team"] == "ml ops"  # added, one line


@pytest.mark.parametrize(
    ("text", "expected"),
    [("plain", "plain"), (" a\nb\r\n c ", "a b c"), ("x\u2028y\u202ez\ufeff", "x y z"), ("\t\n", "")],
)
def test_label_value_is_one_line_of_visible_text(text, expected):
    assert label_value(text) == expected


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_runtime_base_labels(name, cuda):
    provider = row(name, cuda)
    labels = plan_runtime_base(provider, provider.bases["default"], None, True).labels
    assert labels["io.gpux.provider"] == name
    assert labels["io.gpux.onnxruntime.version"] == provider.version
    assert labels["io.gpux.pack.version"] == __version__
    assert labels["org.opencontainers.image.base.name"] == provider.bases["default"].image
    assert not any(k.startswith("io.gpux.model.") or k == "io.gpux.port" for k in labels)  # no model in it


# ---------------------------------------------------------------------------------------------
# gpux.json and session options


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_gpux_json(make, name, cuda):
    plan = make(name, cuda)
    provider = row(name, cuda)
    doc = plan.gpux_json.to_json()
    assert contract.parse(json.loads(json.dumps(doc))) == plan.gpux_json  # written, then read as the runtime reads it
    assert doc["provider"] == name
    assert doc["execution_providers"][0][0] == provider.ep == EPS[name]
    assert [ep for ep, _ in doc["execution_providers"]] == list(provider.execution_providers)
    assert doc["execution_providers"][-1][0] == "CPUExecutionProvider"
    assert doc["provider_names"] == EPS
    assert "CPUExecutionProvider" in doc["cpu_providers"]
    assert set(doc["cpu_providers"]) == {"CPUExecutionProvider", "OpenVINOExecutionProvider"}
    assert doc["run_flags"] == provider.run_flags
    if provider.device:
        assert doc["run_flags"] == RUN_FLAGS[provider.device]
    if name == "openvino":
        assert doc["plugin"] == {"ep": "OpenVINOExecutionProvider", "module": "onnxruntime_ep_openvino",
                                 "device": "CPU"}
    else:
        assert doc["plugin"] is None
    if name == "tensorrt":
        assert doc["warmup_profiles"] == {"features": {"min": [1, 4], "opt": [1, 4], "max": [32, 4]}}
    else:
        assert doc["warmup_profiles"] == {}
    assert doc["warmup"] == plan.warmup
    assert doc["serving"]["port"] == 8080 and doc["serving"]["grpc_port"] is None
    json.dumps(doc)  # plain JSON


@pytest.mark.parametrize(("name", "cuda"), ROWS)
def test_execution_providers_memory_limit_and_device_id(make, name, cuda):
    plan = make(name, cuda, config={"runtime": {"gpu": {"memory": "2GB"}}, "pack": {"device_id": 3}})
    options = dict((ep, opts) for ep, opts in plan.execution_providers)
    assert list(options) == list(row(name, cuda).execution_providers)
    for ep, opts in options.items():
        key = MEMORY_KEY[name].get(ep)
        if key:
            assert opts[key] == str(2 * 1024**3)
        assert not ({"gpu_mem_limit", "migraphx_mem_limit"} - {key}) & set(opts)
        if ep in DEVICE_ID_EPS:
            assert opts["device_id"] == "3"
        else:
            assert "device_id" not in opts
    assert [list(entry) for entry in plan.gpux_json.execution_providers] == plan.execution_providers


@pytest.mark.parametrize(("name", "cuda"), GPU_ROWS)
def test_execution_providers_defaults_without_settings(make, name, cuda):
    for ep, opts in make(name, cuda).execution_providers:
        assert "gpu_mem_limit" not in opts and "migraphx_mem_limit" not in opts
        if ep in DEVICE_ID_EPS:
            assert opts["device_id"] == "0"


@pytest.mark.parametrize(
    ("openvino", "expected"),
    [
        ({}, {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}),
        ({"device": "GPU", "precision": "auto"}, {"GPU": {}}),
        ({"device": "NPU", "precision": "f16"}, {"NPU": {"INFERENCE_PRECISION_HINT": "f16"}}),
    ],
)
def test_openvino_load_config(make, openvino, expected):
    plan = make("openvino", config={"pack": {"openvino": openvino}} if openvino else None)
    [(ep, opts), (cpu, _)] = plan.execution_providers
    assert (ep, cpu) == ("OpenVINOExecutionProvider", "CPUExecutionProvider")
    assert json.loads(opts["load_config"]) == expected
    assert plan.gpux_json.plugin.device == next(iter(expected))


def test_provider_options_by_short_or_ep_name(make):
    plan = make("cuda", config={"pack": {"provider_options": {
        "cuda": {"cudnn_conv_algo_search": "HEURISTIC", "do_copy_in_default_stream": True},
        "CUDAExecutionProvider": {"arena_extend_strategy": "kSameAsRequested"}}}})
    opts = dict(plan.execution_providers)["CUDAExecutionProvider"]
    assert opts["cudnn_conv_algo_search"] == "HEURISTIC"
    assert opts["do_copy_in_default_stream"] == "true"
    assert opts["arena_extend_strategy"] == "kSameAsRequested"


@pytest.mark.parametrize("cuda", ["13", "12"])
def test_tensorrt_execution_providers_carry_the_profiles(make, cuda):
    plan = make("tensorrt", cuda, config={"serving": {"batch_size": 8}})
    opts = dict(plan.execution_providers)["TensorrtExecutionProvider"]
    assert plan.tensorrt_profiles == {"features": {"min": [1, 4], "opt": [8, 4], "max": [32, 4]}}
    assert (opts["trt_profile_min_shapes"], opts["trt_profile_opt_shapes"], opts["trt_profile_max_shapes"]) == (
        "features:1x4", "features:8x4", "features:32x4")
    assert "trt_profile_min_shapes" not in dict(make("cuda", cuda).execution_providers)["CUDAExecutionProvider"]


def test_tensorrt_profiles_derivation(make):
    """Derived only when the batch is the one dynamic dimension; pack.tensorrt.profiles wins."""
    cfg = make("cpu").config
    spec = lambda name, shape: SimpleNamespace(name=name, shape=shape)  # noqa: E731
    assert tensorrt_profiles(cfg, [spec("x", ("n", 3)), spec("fixed", (2, 2))]) == {
        "x": {"min": [1, 3], "opt": [1, 3], "max": [32, 3]}}
    assert tensorrt_profiles(cfg, [spec("x", ("n", "seq"))]) == {}
    assert tensorrt_profiles(cfg, [spec("x", (1, 3))]) == {}
    big = make("cpu", config={"runtime": {"batch_size": 64}}).config
    assert tensorrt_profiles(big, [spec("x", ("n", 3))])["x"] == {"min": [1, 3], "opt": [64, 3], "max": [64, 3]}
    given = make("cpu", config={"pack": {"tensorrt": {"profiles": {
        "x": {"min": [1, 3], "opt": [4, 3], "max": [16, 3]}}}}}).config
    assert tensorrt_profiles(given, [spec("x", ("n", 3))]) == {"x": {"min": [1, 3], "opt": [4, 3], "max": [16, 3]}}
