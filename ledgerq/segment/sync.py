"""Group commit: many threads waiting for durability share one fsync.

Writers append under the queue lock and take a ticket (the file's write count).
:meth:`GroupCommit.wait_durable` then makes sure an fsync that started after
that write has finished.  The first waiter with no fsync in progress becomes
the leader: it notes the current write count, fsyncs *without* any lock held
(so others keep appending), publishes the count as durable and wakes everyone
it covered.  Waiters that arrive while it runs wait for the next round, whose
leader covers all of them at once - with N concurrent writers an fsync is
shared by up to N appends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["GroupCommit"]

logger = logging.getLogger("ledgerq")
SLOW_SYNC_SECONDS = 1.0
_MAX_GATHER_YIELDS = 8


class GroupCommit:
    """Durability tracking for one file descriptor (or a set synced together)."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self._sync = sync
        self._cond = threading.Condition(threading.Lock())
        self._written = 0  # bumped by note_write() under the caller's own lock
        self._durable = 0
        self._syncing = False
        self._waiting = 0  # threads inside wait_durable
        # Whether the last round had company: only then are other writers likely on
        # their way, and worth a yield (which costs a context switch: ~80 us here).
        self._crowded = False
        self.rounds = 0  # fsyncs done: writes / rounds is how many each one covered

    def note_write(self) -> int:
        """Record one more write; return its ticket for :meth:`wait_durable`."""
        self._written += 1
        return self._written

    @property
    def is_dirty(self) -> bool:
        """Whether some write is not known to be durable yet."""
        return self._durable < self._written

    def wait_durable(self, ticket: int) -> None:
        """Return once the write with ``ticket`` (and all before it) is durable.

        Raises whatever the sync function raises (to every waiter of that round).
        """
        with self._cond:
            self._waiting += 1
            try:
                while self._durable < ticket:
                    if self._syncing:
                        self._cond.wait()
                        continue
                    self._lead_round()
            finally:
                self._waiting -= 1

    def _lead_round(self) -> None:
        """fsync once for every write so far (called, and returns, with the lock held)."""
        self._syncing = True
        gather = self._crowded
        self._cond.release()
        if gather:
            # Let writers that are already on their way (woken by the last round)
            # reach the file first: one fsync then covers them too.  A yield, not a
            # timed wait - it ends as soon as no new write arrives.
            seen = -1
            for _ in range(_MAX_GATHER_YIELDS):
                if self._written == seen:
                    break
                seen = self._written
                time.sleep(0)
        target = self._written
        started = time.monotonic()
        try:
            self._sync()
            elapsed = time.monotonic() - started
            if elapsed > SLOW_SYNC_SECONDS:
                logger.warning("ledgerq: slow fsync: %.2f s", elapsed)
        except BaseException:
            self._cond.acquire()
            self._syncing = False
            self._cond.notify_all()
            raise
        self._cond.acquire()
        self.rounds += 1
        self._syncing = False
        self._crowded = self._waiting > 1
        if target > self._durable:
            self._durable = target
        self._cond.notify_all()

    def sync_now(self) -> None:
        """Make every write so far durable."""
        self.wait_durable(self._written)
