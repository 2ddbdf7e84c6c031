"""``asyncio.run`` with a hang guard, for the tests of asynchronous code."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_guarded(coro: Coroutine[Any, Any, T], guard_s: float) -> T:
    """Run ``coro`` to its end in a new event loop; a coroutine still running after
    ``guard_s`` seconds is cancelled and raises ``TimeoutError`` (a hang guard, not a
    timing assertion)."""

    async def guarded() -> T:
        async with asyncio.timeout(guard_s):
            return await coro

    return asyncio.run(guarded())
