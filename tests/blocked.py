"""A dequeue blocked in another thread, for the tests of what wakes it."""

from __future__ import annotations

import threading
from typing import Any

import ledgerq


def close_during_a_blocked_dequeue(q: Any) -> list[BaseException]:
    """Close ``q`` (a queue, sharded or not) while another thread waits in
    ``q.dequeue(timeout=None)``; return what that dequeue raised, the thread ended.

    Only ``QueueClosedError`` is caught: anything else the dequeue raises, or a dequeue
    that returns, leaves the list empty.  A thread not woken within 60 s fails.
    """
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            q.dequeue(timeout=None)
        except ledgerq.QueueClosedError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    q.close()
    waiter.join(timeout=60)
    assert not waiter.is_alive(), "close did not wake the blocked dequeue"
    return errors
