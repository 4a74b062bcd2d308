"""An image's creation time: the one rule, shared by the plan and a model-only rebuild."""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone

from gpux_pack.errors import UsageError


def created_now() -> str:
    """Build time, or SOURCE_DATE_EPOCH for reproducible builds."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch:
        return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        if not re.fullmatch(r"[0-9]{1,11}", epoch):
            raise ValueError
        return datetime.fromtimestamp(int(epoch), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"SOURCE_DATE_EPOCH={ascii(epoch)} is not a Unix time in seconds") from None
