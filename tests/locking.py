"""Run shared-mode code with the lock words or with the flock files they fall back to.

A shared-mode session locks the way its first handle chose (``segment.steplock``):
lock words where ``atomicshm`` imports, flock files otherwise or when
``LEDGERQ_LOCKING=flock`` says so.  The behaviour suites open their queues inside
:func:`locking` to run every shared-mode configuration both ways.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["LOCKINGS", "locking"]

LOCKINGS = ("words", "flock")


@contextlib.contextmanager
def locking(mode: str | None) -> Iterator[None]:
    """Sessions started in the block lock with ``mode`` ("words", "flock"; None: as the
    environment says)."""
    if mode is None:
        yield
        return
    before = os.environ.get("LEDGERQ_LOCKING")
    if mode == "flock":
        os.environ["LEDGERQ_LOCKING"] = "flock"
    else:
        os.environ.pop("LEDGERQ_LOCKING", None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LEDGERQ_LOCKING", None)
        else:
            os.environ["LEDGERQ_LOCKING"] = before
