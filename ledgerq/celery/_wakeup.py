"""A consumer's wake-up: a pipe, so that a signal handler may ring it too.

``drain_events`` sleeps until a consumed queue may have a message (a listener the
shared queue calls from its housekeeper thread) - and, in a Celery worker, until a
warm or cold shutdown begins: Celery's signal handler sends ``worker_shutting_down``
from the main thread, which may be inside the wait, and a ``threading.Event`` there
could deadlock (its lock is not reentrant).  Writing a byte to a non-blocking pipe
is safe from any thread and from a signal handler.
"""

from __future__ import annotations

import contextlib
import os
import select

__all__ = ["Wakeup"]


class Wakeup:
    """Ring from anywhere; wait for a ring (up to a timeout); clear before looking."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._closed = False

    def set(self) -> None:
        """Ring (a full pipe is rung already)."""
        if self._closed:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._w, b"!")

    def clear(self) -> None:
        """Forget the rings so far."""
        if self._closed:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._r, 4096):
                pass

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a ring; whether one came (at once, once
        closed)."""
        if self._closed:
            return True
        ready, _, _ = select.select([self._r], [], [], max(0.0, timeout))
        return bool(ready)

    def close(self) -> None:
        """Release the pipe."""
        if self._closed:
            return
        self._closed = True
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
