"""The install stage: a plan's locked wheels installed on the host (wheels.py), then the link
check on the base image's files plus the installed tree, before anything is built or tagged."""

from __future__ import annotations

import sys
from pathlib import Path

from gpux_pack import linkcheck, wheels
from gpux_pack.errors import BuildError
from gpux_pack.plan import RuntimeBase
from gpux_pack.runtime.contract import SITE
from gpux_pack.ui import Reporter


def install(runtime_base: RuntimeBase, ui: Reporter) -> wheels.Installed:
    """The runtime base image's packages: fetched, installed for the image's Python and
    platform, and link-checked."""
    lock = runtime_base.lock
    assert lock is not None, "install needs the plan's lock"
    installed = wheels.unpack(wheels.fetch(lock, log=ui.info), log=ui.info)
    if not installed.compiled:
        ui.info(f"no bytecode shipped: this host runs Python {sys.version_info[0]}.{sys.version_info[1]}, "
                f"the image {lock.target.python}")
    check_links(runtime_base, installed, ui)
    return installed


def check_links(runtime_base: RuntimeBase, installed: wheels.Installed, ui: Reporter) -> None:
    """The provider's libraries must resolve in base + installed packages, for the image's
    architecture, and its TensorRT must be no older than the one it was built with, or the build
    fails naming the problem before anything is built or tagged (instead of a silent CPU fallback
    in production). Where the plan put the check in the image (apt libraries) or off, nothing."""
    provider, base = runtime_base.provider, runtime_base.base
    if runtime_base.link_check != "host":
        return
    if not base.rootfs:
        ui.info(f"link check not run: base image {base.image} was not inspected (no Docker engine)")
        return
    problems = linkcheck.check_tree(
        provider.ep, list(provider.libraries), list(provider.dlopen), list(provider.library_dirs),
        list(provider.driver_libs), Path(base.rootfs), {SITE: installed.path}, SITE, base.arch,
        list(base.ld_library_path), ui.info, provider.tensorrt,
    )
    if problems:
        hint = provider.link_hint or "use a base image that provides it"
        raise BuildError(linkcheck.failure(provider.ep, problems, hint), "link check",
                         [f"link check: {line}" for line in problems])
