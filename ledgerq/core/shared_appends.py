"""What an append does in shared mode beyond exclusive mode: the append session.

There is one append pipeline, :class:`~ledgerq.core.queue.QueueCore`'s (``_append_plain``,
``_append_unique``, ``_append_plain_batch``, ``_append``, all ending in
``_reserve_ids`` and ``_appended``).  An exclusive handle owns the log: its own view is
the log's, nobody else appends, and the pipeline runs uncontended.  A shared handle's
pipeline is the same code with a :class:`SharedAppends` (``QueueCore._appends``; None
in exclusive mode) at these points:

``begin``
    take the append lock (a lock word of the state page, or ``flock``), bring the log's
    view up to date, and say the next id and the earliest stamp - never below the log's
    newest, since the handles' clocks differ a little and stamps must not go back in
    log order.  While the queue's disk reserve is spent (a word of the page, set by
    whichever handle spent it) the id gate is closed, so the append takes the slow path
    (``_reserve_ids``), which refuses or writes the reserve again;
``reserved_until`` / ``publish_reserved``
    the id reservation is the session's: the page holds the copy of ``meta.json``'s
    that every handle reads before raising it;
``retire``
    retention after a rotation runs under the append lock (the readers' published heads
    bound it: ``SharedQueueCore._retire_locked``);
``end``
    release the append lock;
``after``
    outside the append lock, ``retention_max_bytes`` (which takes the readers' locks,
    and those come before the append lock);
``holding_readers``
    a bounded queue's appends, and a unique key this handle's view shows held, are
    judged holding every reader's step: the backlog they count cannot change under
    the check, and another process's ack just before counts.

Retention (``QueueCore._delete_consumed``, ``_drop_oldest_while_over``) and ``stats``
are written once as well: the session marks a deletion (``deleting``), publishes the
log after one (``publish_log``), runs retention after a settle (``retire_consumed``),
and brings the view up to date for a report (``look``, ``enqueued``).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from ledgerq.format.shared_state import (
    SLOT_ENQUEUED_BASE,
    SLOT_ENQUEUED_THROUGH,
    SLOT_RESERVE_SPENT,
    SLOT_RESERVED_UNTIL,
    SLOT_WRITING,
)

if TYPE_CHECKING:
    from ledgerq.core.shared_queue import SharedQueueCore
    from ledgerq.segment.shared_manager import SharedSegmentManager
    from ledgerq.segment.shared_page import SharedPage

__all__ = ["SharedAppends", "enqueued_count"]


def enqueued_count(page: SharedPage, next_id: int) -> int:
    """``stats().enqueued`` in shared mode: the page's base, plus one per id handed out
    since (the log's next id is ``next_id``)."""
    return page.get(SLOT_ENQUEUED_BASE) + max(0, next_id - page.get(SLOT_ENQUEUED_THROUGH))


class SharedAppends:
    """The append session of one shared handle (see the module): ``queue``'s appends
    through ``manager``, coordinated by ``page``."""

    __slots__ = ("_begin_append", "_manager", "_memory", "_page", "_queue", "end")

    def __init__(
        self, queue: SharedQueueCore, manager: SharedSegmentManager, page: SharedPage
    ) -> None:
        self._queue = queue
        self._manager = manager
        self._page = page
        self._memory = page.memory  # (the gate reads byte SLOT_RESERVE_SPENT of it)
        # Bound once: these run on every append (a call layer is ~0.1 us of ~4).
        self._begin_append = manager.begin_append
        self.end = manager.end_append
        """Release the append lock (publishing the log's tail)."""

    def begin(self, now_ns: int) -> tuple[int, int]:
        """Take the append lock and catch up; return the next id and the stamp to use
        (``now_ns``, or the log's newest stamp if later).  Closes the queue's id gate
        while the disk reserve is spent."""
        self._begin_append()
        if self._memory[SLOT_RESERVE_SPENT]:
            self._queue._append_gate = 0
        active = self._manager.segments[-1]
        newest = active.last_timestamp
        # (SegmentManager.next_id, inlined)
        next_id = active.last_id + 1 if active.last_id else active.first_id
        return next_id, now_ns if now_ns >= newest else newest

    def reserved_until(self) -> int:
        """The id reservation as the session knows it (the page's copy of meta.json's)."""
        return self._page.get(SLOT_RESERVED_UNTIL)

    def publish_reserved(self, until: int) -> None:
        """A reservation this handle raised and saved: every handle's from now on."""
        self._page.set(SLOT_RESERVED_UNTIL, until)

    def deleting(self) -> None:
        """Retention is about to delete segments (append lock held): the ``writing`` word
        says so until the log's new first segment is published - a handle dying in
        between leaves it set, and the next appender republishes (a new generation:
        the others look again)."""
        self._page.set(SLOT_WRITING, 1)

    def publish_log(self) -> None:
        """Publish the log's segments after a deletion (append lock held)."""
        self._manager.publish()

    def look(self) -> None:
        """Bring this handle's view up to date for a report (``stats``): the readers
        other handles created, and the log's tail."""
        self._queue._open_readers_on_disk()
        self._manager.refresh()

    def enqueued(self) -> int:
        """How many messages the queue has taken, every handle's (the page's count)."""
        return enqueued_count(self._page, self._manager.next_id)

    def retire_consumed(self) -> None:
        """Retention after a settle or a rotation was seen (not holding the append lock):
        the consumed segments under it, then ``retention_max_bytes``."""
        manager = self._manager
        queue = self._queue
        manager.lock_appends()
        try:
            queue._retire_locked()
        finally:
            manager.unlock_appends()
        if queue._max_bytes:
            queue._enforce_max_bytes()

    def retire(self) -> None:
        """Retention after a rotation (append lock held)."""
        self._queue._retire_locked()

    def after(self) -> None:
        """After the append lock is released: ``retention_max_bytes``."""
        queue = self._queue
        if queue._max_bytes and len(self._manager.segments) > 1:
            queue._enforce_max_bytes()

    def holding_readers(self, every_reader: bool) -> contextlib.AbstractContextManager[None]:
        """Hold every reader's step around an append of a bounded queue, or one whose
        admission asked for every reader (``every_reader``); else nothing."""
        if self._queue._backlog is None and not every_reader:
            return contextlib.nullcontext()
        return self._queue._holding_every_reader()
