"""Locks without the network, for tests that plan: a Plan or RuntimeBase planned with a lock as
wheels.resolve would return it (the build plans once, with its resolver; a test varies the lock)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpux_pack.wheels import Lock, Pin


def with_lock(plan: Any, lock: Lock) -> Any:
    """The same plan, as if it had been made with this lock."""
    return replace(plan, lock=lock)


def lock_for(plan: Any, version: str | None = None, more: tuple[Pin, ...] = ()) -> Lock:
    """A lock of the plan's requirements pinning its provider's onnxruntime (the table's version, or this one)."""
    pin = Pin(plan.provider.ort, version or plan.provider.version, frozenset({"0" * 64}))
    return Lock(plan.target, plan.requirements, (pin, *more))
