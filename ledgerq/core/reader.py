"""A reader: one consumer's position, leases, acks and delivery counts.

The model is Kestrel's: a reader's durable state is a *head* id (every id below
it is done) and the set of ids acked out of order above it; ledgerq adds how
many times each not-yet-acked message was delivered, so a lease lost to a crash
counts as a failed delivery.

In memory:

* the *cursor* reads the log in id order, skipping ``_skip`` (ids acked in an
  earlier run that lie ahead of it);
* the *selector* holds entries available for delivery that the cursor has
  already passed (given back by nack or a lost lease; with priorities, every
  pending entry) and decides the order;
* ``_leased`` the entries handed out, with their delivery number;
* ``_delays`` the ids read (or given back) that may not be delivered yet, by due
  time (``core.delays``): the selector hands out an entry whose ``deliver_at`` lies
  ahead, the reader parks its id there, and gives the entry back to the selector
  when it falls due.

The head is the smallest of: the smallest leased id, the selector's smallest
id, the smallest parked id, and the cursor's next id.  Every method runs with the queue lock held.
"""

from __future__ import annotations

import heapq
import logging
import os
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from ledgerq._errors import (
    LedgerQError,
    QueueClosedError,
    UnknownMessageError,
)
from ledgerq._types import ReaderStats
from ledgerq.core.args import check_id
from ledgerq.core.delays import NEVER_NS, DelayIndex
from ledgerq.core.failures import FailedDeliveries
from ledgerq.core.feature import Feature, FifoSelector, Selector
from ledgerq.core.journal import ReaderJournal
from ledgerq.core.reader_session import NO_SESSION, NoSession, ReaderSession
from ledgerq.core.removal import Removal
from ledgerq.core.retry import RetryPolicy
from ledgerq.core.schedule import DeliveryInTime
from ledgerq.format.entry import Entry, EntryFlags, RecordType
from ledgerq.format.reader_state import (
    Checkpoint,
    StateRecordType,
)
from ledgerq.segment.cursor import LogCursor
from ledgerq.segment.files import StorageError
from ledgerq.segment.messages import entry_to_message

if TYPE_CHECKING:
    from ledgerq.segment.manager import SegmentManager

__all__ = ["ReaderCore", "ReaderHooks", "entry_to_message", "initial_checkpoint"]

logger = logging.getLogger("ledgerq")

_ACK = StateRecordType.ACK
_NACK = StateRecordType.NACK
_DEAD = StateRecordType.DEAD_LETTER
_EXPIRE = StateRecordType.EXPIRE
_RELEASE = StateRecordType.RELEASE
_DATA = int(RecordType.DATA)
_DELIVER_AT = int(EntryFlags.HAS_DELIVER_AT)
_HAS_GROUP = int(EntryFlags.HAS_GROUP)
_SCHEDULED = _DELIVER_AT | _HAS_GROUP
# The ids finished above the head are pruned (those below it dropped) once there are
# this many - and then again each time the set has doubled: a head held back by one
# old message (leased, delayed, waiting for its retry or its group) keeps them all,
# and pruning at a fixed size would cost O(n) per ack.  4,096 keeps the set small (the
# unique keys' sweep reads it whole); a prune costs per ack the same at any size.
_PRUNE_DONE_AT = 4096
_LOST_LEASE = "lease lost (process crashed or queue reopened before ack)"
# The reason a dead letter carries when its nacker stopped before the move (the nack's
# own reason is not in the journal).
_NACK_UNFINISHED = "nacked (the move here was finished by another handle or a reopen)"


class ReaderHooks:
    """The features registered for the hooks a reader calls."""

    def __init__(self, features: Sequence[Feature]) -> None:
        def overriding(name: str) -> list[Feature]:
            base = getattr(Feature, name)
            return [f for f in features if getattr(type(f), name) is not base]

        self.selector = overriding("selector")
        self.deliverable = overriding("deliverable")
        self.deliverable_flags = 0  # the entry flags any of them looks at
        for feature in self.deliverable:
            self.deliverable_flags |= feature.deliverable_flags
        self.failed = overriding("failed")
        self.settled = overriding("settled")


