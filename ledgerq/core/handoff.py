"""The hand-off: ``forward``, a leased message's work enqueued into another queue and
the message acked, exactly once (a mixin of the queue core).

The source reader's hand-off key for the message (``core.feature.handoff_key``) goes
with the forwarded batch into the target, where the forward feature
(``features/forward.py``) records it before the batch; a source message delivered
again after a crash whose key already landed adds nothing, and is only acked.  What is
written where, in which order, and what recovery sees: docs/architecture.md,
"Exactly-once hand-off".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ledgerq._errors import QueueClosedError
from ledgerq._types import Item, Priority
from ledgerq.core.appending import Appending
from ledgerq.core.args import check_id, check_timeout
from ledgerq.core.feature import Draft, HandedOff, handoff_key

if TYPE_CHECKING:
    from ledgerq.core.reader_handle import Reader

__all__ = ["HandOff"]


class HandOff(Appending):
    """The hand-off part of :class:`~ledgerq.core.queue.QueueCore` (a mixin: its methods
    take the queue as ``self``; the target of a forward is another queue core).  A
    forward is an append of the target's, so this part is built on the append paths."""

    _resolved_path: str | None = None  # the directory resolved, at the first forward

    def _real_path(self) -> str:
        """The queue directory, absolute and resolved (a hand-off key names it)."""
        real = self._resolved_path
        if real is None:
            real = self._resolved_path = os.path.realpath(self.path)
        return real

    def _hand_off(
        self,
        reader: Reader,
        message_id: object,
        target: object,
        items: object,
        timeout: float | None,
    ) -> list[int]:
        """``reader.forward``: enqueue ``items`` into ``target`` and ack ``message_id``
        (of ``reader``, of this queue), exactly once (features/forward.py).

        Everything is checked before anything is written: the id (leased by this
        handle), the target (another open queue), the items."""
        if type(message_id) is not int:
            message_id = check_id(message_id)
        if not isinstance(target, HandOff):
            raise TypeError(
                f"forward's target must be an open ledgerq queue, not {type(target).__name__}"
            )
        if target._closed:
            raise QueueClosedError(
                f"forward's target queue {target.path} is closed; forward into an open queue"
            )
        source = self._resolved_path or self._real_path()
        if target is self or (target._resolved_path or target._real_path()) == source:
            raise ValueError(
                f"forward's target is the source queue itself ({self.path}); forward into "
                "another queue, or enqueue and ack"
            )
        if (
            type(items) is list
            and target._plain_path
            and timeout == 0
            and items
            and (
                (type(items[0]) is bytes and len(items[0]) <= target._max_size)
                if len(items) == 1
                # set/map/max run in C (as enqueue_batch's check): bytes, not too large.
                else set(map(type, items)) == {bytes} and max(map(len, items)) <= target._max_size
            )
        ):
            payloads: list[bytes] | None = items
            drafts: list[Draft] = []
            sizes = None
        else:
            payloads = None
            drafts, sizes = target._handoff_drafts(items)
        # Leased by this handle: a look, not a step, so no lock (the ack below decides
        # under it, and a lease the lock held here could still end before the append).
        if self._closed or reader._removed:
            with self._lock:
                reader._ensure_usable()
        core = reader._core
        if message_id not in core._leased:
            with self._lock:
                core.check_leased(message_id)  # raises, saying why
        key = handoff_key(reader._handoff_prefix or reader.handoff_prefix(), message_id)
        if payloads is not None:
            ids = target._append_handoff_plain(key, payloads)
        elif drafts:
            ids = target._append_handoff(key, drafts, sizes, timeout)
        else:
            check_timeout(timeout)
            # Nothing to hand on - but a delivery before may have: its ids, if so.
            ids = target._append_handoff_plain(key, [])
        # A kill -9 here leaves the items landed and the message leased: delivered
        # again, its forward finds the hand-off key in the target and only acks.
        reader.ack(message_id)
        return ids

    def _handoff_drafts(self, items: object) -> tuple[list[Draft], list[int] | None]:
        """Validate forwarded ``items`` (bytes-like, an Item, or an iterable of them) for
        this queue; nothing is written.  A forwarded item may not carry ``dedup_id``
        or ``unique_key``: the hand-off is itself exactly once, and an item left out as
        a duplicate would leave the batch's ids out of step with what landed."""
        self._ensure_open()
        if isinstance(items, (bytes, bytearray, memoryview, Item)):
            items = [items]
        elif isinstance(items, str) or not isinstance(items, Iterable):
            raise TypeError(
                "forward's items must be bytes, an Item, or a list of them, "
                f"not {type(items).__name__}"
            )
        drafts: list[Draft] = []
        sizes: list[int] | None = [] if self._backlog is not None else None
        for item in items:
            if isinstance(item, Item):
                if item.dedup_id is not None or item.unique_key is not None:
                    raise ValueError(
                        "a forwarded Item may not carry dedup_id or unique_key (the "
                        "hand-off is exactly once already); nothing was forwarded"
                    )
                drafts.append(self._prepare_item(item, sizes))  # (no dedup_id, no key)
            else:
                drafts.append(self._prepare(item, None, Priority.MEDIUM, None, None, sizes=sizes))
        return drafts, sizes

    def _append_handoff(
        self, key: bytes, drafts: list[Draft], sizes: list[int] | None, timeout: float | None
    ) -> list[int]:
        """Append forwarded ``drafts`` as one batch under the hand-off ``key``, once: if
        the key already landed here, write nothing and return the ids it got then."""
        count = len(drafts)
        for position, draft in enumerate(drafts):
            draft.handoff = (key, position, count)
        try:
            return self._append(drafts, sizes, timeout)
        except HandedOff as landed:
            return landed.ids

    def _append_handoff_plain(self, key: bytes, payloads: list[bytes]) -> list[int]:
        """:meth:`_append_handoff` for bytes payloads with no option and no feature hook:
        the hand-off feature stores its record before the batch is written (as
        :meth:`_append_unique` has the unique-jobs feature store its own).  No payloads:
        only look ``key`` up."""
        taker = self._handoff_taker
        assert taker is not None
        count = len(payloads)
        with self._lock:
            # (_begin, inlined as in _append_plain: this is every forward's path)
            if self._closed:
                self._ensure_open()
            now = self._clock_offset_ns + self._clock_mono()
            appends = self._appends
            if appends is None:
                first = self._next_id
            else:
                first, now = appends.begin(now)
            try:
                landed: list[int] | None
                if not count:  # only the look-up: nothing is written
                    landed = taker.handed_off(key) or []
                else:
                    try:
                        landed = taker.take_handoff(key, first, count, now)
                    except BaseException:
                        taker.rollback()
                        raise
                if landed is None:
                    try:
                        rotated = self._write_plain(first, now, payloads)
                    except BaseException:
                        if self._next_id <= first:
                            taker.undo_handoff()  # (else in the log all the same: landed)
                        raise
                    # (_appended, inlined as in _append_plain)
                    self._next_id = first + count
                    self._enqueued += count
                    ticket = self._log_commit.note_write()
                    if rotated:
                        self._retire_after_rotation()
            finally:
                if appends is not None:
                    appends.end()
            if landed is not None:
                return landed
            if rotated or self._waits.waiting or self._waits.listeners:
                self._after_append()
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        return [first] if count == 1 else list(range(first, first + count))
