"""The process a broker record lives for: whether it is still there.

A binding of an ``auto_delete`` queue (:mod:`ledgerq.celery._bindings`) and the record
of a temporary queue (:mod:`ledgerq.celery._temporary`) each name the process that
declared the queue; both end with that process, so both ask the same question of it.
"""

from __future__ import annotations

import os

__all__ = ["process_is_alive"]


def process_is_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's counts: it cannot be signalled,
    but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True
