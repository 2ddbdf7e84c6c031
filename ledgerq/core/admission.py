"""Admission: the checked append path, where features admit a batch of drafts and a
bounded queue makes it wait for room (a mixin of the queue core).

Every append that a feature must see - an :class:`~ledgerq.Item` with options, dedup,
unique keys among other options, compression, encryption, a forwarded batch, a bounded
queue - goes ``_append`` -> ``_append_admitted``: under the queue's lock (and in shared
mode the append session, holding every reader's step when a feature asks for their
state: ``ReadersNeeded``), the features admit the drafts (a duplicate keeps the
original's id), the bounds are checked (``_check_room``; a batch that can never fit
raises at once), then the drafts are encoded and written in one append
(``_write_drafts``).  A failure after the admission undoes it (``_undo_admission``), so
that nothing a feature recorded outlives an append that did not happen.  A batch short of
room waits (``_wait_for_room``) and is admitted again: what the features found may have
changed meanwhile.  The plain paths - bytes with no feature to see them - are the queue's
own (core/queue.py) and skip all of this.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping

from ledgerq._errors import CorruptionError, MessageTooLargeError, QueueFullError
from ledgerq.core.args import check_timeout
from ledgerq.core.backlog import written_sizes
from ledgerq.core.feature import Draft, KeyAdmitter, ReadersNeeded
from ledgerq.core.queue_state import QueueState
from ledgerq.format.entry import Entry, EntryFlags, encode_entry
from ledgerq.segment.cursor import LogCursor

__all__ = ["Admission"]

_NO_READERS = contextlib.nullcontext()  # an exclusive append holds no reader's step
# Entries whose stored payload is not the message (compressed, or sealed).
_RESTORED_FLAGS = int(EntryFlags.COMPRESSED) | int(EntryFlags.ENCRYPTED)


class Admission(QueueState):
    """The checked append path of :class:`~ledgerq.core.queue.QueueCore` (a mixin: its
    methods take the queue as ``self``)."""

    def _append(
        self, drafts: list[Draft], sizes: list[int] | None = None, timeout: float | None = 0
    ) -> list[int]:
        """Append ``drafts`` as one batch (all or nothing); return an id for each.

        A draft its features found to be a duplicate (dedup) is not written: its id
        is the original message's.  ``sizes`` (the payload sizes as given) and
        ``timeout`` are for a bounded queue: see :meth:`_check_room` and
        :meth:`_wait_for_room`.
        """
        wait = check_timeout(timeout)
        deadline = None if wait is None else time.monotonic() + wait
        if self._appends is None:
            return self._append_admitted(drafts, sizes, deadline, wait)
        # A wait for room bounds the waits for another handle's steps too (timeout 0
        # means no wait for room, not for a lock: those wait lock_timeout).
        before = self._budget.limit(deadline if wait else None)
        try:
            return self._append_admitted(drafts, sizes, deadline, wait)
        finally:
            self._budget.limit(before)

    def _append_admitted(
        self,
        drafts: list[Draft],
        sizes: list[int] | None,
        deadline: float | None,
        wait: float | None,
    ) -> list[int]:
        """:meth:`_append` once the timeout is checked: admit, wait for room, write."""
        appends = self._appends
        every_reader = False  # a feature asked for the readers' state (ReadersNeeded)
        with self._lock:
            while True:
                if self._closed:
                    self._ensure_open()
                with _NO_READERS if appends is None else appends.holding_readers(every_reader):
                    now = self._clock_offset_ns + self._clock_mono()
                    if appends is not None:
                        self._next_id, now = appends.begin(now)
                    try:
                        if self._admitters:
                            if appends is not None:
                                for feature in self._admitters:
                                    feature.catch_up()
                            try:
                                to_write, existing = self._admit(drafts, now)
                            except ReadersNeeded:
                                every_reader = True  # (admit rolled back): once more
                                continue
                        else:
                            to_write, existing = drafts, {}
                        if not to_write:
                            return [existing[i] for i in range(len(drafts))]
                        short = ""
                        if self._backlog is not None:
                            assert sizes is not None
                            short = self._check_room(to_write, sizes, existing)
                        if not short:
                            first, ticket = self._write_drafts(to_write, now)
                            if self._backlog is not None:
                                assert sizes is not None
                                self._backlog.appended(first, written_sizes(sizes, existing))
                            break
                    finally:
                        if appends is not None:
                            appends.end()
                self._wait_for_room(short, deadline, wait)
            self._after_append()
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        count = len(to_write)
        if not existing:
            return list(range(first, first + count))
        fresh_ids = iter(range(first, first + count))
        return [existing[i] if i in existing else next(fresh_ids) for i in range(len(drafts))]

    def _write_drafts(self, to_write: list[Draft], now: int) -> tuple[int, int]:
        """Write the admitted drafts (lock held, the append session begun); return the
        first id and the commit ticket."""
        first = self._next_id
        count = len(to_write)
        segments = len(self._manager.segments)
        try:
            records = self._encode_drafts(to_write, first, now)
            if first + count > self._append_gate:
                self._reserve_ids(first + count)
            for feature in self._preparers:
                feature.before_append()
            self._manager.append(records, [len(r) for r in records], first, now)
        except BaseException:
            self._count_written(first)
            self._undo_admission(to_write, first, now)
            raise
        ticket = self._appended(first, count, len(self._manager.segments) != segments)
        for feature in self._recorders:
            feature.appended(to_write, first, now)
        return first, ticket

    def _encode_drafts(
        self, drafts: list[Draft], first: int, now: int, continues: bool = False
    ) -> list[bytes]:
        """Encode ``drafts`` as one batch from id ``first``, stamped ``now`` (lock held);
        with ``continues`` the batch goes on after them (the last one continues it too)."""
        last = len(drafts) if continues else len(drafts) - 1
        # An encrypted queue's sealer takes encode_entry's arguments.
        encode = encode_entry if self._sealer is None else self._sealer.encode
        return [
            encode(
                first + i,
                now,
                draft.payload,
                expires_at=None if draft.expires_in_ns is None else now + draft.expires_in_ns,
                priority=draft.priority,
                headers_blob=draft.headers_blob,
                compressed=draft.compressed,
                # Marks the batch's extent, so recovery can cut a partial one.
                batch_continues=i < last,
                deliver_at=None if draft.delay_ns is None else now + draft.delay_ns,
                group=draft.group,
            )
            for i, draft in enumerate(drafts)
        ]

    def _undo_admission(self, to_write: list[Draft], first: int, now: int) -> None:
        """An append of ``to_write`` from id ``first`` raised, after _count_written: the
        admitting features forget what they noted - but a unique key, whose message
        must never be in the log without it, is held if the entries reached the log
        all the same (a rotation that failed after the write)."""
        written = self._next_id > first
        for feature in self._admitters:
            if written and isinstance(feature, KeyAdmitter):
                feature.appended(to_write, first, now)
            else:
                feature.rollback()

    def _admit(self, drafts: list[Draft], now: int) -> tuple[list[Draft], dict[int, int]]:
        """Ask the admitting features about each draft (lock held).

        Returns the drafts to write and, by position, the ids of those found to be
        duplicates (counted in ``stats().duplicates``).  Admitted drafts are noted
        by their features until the append succeeds or calls their ``rollback``.
        """
        fresh: list[Draft] = []
        existing: dict[int, int] = {}
        try:
            for position, draft in enumerate(drafts):
                candidate = self._next_id + len(fresh)  # the id it gets if written
                for feature in self._admitters:
                    found = feature.admit(draft, now, candidate)
                    if found is not None:
                        existing[position] = found
                        for earlier in self._admitters:  # they admitted it: not written
                            if earlier is feature:
                                break
                            earlier.unadmit(draft)
                        break
                else:
                    fresh.append(draft)
        except BaseException:
            for feature in self._admitters:  # the drafts admitted before: nothing written
                feature.rollback()
            raise
        self._tally.duplicates += len(existing)
        return fresh, existing

    def _check_room(
        self, to_write: list[Draft], sizes: list[int], existing: Mapping[int, int]
    ) -> str:
        """Whether the admitted ``to_write`` fit the bounds now (lock held): "" if they do,
        else why not, having rolled the admission (dedup) back - it is done again after
        the wait, since what it found may change meanwhile.

        Raises at once, written nothing, when the batch is larger than a bound on its
        own: :class:`MessageTooLargeError` for one message, else :class:`QueueFullError`.
        """
        backlog = self._backlog
        assert backlog is not None
        size = sum(written_sizes(sizes, existing))
        never = backlog.refusal(len(to_write), size)
        cores = [r._core for r in self._readers.values()]
        short = never or backlog.shortfall(self, cores, self._next_id, len(to_write), size)
        if short:
            for feature in self._admitters:
                feature.rollback()
            self._tally.duplicates -= len(existing)
            if never:
                error = MessageTooLargeError if len(to_write) == 1 else QueueFullError
                raise error(f"{never}: it can never be enqueued in {self.path}")
        return short

    def _wait_for_room(self, short: str, deadline: float | None, wait: float | None) -> None:
        """Wait (lock held, released meanwhile) until an ack or the like may have made
        room, or raise :class:`QueueFullError` if ``deadline`` has passed.

        Room is made by the default reader's and named readers' acks, dead-letters,
        expiries, drops and purges in this handle (they notify the condition while
        ``Waits.room_waiting`` counts a waiter), and in shared mode by other processes
        (the housekeeper watches their journals while ``Waits.waiting`` counts one).
        """
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            waited = "" if not wait else f" after waiting {wait:g} s"
            raise QueueFullError(
                f"queue {self.path} is full ({short}){waited}; nothing was written - "
                "consume and ack messages, or pass a timeout to wait for room"
            )
        if self._prepare_wait():
            return  # now watching the other processes' changes: look once more
        self._waits.waiting += 1
        self._waits.room_waiting += 1
        try:
            self._waits.cond.wait(remaining)
        finally:
            self._waits.waiting -= 1
            self._waits.room_waiting -= 1
        if self._closed:
            self._ensure_open()

    def _entries_from(self, first_id: int) -> Iterator[Entry]:
        """The log's entries from ``first_id`` on (lock held), for the backlog's ledger."""
        cursor = LogCursor(self._manager, first_id)
        while (entry := cursor.next()) is not None:
            yield entry

    def _given_size(self, entry: Entry) -> int:
        """The size of ``entry``'s payload as its producer gave it (decompressed)."""
        if not entry.flags & _RESTORED_FLAGS and self._sealer is None:
            return len(entry.payload)
        try:
            return len(self._restore(entry))
        except CorruptionError:
            return 0  # never delivered: skipped as corrupt when a reader meets it
