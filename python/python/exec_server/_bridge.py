"""How the native module's results reach asyncio futures (on their loop)."""

from __future__ import annotations

import asyncio
from typing import Any


def deliver(future: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    """Sets ``future``'s result (``ok``) or exception, unless it is already
    done (cancelled meanwhile)."""
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
