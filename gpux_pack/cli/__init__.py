"""`gpux-pack`: build, bench, push, deploy, plan, run, serve, predict, init, warmup, render, providers, inspect, schema, cache. Errors are caught here, once.

Exit codes: 0 ok; 1 build or Docker failure; 2 usage, config or model error.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import typer

try:  # typer >= 0.29 vendors click
    from typer._click import exceptions as click_errors
    from typer._click.core import Context as ClickContext
except ImportError:  # pragma: no cover - older typer on real click
    from click import Context as ClickContext
    from click import exceptions as click_errors

from gpux_pack import __version__, engine
from gpux_pack.cli import flags, printing
from gpux_pack.cli.flags import (BaseOpt, ContainedOpt, JsonOpt, OptimizeOpt, PathArg, PlatformOpt, ProviderOpt,
                                 PullOpt, QuietOpt, RefreshOpt, StrictOpt, WarmupOpt)
from gpux_pack.cli.maintenance import base_app, cache_app
from gpux_pack.errors import PackError
from gpux_pack.project import prechecks
from gpux_pack.ui import Reporter, printable

app = typer.Typer(
    name="gpux-pack",
    help="Turn an ONNX model and its gpux.yml into a production container image.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(cache_app, name="cache")
app.add_typer(base_app, name="base")



def _version(value: bool) -> None:
    if value:
        print(f"gpux-pack {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    pass


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
    quiet: bool = QuietOpt,
    json_out: bool = JsonOpt,
    refresh: bool = RefreshOpt,
    push_: bool = typer.Option(False, "--push", help="Push every image built, with its SBOM and provenance "
                               "attached; their digests go in the summary."),
    sbom: Optional[Path] = typer.Option(None, "--sbom", help="Write each image's CycloneDX SBOM into DIR "
                                        "(<tag>.cdx.json)."),
    sign_key: Optional[Path] = typer.Option(None, "--sign-key", help="With --push: sign each pushed image with "
                                            "this PEM EC P-256 key, in cosign's format."),
    sign_model: Optional[Path] = typer.Option(None, "--sign-model", help="Sign the model files with this PEM EC "
                                              "P-256 key (OpenSSF model signing); the image can check them "
                                              "before loading (pack.verify_model, GPUX_VERIFY_MODEL=1)."),
    contained: bool = ContainedOpt,
    strict: bool = StrictOpt,
    optimize: Optional[str] = OptimizeOpt,
) -> None:
    """Build the model's image(s) through the Docker engine."""
    from gpux_pack.commands import build

    request = build_request(dict(path=path, provider=provider, tag=tag, base_image=base_image, platform=platform,
                                 warmup=warmup, no_cache=no_cache, quiet=quiet, json_out=json_out, refresh=refresh,
                                 push_=push_, sbom=sbom, sign_key=sign_key, sign_model=sign_model,
                                 contained=contained, strict=strict, optimize=optimize))

    ui = Reporter(quiet=quiet)  # logs go to stderr in every mode; --json owns stdout
    platforms, bases = build.platforms(platform, base_image, push_)
    options = replace(flags.options(tag, bases.get(None), platforms[0], warmup), sign_model=sign_model,
                      optimize=flags.optimize_steps(optimize))
    for name in platforms[1:] if platforms[0] else ():
        flags.options(tag, bases.get(name), name, warmup)  # every platform's base is valid before anything runs
    if sign_key is not None and not push_:
        raise typer.BadParameter("signing needs --push (a signature names the pushed digest)", param_hint="--sign-key")
    outcome = build.build(path, provider, tag, options, platforms, bases, ui, printing.failed, no_cache=no_cache,
                          refresh=refresh, push=push_, contained=contained, strict=strict, sign_key=sign_key)
    if sbom is not None:
        for written in build.write_sboms(outcome, sbom):
            ui.info(f"wrote {written}")
    doc = build.summary(outcome)
    if json_out:
        print(json.dumps(doc.model_dump(mode="json"), indent=2))
    else:
        before, table, after = build.summary_report(doc)
        printing.lines(before, table, after)
    if outcome.failures:
        raise typer.Exit(max(e.exit_code for _, e in outcome.failures))
    build.record(request, outcome)