class ReaderCore(FailedDeliveries, Removal, DeliveryInTime):
    """The state machine of one reader (no locking, no waiting: the queue does those).

    Its groups and delays - what holds a message back until its turn or its time -
    are :class:`~ledgerq.core.schedule.DeliveryInTime`'s, and the ways a lease ends
    without an ack - nacks, releases, timeouts, and the features' ``failed`` hook -
    :class:`~ledgerq.core.failures.FailedDeliveries`', and the messages settled by
    tooling, purge or retention :class:`~ledgerq.core.removal.Removal`'s, each written
    apart.

    ``session`` is what a step coordinates with the other handles reading it: nothing
    in exclusive mode (:data:`NO_SESSION`), the step lock and the catch-up of the
    reader's journal in shared mode (``SharedReaderCore``).
    """

    session: ReaderSession | NoSession = NO_SESSION

    def __init__(
        self,
        name: str,
        journal: ReaderJournal,
        manager: SegmentManager,
        hooks: ReaderHooks,
        *,
        visibility_timeout: float | None,
        start_latest: bool = False,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        self.name = name
        self._retry_policy = retry_policy
        self.journal = journal
        self._manager = manager
        self._hooks = hooks
        self._visibility = visibility_timeout
        is_new = not os.path.exists(journal.path)
        state = journal.load()
        self.counters = {"acked": 0, "nacked": 0, "expired": 0, "dead_lettered": 0}
        self.counters.update(state.counters)
        self._deliveries = state.deliveries
        head = manager.next_id if is_new and start_latest else state.head
        head = max(head, manager.segments[0].first_id)
        # An ack whose entry is not in the log (sync="never": a power cut kept the ack and
        # lost the entry, whose id is never used again) must not count in pending().
        self._skip = {i for i in state.done if i >= head and self._exists_unread(i)}
        self._done: set[int] = set()
        self._prune_done_at = _PRUNE_DONE_AT
        self._cursor = LogCursor(manager, head)
        self._leased: dict[int, tuple[Entry, int]] = {}  # id -> (entry, delivery number)
        # id -> (holder, deadline_ns) of the leases other handles hold: shared mode's,
        # known from the reader's journal (none in exclusive mode, where no other is).
        self._foreign: dict[int, tuple[int, int]] = {}
        # id -> why a lease voided by another handle failed (timed out or reclaimed): the
        # reason its failure is reported with, once this handle reads it back.
        self._fail_reason: dict[int, str] = {}
        self._leased_heap: list[int] = []
        self._reported: dict[int, int] = {}  # id -> failures already passed to `failed`
        # id -> failures a NACK reported that this handle did not see acted on (another
        # handle's nack, or one before a reopen): what the failure called for is checked
        # again - a move to the DLQ its nacker may not have lived to make - but it is
        # neither reported as a lost lease nor delayed a second time.
        self._nacked: dict[int, int] = {}
        # id -> (failures, reason) of a report whose feature raised: to report again
        self._unreported: dict[int, tuple[int, str]] = {}
        self._deadlines: list[tuple[float, int, int]] = []  # (monotonic deadline, id, delivery)
        self._touched: dict[int, float] = {}  # id -> its lease's deadline since a touch
        # Leases revoked because retention_max_bytes deleted their segment (the newest
        # _REVOKED_KEPT), for the error their ack or nack then raises.
        self._revoked: dict[int, None] = {}
        # id -> not before (ns): a failed delivery's retry delay, or a delayed release;
        # journalled (NOT_BEFORE records), void once the id is leased again or finished.
        self._not_before: dict[int, int] = dict(state.not_before)
        self._note_nacked(self._not_before)
        self._reset_groups()
        self._delays = DelayIndex()
        self._due_ns = NEVER_NS  # the delay index's earliest due time, read on every take
        # Delayed entries found ahead of the cursor, for stats (see _unread_delayed).
        self._ahead_ids = array("Q")
        self._ahead_dues = array("q")
        self._ahead_from = 0
        self._selector: Selector = self._make_selector()
        if is_new:
            self.checkpoint()

    def _note_nacked(self, not_before: Iterable[int]) -> None:
        """Ids with a NOT_BEFORE record read back: written with a NACK (every nack
        writes one, with the retry delay or none) or a RELEASE - their last
        failure was reported by the handle that wrote it, which may have stopped before
        acting on it.  (A release's failures were reported before it: checked again
        with the same count, they call for nothing new.)"""
        deliveries, reported, nacked = self._deliveries, self._reported, self._nacked
        for message_id in not_before:
            failures = deliveries.get(message_id, 0)
            if failures > reported.get(message_id, 0):
                nacked[message_id] = failures

    def _make_selector(self) -> Selector:
        for feature in self._hooks.selector:
            selector = feature.selector(self)
            if selector is not None:
                return selector
        return FifoSelector(self)

    # ------------------------------------------------------------------ the log

    def read_next(self) -> Entry | None:
        """The next entry of the log not acked before nor leased (for selectors)."""
        skip, foreign, leased = self._skip, self._foreign, self._leased
        cursor = self._cursor
        while True:
            entry = cursor.next()
            if entry is None:
                return None
            if entry.type != _DATA:
                continue  # reserved record types carry no message
            message_id = entry.id
            if skip and message_id in skip:
                skip.discard(message_id)
                self._done.add(message_id)
                continue
            if entry.flags & _HAS_GROUP:
                self._note_member(entry)  # leased or not: it holds its group
            if message_id in foreign or message_id in leased:
                # Leased ahead of the cursor (shared mode: by another handle, or by this
                # one across a rebuild of its state): it comes back, if ever, through
                # a record of the reader's journal.
                continue
            return entry

    @property
    def last_offset(self) -> int:
        """Where, in its segment, the entry :meth:`read_next` returned last starts (for a
        selector that indexes entries and reads them back with :meth:`read_entry_at`)."""
        return self._cursor.last_offset

    def read_entry_at(self, message_id: int, offset: int) -> Entry:
        """The entry ``message_id``, read back at ``offset`` of its segment (a
        :attr:`last_offset`).  Raises ``DecodeError``, ``OSError`` or ``IndexError``
        when its segment was dropped or the bytes there are damaged."""
        return self._manager.read_entry_at(message_id, offset)

    def peek_unread(self, n: int) -> list[Entry]:
        """The next ``n`` unread entries of the log (not acked, not leased), without
        moving the cursor."""
        skip, foreign, leased = self._skip, self._foreign, self._leased
        found: list[Entry] = []
        cursor = self._cursor.clone()
        while len(found) < n:
            entry = cursor.next()
            if entry is None:
                break
            message_id = entry.id
            if message_id not in skip and message_id not in foreign and message_id not in leased:
                found.append(entry)
        return found

    def has_read_past(self, message_id: int) -> bool:
        """Whether the log has been read beyond ``message_id`` (a cheap bound on the head)."""
        return self._cursor.next_id > message_id

    def deliveries(self, message_id: int) -> int:
        """How many times ``message_id`` has been delivered so far."""
        return self._deliveries.get(message_id, 0)

    # ------------------------------------------------------------------ positions

    @property
    def head(self) -> int:
        """The lowest id that may still need delivering."""
        head = self._cursor.next_id
        heap = self._leased_heap
        while heap and heap[0] not in self._leased:
            heapq.heappop(heap)
        if heap and heap[0] < head:
            head = heap[0]
        held = self._selector.min_id()
        if held is not None and held < head:
            head = held
        if self._delays:
            parked = self._delays.min_id()
            if parked is not None and parked < head:
                head = parked
        if self._group_held:
            waiting = min(self._group_held)
            if waiting < head:
                head = waiting
        return head

    # ------------------------------------------------------------------ delivery

    def take(
        self, n: int, now: float, now_ns: int, deadline_ns: int = 0
    ) -> list[tuple[Entry, int]]:
        """Lease up to ``n`` entries; return each with its attempt number.

        ``deadline_ns``: the leases' visibility deadline in the queue's time, for the
        journal (0: none; only shared mode's journal keeps it).
        """
        if n == 1:
            one = self.take_one(now, now_ns, deadline_ns)
            return [one] if one is not None else []
        if self._deadlines:
            self.expire_leases(now, now_ns)
        chosen: list[Entry] = []
        try:
            while len(chosen) < n:
                entry = self._choose(now_ns)
                if entry is None:
                    break
                chosen.append(entry)
            if not chosen:
                return []
            self.journal.append_lease([e.id for e in chosen], deadline_ns)
        except BaseException:
            for entry in chosen:  # nothing was leased: keep them available
                self._selector.give_back(entry)
            raise
        return [self._lease(entry, now) for entry in chosen]

    def take_one(self, now: float, now_ns: int, deadline_ns: int = 0) -> tuple[Entry, int] | None:
        """:meth:`take` for one entry, without the lists (the polling hot path)."""
        if self._deadlines:
            self.expire_leases(now, now_ns)
        entry = self._choose(now_ns)
        if entry is None:
            return None
        try:
            self.journal.append_lease_one(entry.id, deadline_ns)
        except BaseException:
            self._selector.give_back(entry)  # nothing was leased: keep it available
            raise
        return self._lease(entry, now)

    def _choose(self, now_ns: int) -> Entry | None:
        """The next entry to deliver (settling expired and dead-lettered ones on the way).

        Raises having changed nothing: an entry whose EXPIRE record cannot be written is
        given back.  An entry whose move to the DLQ fails (a full disk) is set aside
        while the next one is chosen, and given back before this returns - it moves at a
        later dequeue, never delivered meanwhile; its error is raised only if no other
        entry can be delivered.
        """
        if now_ns >= self._due_ns:
            self._release_due(now_ns)
        selector = self._selector
        hooks = self._hooks
        deferred: list[Entry] = []
        error: LedgerQError | None = None
        try:
            while True:
                entry = selector.take(now_ns)
                if entry is None:
                    if error is not None:
                        raise error
                    return None
                # One test on the undelayed, ungrouped path (profiled: the hot path).
                if (entry.flags & _SCHEDULED or self._not_before) and not self._may_deliver(
                    entry, now_ns
                ):
                    continue  # parked until its time, or held aside for its group
                if entry.flags & hooks.deliverable_flags and not all(
                    f.deliverable(self, entry, now_ns) for f in hooks.deliverable
                ):
                    try:
                        self._finish(entry.id, _EXPIRE, "expired")
                    except BaseException:
                        selector.give_back(entry)
                        raise
                    continue
                failures = self._deliveries.get(entry.id, 0)
                if failures and failures > self._reported.get(entry.id, 0):
                    try:
                        if self._nacked and self._nacked.get(entry.id) == failures:
                            # Reported by its nacker, with its retry delay written:
                            # only a move it called for is checked again.
                            if self._report_failure(
                                entry,
                                failures,
                                _NACK_UNFINISHED,
                                now_ns,
                                give_back=False,
                                again=True,
                            ):
                                continue
                            return entry
                        reason = (
                            self._fail_reason.pop(entry.id, _LOST_LEASE)
                            if self._fail_reason
                            else _LOST_LEASE
                        )
                        if self._report_failure(entry, failures, reason, now_ns, give_back=False):
                            continue
                        if self._retry_policy is not None and self._retry_later(
                            entry.id, now_ns + self._retry_policy.delay_ns(failures), now_ns
                        ):
                            continue  # a lost lease waits its retry delay too
                    except LedgerQError as exc:
                        deferred.append(entry)
                        error = error or exc
                        continue
                return entry
        finally:
            for entry in deferred:
                selector.give_back(entry)

    def _lease(self, entry: Entry, now: float) -> tuple[Entry, int]:
        """Record the lease of ``entry`` (its LEASE record is written); return it, attempt."""
        message_id = entry.id
        attempt = self._deliveries.get(message_id, 0) + 1
        self._deliveries[message_id] = attempt
        if self._not_before:
            self._not_before.pop(message_id, None)  # the LEASE record voids it
        if self._nacked:
            self._nacked.pop(message_id, None)
        if self._touched:
            self._touched.pop(message_id, None)  # a touch of an earlier lease
        lease = (entry, attempt)
        self._leased[message_id] = lease
        heapq.heappush(self._leased_heap, message_id)
        if self._visibility is not None:
            heapq.heappush(self._deadlines, (now + self._visibility, message_id, attempt))
        return lease

    def _give_back(self, entry: Entry) -> None:
        """Make ``entry`` (leased or reported on) available again."""
        if entry.id >= self._cursor.next_id:
            return  # ahead of the cursor (a lease kept across a rebuild): it reads it again
        self._selector.give_back(entry)

    def _finish(self, message_id: int, kind: StateRecordType, counter: str) -> int:
        """Settle an id that is not leased (expired, dead-lettered)."""
        ticket = self.journal.append(kind, [message_id])
        self._forget(message_id)
        self.counters[counter] += 1
        return ticket

    def _forget(self, message_id: int) -> None:
        self._deliveries.pop(message_id, None)
        if self._group_of:
            group = self._group_of.pop(message_id, None)
            if group is not None:
                self._group_held.pop(message_id, None)
                self._group_advance(group)
        if self._touched:
            self._touched.pop(message_id, None)
        if self._not_before:
            self._not_before.pop(message_id, None)
        if self._reported:
            self._reported.pop(message_id, None)
        if self._nacked:
            self._nacked.pop(message_id, None)
        if self._unreported:
            self._unreported.pop(message_id, None)
        if self._fail_reason:
            self._fail_reason.pop(message_id, None)
        self._done.add(message_id)

    def check_leased(self, message_id: int) -> None:
        """Raise :class:`UnknownMessageError` unless ``message_id`` is leased here."""
        if message_id not in self._leased:
            if message_id in self._revoked:
                raise UnknownMessageError(
                    f"message {message_id} was leased by reader {self.name!r} when "
                    "retention_max_bytes deleted its segment: it was dropped (counted in "
                    "stats().dropped) and can no longer be acked or nacked"
                )
            raise UnknownMessageError(
                f"message {message_id} is not leased by reader {self.name!r} "
                "(never dequeued, already acked or nacked, or its lease expired)"
            )

    def ack(self, ids: list[int]) -> int:
        """Ack leased ids (checked by the caller); return the journal ticket."""
        if len(ids) == 1:
            return self.ack_one(ids[0])
        ticket = self.journal.append(_ACK, ids)  # first: if it fails, nothing changed
        for message_id in ids:
            del self._leased[message_id]
            self._forget(message_id)
        self.counters["acked"] += len(ids)
        self._after_ack(ids)
        return ticket

    def ack_one(self, message_id: int) -> int:
        """:meth:`ack` for one id, checking that it is leased (the hot path)."""
        if message_id not in self._leased:
            self.check_leased(message_id)  # raises, saying why
        ticket = self.journal.append_one(_ACK, message_id)  # first: if it fails, nothing changed
        del self._leased[message_id]
        self._forget(message_id)
        self.counters["acked"] += 1
        if self._hooks.settled or len(self._done) > self._prune_done_at:
            self._after_ack([message_id])
        return ticket

    def _after_ack(self, ids: list[int]) -> None:
        for feature in self._hooks.settled:
            feature.settled(self, ids)
        if len(self._done) > self._prune_done_at:
            self._prune_done()

    def leased_entries(self) -> list[Entry]:
        """Entries currently leased."""
        return [entry for entry, _ in self._leased.values()]

    def _exists_unread(self, message_id: int) -> bool:
        manager = self._manager
        seg = manager.segments[manager.find(message_id)]
        return seg.first_id <= message_id <= seg.last_id

    def seek(self, target: int) -> None:
        """Deliver from the first message with id >= ``target`` next (replay or skip).

        Current leases are dropped (their acks become unknown), attempts start
        again, and the new position is checkpointed durably.
        """
        target = max(target, self._manager.segments[0].first_id, 1)
        # The new position is written first: if it cannot be, nothing changed.  (It is
        # what checkpoint() computes once the state below is reset.)
        self.journal.rewrite(Checkpoint(target, [], [], dict(self.counters)))
        self._leased.clear()
        self._leased_heap.clear()
        self._deadlines.clear()
        self._touched.clear()
        self._deliveries.clear()
        self._reported.clear()
        self._nacked.clear()
        self._unreported.clear()
        self._fail_reason.clear()
        self._skip = set()
        self._done = set()
        self._delays.clear()
        self._due_ns = NEVER_NS
        self._not_before.clear()
        self._reset_groups()
        self._forget_ahead()
        self._cursor.seek(target)
        self._selector = self._make_selector()

    # ------------------------------------------------------------------ reading ahead

    def peek(self, n: int, now_ns: int) -> list[Entry]:
        """The next ``n`` entries that would be delivered, without leasing them.

        Never one whose delay has not passed: those ahead are skipped (looking further).
        """
        if now_ns >= self._due_ns:
            self._release_due(now_ns)
        want = n
        while True:
            found = self._selector.peek(want, now_ns)
            ready = [
                e
                for e in found
                if not e.flags & _DELIVER_AT or e.deliver_at is None or e.deliver_at <= now_ns
            ]
            if any(e.flags & _HAS_GROUP for e in ready):
                ready = self._in_group_turn(ready)
            if len(ready) >= n or len(found) < want:
                return ready[:n]
            want *= 2

    def _in_group_turn(self, entries: list[Entry]) -> list[Entry]:
        """``entries`` without the grouped ones a dequeue would not deliver now: one per
        group, its group's first unfinished message, and only if it is not leased."""
        shown: set[str] = set()
        kept = []
        for entry in entries:
            group = entry.group
            if group is not None and entry.flags & _HAS_GROUP:
                first = self._group_first(group)
                if group in shown or (first is not None and first != entry.id):
                    continue
                shown.add(group)
            kept.append(entry)
        return kept

    def pending(self) -> int:
        """Messages waiting to be delivered (not leased, not acked)."""
        unread = 0
        segments = self._manager.segments
        start = self._cursor.next_id
        for seg in segments:
            if seg.is_empty or seg.last_id < start:
                continue
            if seg.first_id >= start:
                unread += seg.count
            else:
                unread += seg.last_id - start + 1
        if self._skip:
            # Only finished ids the count above includes: in shared mode, retention may
            # have deleted segments ahead of a cursor that had not read them (a handle
            # that consumes nothing), and the ids others acked there are in _skip.
            low = max(start, segments[0].first_id)
            unread -= sum(1 for i in self._skip if i >= low)
        return max(unread, 0) + self._selector.held() + len(self._delays) + len(self._group_held)

    def in_flight(self) -> int:
        """Messages leased and not yet acked or nacked (by any handle)."""
        return len(self._leased) + len(self._foreign)

    def is_finished(self, message_id: int) -> bool:
        """Whether this reader is done with ``message_id`` (acked, dead-lettered, expired,
        dropped, purged; or below its head: never to be delivered again), for unique keys.
        An id at or past the head that the log does not hold counts as not finished."""
        return message_id in self._done or message_id in self._skip or message_id < self.head

    def finished_test(self) -> Callable[[int], bool]:
        """:meth:`is_finished` as a function of the state now (its head computed once):
        for a sweep over many ids while nothing changes (lock held)."""
        head, done, skip = self.head, self._done, self._skip
        return lambda message_id: message_id < head or message_id in done or message_id in skip

    def finished_from(self, first: int) -> set[int]:
        """The ids >= ``first`` already finished (acked, dead-lettered, expired), in this
        run or an earlier one: out of order, above the head (for a bounded queue)."""
        return {i for i in self._done if i >= first} | {i for i in self._skip if i >= first}

    # ------------------------------------------------------------------ persistence

    def _prune_done(self) -> None:
        head = self.head
        self._done = {i for i in self._done if i >= head}
        self._prune_done_at = max(_PRUNE_DONE_AT, 2 * len(self._done))

    def checkpoint(self, *, keep_leases: bool = True) -> None:
        """Rewrite the journal as one checkpoint of the current state (durable).

        The journal is of the newest version from its open on (``ReaderJournal.load``
        rewrites an older one), so a RELEASE or NOT_BEFORE can be appended to it as it is.
        The leases it lists are :meth:`_leases_to_keep`'s (none in exclusive mode, where
        a reopen voids them all); ``keep_leases`` False lists none (the last shared
        handle closing: every lease is lost, each a failed delivery next time).
        """
        head = self.head
        if head > self._cursor.next_id:
            # Everything between the cursor and the head is finished (shared mode: other
            # handles' acks ahead of it): move the cursor there before dropping those ids.
            self._done.update(i for i in self._skip if i < head)
            try:
                self._cursor.seek(head)  # (reads the segments: EIO opening one)
            except StorageError:
                raise
            except OSError as exc:
                where = exc.filename or self._manager.directory
                raise StorageError("read", where, exc) from exc
        self._prune_done()
        self._skip = {i for i in self._skip if i >= head}
        done = sorted(self._done | self._skip)
        deliveries = sorted((i, n) for i, n in self._deliveries.items() if i >= head)
        leases = self._leases_to_keep() if keep_leases else []
        not_before = sorted((i, due) for i, due in self._not_before.items() if i >= head)
        self.journal.rewrite(
            Checkpoint(head, done, deliveries, dict(self.counters), leases, not_before)
        )

    def _leases_to_keep(self) -> list[tuple[int, int, int]]:
        """The leases a checkpoint lists, ``(id, holder, deadline_ns)`` in id order: none
        here (an exclusive reopen voids every lease)."""
        return []

    def publish_head(self, *, moved: bool = False) -> None:
        """Write this reader's head where the other handles' retention reads it (shared
        mode); nothing here, where retention reads the head itself."""

    def close_last(self, with_room: Callable[[Callable[[], object]], None]) -> None:
        """Close as the queue's last handle: one clean checkpoint, listing no lease.

        Only a journal that changed (or that lists leases: they are all lost now) is
        rewritten.  The checkpoint is compaction: on a full disk it may use the disk
        reserve (``with_room``), and if it still fails, the journal - which holds every
        record - is synced as it is and the failure logged, not raised: a full disk must
        not fail the close of a queue that was only read (``ledgerq stats``), nor lose
        anything (the next session's first handle drops the leases it lists).
        """
        session = self.session
        try:
            try:
                session.enter()
            except QueueClosedError:
                return  # removed by another handle: nothing of it to keep
            try:
                if self.journal.has_grown or self._leases_to_keep():
                    try:
                        with_room(lambda: self.checkpoint(keep_leases=False))
                    except StorageError as exc:
                        logger.warning(
                            "ledgerq: %s; the reader state is kept as it is (synced)", exc
                        )
                self._leased.clear()
                self._foreign = {}
            finally:
                session.leave()
            self.journal.commit.sync_now()
        finally:
            self.journal.close()

    def close(self) -> None:
        """Close as one of the queue's handles that is not the last (shared mode; an
        exclusive handle is always the last): the journal made durable as it is."""
        try:
            self.journal.commit.sync_now()
        finally:
            self.journal.close()

    def maybe_compact(self) -> None:
        """Checkpoint if the journal has grown enough; never raises.

        Compaction is housekeeping after a call whose effect has happened (its record
        is written): a checkpoint the disk refuses is logged and tried again once the
        journal has grown some more.
        """
        if self.journal.wants_compaction:
            try:
                self.checkpoint()
            except StorageError as exc:
                self.journal.postpone_compaction()
                logger.warning("ledgerq: could not compact a reader's state (%s)", exc)

    def stats(self, now_ns: int) -> ReaderStats:
        """This reader's figures."""
        oldest = self._selector.oldest_timestamp()
        return ReaderStats(
            name=self.name,
            pending=self.pending(),
            in_flight=self.in_flight(),
            acked=self.counters["acked"],
            nacked=self.counters["nacked"],
            expired=self.counters["expired"],
            dead_lettered=self.counters["dead_lettered"],
            head=self.head,
            oldest_pending_age=max(0.0, (now_ns - oldest) / 1e9) if oldest is not None else 0.0,
            delayed=self.delayed(now_ns),
        )

    def _check(self) -> None:
        """Assert invariants (tests call this after every step)."""
        for message_id, (entry, attempt) in self._leased.items():
            assert entry.id == message_id
            assert self._deliveries.get(message_id) == attempt, "lease without its delivery"
            assert message_id < self._cursor.next_id
        assert self.head <= self._cursor.next_id


def initial_checkpoint(head: object, done: Iterable[object], next_id: int) -> Checkpoint:
    """The first checkpoint of a reader created with every id below ``head`` and in ``done`` done.

    ``head`` is the first id the reader may deliver: from 1 to ``next_id`` (the tail);
    each ``done`` id lies above it and below ``next_id`` - a reader cannot have acked
    a message that does not exist yet.  Raises ``TypeError`` for an id that is not an
    int, ``ValueError`` for one out of those bounds (naming it).
    """
    first = check_id(head)
    if not 1 <= first <= next_id:
        raise ValueError(
            f"a new reader's first id must be from 1 to the queue's next id {next_id}, got {first}"
        )
    ids = sorted({check_id(i) for i in done})
    for message_id in (ids[0], ids[-1]) if ids else ():
        if not first < message_id < next_id:
            raise ValueError(
                f"done id {message_id} is not above the reader's first id {first} and "
                f"below the queue's next id {next_id}"
            )
    return Checkpoint(first, ids, [], {})
