"""`gpux-pack plan`: every decision a build would make (provider and why, base image and its facts,
Python, the lock with download sizes, tag, warmup, runtime base reuse), downloading no wheel and
building nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpux_pack import __version__, engine, wheels
from gpux_pack.pipeline import build
from gpux_pack.optimize import describe
from gpux_pack.plan import Options, optimization, preprocessing
from gpux_pack.ui import Reporter


def plans(path: Path, provider: str | None, tag: str | None, options: Options, offline: bool, contained: bool,
          strict: bool) -> list[dict[str, Any]]:
    """One plan per provider, as `plan --json` prints it."""
    ui = Reporter(quiet=True)
    loaded, decision, client = build.open_project(path, provider, tag, engine.try_connect, ui, contained, strict,
                                                  warn=False)
    host = engine.host_info(client) if client is not None else None
    out = []
    for name in decision.providers:
        plan = build.plan_for(loaded, name, decision.reason, options, client, ui, pull=False,
                              resolve=build.resolver(ui, offline=offline))
        lock = plan.lock
        assert lock is not None, "planned with a resolver"
        known = wheels.sizes(lock, offline=offline)
        pins = [{"name": p.name, "version": p.version, "size_bytes": known[p.name][0], "cached": known[p.name][1]}
                for p in lock.pins]
        note = host.plugin_refusal(plan.provider, loaded.project.config.pack.openvino.device) if host else ""
        out.append({
            "provider": plan.provider.name, "reason": plan.reason, "tag": plan.tag,
            "base_image": {"image": plan.base.image, "python": plan.base.python, "platform": plan.platform,
                           "arch": plan.base.arch, "glibc": ".".join(map(str, plan.base.glibc)),
                           "inspected": plan.base.probed, "interpreter": plan.runtime_base.config.python},
            "python": plan.base.python, "warmup": plan.warmup, "link_check": plan.link_check,
            "preprocessing": _preprocessing(plan),
            "optimize": _optimize(loaded.project, plan, options),
            "digest_depends_on": _depends_on(plan),
            "runtime_base": {"tag": plan.runtime_base.tag, "present": build.runtime_base_present(client, plan)},
            "onnxruntime": lock.version_of(plan.provider.ort),
            "lock": pins,
            "download_bytes": sum(p["size_bytes"] or 0 for p in pins if not p["cached"]),
            "download_unknown": [p["name"] for p in pins if not p["cached"] and p["size_bytes"] is None],
            "cached_bytes": sum(p["size_bytes"] or 0 for p in pins if p["cached"]),
            "notes": [*plan.notes, *([f"{note}; an image started on this host serves on the CPU provider"] if note else [])],
        })
    return out


def lines(rows: list[dict[str, Any]]) -> list[str]:
    """The plans as `plan` prints them without --json."""
    out = []
    for r in rows:
        base = r["base_image"]
        facts = f"Python {base['python']}, glibc {base['glibc']}, {base['arch']}"
        out.append(f"{r['provider']}: {r['reason']}")
        out.append(f"  tag           {r['tag']}")
        out.append(f"  base image    {base['image']} ({facts}{'' if base['inspected'] else '; assumed, not inspected'})")
        out.append(f"  warmup        {r['warmup']}   link check: {r['link_check']}")
        out.append(f"  digest        depends on {', '.join(r['digest_depends_on'])}")
        steps = r["preprocessing"] or {}
        if "text" in steps:
            t = steps["text"]
            out.append(f"  text          '{t['input']}' -> {', '.join(f['name'] for f in t['feeds'])}: tokenizer "
                       f"{t['tokenizer']}, max_length {t['max_length']}, padding {t['padding']}")
        if "image" in steps:
            i = steps["image"]
            how = "letterbox" if i["letterbox"] else "resize " + "x".join(map(str, i["resize"] or i["size"]))
            crop = f", crop {'x'.join(map(str, i['crop']))}" if i["crop"] else ""
            norm = "mean/std" if i["mean"] else "pixels / 255" if i["type"] != "uint8" else "raw pixels"
            out.append(f"  image         '{i['input']}' -> {i['feed']} {i['layout']} {i['type']}: {how}{crop}, {norm}")
        if "audio" in steps:
            a = steps["audio"]
            out.append(f"  audio         '{a['input']}' -> {a['feed']}: WAV at {a['sample_rate']} Hz, {a['samples']} "
                       f"samples, log-mel {a['n_mels']} x {a['frames']} (n_fft {a['n_fft']}, hop {a['hop_length']})")
        if r["optimize"]["steps"]:
            out.append(f"  optimize      {r['optimize']['described']}, each checked against the original")
        out += [f"  note          {note}" for note in [*r["optimize"]["skipped"], *r["notes"]]]
        state = "present: only the model is built" if r["runtime_base"]["present"] else "built on the first build"
        out.append(f"  runtime base  {r['runtime_base']['tag']} ({state})")
        unknown = f", {len(r['download_unknown'])} of unknown size" if r["download_unknown"] else ""
        out.append(f"  lock          {len(r['lock'])} packages, {r['download_bytes'] / 1e6:.1f} MB to download{unknown}, "
                   f"{r['cached_bytes'] / 1e6:.1f} MB cached")
        for p in r["lock"]:
            size = "?" if p["size_bytes"] is None else f"{p['size_bytes'] / 1e6:.1f} MB"
            out.append(f"    {p['name'] + '==' + p['version']:<42} {size:>10}  {'cached' if p['cached'] else 'to download'}")
    return out


def _preprocessing(plan: Any) -> dict[str, Any] | None:
    """What the image does to a request first, and where a tokenizer comes from (a download is the build's)."""
    steps = preprocessing(plan.signature)
    if steps and "text" in steps:
        steps["text"]["tokenizer"] = plan.signature.text.tokenizer.shown()
    return steps


def _depends_on(plan: Any) -> list[str]:
    """What the image's digest is a function of: the same of each gives the same digest."""
    when = ("SOURCE_DATE_EPOCH" if os.environ.get("SOURCE_DATE_EPOCH")
            else "the build time (set SOURCE_DATE_EPOCH for a reproducible digest)")
    base = f"the base image's id ({plan.base.id[:19]})" if plan.base.id else "the base image's id"
    return ["gpux.yml's values", "the model's bytes", *(["the preprocessing files"] if plan.assets else []),
            base, "the lock (each wheel's version and hash)", f"gpux-pack {__version__}", when]


def _optimize(project: Any, plan: Any, options: Options) -> dict[str, Any]:
    """What pack.optimize (or --optimize) would do to the model for this image, and what it cannot."""
    decision = optimization(project, plan.provider, options)
    return {"steps": [{"mode": s.mode, "how": s.how} for s in decision.steps], "described": describe(decision),
            "skipped": list(decision.skipped)}
