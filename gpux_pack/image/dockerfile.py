"""Plan -> Dockerfile text, through the Jinja2 templates in templates/.

Three parts come from one template family: "runtime" (a provider's runtime base image: base,
installed packages, runtime), "model" (a model image on top of it: model, gpux.json) and
"image" (both in one self-contained Dockerfile, for `render`: the same layers).

Where text meets the Dockerfile, one rule: every value goes through the filter of its exact
context (`comment`, `image_ref`, `label_lines`), which validates or escapes it, and a finaliser
refuses any rendered value that could end a line, so no value can add an instruction."""

from __future__ import annotations

import json
import os

import re
import shlex
from functools import lru_cache
from typing import Any

import jinja2

from gpux_pack import __version__
from gpux_pack.image.layout import LAYERS, LINKCHECK, model_layers
from gpux_pack.plan import PYTHON, ImageConfig, Plan, RuntimeBase
from gpux_pack.runtime.contract import APP_DIR, SITE
from gpux_pack.providers import Provider
from gpux_pack.reference import parse_reference
from gpux_pack.sources import templates_dir
from gpux_pack.staging import cache_dir

# Every character some parser or editor takes as the end of a line (str.splitlines' set).
LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
_CONTINUATION = " \\\n"  # what label_lines itself writes between key="value" pairs
_LABEL_KEY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._/-]*[A-Za-z0-9])?", re.ASCII)


class RenderError(Exception):
    """A value that cannot be written into its Dockerfile context: a bug upstream, since
    config and plan validate every value first. Never caught silently."""


def _one_line(text: str) -> str:
    """Whitespace runs (line breaks of every kind included) and control characters -> one space."""
    text = "".join(c if c.isprintable() or c.isspace() else " " for c in text)
    return " ".join(LINE_BREAKS.sub(" ", text).split())


def _comment(value: object) -> str:
    """Text inside a `#` comment line: one line."""
    return _one_line(str(value))


def _image_ref(value: object) -> str:
    """A FROM operand: an image reference by the registry grammar, nothing else."""
    try:
        return str(parse_reference(str(value)))
    except ValueError as e:
        raise RenderError(f"FROM: {e}") from None


def _label(value: object) -> str:
    """A LABEL value inside double quotes: one line, with quotes, backslashes and $ escaped."""
    return _one_line(str(value)).replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")


def _label_lines(labels: dict[str, str]) -> str:
    """key="value" pairs, one per continuation line. Keys were validated by the config."""
    for key in labels:
        if not _LABEL_KEY.fullmatch(key):
            raise RenderError(f"LABEL key {ascii(key)} is not a label key")
    return (_CONTINUATION + "      ").join(f'{key}="{_label(value)}"' for key, value in labels.items())


_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_ENV_VALUE = re.compile(r"[A-Za-z0-9_./:,=@+-]*", re.ASCII)


def _env_lines(env: tuple[tuple[str, str], ...]) -> str:
    """KEY=value pairs, one per continuation line. Values are gpux-pack's own constants; the
    check makes sure none ever needs quoting."""
    for key, value in env:
        if not _ENV_KEY.fullmatch(key) or not _ENV_VALUE.fullmatch(value):
            raise RenderError(f"ENV {ascii(key)}={ascii(value)} is not a plain variable")
    return (_CONTINUATION + "    ").join(f"{key}={value}" for key, value in env)


def _finalize(value: object) -> object:
    """Applied to every `{{ }}` output: nothing rendered may end a line, except label_lines'
    own continuations."""
    text = str(value) if value is not None else ""
    if LINE_BREAKS.search(text.replace(_CONTINUATION, " ")):
        raise RenderError(f"a value with a line break reached the Dockerfile: {ascii(text[:80])}")
    return value


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        bytecode_cache=_compiled_templates(),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,
    )
    env.filters["comment"] = _comment
    env.filters["image_ref"] = _image_ref
    env.filters["label_lines"] = _label_lines
    return env


def _compiled_templates() -> jinja2.BytecodeCache | None:
    """Jinja's compiled template under the cache (keyed by the template's text): compiling it
    took 10 ms of every build. None where the cache cannot be written: compiled each time."""
    folder = cache_dir() / "templates"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(folder)) if os.access(folder, os.W_OK) else None


