"""The model's session in process: providers and fallback, warmup's profile, cgroup limits, the
intra-op thread rule, and what the runtime imports."""

from __future__ import annotations

import gc
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from gpux_pack.runtime import warmup
from gpux_pack.runtime.contract import Libraries
from gpux_pack.runtime.session import Model, diagnose
from gpux_pack.runtime.settings import Settings, StartupError
from gpux_pack.runtime.server import App

from tests.in_process import ROOT, Client, reference, settings, spec_dir


def test_provider_override_and_fallback(tmp_path, caplog):
    folder = spec_dir(tmp_path, "mlp", provider="cuda")
    model = Model.load(settings(folder))  # no CUDA here: loud fallback to CPU
    assert model.requested[0] == "CUDAExecutionProvider"
    assert model.active == ["CPUExecutionProvider"]
    assert "FALLBACK" in caplog.text and "GPUX_REQUIRE_PROVIDER=1" in caplog.text
    with pytest.raises(StartupError, match="GPUX_REQUIRE_PROVIDER=1: CUDAExecutionProvider is not active"):
        Model.load(settings(folder, GPUX_REQUIRE_PROVIDER="1"))
    s = settings(folder, GPUX_PROVIDERS="cpu")
    assert [n for n, _ in s.providers] == ["CPUExecutionProvider"]
    with pytest.raises(StartupError, match="unknown provider 'tpu'"):
        settings(folder, GPUX_PROVIDERS="tpu")


def test_warmup_leaves_no_profile_in_the_temporary_folder(tmp_path, monkeypatch):
    """ONNX Runtime creates warmup's profile file when the session loads: it goes when warmup has
    read it, when the load fails after the session, and with a model dropped before its warmup."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    folder = spec_dir(tmp_path, "mlp", provider="cuda")  # no CUDA here: served on CPU, and profiled
    model = Model.load(settings(folder))
    assert [p.name for p in scratch.iterdir()][0].startswith("gpux-warmup-")  # there while it runs
    assert warmup.run(model)["partition"] == {"CPUExecutionProvider": 3}  # after fusion
    assert list(scratch.iterdir()) == []
    with pytest.raises(StartupError, match="is not active"):
        Model.load(settings(folder, GPUX_REQUIRE_PROVIDER="1"))
    gc.collect()
    assert list(scratch.iterdir()) == []
    Model.load(settings(folder))  # never warmed up
    gc.collect()
    assert list(scratch.iterdir()) == []


def test_warmup_never_is_ready_at_once(tmp_path):
    app = App(Model.load(settings(spec_dir(tmp_path, "mlp", warmup="never"))))
    app.start_warmup()
    assert app.ready.is_set() and app.model.warmup_state == {"state": "skipped"}


def _libraries(run_flags: str | None = "--gpus all", **libraries: list[str]) -> tuple[Libraries, str | None]:
    """gpux.json's parts diagnose reads, for a provider started with `--gpus all` by default."""
    return Libraries(**{k: tuple(v) for k, v in libraries.items()}), run_flags


