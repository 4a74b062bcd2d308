"""`gpux-pack`: build, bench, push, deploy, plan, run, serve, predict, init, warmup, render, providers, inspect, schema, cache. Errors are caught here, once.

Exit codes: 0 ok; 1 build or Docker failure; 2 usage, config or model error.
"""

from __future__ import annotations

import json
import shlex
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer

try:  # typer >= 0.29 vendors click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer on real click
    from click import exceptions as click_errors

from gpux_pack import __version__, engine, providers
from gpux_pack.errors import BuildError, PackError, UsageError
from gpux_pack.reference import parse_reference
from gpux_pack.ui import Reporter, built_line

app = typer.Typer(
    name="gpux-pack",
    help="Turn an ONNX model and its gpux.yml into a production container image.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

PathArg = typer.Argument(Path("."), help="Folder holding gpux.yml, or the gpux.yml itself.")
ProviderOpt = typer.Option(None, "--provider", "-p", help=providers.names_help())
BaseOpt = typer.Option(None, "--base-image", help="Replace the provider's default base image.")
PlatformOpt = typer.Option(None, "--platform", help="The image's platform, e.g. linux/amd64.")
WarmupOpt = typer.Option(None, "--warmup", help="auto | always | never.")
RefreshOpt = typer.Option(False, "--refresh", help="Re-resolve the image's wheels instead of reusing the cached lock.")
ContainedOpt = typer.Option(False, "--contained", help="Read nothing outside the project folder (for projects "
                            "you do not trust): gpux.yml and the model must resolve inside it.")
PullOpt = typer.Option("missing", "--pull", help="Pull the image first: missing (when this engine lacks it), "
                       "always, or never, as docker run --pull.")


def _pull(policy: str) -> str:
    if policy not in engine.PULL_POLICIES:
        raise typer.BadParameter(f"{policy!r}: expected missing, always or never", param_hint="--pull")
    return policy


StrictOpt = typer.Option(False, "--strict", help="Refuse gpux.yml keys and values gpux-pack cannot act on "
                         "(otherwise a warning each).")


def _version(value: bool) -> None:
    if value:
        print(f"gpux-pack {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    pass


def _options(tag, base_image, platform, warmup):
    from gpux_pack.plan import Options  # the commands that plan pay for pydantic, not --help or run
    from gpux_pack.wheels import ARCHES

    if warmup is not None and warmup not in ("auto", "always", "never"):
        raise typer.BadParameter(f"'{warmup}' is not auto, always or never", param_hint="--warmup")
    if base_image is not None and base_image not in ("default", "vendor"):
        try:
            parse_reference(base_image)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--base-image") from None
    if platform is not None:
        if platform not in ARCHES:
            raise typer.BadParameter(f"'{platform}' is not one of {', '.join(ARCHES)}", param_hint="--platform")
    return Options(tag=tag, base_image=base_image, platform=platform, warmup=warmup)


@app.command("build")
def build_cmd(
    path: Path = PathArg,
    provider: Optional[str] = ProviderOpt,
    tag: Optional[str] = typer.Option(None, "--tag", "-t", help="Image reference; {name} {version} {provider} expand."),
    base_image: Optional[list[str]] = typer.Option(
        None, "--base-image", help="Replace the provider's default base image; PLATFORM=IMAGE for one platform."
    ),
    platform: Optional[str] = typer.Option(
        None, "--platform", help="The image's platform, e.g. linux/amd64; several (with --push): an OCI index."
    ),
    warmup: Optional[str] = WarmupOpt,
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not use Docker's layer cache."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the result and errors."),
    json_out: bool = typer.Option(False, "--json", help="One JSON summary on stdout; logs on stderr."),
    refresh: bool = RefreshOpt,
    push_: bool = typer.Option(False, "--push", help="Push every image built; their digests go in the summary."),
    contained: bool = ContainedOpt,
    strict: bool = StrictOpt,
) -> None:
    """Build the model's image(s) through the Docker engine."""
    from gpux_pack.commands import build

    started = time.perf_counter()
    ui = Reporter(quiet=quiet)  # logs go to stderr in every mode; --json owns stdout
    platforms, bases = _platforms(platform, base_image, push_)
    options = _options(tag, bases.get(None), platforms[0], warmup)
    for name in platforms[1:] if platforms[0] else ():
        _options(tag, bases.get(name), name, warmup)  # every platform's base is valid before anything runs
    loaded, decision, client = build.start(path, provider, tag, engine.connect, ui, contained, strict)
    if tag and len(decision.providers) > 1 and "{provider}" not in tag:
        raise typer.BadParameter("several providers need {provider} in the tag", param_hint="--tag")
    if (warmup or loaded.project.config.pack.warmup) != "never":  # a baked warmup wants the host's device
        options = replace(options, host=engine.host_info(client))
    per_platform = [replace(options, platform=p, base_image=bases.get(p, bases.get(None)), multi_platform=True)
                    for p in platforms] if len(platforms) > 1 else [options]  # fmt: skip
    results, failures, indexes = build.build_each(loaded, decision, per_platform, client, ui, _failed, no_cache,
                                                  refresh, push_)  # fmt: skip
    _summary(results, failures, json_out, time.perf_counter() - started, indexes)
    if failures:
        raise typer.Exit(max(e.exit_code for _, e in failures))
    if len(results) == 1 and sys.argv[1:2] == ["build"]:
        _record_rebuild(loaded.project.root, results[0], client)


def _record_rebuild(root: Path, made: Any, client: Any) -> None:
    """What the next identical `build` needs to replay this one when only the weights change."""
    from gpux_pack.commands import rebuild
    from gpux_pack.wheels import lock_path

    plan, built = made.plan, made.built
    if built.loaded is None or plan.warmup == "baked":
        return
    try:
        images = {ref: client.images.get(ref).id for ref in (plan.base.image, plan.runtime_base.tag)}
    except Exception:  # a base that is not an image here: nothing to replay from
        return
    rebuild.record(sys.argv[1:], root, plan.model.path, plan.model.sha256, plan.model.size_bytes, plan.provider.name,
                   images, lock_path(plan.requirements, plan.target), built.loaded, plan.project.variables, _row(made))


def _platforms(platform: str | None, bases: list[str] | None, push_: bool) -> tuple[list, dict]:
    """--platform a,b and --base-image [PLATFORM=]IMAGE...: the platforms (or [None]) and each
    one's base (None: every platform's; the last given for a platform wins)."""
    from gpux_pack.wheels import ARCHES

    platforms = [p.strip() for p in platform.split(",")] if platform else [None]
    if len(platforms) > 1:
        if len(set(platforms)) != len(platforms) or len({ARCHES.get(p) for p in platforms}) != len(platforms):
            raise typer.BadParameter(f"'{platform}' names a platform twice", param_hint="--platform")
        if not push_:
            raise typer.BadParameter("several platforms need --push: their index lives in a registry, not in the "
                                     "engine", param_hint="--platform")  # fmt: skip
    chosen: dict[str | None, str] = {}
    for item in bases or []:
        where, _, image = item.rpartition("=")  # a reference never holds '='
        key = where or None
        if key is not None and key not in platforms:
            building = platform or "none given"
            raise typer.BadParameter(f"'{item}': {where} is not a platform being built ({building})",
                                     param_hint="--base-image")  # fmt: skip
        chosen[key] = image  # a later one for the same platform wins, as with any option given twice
    return platforms, chosen


def _failed(name: str, e: PackError) -> None:
    _print_error(e, prefix=f"{name}: ")


def _row(made: Any) -> dict[str, Any]:
    """One image's row of the build summary."""
    plan, prepared, built, pushed = made.plan, made.prepared, made.built, made.pushed
    return {
        "tag": built.tag,
        "id": built.id,
        "size_bytes": built.size_bytes,
        "provider": plan.provider.name,
        "reason": plan.reason,
        "base_image": plan.base.image,
        "runtime_base": plan.runtime_base.tag,
        "runtime_base_built": prepared.runtime_base_context is not None,
        "context_bytes": prepared.context.size_bytes,
        "platform": plan.platform,
        "python": plan.base.python,
        "onnxruntime": plan.lock.version_of(plan.provider.ort),
        "warmup": plan.warmup,
        "seconds": round(built.seconds, 2),
        "steps": built.steps,
        "cached_steps": built.cached_steps,
        "assembled": built.assembled,
        "digest": pushed.digest if pushed else None,
        "notes": list(plan.notes),
    }


def _summary(results: list[Any], failures: list[Any], json_out: bool, seconds: float, indexes: list[Any]) -> None:
    rows = [_row(made) for made in results]
    failed = [{"provider": name, "error": str(e), "exit_code": e.exit_code} for name, e in failures]
    index_rows = [{"provider": name, "tag": i.tag, "digest": i.digest,
                   "manifests": [{"platform": p, "digest": d} for p, d in i.members]} for name, i in indexes]  # fmt: skip
    if json_out:
        from gpux_pack.commands.summary import BuildSummary

        doc = BuildSummary.model_validate({"images": rows, "indexes": index_rows, "failed": failed,
                                           "seconds": round(seconds, 2)})  # fmt: skip
        print(json.dumps(doc.model_dump(mode="json"), indent=2))
        return
    _summary_text(rows, failed, seconds)
    for i in index_rows:
        print(f"pushed index {i['digest']}  ({', '.join(m['platform'] for m in i['manifests'])})")


def _summary_text(rows: list[dict[str, Any]], failed: list[dict[str, Any]], seconds: float) -> None:
    if len(rows) + len(failed) == 1 and rows:
        r = rows[0]
        how = "assembled, nothing ran" if r["assembled"] else f"{r['cached_steps']}/{r['steps']} steps cached"
        print(built_line(r["tag"], r["id"], r["size_bytes"], r["provider"], r["seconds"], how))
        if r["digest"]:
            print(f"pushed {r['digest']}")
        return
    from rich.table import Table

    table = Table(title=f"{len(rows)} built, {len(failed)} failed, {seconds:.1f}s")
    for col in ("provider", "platform", "tag", "image", "size", "onnxruntime", "seconds", "result"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(escape(c) for c in (r["provider"], r["platform"] or "", r["tag"], r["id"][7:19],
                                             f"{r['size_bytes'] / 1e6:.0f} MB", r["onnxruntime"] or "",
                                             f"{r['seconds']:.1f}", "ok")))  # fmt: skip
    for f in failed:
        table.add_row(escape(f["provider"]), "", "", "", "", "", "", escape(f"failed: {f['error'][:100]}"))
    _console().print(table)
    for r in rows:
        if r["digest"]:
            print(f"pushed {r['digest']}")


@app.command("plan")
def plan_cmd(
    path: Path = PathArg,
    provider: Optional[str] = ProviderOpt,
    tag: Optional[str] = typer.Option(None, "--tag", "-t", help="The tag to plan for."),
    base_image: Optional[str] = BaseOpt,
    platform: Optional[str] = PlatformOpt,
    warmup: Optional[str] = WarmupOpt,
    offline: bool = typer.Option(False, "--offline", help="Use only cached locks; never the network."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
    contained: bool = ContainedOpt,
    strict: bool = StrictOpt,
) -> None:
    """Every decision a build would make (provider and why, base image and its facts, Python,
    the lock with download sizes, tag, warmup, runtime base reuse), downloading no wheel and
    building nothing."""
    from gpux_pack import wheels
    from gpux_pack.commands import build

    options = _options(tag, base_image, platform, warmup)
    ui = Reporter(quiet=True)
    loaded, decision, client = build.start(path, provider, tag, engine.try_connect, ui, contained, strict, warn=False)
    host = engine.host_info(client) if client is not None else None
    out = []
    for name in decision.providers:
        plan = build.locked(build.plan_for(loaded, name, decision.reason, options, client, ui, pull=False), ui,
                            client=client, offline=offline)  # fmt: skip
        lock = plan.lock
        known = wheels.sizes(lock, offline=offline)
        pins = [{"name": p.name, "version": p.version, "size_bytes": known[p.name][0], "cached": known[p.name][1]}
                for p in lock.pins]  # fmt: skip
        note = host.plugin_refusal(plan.provider, loaded.project.config.pack.openvino.device) if host else ""
        out.append({
            "provider": plan.provider.name, "reason": plan.reason, "tag": plan.tag,
            "base_image": {"image": plan.base.image, "python": plan.base.python, "platform": plan.platform,
                           "arch": plan.base.arch, "glibc": ".".join(map(str, plan.base.glibc)),
                           "inspected": plan.base.probed, "interpreter": plan.runtime_base.config.python},
            "python": plan.base.python, "warmup": plan.warmup, "link_check": plan.link_check,
            "runtime_base": {"tag": plan.runtime_base.tag, "present": plan.runtime_base_present},
            "onnxruntime": lock.version_of(plan.provider.ort),
            "lock": pins,
            "download_bytes": sum(p["size_bytes"] or 0 for p in pins if not p["cached"]),
            "download_unknown": [p["name"] for p in pins if not p["cached"] and p["size_bytes"] is None],
            "cached_bytes": sum(p["size_bytes"] or 0 for p in pins if p["cached"]),
            "notes": [*plan.notes, *([f"{note}; an image started on this host serves on the CPU provider"] if note else [])],
        })  # fmt: skip
    if json_out:
        print(json.dumps({"plans": out}, indent=2))
        return
    for r in out:
        base = r["base_image"]
        facts = f"Python {base['python']}, glibc {base['glibc']}, {base['arch']}"
        print(f"{_printable(r['provider'])}: {_printable(r['reason'])}")
        print(f"  tag           {_printable(r['tag'])}")
        print(f"  base image    {_printable(base['image'])} ({facts}{'' if base['inspected'] else '; assumed, not inspected'})")
        print(f"  warmup        {r['warmup']}   link check: {r['link_check']}")
        for note in r["notes"]:
            print(f"  note          {_printable(note)}")
        state = "present: only the model is built" if r["runtime_base"]["present"] else "built on the first build"
        print(f"  runtime base  {_printable(r['runtime_base']['tag'])} ({state})")
        unknown = f", {len(r['download_unknown'])} of unknown size" if r["download_unknown"] else ""
        print(f"  lock          {len(r['lock'])} packages, {r['download_bytes'] / 1e6:.1f} MB to download{unknown}, "
              f"{r['cached_bytes'] / 1e6:.1f} MB cached")  # fmt: skip
        for p in r["lock"]:
            size = "?" if p["size_bytes"] is None else f"{p['size_bytes'] / 1e6:.1f} MB"
            print(f"    {p['name'] + '==' + p['version']:<42} {size:>10}  {'cached' if p['cached'] else 'to download'}")


@app.command("bench")
def bench_cmd(
    target: str = typer.Argument(..., help="An image built by gpux-pack, or a project folder / gpux.yml to build."),
    provider: Optional[str] = ProviderOpt,
    tag: Optional[str] = typer.Option(None, "--tag", "-t", help="Tags of the images built from a project ({provider})."),
    base_image: Optional[str] = BaseOpt,
    runs: int = typer.Option(200, "--runs", min=10, max=100000, help="Timed runs, in the container and over HTTP."),
    concurrency: int = typer.Option(1, "--concurrency", "-c", min=1, max=256, help="Concurrent HTTP clients."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Start each provider's image, warm it, and compare: session.run inside the container, and
    end-to-end KServe v2 latency (p50/p99) and throughput from this host."""
    from gpux_pack.commands import bench, build

    ui = Reporter(quiet=json_out)
    client = engine.connect()
    if Path(target).exists():
        options = _options(tag, base_image, None, None)
        loaded, decision, _ = build.start(Path(target), provider, tag, lambda: client, ui)
        if tag and len(decision.providers) > 1 and "{provider}" not in tag:
            raise typer.BadParameter("several providers need {provider} in the tag", param_hint="--tag")
        made, failures, _ = build.build_each(loaded, decision, [options], client, ui, _failed)
        if failures:
            raise typer.Exit(max(e.exit_code for _, e in failures))
        images = [m.built.tag for m in made]
    else:
        if provider:
            raise typer.BadParameter("--provider picks what to build from a project folder", param_hint="--provider")
        images = [target]
    results = [bench.bench(client, image, ui, runs, concurrency).row() for image in images]
    if json_out:
        print(json.dumps({"results": results}, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"{runs} runs, concurrency {concurrency}")
    for col in ("provider", "active", "model p50", "model p99", "HTTP p50", "HTTP p99", "req/s", "image"):
        table.add_column(col)
    for r in results:
        table.add_row(*(escape(str(c)) for c in (
            r["provider"], r["active"][0], f"{r['model_p50_ms']:.3f} ms", f"{r['model_p99_ms']:.3f} ms",
            f"{r['http_p50_ms']:.3f} ms", f"{r['http_p99_ms']:.3f} ms", f"{r['throughput_rps']:.0f}", r["image"])))
    _console().print(table)


@app.command("push")
def push_cmd(
    images: list[str] = typer.Argument(..., help="Images to push (name:tag, as built)."),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    json_out: bool = typer.Option(False, "--json", help="One JSON summary on stdout; logs on stderr."),
) -> None:
    """Push images with the credentials of your Docker config (docker login, credential helpers);
    print each pushed digest (name@sha256:...)."""
    from gpux_pack.registry.push import push

    ui = Reporter(quiet=quiet or json_out)
    client = engine.connect()
    done = [push(client, ref, ui) for ref in images]
    if json_out:
        print(json.dumps({"images": [{"tag": p.tag, "digest": p.digest, "size_bytes": p.size,
                                      "seconds": round(p.seconds, 2)} for p in done]}, indent=2))  # fmt: skip
        return
    for p in done:
        print(f"pushed {p.digest}")


@app.command("deploy")
def deploy_cmd(
    image: str = typer.Argument(..., help="A pushed image: local with a registry digest, or only in its registry "
                                "(registry/name:tag or registry/name@sha256:..., read with your Docker credentials)."),
    target: str = typer.Option(..., "--target", help="compose, kubernetes or kserve (one manifest set each)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Folder to write to (default: stdout)."),
    replicas: int = typer.Option(1, "--replicas", help="Replicas to run (the least, with --max-replicas)."),
    max_replicas: Optional[int] = typer.Option(None, "--max-replicas", help="Autoscale on cpu up to this many "
                                               "(kubernetes: an HPA; kserve: KServe's; default: --replicas)."),
    cpu: Optional[str] = typer.Option(None, "--cpu", help="CPUs each replica requests and may use, a Kubernetes "
                                      "quantity (default: 2 for a CPU provider, else 1)."),
    memory: Optional[str] = typer.Option(None, "--memory", help="Memory each replica requests and may use, a Kubernetes "
                                         "quantity (default: from the model's size)."),
    cache_claim: Optional[str] = typer.Option(None, "--cache-claim", help="Share compiled caches: mount this "
                                              "ReadWriteMany PersistentVolumeClaim at GPUX_CACHE_DIR (and write it)."),
    cache_size: Optional[str] = typer.Option(None, "--cache-size", help="The claim's size (default 10Gi)."),
) -> None:
    """Manifests that run the image pinned by digest, with its device, probes, a locked-down pod,
    resources sized for its model and, when asked, replicas that scale and share a cache."""
    from gpux_pack.commands import deploy

    if target not in deploy.TARGETS:
        raise typer.BadParameter(f"{target!r}: expected one of {', '.join(deploy.TARGETS)}", param_hint="--target")
    scaling = deploy.scaling(replicas, max_replicas, cpu, memory, cache_claim, cache_size)
    files = deploy.manifests(deploy.subject(engine.try_connect(), image), target, scaling)
    written = deploy.write(files, output)
    if written:
        for path in written:
            print(path)
        return
    print("---\n".join(files.values()), end="")


@app.command("run")
def run_cmd(
    image: str = typer.Argument(..., help="An image built by gpux-pack (name:tag or id)."),
    port: Optional[int] = typer.Option(None, "--port", "-p", min=1, max=65535, help="Host port (default: a free one)."),
    bind: str = typer.Option("127.0.0.1", "--bind", help="Host address to publish on (0.0.0.0: every interface)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Leave it running; print its URL, then its id."),
    cpu_fallback: bool = typer.Option(False, "--cpu-fallback", help="Serve on CPU when this host lacks the device."),
    timeout: int = typer.Option(300, "--timeout", min=1, max=86400, help="Seconds to wait for readiness."),
    pull: str = PullOpt,
) -> None:
    """Start an image with its provider's device flags, a read-only root, a tmpfs /tmp and a
    cache volume; wait until it is ready and print its URL (Ctrl-C stops it: drained, removed).
    An image only in its registry is pulled first, as docker run does (--pull)."""
    from gpux_pack.commands.run import start

    ui = Reporter(quiet=detach)
    client = engine.connect()
    engine.ensure_image(client, image, _pull(pull), ui.info)
    started = start(client, image, ui, port=port, bind=bind, cpu_fallback=cpu_fallback, timeout=timeout)
    note = " (on CPU: --cpu-fallback)" if started.on_cpu else ""
    print(f"{started.url}  {started.provider}{note}  cache volume {started.volume}", flush=True)
    if detach:
        print(started.container.id)
        return
    try:
        for chunk in started.container.logs(stream=True, follow=True, since=int(time.time())):
            sys.stderr.write(chunk.decode(errors="replace"))
    except KeyboardInterrupt:
        print("stopping (in-flight requests drain)", file=sys.stderr)
    finally:
        try:
            started.container.stop(timeout=15)
        finally:
            engine.remove_container(started.container)


@app.command("warmup")
def warmup_cmd(
    image: str = typer.Argument(..., help="An image built by gpux-pack (name:tag or id)."),
    tag: Optional[str] = typer.Option(None, "--tag", "-t", help="The warmed image's tag ({short}: the key's short "
                                      "name). Default: <tag>-warm-{short}."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPUs for the warmup container: all or a count "
                                       "(default: the provider's, all for cuda/tensorrt)."),
    device: list[str] = typer.Option([], "--device", help="A device for the warmup container (repeatable; "
                                     "default for rocm/migraphx: /dev/kfd and /dev/dri)."),
    export: Optional[Path] = typer.Option(None, "--export", help="Write the cache into DIR/<key>/ (mount DIR at "
                                          "GPUX_CACHE_DIR) instead of making an image."),
    timeout: int = typer.Option(3600, "--timeout", min=1, max=86400, help="Seconds the warmup may take."),
    pull: str = PullOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    json_out: bool = typer.Option(False, "--json", help="One JSON summary on stdout; logs on stderr."),
) -> None:
    """Compile the image's provider caches on this machine (its accelerator) and bake them into
    a derived image (+1 layer, same config, io.gpux.warmup=baked) or export them for a volume."""
    from gpux_pack.commands.warmup import warm_image
    from gpux_pack.engine import image_labels

    if tag is not None:
        try:
            parse_reference(tag.replace("{short}", "x"))
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--tag") from None
    if tag is not None and export is not None:
        raise typer.BadParameter("--tag makes an image, --export a folder: choose one", param_hint="--export")
    ui = Reporter(quiet=quiet or json_out)
    client = engine.connect()
    engine.ensure_image(client, image, _pull(pull), ui.info)
    row = providers.PROVIDERS.get(image_labels.read(client, image).provider)
    devices = providers.devices_for(row, gpus, tuple(device))
    warmed = warm_image(client, image, ui, tag=tag, devices=devices, export=export, timeout=timeout)
    state = warmed.state
    summary = {
        "image": image, "tag": warmed.tag, "id": warmed.id, "exported": str(warmed.exported) if warmed.exported else None,
        "key": warmed.key, "short": warmed.short, "cache": state.get("cache"), "assembled": warmed.assembled,
        "device": (warmed.record.get("parts") or {}).get("device"), "warmup_seconds": state.get("seconds"),
        "partition": state.get("partition"), "accuracy": state.get("accuracy"), "seconds": round(warmed.seconds, 2),
    }  # fmt: skip
    if json_out:
        print(json.dumps(summary, indent=2))
    elif warmed.exported:
        print(f"exported {warmed.exported}  key {warmed.key}  ({summary['device']})")
    else:
        print(f"warmed {warmed.tag}  {(warmed.id or '')[7:19]}  key {warmed.key}  "
              f"({summary['device'] or 'already warm'})")  # fmt: skip


@app.command("serve")
def serve_cmd(
    path: Path = PathArg,
    provider: Optional[str] = typer.Option(None, "--provider", "-p", help="The provider to serve with (default: "
                                           "gpux.yml's, else the first accelerator this machine's onnxruntime offers)."),
    host: Optional[str] = typer.Option(None, "--host", help="Address to listen on (default: serving.host when "
                                       "gpux.yml sets it, else 127.0.0.1; 0.0.0.0: every interface)."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="Port (default: serving.port)."),
) -> None:
    """Serve the model on this machine, without Docker: the image's runtime and endpoints, this
    machine's onnxruntime; reloads when gpux.yml or the model changes (Ctrl-C stops)."""
    import ipaddress

    from gpux_pack.commands.serve import serve

    try:
        if host is not None:
            ipaddress.ip_address(host)
    except ValueError:
        raise typer.BadParameter(f"{host!r}: expected an IP address such as 127.0.0.1 or 0.0.0.0",
                                 param_hint="--host") from None  # fmt: skip
    code = serve(path, provider, host, port, Reporter())
    if code:
        raise typer.Exit(code)


@app.command("predict")
def predict_cmd(
    target: str = typer.Argument(..., help="An image built by gpux-pack, or a project folder / gpux.yml."),
    inputs: list[str] = typer.Option([], "--input", "-i", help="NAME=FILE.npy, NAME=FILE.json, NAME=[values], "
                                     "FILE.json or @FILE.json holding {NAME: values}, or that object inline "
                                     "(repeatable)."),
    files: list[Path] = typer.Option([], "--file", "-f", help="A JSON file holding {NAME: values} (GPUX's -f)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Save the outputs: FILE.json, or a folder "
                                          "of NAME.npy files (default: print JSON)."),
    provider: Optional[str] = typer.Option(None, "--provider", "-p", help="For a project: the provider to run with."),
    timeout: int = typer.Option(300, "--timeout", min=1, max=86400, help="Seconds for a fresh container to be "
                                "ready, and for the answer."),
    cpu_fallback: bool = typer.Option(False, "--cpu-fallback", help="For an image: serve on CPU when this host "
                                      "lacks its device."),
    benchmark: bool = typer.Option(False, "--benchmark", help="For a project: time the model in this process "
                                   "(GPUX's run --benchmark): mean, std, min, max, median, p95, p99, throughput."),
    runs: int = typer.Option(100, "--runs", min=1, max=100000, help="With --benchmark: timed runs."),
    warmup: int = typer.Option(10, "--warmup", min=0, max=10000, help="With --benchmark: untimed runs first."),
    json_out: bool = typer.Option(False, "--json", help="With --benchmark: one JSON document on stdout."),
    pull: str = PullOpt,
) -> None:
    """One inference: in this process for a project, over KServe v2 for an image (a running
    container of it, else a fresh one, removed after). --benchmark: GPUX's in-process timing."""
    try:
        from gpux_pack.commands import predict
        from gpux_pack.runtime.tensors import dumps, to_json
    except ImportError as e:
        raise UsageError(f"predict needs the image runtime's libraries here ({e.name} is missing): pip install "
                         "'gpux-pack[serve]'") from None  # fmt: skip

    given = predict.read_inputs([*inputs, *(f"@{f}" for f in files)])
    ui = Reporter()
    if benchmark:
        if not Path(target).exists():
            raise UsageError(f"{target}: --benchmark times a project's model in this process; for an image, "
                             "gpux-pack bench IMAGE")  # fmt: skip
        _benchmark(predict.benchmark(Path(target), provider, given, runs, warmup, ui), json_out)
        return
    if not given:
        raise typer.BadParameter("give the model's inputs (NAME=FILE, FILE.json or inline JSON)", param_hint="--input")
    if Path(target).exists():
        outputs = predict.in_process(Path(target), provider, given, ui)
    elif target.startswith(("/", "./", "../", "~")) or target.endswith((".yml", ".yaml")):
        raise UsageError(f"{target}: no such file or folder")
    else:
        if provider:
            raise typer.BadParameter("an image serves with its own provider", param_hint="--provider")
        outputs = predict.from_image(target, given, ui, timeout, cpu_fallback, _pull(pull))
    written = predict.save(outputs, output)
    if written:
        for path in written:
            print(path)
        return
    sys.stdout.write(dumps(to_json(outputs)).decode() + "\n")


def _benchmark(result: dict[str, Any], json_out: bool) -> None:
    if json_out:
        print(json.dumps(result, indent=2))
        return
    print(_printable(f"{result['runs']} runs after {result['warmup']} warmup runs on {result['provider']} "
                     f"({result['reason']})"))  # fmt: skip
    for key, value in result.items():
        if key.endswith("_time_ms"):
            print(f"  {key[:-8]:<10} {value:>12.4f} ms")
    print(f"  {'throughput':<10} {result['throughput_fps']:>12.2f} runs/s")


@app.command("init")
def init_cmd(
    model: Path = typer.Argument(..., help="The .onnx model."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Where to write gpux.yml (a folder or a "
                                          "file; default: beside the model)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing gpux.yml."),
) -> None:
    """Write a gpux.yml whose inputs and outputs come from the model's graph."""
    from gpux_pack.commands.init import init

    written = init(model, output, force)
    print(f"wrote {written}; build it with: gpux-pack build {shlex.quote(str(written.parent))}")


cache_app = typer.Typer(help="The wheel, lock, install and base-image caches (~/.cache/gpux-pack).",
                        no_args_is_help=True)  # fmt: skip
app.add_typer(cache_app, name="cache")


@cache_app.command("ls")
def cache_ls(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """What each cache holds: entries, bytes, the oldest and newest use, and what killed builds left."""
    from gpux_pack.commands import cache

    rows = [e.summary() for e in cache.kinds()]
    if json_out:
        print(json.dumps({"root": str(cache.root()), "caches": rows}, indent=2))
        return
    print(f"{cache.root()}")
    for r in rows:
        left = f"  (+{r['leftovers']} left by killed builds, {r['leftover_bytes'] / 1e6:.1f} MB)" if r["leftovers"] else ""
        print(f"  {r['name']:<8} {r['entries']:>6} entries  {r['bytes'] / 1e6:>10.1f} MB  {r['what']}{left}")


@cache_app.command("prune")
def cache_prune(
    older_than: str = typer.Option("30d", "--older-than", help="Remove entries unused for this long: 30d, 12h, 0s (all)."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Remove cache entries not used for --older-than (by their last modification), and whatever
    killed builds left, at any age."""
    from gpux_pack.commands import cache

    seconds = cache.parse_age(older_than)
    removed = cache.prune(seconds)
    total = sum(b for _, b in removed)
    if json_out:
        print(json.dumps({"removed": [{"path": str(p), "bytes": b} for p, b in removed], "bytes": total}, indent=2))
        return
    print(f"removed {len(removed)} entries, {total / 1e6:.1f} MB")


@app.command("render")
def render_cmd(
    path: Path = PathArg,
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write the Dockerfile and build context to."),
    provider: Optional[str] = ProviderOpt,
    tag: Optional[str] = typer.Option(None, "--tag", "-t", help="Image reference written into the Dockerfile's comment."),
    base_image: Optional[str] = BaseOpt,
    platform: Optional[str] = PlatformOpt,
    warmup: Optional[str] = WarmupOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    refresh: bool = RefreshOpt,
    contained: bool = ContainedOpt,
    strict: bool = StrictOpt,
) -> None:
    """Write the Dockerfile and the whole build context; `docker build DIR` gives the same image."""
    from gpux_pack.commands import build
    from gpux_pack.image.context import write

    ui = Reporter(quiet=quiet)
    options = _options(tag, base_image, platform, warmup)
    if options.warmup == "always":
        raise typer.BadParameter("a baked warmup needs `gpux-pack build`", param_hint="--warmup")
    loaded, decision, client = build.start(path, provider, tag, engine.try_connect, ui, contained, strict)
    if len(decision.providers) > 1:
        raise typer.BadParameter("render writes one context: give one provider", param_hint="--provider")
    prepared = build.prepare(loaded, decision.providers[0], decision.reason, options, client, ui, pull=False,
                             refresh=refresh, self_contained=True)
    write(prepared.context, output)
    print(f"wrote {output}/Dockerfile and its context ({prepared.context.size_bytes / 1e6:.0f} MB); "
          f"build it with: docker build -t {prepared.plan.tag} {output}")


@app.command("providers")
def providers_cmd(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """The execution providers, their packages and base images, and what this Docker host can run."""
    client = engine.try_connect()
    host = engine.host_info(client) if client is not None else None
    rows = []
    for p in providers.PROVIDERS.values():
        ok, why = (None, "Docker engine not reachable") if host is None else host.can_run(p)
        rows.append({
            "name": p.name, "title": p.title, "base_image": p.base_image,
            "package": p.pip_requirement + (f" + {p.extra_requirements[0]}" if p.plugin else ""),  # the plugin EP's
            "vendor_base_image": p.bases["vendor"].image if "vendor" in p.bases else None,
            "python": p.bases["default"].python, "execution_providers": list(p.execution_providers),
            "platforms": list(p.platforms), "docker_run": p.run_flags, "cuda12": _cuda12(p.name),
            "host_can_run": ok, "why": why,
        })  # fmt: skip
    if json_out:
        print(json.dumps({"host": host.details if host else None, "providers": rows}, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"Docker host: {host.details if host else 'not reachable'}")
    for col in ("provider", "ONNX Runtime package", "default base image", "runs here", "why"):
        table.add_column(col)
    for r in rows:
        runs = "?" if r["host_can_run"] is None else ("yes" if r["host_can_run"] else "no")
        table.add_row(*(escape(str(c)) for c in (r["name"], r["package"], r["base_image"], runs, r["why"])))
    _console().print(table)


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _console():
    """stdout; as wide as the terminal, or 160 columns in logs and pipes."""
    from rich.console import Console

    console = Console(soft_wrap=True)
    return console if console.is_terminal else Console(width=160)


def _cuda12(name: str) -> str | None:
    return providers.get(name, cuda="12").pip_requirement if name in providers.CUDA12 else None


base_app = typer.Typer(help="Runtime base images: a provider's wheels and runtime, without a model.",
                       no_args_is_help=True, rich_markup_mode=None)
app.add_typer(base_app, name="base")
BaseProviderOpt = typer.Option(..., "--provider", "-p", help=f"{', '.join(providers.PROVIDERS)}.")
CudaOpt = typer.Option("13", "--cuda", help="CUDA major version for cuda/tensorrt: 13 or 12.")
NvidiaLibsOpt = typer.Option(None, "--nvidia-libs", help="wheels | base: where CUDA/cuDNN come from.")
LinkCheckOpt = typer.Option(True, "--link-check/--no-link-check", help="Check the provider's libraries at build time.")


def _prepare_runtime_base(provider, cuda, base_image, platform, nvidia_libs, link_check, client, ui, refresh):
    from gpux_pack.commands.build import prepare_runtime_base

    names = providers.parse_provider_list(provider)
    if len(names) != 1 or names[0] == "auto":
        raise typer.BadParameter("a runtime base image is for one provider: name one (not auto)", param_hint="--provider")
    name = names[0]
    if cuda not in ("12", "13"):
        raise typer.BadParameter(f"'{cuda}' is not 13 or 12", param_hint="--cuda")
    if nvidia_libs not in (None, "wheels", "base"):
        raise typer.BadParameter(f"'{nvidia_libs}' is not wheels or base", param_hint="--nvidia-libs")
    return prepare_runtime_base(name, cuda, base_image, platform, nvidia_libs, link_check, client, ui,
                                pull=client is not None, refresh=refresh)


@base_app.command("build")
def base_build(
    provider: str = BaseProviderOpt,
    base_image: Optional[str] = BaseOpt,
    platform: Optional[str] = PlatformOpt,
    cuda: str = CudaOpt,
    nvidia_libs: Optional[str] = NvidiaLibsOpt,
    link_check: bool = LinkCheckOpt,
    no_cache: bool = typer.Option(False, "--no-cache"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    json_out: bool = typer.Option(False, "--json"),
    refresh: bool = RefreshOpt,
) -> None:
    """Build a provider's runtime base image; `build` then adds only the model on top of it."""
    from gpux_pack.commands.build import make_runtime_base

    ui = Reporter(quiet=quiet)
    _options(None, base_image, platform, None)
    client = engine.connect()
    runtime_base, context = _prepare_runtime_base(provider, cuda, base_image, platform, nvidia_libs, link_check,
                                                  client, ui, refresh)  # fmt: skip
    built = make_runtime_base(client, runtime_base, context, ui, no_cache=no_cache)
    if json_out:
        print(json.dumps({"tag": built.tag, "id": built.id, "size_bytes": built.size_bytes,
                          "provider": runtime_base.provider.name, "seconds": round(built.seconds, 2)}, indent=2))
    else:
        print(f"built {built.tag}  {built.id[7:19]}  {built.size_bytes / 1e6:.0f} MB  {built.seconds:.1f}s")


@base_app.command("render")
def base_render(
    provider: str = BaseProviderOpt,
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write the Dockerfile and context to."),
    base_image: Optional[str] = BaseOpt,
    platform: Optional[str] = PlatformOpt,
    cuda: str = CudaOpt,
    nvidia_libs: Optional[str] = NvidiaLibsOpt,
    link_check: bool = LinkCheckOpt,
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    refresh: bool = RefreshOpt,
) -> None:
    """Write a runtime base image's Dockerfile and context."""
    from gpux_pack.image.context import write

    ui = Reporter(quiet=quiet)
    _options(None, base_image, platform, None)
    runtime_base, context = _prepare_runtime_base(provider, cuda, base_image, platform, nvidia_libs, link_check,
                                                  engine.try_connect(), ui, refresh)  # fmt: skip
    write(context, output)
    print(f"wrote {output}/Dockerfile; build it with: docker build -t {runtime_base.tag} {output}")


@app.command("inspect")
def inspect_cmd(
    image: str = typer.Argument(..., help="Image reference or id (one only in its registry is read from there); "
                                "or a project folder, gpux.yml or .onnx file."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The gpux labels of a built image (on this engine, else in the registry its name gives); for
    a project or a model file, its inputs, outputs, opsets and size, without Docker."""
    from gpux_pack.registry import remote

    if Path(image).exists():
        from gpux_pack.commands import inspect

        info = inspect.of_path(Path(image))
        print(json.dumps(info, indent=2) if json_out else "\n".join(_printable(line) for line in inspect.lines(info)))
        return

    found = remote.read(engine.try_connect(), image, built_by_us=False)
    info = {"image": image, "id": found.id, "size_bytes": found.size_bytes, "labels": found.shown,
            "registry_digest": found.pinned}  # fmt: skip
    if json_out:
        print(json.dumps(info, indent=2))
        return
    where = f" (in its registry, compressed: {found.pinned})" if found.pinned else ""
    print(f"{info['image']}  {info['id']}  {(info['size_bytes'] or 0) / 1e6:.0f} MB{where}")
    for key, value in info["labels"].items():
        print(f"  {key}: {value}")


@app.command("schema")
def schema_cmd(
    of: str = typer.Option("gpux.yml", "--of", help="gpux.yml, or build-summary (what build --json prints)."),
) -> None:
    """Print the JSON Schema of gpux.yml (for editors and linters) or of build --json."""
    if of == "build-summary":
        from gpux_pack.commands import summary

        print(json.dumps(summary.json_schema(), indent=2))
        return
    if of != "gpux.yml":
        raise typer.BadParameter(f"{of!r}: expected gpux.yml or build-summary", param_hint="--of")
    from gpux_pack.project.config import json_schema

    print(json.dumps(json_schema(), indent=2))


def _print_error(e: PackError, prefix: str = "") -> None:
    """One line; a failed build adds the end of the failing step's output. A user's value with
    a line break in it never splits the line."""
    text = str(e) if isinstance(e, BuildError) else " ".join(str(e).splitlines())
    print("\n".join(_printable(line) for line in f"error: {prefix}{text}".split("\n")), file=sys.stderr)
    if isinstance(e, BuildError) and e.log_tail:
        print("last lines of its output:", file=sys.stderr)
        for line in e.log_tail:
            print(f"  | {_printable(line)}", file=sys.stderr)


def _printable(line: str) -> str:
    """Control characters (a NUL in a user's value, a terminal escape) shown escaped."""
    return line if line.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in line)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that cleanups (temporary cache entries,
    containers) run as they do for Ctrl-C."""


_STOPPED: list[int] = []  # the signal that stopped the command (typer turns the exception into exit 130)


def _stop(signum: int, frame: Any) -> None:
    _STOPPED.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; every failure ends as one line on stderr and an exit code."""
    err = sys.stderr
    _STOPPED.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _stop)
    try:
        code = app(args=argv, standalone_mode=False, prog_name="gpux-pack")
        if _STOPPED and code == 130:  # typer's answer to the interrupt: say which
            raise KeyboardInterrupt
    except PackError as e:
        _print_error(e)
        sys.exit(e.exit_code)
    except click_errors.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError" and e.ctx is not None:
            print(e.ctx.get_help(), file=err)
            sys.exit(2)
        hint = f" (see: {e.ctx.command_path} --help)" if e.ctx else ""
        print(f"error: {e.format_message()}{hint}", file=err)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        if _STOPPED and _STOPPED[0] == signal.SIGTERM:
            print("terminated", file=err)
            sys.exit(143)
        print("interrupted", file=err)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)  # click returns typer.Exit's code here


if __name__ == "__main__":
    main()