def link_check_command(provider: Provider) -> str:
    """The build step that proves the provider's libraries resolve in the image (shell-quoted:
    the library globs are for the check, not for the shell)."""
    cmd = [PYTHON, LINKCHECK, "--provider", provider.ep]
    for flag, values in (("--lib", provider.libraries), ("--dlopen", provider.dlopen),
                         ("--dir", provider.library_dirs), ("--driver", provider.driver_libs)):
        for value in values:
            cmd += [flag, value]
    if provider.tensorrt:
        cmd += ["--tensorrt", provider.tensorrt]
    if provider.link_hint:
        cmd += ["--hint", provider.link_hint]
    return shlex.join(cmd)


def env_instruction(image: ImageConfig) -> str:
    """The ENV a runtime base image sets, as its Dockerfile and an assembled image's history
    spell it."""
    return "ENV " + _env_lines(image.env)


def config_instructions(image: ImageConfig) -> list[str]:
    """The rest of what a runtime base image sets besides its files (USER, WORKDIR, HEALTHCHECK,
    ENTRYPOINT, CMD), spelled once: the Dockerfile writes these lines, an assembled image's
    history records them."""
    out = [f"USER {image.user}"] + ([f"WORKDIR {image.workdir}"] if image.workdir else [])
    out.append(f"HEALTHCHECK --interval={image.health_interval}s --timeout={image.health_timeout}s "
               f"--start-period={image.health_start}s --retries={image.health_retries}{_CONTINUATION}"
               f"  CMD {json.dumps(list(image.healthcheck))}")
    return out + [f"ENTRYPOINT {json.dumps(list(image.entrypoint))}", f"CMD {json.dumps(list(image.cmd))}"]


def _render(provider: Provider, image: ImageConfig, **values: Any) -> str:
    template = environment().get_template("base.Dockerfile.j2")
    text = template.render(
        pack_version=__version__,
        provider=provider,
        site=SITE,
        python=PYTHON,
        app=APP_DIR,
        env_instruction=env_instruction(image),
        config_instructions=config_instructions(image),
        layers=LAYERS,
        **values,
    )
    lines = [line.rstrip() for line in text.split("\n")]  # "\n" only: str.splitlines splits on U+2028 too
    out: list[str] = []
    for line in lines:  # no runs of blank lines where optional blocks rendered empty
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip() + "\n"


def dockerfile(plan: Plan, part: str = "model") -> str:
    """The model image. part "model": on the plan's runtime base image (what `build` sends);
    "image": self-contained, from the base image (what `render` writes), with the same layers."""
    return _render(
        plan.provider,
        plan.runtime_base.config,
        part=part,
        runtime_base=plan.runtime_base.tag if part == "model" else None,
        name=plan.name,
        version=plan.version,
        tag=plan.tag,
        base_image=plan.base.image,
        system_packages=plan.base.apt_packages(),
        link_check=link_check_command(plan.provider) if plan.link_check == "image" else None,
        host_check=plan.link_check == "host",
        ports=plan.ports,
        labels=plan.labels,
        model_layers=model_layers(plan.carries_assets, plan.one_layer),
    )


def runtime_base_dockerfile(runtime_base: RuntimeBase, tag: str | None = None) -> str:
    """A provider's runtime base image. Depends only on the table and the templates, so the
    files in base-images/ are rendered from the same data as every model image."""
    return _render(
        runtime_base.provider,
        runtime_base.config,
        part="runtime",
        runtime_base=None,
        name=None,
        version=None,
        tag=tag,
        base_image=runtime_base.base.image,
        system_packages=runtime_base.apt_packages,
        link_check=link_check_command(runtime_base.provider) if runtime_base.link_check == "image" else None,
        host_check=runtime_base.link_check == "host",
        ports=(),
        labels=runtime_base.labels,
        model_layers=(),
    )


def warm_dockerfile(image: str, labels: dict[str, str]) -> str:
    """The Dockerfile of a warmed image, for the builder (see commands/warmup.py)."""
    return environment().get_template("warm.Dockerfile.j2").render(pack_version=__version__, image=image,
                                                                   labels=labels, layers=LAYERS)
