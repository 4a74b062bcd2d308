"""Plan + lock -> Dockerfile text, through the Jinja2 templates in templates/.

Three parts come from one template family: "image" (a model image, built from scratch),
"runtime" (a provider's runtime base image: wheels and runtime, no model) and "model" (a model
image on top of such a runtime base image)."""

from __future__ import annotations

import shlex
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from gpux_pack import __version__, plan as planning
from gpux_pack.plan import Plan
from gpux_pack.providers import Base, Provider
from gpux_pack.wheels import Lock

LINKCHECK = f"{planning.APP_DIR}/runtime/gpux_runtime/linkcheck.py"


def templates_dir() -> Path:
    """Inside the wheel: gpux_pack/templates. In a source checkout: <repo>/templates."""
    packaged = Path(str(resources.files("gpux_pack"))) / "templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "templates"


def _label(value: object) -> str:
    """A LABEL value inside double quotes: one line, with quotes, backslashes and $ escaped."""
    text = " ".join(str(value).split())
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")


def _label_lines(labels: dict[str, str]) -> str:
    """key="value" pairs, one per continuation line."""
    return " \\\n      ".join(f'{key}="{_label(value)}"' for key, value in labels.items())


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["label"] = _label
    env.filters["label_lines"] = _label_lines
    return env


def link_check_command(provider: Provider) -> str:
    """The build step that proves the provider's libraries resolve in the image (shell-quoted:
    the library globs are for the check, not for the shell)."""
    cmd = [f"{planning.VENV}/bin/python", LINKCHECK, "--provider", provider.execution_providers[0]]
    for flag, values in (("--lib", provider.libraries), ("--dlopen", provider.dlopen),
                         ("--dir", provider.library_dirs), ("--driver", provider.driver_libs)):
        for value in values:
            cmd += [flag, value]
    if provider.link_hint:
        cmd += ["--hint", provider.link_hint]
    return shlex.join(cmd)


def _render(provider: Provider, **values: Any) -> str:
    template = environment().get_template(provider.template_name)
    text = template.render(
        pack_version=__version__,
        provider=provider,
        venv=planning.VENV,
        app=planning.APP_DIR,
        user=planning.USER,
        **values,
    )
    lines = [line.rstrip() for line in text.splitlines()]
    out: list[str] = []
    for line in lines:  # no runs of blank lines where optional blocks rendered empty
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip() + "\n"


def dockerfile(plan: Plan, lock: Lock, runtime_image: str | None = None) -> str:
    """The model image: built from scratch, or on `runtime_image` when one fits."""
    ort_version = lock.version_of(plan.provider.ort) or "unknown"
    return _render(
        plan.provider,
        part="model" if runtime_image else "image",
        runtime_image=runtime_image,
        name=plan.name,
        version=plan.version,
        tag=plan.tag,
        base_image=plan.base.image,
        deps_packages=plan.base_spec.packages("deps"),
        final_packages=plan.base_spec.packages("final"),
        link_check=link_check_command(plan.provider) if plan.link_check else None,
        port=plan.port,
        labels=planning.labels(plan, ort_version),
    )


def runtime_dockerfile(provider: Provider, base: Base, link_check: bool = True, tag: str | None = None) -> str:
    """A provider's runtime base image. Depends only on the table and the templates, so the
    files in base-images/ are rendered from the same data as every model image."""
    return _render(
        provider,
        part="runtime",
        runtime_image=None,
        name=None,
        version=None,
        tag=tag,
        base_image=base.image,
        deps_packages=base.packages("deps"),
        final_packages=base.packages("final"),
        link_check=link_check_command(provider) if link_check else None,
        port=None,
        labels=runtime_labels(provider, base),
    )


def runtime_labels(provider: Provider, base: Base) -> dict[str, str]:
    return {
        "org.opencontainers.image.title": f"gpux runtime for {provider.name}",
        "org.opencontainers.image.description": f"{provider.ort} {provider.version} and the gpux runtime, without a model",
        "org.opencontainers.image.base.name": base.image,
        "io.gpux.provider": provider.name,
        "io.gpux.onnxruntime.version": provider.version,
        "io.gpux.pack.version": __version__,
    }