@app.command("plan")
def plan_cmd(
    path: Path = PathArg,
    provider: Optional[str] = ProviderOpt,
    tag: Optional[str] = typer.Option(None, "--tag", "-t", help="The tag to plan for."),
    base_image: Optional[str] = BaseOpt,
    platform: Optional[str] = PlatformOpt,
    warmup: Optional[str] = WarmupOpt,
    offline: bool = typer.Option(False, "--offline", help="Use only cached locks; never the network."),
    json_out: bool = JsonOpt,
    contained: bool = ContainedOpt,
    strict: bool = StrictOpt,
    optimize: Optional[str] = OptimizeOpt,
) -> None:
    """Every decision a build would make (provider and why, base image and its facts, Python,
    the lock with download sizes, tag, warmup, runtime base reuse, the model's optimisation),
    downloading no wheel and building nothing."""
    from gpux_pack.commands import plan

    options = replace(flags.options(tag, base_image, platform, warmup), optimize=flags.optimize_steps(optimize))
    rows = plan.plans(path, provider, tag, options, offline, contained, strict)
    print(json.dumps({"plans": rows}, indent=2) if json_out else "\n".join(printable(line) for line in plan.lines(rows)))


@app.command("bench")
def bench_cmd(
    target: str = typer.Argument(..., help="An image built by gpux-pack, or a project folder / gpux.yml to build."),
    provider: Optional[str] = ProviderOpt,
    tag: Optional[str] = typer.Option(None, "--tag", "-t", help="Tags of the images built from a project ({provider})."),
    base_image: Optional[str] = BaseOpt,
    runs: int = typer.Option(200, "--runs", min=10, max=100000, help="Timed runs, in the container and over HTTP."),
    concurrency: int = typer.Option(1, "--concurrency", "-c", min=1, max=256, help="Concurrent HTTP clients."),
    json_out: bool = JsonOpt,
) -> None:
    """Start each provider's image, warm it, and compare: session.run inside the container, and
    end-to-end KServe v2 latency (p50/p99) and throughput from this host."""
    from gpux_pack.commands import bench

    if provider and not Path(target).exists():
        raise typer.BadParameter("--provider picks what to build from a project folder", param_hint="--provider")
    options = flags.options(tag, base_image, None, None) if Path(target).exists() else None
    ui = Reporter(quiet=json_out)
    results, failures = bench.bench_target(engine.connect(), target, provider, tag, options, runs, concurrency, ui,
                                           printing.failed)
    if failures:
        raise typer.Exit(max(e.exit_code for _, e in failures))
    if json_out:
        print(json.dumps({"results": results}, indent=2))
    else:
        printing.lines([], bench.table(results, runs, concurrency))