def test_diagnose_says_no_device_when_every_library_loads():
    """onnxruntime's own provider library, and one opened by name through the loader's search."""
    libs = dict(libs=["libonnxruntime_providers_shared.so"], dlopen=["libc.so.6"])
    assert diagnose(*_libraries(**libs)) == "its libraries load but no device was found; start the container with --gpus all"
    assert diagnose(*_libraries(None, **libs)) == "no device"


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    """A site-packages whose onnxruntime/capi holds libgpuxprov.so, which needs libgpuxdep.so
    (RUNPATH $ORIGIN) that is not there, and whose nvidia/x/lib holds libgpuxwheel.so.
    Names no other test loads: the process's loader remembers what it opened."""
    if not shutil.which("gcc"):
        pytest.fail("gcc is needed to compile the test libraries")
    capi, wheel = tmp_path / "onnxruntime" / "capi", tmp_path / "nvidia" / "x" / "lib"
    capi.mkdir(parents=True)
    wheel.mkdir(parents=True)
    (tmp_path / "onnxruntime" / "__init__.py").write_text("")
    (tmp_path / "dep.c").write_text("int dep(void) { return 1; }\n")
    (tmp_path / "prov.c").write_text("int dep(void); int prov(void) { return dep() + 1; }\n")
    run = lambda *args: subprocess.run(args, cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    run("gcc", "-shared", "-fPIC", "-o", capi / "libgpuxdep.so", "dep.c")
    run("gcc", "-shared", "-fPIC", "-o", capi / "libgpuxprov.so", "prov.c", f"-L{capi}", "-lgpuxdep",
        "-Wl,-rpath,$ORIGIN")
    run("gcc", "-shared", "-fPIC", "-o", wheel / "libgpuxwheel.so", "dep.c")
    (capi / "libgpuxdep.so").unlink()
    monkeypatch.setattr(ort, "__file__", str(tmp_path / "onnxruntime" / "__init__.py"))
    return tmp_path


def test_diagnose_reports_the_loaders_own_words(fake_site):
    """The loader's message names the missing dependency, not the provider library asking for it."""
    reason = diagnose(*_libraries(libs=["libgpuxprov.so"]))
    assert reason.startswith("libgpuxdep.so: cannot open shared object file"), reason
    # a library of the driver's: the docker run flags that bring it, or the loader's words without them
    driver = dict(libs=["libgpuxprov.so"], driver=["libgpuxdep.so"])
    assert diagnose(*_libraries(**driver)) == \
        "the GPU driver's libgpuxdep.so is not in the container; start it with --gpus all"
    assert diagnose(*_libraries(None, **driver)).startswith("libgpuxdep.so: cannot open shared object file")
    # the image's own missing library wins over the driver's: no docker run flag fixes it
    both = dict(libs=["libgpuxprov.so"], dlopen=["libgpuxgone.so.1"], driver=["libgpuxdep.so"])
    assert diagnose(*_libraries(**both)).startswith("libgpuxgone.so.1: cannot open shared object file")
    # a provider library onnxruntime lacks: its path in capi
    assert diagnose(*_libraries(libs=["libgpuxnone.so"])).startswith(
        f"{fake_site}/onnxruntime/capi/libgpuxnone.so: cannot open shared object file")


def test_diagnose_opens_by_name_from_the_folders_the_runtime_preloads(fake_site):
    """dlopen names: from a `dirs` folder (site-packages globs) that holds the file, else by name
    through the loader's search, which does not know the wheel's folder."""
    assert diagnose(*_libraries(dlopen=["libgpuxwheel.so"])).startswith(
        "libgpuxwheel.so: cannot open shared object file")
    assert diagnose(*_libraries(dlopen=["libgpuxwheel.so"], dirs=["nvidia/*/lib"])).startswith(
        "its libraries load but no device was found")


def test_diagnose_opens_onnxruntimes_shared_library_first_with_its_symbols_global(fake_site):
    """A provider library takes symbols (Provider_GetHost) from libonnxruntime_providers_shared.so,
    which ONNX Runtime loads first with RTLD_GLOBAL; opened alone it would fail on them."""
    capi = fake_site / "onnxruntime" / "capi"
    (fake_site / "host.c").write_text("int gpux_test_host(void) { return 1; }\n")
    (fake_site / "guest.c").write_text("int gpux_test_host(void); int guest(void) { return gpux_test_host(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", capi / "libgpuxguest.so", "guest.c"], cwd=fake_site, check=True)
    alone = diagnose(*_libraries(libs=["libgpuxguest.so"]))
    assert alone.endswith("libgpuxguest.so: undefined symbol: gpux_test_host"), alone
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", capi / "libonnxruntime_providers_shared.so", "host.c"],
                   cwd=fake_site, check=True)
    assert diagnose(*_libraries(libs=["libgpuxguest.so"])).startswith("its libraries load but no device was found")


def test_diagnose_never_raises():
    assert diagnose(Libraries(dirs=(None,)), None).startswith("cannot tell why: ")  # type: ignore[arg-type]


def test_runtime_imports_only_its_own_libraries():
    """The runtime folder is copied alone into images holding numpy, onnxruntime, uvicorn, orjson,
    pysimdjson and prometheus-client."""
    import ast
    import sys

    allowed = set(sys.stdlib_module_names) | {"numpy", "onnxruntime", "uvicorn", "orjson", "simdjson", "prometheus_client",
                                              "grpc", "google",  # only with serving.grpc_port
                                              "tokenizers", "PIL",  # only with a tokenizer, image preprocessing
                                              "cryptography"}  # only with a signed model (build --sign-model)
    for path in (ROOT / "gpux_pack" / "runtime").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def test_cgroup_limits_size_threads_and_bodies(tmp_path):
    from gpux_pack.runtime import resources

    root = tmp_path / "cg"
    root.mkdir()
    (root / "cpu.max").write_text("150000 100000\n")
    (root / "memory.max").write_text(str(256 * 1024 * 1024) + "\n")
    lim = resources.limits(root)
    assert lim.cpus == min(2, resources.cpus(tmp_path / "none")) and lim.memory == 256 * 1024 * 1024
    s = Settings.load({"GPUX_CONFIG": str(spec_dir(tmp_path, "mlp") / "gpux.json")}, limits=lim)
    assert s.max_body_bytes == 16 * 1024 * 1024 and s.max_request_bytes == 32 * 1024 * 1024
    assert s.max_workers == 1 and s.threads == lim.cpus


def _two_cpus(folder: Path, **env: str) -> Settings:
    from gpux_pack.runtime import resources

    return Settings.load({"GPUX_CONFIG": str(folder / "gpux.json"), "GPUX_CACHE_DIR": str(folder / "cache"), **env},
                         limits=resources.Limits(cpus=2, memory=8 << 30, memory_from="given"))


