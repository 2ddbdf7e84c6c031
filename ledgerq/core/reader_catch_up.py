"""Catching up: a shared reader's state brought up to date with the records other
handles appended to its journal (a part of the shared reader written apart).

Before every step, under the reader's lock, a shared handle reads the records the
other handles wrote since its offset and folds them in (:meth:`CatchingUp._apply`):
``segment.journal_fold``'s fold - the one ``ReaderState`` replays a journal with -
with this core as its sink (``on_lease``, ``on_nack``, ``on_finish``, ...).  The fold
counts deliveries, NOT_BEFORE times and counters; the sink keeps the cursor, the
selector and the lease tables in step: another handle's lease is *foreign* (the cursor
passes over it), a lease of ours that ended elsewhere is revoked (its ack says why),
and what another handle gave back is read back by id.  A CHECKPOINT - another handle
compacted or seeked - rebuilds the state from it (:meth:`CatchingUp._rebuild`),
keeping this handle's own leases that it still lists.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from ledgerq.core.clock import QueueClock
from ledgerq.core.delays import NEVER_NS
from ledgerq.core.failures import _TIMED_OUT, NO_WAIT
from ledgerq.core.reader import _LOST_LEASE, ReaderCore
from ledgerq.format.reader_state import (
    Checkpoint,
    ReclaimCause,
    StateRecordType,
)
from ledgerq.segment.cursor import LogCursor
from ledgerq.segment.journal_fold import FoldTables, StateRecord, fold_records

__all__ = ["CatchingUp"]

_GONE = ReclaimCause.GONE
_EXPIRED = ReclaimCause.TIMED_OUT


class CatchingUp(ReaderCore):
    """A :class:`~ledgerq.core.reader.ReaderCore` that folds other handles' journal
    records into its state (the fold's sink); shared mode's reader is built on it."""

    # The shared reader's own state (set by SharedReaderCore's constructor).
    holder: int  # this handle's id: the holder of its LEASE_BY records
    _clock: QueueClock
    _foreign_deadlines: list[tuple[int, int, int]]  # (deadline_ns, id, holder)
    _own_deadline_ns: dict[int, int]  # our leases' deadlines, for checkpoints
    _lost: dict[int, str]  # our leases that ended elsewhere: why (for the error)
    _back: set[int]  # ids available again behind the cursor, in one catch-up
    _leased_while_parked: bool  # another handle leased while ids were parked here
    _unconfirmed: set[int]  # our leases a checkpoint did not list (see on_lease)

    def _note_foreign(self, message_id: int, holder: int, deadline: int) -> None:
        self._foreign[message_id] = (holder, deadline)
        if deadline:
            heapq.heappush(self._foreign_deadlines, (deadline, message_id, holder))

    def _revoke(self, message_id: int, why: str) -> None:
        """Our lease of ``message_id`` ended elsewhere: its ack or nack now raises."""
        if self._leased.pop(message_id, None) is not None:
            self._own_deadline_ns.pop(message_id, None)
            self._lost[message_id] = why
            while len(self._lost) > 10_000:
                del self._lost[next(iter(self._lost))]

    def _apply(self, records: Iterable[StateRecord]) -> None:
        """Fold other handles' records into the state (the reader lock held): the one
        fold (``segment.journal_fold``), this core its sink."""
        self._back = set()
        fold_records(records, self)
        if self._unconfirmed:
            for message_id in sorted(self._unconfirmed):
                self._revoke(message_id, "another handle moved the reader (seek) or dropped it")
            self._unconfirmed = set()
            self._leased_heap = list(self._leased)
            heapq.heapify(self._leased_heap)
        self._give_back_ids(self._back)
        if self._leased_while_parked:
            # Another handle leased ids when they fell due: each may still be parked
            # here, and parked it would be given back again (taken twice), or counted
            # pending beside its lease's end.  What is due is released now, and an id
            # leased elsewhere is dropped on the way (_may_release) - cheaper than
            # finding each leased id among the parked ones (O(parked) each).
            self._leased_while_parked = False
            if self._delays:
                now_ns = self._clock.now_ns()
                if now_ns >= self._due_ns:
                    self._release_due(now_ns)
        self._fast_forward()

    # The sink of the fold (``JournalSink``).  The fold has counted the deliveries,
    # NOT_BEFORE times and counters; these keep the cursor, the selector and the lease
    # tables in step.  Ids available again behind the cursor are collected in
    # ``_back``, given back (read back by id) once the records are applied.

    def fold_tables(self) -> FoldTables:
        return self._deliveries, self._not_before, self.counters

    def on_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._rebuild(checkpoint)
        self._back.clear()

    def on_lease(self, holder: int, deadline_ns: int, ids: Sequence[int]) -> None:
        deliveries, reported, back = self._deliveries, self._reported, self._back
        leased, selector, nacked = self._leased, self._selector, self._nacked
        cursor_next = self._cursor.next_id
        if holder == self.holder:
            # Our own record, met again: the file was read whole (a new generation, the
            # holder before died mid-step) and this handle had appended to it since its
            # checkpoint.  What it leased then is still its lease if it holds it.
            if self._unconfirmed:
                self._unconfirmed.difference_update(ids)
            return
        if self._delays:
            self._leased_while_parked = True
        for message_id in ids:
            # The leaser reported the failures before it (or learnt of them).
            before = deliveries[message_id] - 1
            if reported.get(message_id, 0) < before:
                reported[message_id] = before
            if nacked:
                nacked.pop(message_id, None)
            back.discard(message_id)
            if message_id in leased and holder != self.holder:
                self._revoke(message_id, "another handle leased it after it expired")
            if message_id < cursor_next:
                selector.discard(message_id)
            self._note_foreign(message_id, holder, deadline_ns)

    def on_touch(self, holder: int, deadline_ns: int, ids: Sequence[int]) -> None:
        for message_id in ids:
            held = self._foreign.get(message_id)
            if held is not None and held[0] == holder:
                self._note_foreign(message_id, holder, deadline_ns)

    def on_reclaim(self, holder: int, cause: int, ids: Sequence[int]) -> None:
        self._apply_reclaim(holder, cause, ids, self._back, self._cursor.next_id)

    def on_nack(self, ids: Sequence[int]) -> None:
        # Reported by the nacker, which may have died between its NACK and the move to
        # the DLQ that the failure called for: the next taker checks that once more,
        # but neither as a lost lease nor with a second retry delay (``_nacked``).
        deliveries, nacked = self._deliveries, self._nacked
        for message_id in ids:
            nacked[message_id] = deliveries.get(message_id, 0)
        self._make_available(ids)

    def on_release(self, ids: Sequence[int]) -> None:
        deliveries, reported = self._deliveries, self._reported
        for message_id in ids:
            count = deliveries.get(message_id, 0)  # (the fold took the lease's back)
            if reported.get(message_id, 0) > count:
                reported[message_id] = count
        self._make_available(ids)

    def _make_available(self, ids: Sequence[int]) -> None:
        foreign, back = self._foreign, self._back
        cursor_next = self._cursor.next_id
        for message_id in ids:
            foreign.pop(message_id, None)
            if message_id < cursor_next:
                back.add(message_id)

    def on_not_before(self, due_ns: int, ids: Sequence[int]) -> None:
        # Another handle's failed delivery (or delayed release) waits: its NACK or
        # RELEASE just before made it available - park it instead.
        # Or it was available here already - given back by an earlier catch-up (its
        # lease reclaimed), and another handle's take found the failure and wrote its
        # retry time alone: park it too (it would wait all the same when taken, but
        # counted pending, not delayed).
        deliveries, reported, back = self._deliveries, self._reported, self._back
        nacked, selector = self._nacked, self._selector
        cursor_next = self._cursor.next_id
        for message_id in ids:
            count = deliveries.get(message_id, 0)
            if nacked.get(message_id) != count:  # (after a NACK: see on_nack)
                reported[message_id] = count  # a delayed release: nothing to report
            if due_ns == NO_WAIT:
                continue
            if message_id in back:
                back.discard(message_id)
                self._park(due_ns, message_id)
            elif message_id < cursor_next and selector.discard(message_id):
                self._park(due_ns, message_id)

    def on_finish(self, kind: StateRecordType, ids: Sequence[int]) -> None:
        foreign, back, leased, selector = self._foreign, self._back, self._leased, self._selector
        cursor_next = self._cursor.next_id
        delays = self._delays
        for message_id in ids:
            lease = foreign.pop(message_id, None)
            back.discard(message_id)
            if message_id in leased:
                self._revoke(message_id, "another handle settled it")
            elif lease is None and delays and message_id < cursor_next:
                # Finished without a lease: another handle purged it, perhaps while it
                # waited for its time here (a delay, a retry).  O(delayed), and only
                # then: an ack follows a lease this handle applied.
                delays.discard(message_id)
            if message_id < cursor_next:
                selector.discard(message_id)
            else:
                self._skip.add(message_id)
            self._forget(message_id)

    def _apply_reclaim(
        self, holder: int, cause: int, ids: Iterable[int], back: set[int], cursor_next: int
    ) -> None:
        """Void ``holder``'s leases of ``ids`` (only those it still holds): available
        again, behind the cursor into ``back``, each a failed delivery."""
        reason = _TIMED_OUT if cause == _EXPIRED else _LOST_LEASE
        for message_id in ids:
            lease = self._foreign.get(message_id)
            if lease is not None and lease[0] == holder:
                del self._foreign[message_id]
            elif holder == self.holder and message_id in self._leased:
                why = (
                    "its visibility timeout expired"
                    if cause == _EXPIRED
                    else "its lease was reclaimed"
                )
                self._revoke(message_id, why)
            else:
                continue  # not (or no longer) that holder's lease
            self._fail_reason[message_id] = reason
            if message_id < cursor_next:
                back.add(message_id)

    def _give_back_ids(self, ids: set[int]) -> None:
        """Make ``ids`` (behind the cursor) available again: read their entries back."""
        selector = self._selector
        for message_id in sorted(ids):
            entry = self._manager.read_entry(message_id)
            if entry is not None:
                selector.give_back(entry)

    def _fast_forward(self) -> None:
        """Move the cursor over a long run of ids other handles finished ahead of it.

        A handle that does not consume this reader (a producer asking ``stats()``)
        would otherwise remember every id acked ahead of its cursor.
        """
        skip = self._skip
        if len(skip) < 1024:
            return
        cursor = self._cursor
        start = end = cursor.next_id
        while end in skip:
            end += 1
        if end - start < 256:
            return
        for message_id in range(start, end):
            skip.discard(message_id)
            self._done.add(message_id)
        cursor.seek(end)
        if len(self._done) > self._prune_done_at:
            self._prune_done()

    def _rebuild(self, checkpoint: Checkpoint) -> None:
        """Start over from ``checkpoint`` (another handle compacted, or seeked)."""
        manager = self._manager
        head = max(checkpoint.head, manager.segments[0].first_id)
        counters = {"acked": 0, "nacked": 0, "expired": 0, "dead_lettered": 0}
        counters.update(checkpoint.counters)
        self.counters = counters
        self._deliveries = dict(checkpoint.deliveries)
        mine: dict[int, int] = {}
        self._foreign = {}
        self._foreign_deadlines = []
        for message_id, holder, deadline in checkpoint.leases:
            if holder == self.holder:
                mine[message_id] = deadline
            else:
                self._note_foreign(message_id, holder, deadline)
        # Ours that it does not list are revoked once the catch-up is applied, unless a
        # LEASE_BY of ours follows it in the file (see on_lease).
        self._unconfirmed = {i for i in self._leased if i not in mine}
        self._leased_heap = list(self._leased)
        heapq.heapify(self._leased_heap)
        self._skip = {i for i in checkpoint.done if i >= head and self._exists_unread(i)}
        self._done = set()
        self._reported = {i: n for i, n in self._reported.items() if i in self._deliveries}
        self._nacked = {i: n for i, n in self._nacked.items() if i in self._deliveries}
        self._cursor = LogCursor(manager, head)
        self._selector = self._make_selector()
        # Parked ids are read again from the new cursor, and parked again if not due.
        self._not_before = dict(checkpoint.not_before)
        self._note_nacked(self._not_before)
        self._reset_groups()
        self._delays.clear()
        self._due_ns = NEVER_NS
        self._forget_ahead()
