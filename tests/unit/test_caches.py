"""Compiled-artefact caches (runtime/caches.py) on real folders: keys, verification, the choice
at start, publishing under concurrency, partition and accuracy."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from gpux_pack.runtime import caches, contract

SPEC = {"model": {"sha256": "ab" * 32}}
OPTS = {"device_type": "CPU", "cache_dir": "${GPUX_CACHE_DIR}/openvino"}


def parts(**change):
    p = caches.key_parts(SPEC["model"]["sha256"], "OpenVINOExecutionProvider", OPTS, [{"x": [1, 4]}], "1.24.1",
                       device="cpu: Test CPU [avx2 fma]", libraries={"onnxruntime-openvino": "1.24.1"})
    return {**p, **change}


def compile_into(cache: caches.Cache, content: bytes = b"blob") -> dict:
    folder = cache.folder / "openvino"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "123.blob").write_bytes(content)
    return caches.publish(cache, {"shapes": [{"x": [1, 4]}], "seconds": 0.1})


def test_the_key_covers_what_compiled_code_depends_on_and_not_the_cache_path():
    base = caches.digest(parts())
    assert caches.digest(parts()) == base
    for change in ({"device": "cpu: Other [avx512f]"}, {"onnxruntime": "1.25.0"}, {"shapes": [{"x": [8, 4]}]},
                   {"libraries": {"onnxruntime-openvino": "1.25.0"}}, {"model_sha256": "cd" * 32}):
        assert caches.digest(parts(**change)) != base, change
    assert parts()["options"] == {"device_type": "CPU"}  # the cache path is not part of the key
    assert caches.short(parts()) == f"avx2-{base[:6]}"
    assert caches.short(parts(device="gpu: NVIDIA H200 sm90 (driver 13000)")).startswith("sm90-")
    assert contract.cpu_device().startswith("cpu: ")


def test_a_compiled_cache_is_found_again_as_volume_and_verified(tmp_path):
    first = caches.choose(parts(), tmp_path / "cache", tmp_path / "baked")
    assert first.source == "compiled" and first.folder.name.startswith(".")
    assert caches.expand(OPTS, first.folder) == {"device_type": "CPU", "cache_dir": str(first.folder / "openvino")}
    record = compile_into(first)
    assert first.folder == tmp_path / "cache" / first.key and not any(p.name.startswith(".") for p in
                                                                       (tmp_path / "cache").iterdir())
    assert record["files"] == [{"path": "openvino/123.blob", "size": 4,
                                "sha256": caches.sha256(first.folder / "openvino" / "123.blob")}]
    again = caches.choose(parts(), tmp_path / "cache", tmp_path / "baked")
    assert (again.source, again.folder, again.warnings) == ("volume", first.folder, [])


def test_a_corrupt_blob_or_an_altered_key_is_never_used(tmp_path):
    cache = caches.choose(parts(), tmp_path / "cache", tmp_path / "baked")
    compile_into(cache)
    (cache.folder / "openvino" / "123.blob").write_bytes(b"blub")
    corrupt = caches.choose(parts(), tmp_path / "cache", tmp_path / "baked")
    assert corrupt.source == "compiled"
    assert corrupt.warnings == [f"not using the volume cache {cache.folder}: openvino/123.blob is corrupt "
                                "(sha256 differs from the record)"]
    compile_into(corrupt, b"new blob")  # replaces the corrupt folder
    assert (cache.folder / "openvino" / "123.blob").read_bytes() == b"new blob"
    record = json.loads((cache.folder / caches.RECORD).read_text())
    record["parts"]["device"] = "cpu: Elsewhere [avx512f]"
    (cache.folder / caches.RECORD).write_text(json.dumps(record))
    altered = caches.choose(parts(), tmp_path / "cache", tmp_path / "baked")
    assert altered.source == "compiled" and len(altered.warnings) == 1
    assert "key mismatch: device (recorded 'cpu: Elsewhere [avx512f]', this container 'cpu: Test CPU [avx2 fma]')" \
        in altered.warnings[0]


def test_a_baked_cache_is_read_in_place_and_one_for_another_device_is_named(tmp_path):
    baker = caches.choose(parts(), tmp_path / "bake", tmp_path / "none")
    compile_into(baker)
    baked = tmp_path / "baked"
    baked.mkdir()
    baker.folder.rename(baked / baker.key)
    (baked).chmod(0o555)
    try:
        found = caches.choose(parts(), tmp_path / "cache", baked)
        assert (found.source, found.folder) == ("baked", baked / baker.key)
        other = caches.choose(parts(device="gpu: NVIDIA A100 sm80 (driver 13000)"), tmp_path / "cache", baked)
        assert other.source == "compiled" and other.folder.parent == tmp_path / "cache"
        assert other.warnings == [f"not using the baked cache {baked / baker.key}: key mismatch: device (recorded "
                                  "'cpu: Test CPU [avx2 fma]', this container 'gpu: NVIDIA A100 sm80 (driver 13000)')"]
    finally:
        baked.chmod(0o755)


def test_an_unwritable_cache_dir_falls_back_to_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(caches, "FALLBACK_CACHE_DIR", str(tmp_path / "fallback"))
    (tmp_path / "file").write_text("a file, so nothing can be made under it (even as root)")
    cache = caches.choose(parts(), tmp_path / "file" / "cache", tmp_path / "baked")
    assert cache.source == "compiled" and cache.folder.parent == tmp_path / "fallback"


def test_no_writable_folder_at_all_serves_without_a_cache_in_one_warning(tmp_path, monkeypatch):
    """A read-only root with no tmpfs at /tmp was exit 1 with a traceback ("Read-only file system")."""
    (tmp_path / "file").write_text("nothing can be made under a file, even as root")
    monkeypatch.setattr(caches, "FALLBACK_CACHE_DIR", str(tmp_path / "file" / "fallback"))
    cache = caches.choose(parts(), tmp_path / "file" / "cache", tmp_path / "baked")
    assert (cache.source, cache.folder) == ("none", None)
    assert len(cache.warnings) == 1 and "serving without a cache" in cache.warnings[0]
    assert caches.expand(OPTS, cache.folder) == {"device_type": "CPU"}  # the provider caches nowhere


def _odd_record(folder: Path, kind: str) -> None:
    folder.mkdir(parents=True)
    record = folder / caches.RECORD
    if kind == "fifo":
        import os

        os.mkfifo(record)
    elif kind == "zero":
        record.symlink_to("/dev/zero")
    elif kind == "huge":
        record.write_text('{"parts": {}, "files": [], "pad": "' + "x" * (50 << 20) + '"}')
    elif kind == "deep":
        record.write_text("[" * 100000)


@pytest.mark.parametrize("kind", ["fifo", "zero", "huge", "deep"])
def test_an_odd_record_is_one_warning_and_a_fresh_compile_never_a_hang(tmp_path, kind):
    """warmup.json as a FIFO or a link to /dev/zero: never ready; 50 MB of it: OOM at start."""
    import threading

    key = caches.digest(parts())
    _odd_record(tmp_path / "cache" / key, kind)
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(caches.choose(parts(), tmp_path / "cache",
                                                                           tmp_path / "baked")), daemon=True)
    worker.start()
    worker.join(20)
    assert outcome, "choose did not return"
    cache = outcome[0]
    assert cache.source == "compiled" and len(cache.warnings) == 1, cache.warnings
    assert cache.warnings[0].startswith(f"not using the volume cache {tmp_path / 'cache' / key}: ")
    record = compile_into(cache)  # and publishing over the odd folder replaces it
    assert caches.check(tmp_path / "cache" / key, parts())["files"] == record["files"]


def test_a_compile_leaves_no_stale_folders_behind_it(tmp_path):
    """`.KEY.tmp-*` folders of containers killed mid-warmup and `.KEY.bad-*` ones were never
    removed; a compile folder in use (touched within STALE_AGE) is left alone."""
    import os
    import time

    root = tmp_path / "volume"
    old, busy, bad = root / ".k.tmp-1-aaaa", root / ".k.tmp-2-bbbb", root / ".k.bad-cccc"
    for folder in (old, busy, bad):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "blob").write_bytes(b"x")
    past = time.time() - caches.STALE_AGE - 60
    for path in (old, old / "sub", old / "sub" / "blob", bad, bad / "sub", bad / "sub" / "blob"):
        os.utime(path, (past, past))
    os.utime(busy, (past, past))  # only its file is recent: a compile writing into a subfolder
    cache = caches.choose(parts(), root, tmp_path / "baked")
    assert cache.source == "compiled"
    assert {p.name for p in root.iterdir()} == {busy.name, cache.folder.name}


def _warm_one(root: str, content: bytes) -> str:
    cache = caches.choose(parts(), Path(root), Path(root) / "no-baked")
    if cache.source == "compiled":  # else another process published first: found as "volume"
        compile_into(cache, content)
    return str(cache.folder)


def test_containers_warming_one_volume_at_once_all_end_with_a_valid_folder(tmp_path):
    root = tmp_path / "volume"
    with multiprocessing.get_context("spawn").Pool(6) as pool:  # not fork: earlier tests leave threads running (servers, gRPC); a forked child can deadlock on a lock one held
        folders = pool.starmap(_warm_one, [(str(root), b"blob %d" % i) for i in range(12)])
    key = caches.digest(parts())
    assert set(folders) == {str(root / key)}
    assert sorted(p.name for p in root.iterdir()) == [key]  # no temporary folder left behind
    caches.check(root / key, parts())


def test_partition_counts_fused_subgraphs_as_the_nodes_they_took():
    events = [
        {"cat": "Session", "name": "model_run"},
        {"cat": "Node", "name": "OpenVINOExecutionProvider_OpenVINO-EP-subgraph_1_0_kernel_time",
         "args": {"provider": "OpenVINOExecutionProvider", "op_name": "OpenVINO-EP-subgraph_1"}},
        {"cat": "Node", "name": "/Shape_kernel_time", "args": {"provider": "CPUExecutionProvider", "op_name": "Shape"}},
        {"cat": "Node", "name": "/Shape_kernel_time", "args": {"provider": "CPUExecutionProvider", "op_name": "Shape"}},
        {"cat": "Node", "name": "/Gather_kernel_time", "args": {"provider": "CPUExecutionProvider", "op_name": "Gather"}},
    ]
    assert caches.partition(events, 10) == ({"CPUExecutionProvider": 2, "OpenVINOExecutionProvider": 8},
                                          ["Gather", "Shape"])


def test_accuracy_reports_errors_and_names_the_output_beyond_the_limits():
    ours = {"probs": np.array([0.5, 0.25], np.float32), "label": np.array([1, 2])}
    ref = {"probs": np.array([0.5, 0.2500001], np.float32), "label": np.array([1, 2])}
    errors = caches.accuracy(ours, ref)
    assert errors["label"] == {"max_abs": 0.0, "max_rel": 0.0}
    assert 0 < errors["probs"]["max_abs"] < 1e-6 and 0 < errors["probs"]["max_rel"] < 1e-6
    assert caches.violation(errors, ours, ref, atol=1e-5, rtol=0) is None
    problem = caches.violation(errors, ours, ref, atol=0, rtol=0)
    assert problem.startswith("output 'probs' differs from the CPU provider beyond pack.accuracy (atol 0, rtol 0): "
                              "max abs error ")


def test_library_versions_are_what_importlib_metadata_says():
    """Read from the few distributions' metadata named like LIBRARIES, not from every one."""
    from importlib import metadata

    expected: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        if caches.LIBRARIES.match(name):
            expected[name] = dist.version
    assert caches.library_versions() == dict(sorted(expected.items())) and "onnxruntime" in expected