def _heavy(folder: Path) -> Path:
    """The mlp's gpux.json over a model with its inputs and outputs whose run is milliseconds even
    at batch 1: features -> a 384x384 matrix (an outer product) -> four 384x384 MatMuls -> mean."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {"w_in": rng.random((4, 384)), "ones": np.ones((1, 384)), "w_out": rng.random((384, 3))}
    weights.update({f"w{i}": rng.random((384, 384)) / 384 for i in range(4)})
    nodes = [helper.make_node("MatMul", ["features", "w_in"], ["h"]),
             helper.make_node("Transpose", ["h"], ["col"], perm=[1, 0]),
             helper.make_node("MatMul", ["col", "ones"], ["m0"])]
    nodes += [helper.make_node("MatMul", [f"m{i}", f"w{i}"], [f"m{i + 1}"]) for i in range(4)]
    nodes += [helper.make_node("ReduceMean", ["m4"], ["mean"], axes=[0], keepdims=1),
              helper.make_node("MatMul", ["mean", "w_out"], ["logits"]),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    graph = helper.make_graph(
        nodes, "heavy", [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3]) for n in ("logits", "probs")],
        [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model" / "model.onnx")
    return folder


def test_threads_are_chosen_by_a_rule_the_same_on_every_start(tmp_path):
    """A run too cheap for parallelism to pay (a tiny MLP): 1 thread, on each of 10 starts."""
    chosen = []
    for i in range(10):
        (tmp_path / str(i)).mkdir()
        model = Model.load(_two_cpus(spec_dir(tmp_path / str(i), "mlp")))
        assert model.threads["intra_op"] == 2 and model.threads["chosen"] == "cpus" and "no run timed" in \
            model.threads["why"]
        assert warmup.run(model)["state"] == "done"
        threads = warmup.tune_threads(model)
        assert threads["chosen"] == "rule" and 0 < threads["run_ms"] < warmup.ONE_THREAD_MS, threads
        chosen.append(threads["intra_op"])
    assert chosen == [1] * 10
    assert "too cheap for parallelism to pay; 1 thread" in threads["why"] and f"{threads['run_ms']:g} ms" in \
        threads["why"]
    feeds = {"features": np.array([[5.1, 3.5, 1.4, 0.2]], np.float32)}
    expected = reference("mlp", feeds)
    assert all(np.allclose(model.run(feeds)[k], v, atol=1e-6) for k, v in zip(("logits", "probs"), expected))


def test_a_model_whose_run_is_not_cheap_keeps_every_cpu_without_a_second_session(tmp_path, monkeypatch):
    model = Model.load(_two_cpus(_heavy(spec_dir(tmp_path, "mlp"))))
    loaded = model.session
    monkeypatch.setattr(ort, "InferenceSession", None)  # tune_threads must not load another session
    warmup.run(model)
    threads = warmup.tune_threads(model)
    assert threads["intra_op"] == 2 and threads["chosen"] == "rule" and threads["run_ms"] >= 1, threads
    assert threads["why"] == f"a run takes {threads['run_ms']:g} ms on 2 threads (>= 0.25 ms): every CPU the " \
        "container has (2)"
    assert model.session is loaded


@pytest.mark.parametrize(("costs", "median", "runs"), [
    ([0.05, 3.0, 0.05, 0.05, 0.05], 0.05, 5),  # a cheap model with one run a busy machine slowed
    ([0.3, 0.1, 0.4, 0.1, 0.1, 0.1], 0.1, 6),
    ([1.0, 1.2, 0.9, 1.1], 1.05, 4),  # four of seven on one side: settled
    ([5.0, 9.0], 7.0, 2),  # two runs ten times over the threshold: settled
])
def test_the_rule_reads_a_median_and_stops_once_its_side_is_settled(monkeypatch, costs, median, runs):
    from types import SimpleNamespace

    stamps = iter([t for ms in costs for t in (0.0, ms / 1000)])  # perf_counter before and after each run
    monkeypatch.setattr(warmup, "time", SimpleNamespace(perf_counter=lambda: next(stamps)))
    count: list[int] = []
    assert warmup._run_cost(lambda: count.append(1), 0.25) == pytest.approx(median)
    assert len(count) == runs


def test_gpux_threads_wins_and_info_says_why(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fixed = Model.load(_two_cpus(spec_dir(tmp_path / "a", "mlp"), GPUX_THREADS="2"))
    warmup.run(fixed)
    assert warmup.tune_threads(fixed) == {"intra_op": 2, "chosen": "GPUX_THREADS", "why": "GPUX_THREADS=2"}
    app = App(Model.load(_two_cpus(spec_dir(tmp_path / "b", "mlp"))), "test")
    app.start_warmup()
    assert app.ready.wait(10)
    status, info, _ = Client(app).request("GET", "/info")
    assert status == 200 and info["threads"] == app.model.threads and info["threads"]["intra_op"] == 1
    assert info["threads"]["chosen"] == "rule" and info["threads"]["why"].startswith("a run takes ")
