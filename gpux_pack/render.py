"""Plan + lock -> Dockerfile text, through the Jinja2 templates in templates/."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2

from gpux_pack import __version__, plan as planning
from gpux_pack.plan import Plan
from gpux_pack.wheels import Lock


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


def pip_wheel_name(lock: Lock) -> str:
    """pip is pure Python: its wheel name follows from its version alone."""
    pip = next(p for p in lock.tools if p.name == "pip")
    return f"pip-{pip.version}-py3-none-any.whl"


def dockerfile(plan: Plan, lock: Lock) -> str:
    ort_version = lock.version_of(plan.provider.ort_dist) or "unknown"
    template = environment().get_template(plan.provider.template_name)
    text = template.render(
        pack_version=__version__,
        name=plan.name,
        version=plan.version,
        tag=plan.tag,
        provider=plan.provider,
        base_image=plan.base.image,
        venv=planning.VENV,
        app=planning.APP_DIR,
        user=planning.USER,
        port=plan.port,
        pip_wheel=pip_wheel_name(lock),
        labels=planning.labels(plan, ort_version),
    )
    return "\n".join(line.rstrip() for line in text.splitlines()).strip() + "\n"