@app.command("push")
def push_cmd(
    images: list[str] = typer.Argument(..., help="Images to push (name:tag, as built)."),
    quiet: bool = QuietOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Push images with the credentials of your Docker config (docker login, credential helpers),
    with the SBOM and provenance their builds recorded attached (OCI referrers); print each pushed
    digest (name@sha256:...)."""
    from gpux_pack.commands import push

    done = push.push_all(engine.connect(), images, Reporter(quiet=quiet or json_out))
    print(json.dumps(push.summary(done), indent=2) if json_out else "\n".join(push.lines(done)))


@app.command("sign")
def sign_cmd(
    image: str = typer.Argument(..., help="A pushed image (registry/name:tag or registry/name@sha256:...)."),
    key: Path = typer.Option(..., "--key", help="A PEM EC P-256 private key (GPUX_SIGN_PASSWORD if encrypted)."),
    quiet: bool = QuietOpt,
) -> None:
    """Sign a pushed image in cosign's key-based format (verifiable with `cosign verify --key`)."""
    from gpux_pack.commands import sign

    print(f"signed {sign.sign(engine.try_connect(), image, key, Reporter(quiet=quiet))}")


@app.command("verify")
def verify_cmd(
    image: str = typer.Argument(..., help="A pushed image (registry/name:tag or registry/name@sha256:...)."),
    key: Path = typer.Option(..., "--key", help="The PEM public key the image was signed with."),
    json_out: bool = JsonOpt,
) -> None:
    """Check an image's signature (cosign's format), and read every SBOM and provenance attached to
    it: each must name this image, its model and gpux-pack's build; exit 1 with one line naming
    what failed."""
    from gpux_pack.commands import verify

    done = verify.verify(engine.try_connect(), image, key)
    print(json.dumps(done.__dict__, indent=2) if json_out else "\n".join(verify.lines(done)))


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
    print("\n".join(map(str, written)) if written else "---\n".join(files.values()), end="\n" if written else "")


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
    from gpux_pack.commands import run

    ui, policy = Reporter(quiet=detach), flags.pull(pull)  # a bad flag is refused before Docker is reached
    started = run.run(engine.connect(), image, ui, policy, port, bind, cpu_fallback, timeout)
    print(run.started_line(started), flush=True)
    if detach:
        print(started.container.id)
        return
    run.follow(started)


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
    quiet: bool = QuietOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Compile the image's provider caches on this machine (its accelerator) and bake them into
    a derived image (+1 layer, same config, io.gpux.warmup=baked) or export them for a volume."""
    from gpux_pack.commands import warmup

    policy = flags.pull(pull)
    summary = warmup.warmup(engine.connect(), image, policy, tag, gpus, tuple(device), export, timeout,
                            Reporter(quiet=quiet or json_out))
    print(json.dumps(summary, indent=2) if json_out else warmup.line(summary))


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
    from gpux_pack.commands.serve import serve

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
    benchmark: bool = typer.Option(False, "--benchmark", help="For a project: time the model on this machine "
                                   "(GPUX's run --benchmark): mean, std, min, max, median, p95, p99, throughput."),
    runs: int = typer.Option(100, "--runs", min=1, max=100000, help="With --benchmark: timed runs."),
    warmup: int = typer.Option(10, "--warmup", min=0, max=10000, help="With --benchmark: untimed runs first."),
    json_out: bool = JsonOpt,
    pull: str = PullOpt,
) -> None:
    """One inference: the image's runtime on this machine for a project, over KServe v2 for an
    image (a running container of it, else a fresh one, removed after). --benchmark: GPUX's timing."""
    from gpux_pack.commands import predict
    from gpux_pack.inference import to_json

    given = predict.read_inputs([*inputs, *(f"@{f}" for f in files)])
    if benchmark:
        result = predict.benchmark(target, provider, given, runs, warmup, Reporter())
        print(json.dumps(result, indent=2) if json_out else "\n".join(map(printable, predict.benchmark_lines(result))))
        return
    outputs = predict.predict(target, provider, given, Reporter(), timeout, cpu_fallback, flags.pull(pull))
    written = predict.save(outputs, output)
    print("\n".join(map(str, written)) if written else json.dumps(to_json(outputs), separators=(",", ":"),
                                                                  ensure_ascii=False, allow_nan=False))


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


@app.command("render")
def render_cmd(
    path: Path = PathArg,
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write the Dockerfile and build context to."),
    provider: Optional[str] = ProviderOpt,
    tag: Optional[str] = typer.Option(None, "--tag", "-t", help="Image reference written into the Dockerfile's comment."),
    base_image: Optional[str] = BaseOpt,
    platform: Optional[str] = PlatformOpt,
    warmup: Optional[str] = WarmupOpt,
    quiet: bool = QuietOpt,
    refresh: bool = RefreshOpt,
    contained: bool = ContainedOpt,
    strict: bool = StrictOpt,
) -> None:
    """Write the Dockerfile and the whole build context; `docker build DIR` gives the same image."""
    from gpux_pack.commands import render

    options = flags.options(tag, base_image, platform, warmup)
    if options.warmup == "always":
        raise typer.BadParameter("a baked warmup needs `gpux-pack build`", param_hint="--warmup")
    print(render.render(path, output, provider, tag, options, Reporter(quiet=quiet), refresh, contained, strict))


@app.command("providers")
def providers_cmd(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """The execution providers, their packages and base images, and what this Docker host can run."""
    from gpux_pack.commands.providers import rows, table

    host, found = rows()
    if json_out:
        print(json.dumps({"host": host.details if host else None, "providers": found}, indent=2))
    else:
        printing.lines([], table(host, found))


@app.command("inspect")
def inspect_cmd(
    image: str = typer.Argument(..., help="Image reference or id (one only in its registry is read from there); "
                                "or a project folder, gpux.yml or .onnx file."),
    json_out: bool = JsonOpt,
) -> None:
    """The gpux labels of a built image (on this engine, else in the registry its name gives); for
    a project or a model file, its inputs, outputs, opsets and size, without Docker."""
    from gpux_pack.commands import inspect

    info = inspect.of_path(Path(image)) if Path(image).exists() else inspect.of_image(engine.try_connect(), image)
    print(json.dumps(info, indent=2) if json_out else "\n".join(printable(line) for line in inspect.lines(info)))


@app.command("schema")
def schema_cmd(
    of: str = typer.Option("gpux.yml", "--of", help="gpux.yml, build-summary (what build --json prints) or gpux.json "
                                                   "(what an image's runtime reads)."),
) -> None:
    """Print the JSON Schema of gpux.yml (for editors and linters), of build --json or of gpux.json."""
    if of == "build-summary":
        from gpux_pack.commands import build

        print(json.dumps(build.json_schema(), indent=2))
        return
    if of == "gpux.json":
        from gpux_pack.runtime import contract

        print(json.dumps(contract.schema(), indent=2))
        return
    if of != "gpux.yml":
        raise typer.BadParameter(f"{of!r}: expected gpux.yml, build-summary or gpux.json", param_hint="--of")
    from gpux_pack.project.config import json_schema

    print(json.dumps(json_schema(), indent=2))


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that cleanups (temporary cache entries,
    containers) run as they do for Ctrl-C."""


_STOPPED: list[int] = []  # the signal that stopped the command (typer turns the exception into exit 130)


def _stop(signum: int, frame: Any) -> None:
    _STOPPED.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def build_request(values: dict[str, Any]) -> Any:
    """The `build` command's parameters (typed by the command, or as its parser read them) as the
    model-only rebuild's key (rebuild.Request): paths as their text, absent options as their defaults."""
    from gpux_pack.pipeline import rebuild

    def text(value: Any) -> str | None:
        return None if value is None else str(Path(value))

    return rebuild.Request(
        text(values.get("path", ".")) or ".", values.get("provider"), values.get("tag"),
        tuple(values.get("base_image") or ()), values.get("platform"), values.get("warmup"),
        bool(values.get("no_cache")), bool(values.get("quiet")), bool(values.get("json_out")),
        bool(values.get("refresh")), bool(values.get("push_")), text(values.get("sbom")), text(values.get("sign_key")),
        text(values.get("sign_model")), bool(values.get("contained")), bool(values.get("strict")),
        values.get("optimize"))


def replayed(argv: list[str]) -> bool:
    """`build` asks the pipeline's model-only rebuild (pipeline/rebuild.py) first, with the command
    read by build's own parser but not yet converted: typer converts every value through pydantic,
    which costs more than the replay's work with the engine. Anything the parser refuses, or a
    build the rebuild does not replay, goes on to the full command (which reports the mistake)."""
    if argv[:1] != ["build"]:
        return False
    from gpux_pack.pipeline import rebuild

    group = typer.main.get_command(app)
    context = ClickContext(group, info_name="gpux-pack")
    command = group.get_command(context, "build")  # type: ignore[attr-defined]
    if command is None:
        return False
    try:
        values, rest, _ = command.make_parser(ClickContext(command, info_name="build", parent=context)).parse_args(
            args=argv[1:])
    except click_errors.ClickException:
        return False
    if rest or values.get("help"):
        return False
    return rebuild.replay(build_request(values))


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; every failure ends as one line on stderr and an exit code."""
    err = sys.stderr
    _STOPPED.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _stop)
    try:
        args = sys.argv[1:] if argv is None else argv
        if replayed(args):
            return
        if argv is None and args[:1] == ["build"]:  # a CLI process of its own: its model checks get onnx
            prechecks.start()  # imported in a second process meanwhile (killed at its exit)
        code = app(args=argv, standalone_mode=False, prog_name="gpux-pack")
        if _STOPPED and code == 130:  # typer's answer to the interrupt: say which
            raise KeyboardInterrupt
    except PackError as e:
        printing.error(e)
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
