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
from ledgerq.core.feature import FailedDelivery, Feature, FifoSelector, Selector
from ledgerq.core.journal import ReaderJournal
from ledgerq.core.reader_session import NO_SESSION, NoSession, ReaderSession
from ledgerq.core.retry import RetryPolicy
from ledgerq.core.schedule import DeliveryInTime
from ledgerq.format.entry import Entry, EntryFlags, RecordType
from ledgerq.format.reader_state import (
    Checkpoint,
    StateRecordType,
    encode_ids_record,
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
# and pruning at a fixed size would cost O(n) per ack.
_PRUNE_DONE_AT = 65536
# The due time of a NOT_BEFORE record that asks for no wait: it only says that the
# failures before it were reported (see ReaderCore.nack).
NO_WAIT = 0
_LOST_LEASE = "lease lost (process crashed or queue reopened before ack)"
# The reason a dead letter carries when its nacker stopped before the move (the nack's
# own reason is not in the journal).
_NACK_UNFINISHED = "nacked (the move here was finished by another handle or a reopen)"
_TIMED_OUT = "visibility timeout expired"
_REVOKED_KEPT = 10_000


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


class ReaderCore(DeliveryInTime):
    """The state machine of one reader (no locking, no waiting: the queue does those).

    Its groups and delays - what holds a message back until its turn or its time -
    are :class:`~ledgerq.core.schedule.DeliveryInTime`'s, written apart.

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

    def _report_failure(
        self,
        entry: Entry,
        failures: int,
        reason: str,
        now_ns: int,
        *,
        give_back: bool = True,
        again: bool = False,
    ) -> bool:
        """Tell the features a delivery failed; True (and settled) if one moved it away.

        ``again``: its nacker reported it already, and may have stopped before acting
        on it (:class:`FailedDelivery`).

        ``entry`` is neither leased nor held when this is called.  If a feature raises
        (the DLQ could not be written), the entry is given back (unless ``give_back`` is
        False: the caller does it) - never dropped, so no checkpoint moves the head past
        it - and this failure is reported again, with its reason, before the entry is
        delivered again; the error propagates.
        """
        message_id = entry.id
        retried = self._unreported.pop(message_id, None) if self._unreported else None
        if retried is not None and retried[0] == failures:
            reason = retried[1]  # the report that raised, not a lost lease
        before = self._reported.get(message_id, 0)
        self._reported[message_id] = failures
        if self._nacked:
            self._nacked.pop(message_id, None)
        if self._hooks.failed:
            delivery = FailedDelivery(self, entry, failures, reason, now_ns, again=again)
            try:
                for feature in self._hooks.failed:
                    if feature.failed(delivery):
                        self._finish(message_id, _DEAD, "dead_lettered")
                        return True
            except BaseException:
                self._reported[message_id] = before
                self._unreported[message_id] = (failures, reason)
                if again:
                    self._nacked[message_id] = failures
                if give_back:
                    self._give_back(entry)
                raise
        return False

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

    def expire_leases(self, now: float, now_ns: int) -> None:
        """Give back leases whose visibility timeout passed (a failed delivery each),
        once :meth:`_note_expired` has told the other handles."""
        deadlines = self._deadlines
        # id -> lease: a lease touched to the deadline it had is in the heap twice.
        expired: dict[int, tuple[Entry, int]] = {}
        while deadlines and deadlines[0][0] <= now:
            deadline, message_id, attempt = heapq.heappop(deadlines)
            lease = self._leased.get(message_id)
            if lease is None or lease[1] != attempt:
                continue
            if self._touched and self._touched.get(message_id, deadline) > deadline:
                continue  # touched since: a later deadline is in the heap
            expired[message_id] = lease
        if not expired:
            return
        try:
            self._note_expired(list(expired))
        except BaseException:
            for message_id, lease in expired.items():  # still leased: expired next time
                heapq.heappush(deadlines, (now, message_id, lease[1]))
            raise
        for message_id, (entry, attempt) in expired.items():
            del self._leased[message_id]
            if self._touched:
                self._touched.pop(message_id, None)
            try:
                if not self._report_failure(entry, attempt, _TIMED_OUT, now_ns):
                    self._retry_or_give_back(entry, attempt, now_ns)
            except LedgerQError as exc:
                self._move_failed(message_id, exc)  # given back; moved before redelivery

    def _note_expired(self, ids: list[int]) -> None:
        """The leases of ``ids`` timed out and are about to be given back: say so where
        another handle must know (shared mode's RECLAIM record); nothing here."""

    def _retry_or_give_back(self, entry: Entry, failures: int, now_ns: int) -> None:
        """After a failed delivery (not dead-lettered): park ``entry`` for the retry
        policy's delay, or make it available at once (no policy, or the journal
        refused the delay: logged - the message comes back early rather than never)."""
        policy = self._retry_policy
        if policy is not None:
            try:
                if self._retry_later(entry.id, now_ns + policy.delay_ns(failures), now_ns):
                    return
            except StorageError as exc:
                logger.warning(
                    "ledgerq: could not record the retry delay of message %d (%s); it is "
                    "delivered again at once",
                    entry.id,
                    exc,
                )
        self._give_back(entry)

    def next_deadline(self) -> float | None:
        """Lease time (the queue clock's monotonic seconds) of the next visibility-timeout
        expiry, if any."""
        deadlines = self._deadlines
        while deadlines:
            deadline, message_id, attempt = deadlines[0]
            lease = self._leased.get(message_id)
            if (
                lease is not None
                and lease[1] == attempt
                and not (self._touched and self._touched.get(message_id, deadline) > deadline)
            ):
                return deadline
            heapq.heappop(deadlines)
        return None

    def touch(
        self, message_id: int, seconds: float | None, now: float, now_ns: int
    ) -> float | None:
        """Extend the lease of ``message_id`` (checked by the caller) to ``seconds`` from
        ``now`` (lease time; ``now_ns`` the queue's time), default the visibility
        timeout; return the new deadline (None: no visibility timeout, the lease lasts
        until settled anyway)."""
        if seconds is None:
            seconds = self._visibility
            if seconds is None:
                return None
        attempt = self._leased[message_id][1]
        deadline = now + seconds
        # The earlier deadline stays in the heap: _touched says it is stale.
        self._touched[message_id] = deadline
        heapq.heappush(self._deadlines, (deadline, message_id, attempt))
        return deadline

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

    def nack(self, ids: list[int], reason: str, now_ns: int, delay_ns: int | None = None) -> int:
        """Fail leased ids (checked by the caller); return the journal ticket.

        Each comes back no earlier than ``delay_ns`` from ``now_ns``, or (None) its
        retry policy's delay for its attempt; the delay is written with the NACK record,
        in the same write - as a NOT_BEFORE record, of ``NO_WAIT`` when there is no
        delay: a checkpoint keeps it, so that a reopen, or another handle, knows that
        this failure was reported (not a lost lease: ``_nacked``).  Raises having
        changed nothing if that cannot be written.
        Once it is, the nack has happened: a move to the DLQ that fails then (a full
        disk) does not raise - the message is held back and moved before it can be
        delivered again.
        """
        dues: dict[int, int] = {}
        policy = self._retry_policy
        for message_id in ids:
            if delay_ns is not None:
                wait = delay_ns
            elif policy is not None:
                wait = policy.delay_ns(self._leased[message_id][1])
            else:
                wait = 0
            dues[message_id] = now_ns + wait if wait > 0 else NO_WAIT
        ticket = self._append_with_not_before(encode_ids_record(_NACK, ids), dues)
        self.counters["nacked"] += len(ids)
        for message_id in ids:
            entry, attempt = self._leased.pop(message_id)
            due = dues[message_id]
            self._not_before[message_id] = due
            try:
                if self._report_failure(entry, attempt, reason, now_ns):
                    continue  # dead-lettered (its NOT_BEFORE forgotten with it)
            except LedgerQError as exc:
                self._move_failed(message_id, exc)
                continue
            if due > now_ns:
                self._park(due, message_id)
            else:
                self._give_back(entry)
        return ticket

    def release(self, ids: list[int], now_ns: int, due_ns: int | None = None) -> int:
        """Give leased ids (checked by the caller) back unused; return the journal ticket.

        Not a failed delivery: the RELEASE record undoes the count its LEASE added, so
        the next delivery has the same attempt number, and no feature hears of it.
        With ``due_ns``, not delivered again before then (a NOT_BEFORE record, in the
        same write as the RELEASE).  Without, an id that failed before gets a NOT_BEFORE
        of ``NO_WAIT``: read back (a reopen, another handle), it says those failures were
        reported - not lost leases, to report and delay again (see :meth:`nack`).
        """
        # First: if the write fails, nothing changed.
        if due_ns is None:
            dues = {i: NO_WAIT for i in ids if self._leased[i][1] > 1}
        else:
            dues = dict.fromkeys(ids, due_ns)
        if dues:
            ticket = self._append_with_not_before(encode_ids_record(_RELEASE, ids), dues)
        else:
            ticket = self.journal.append(_RELEASE, ids)
        for message_id in ids:
            entry, attempt = self._leased.pop(message_id)
            if attempt > 1:
                self._deliveries[message_id] = attempt - 1
            else:
                self._deliveries.pop(message_id, None)
            if self._touched:
                self._touched.pop(message_id, None)
            due = dues.get(message_id)
            if due is not None:
                self._not_before[message_id] = due
            if due is None or due <= now_ns:
                self._give_back(entry)
            else:
                self._park(due, message_id)
        if self._deadlines:
            # A deadline is matched to its lease by attempt number, and the next lease
            # of a released id has the same one: drop the stale deadline, or it would
            # expire that lease early.
            released = set(ids)
            self._deadlines[:] = [d for d in self._deadlines if d[1] not in released]
            heapq.heapify(self._deadlines)
        return ticket

    def _move_failed(self, message_id: int, exc: LedgerQError) -> None:
        """A failed delivery whose report raised (the DLQ refused the move): say so.

        ``_report_failure`` gave the entry back and noted the failure, so the move is
        tried again before the message can be delivered (:meth:`_choose`).
        """
        logger.warning(
            "ledgerq: could not move message %d of reader %r to the dead-letter queue (%s); "
            "it is held back and moved at a later dequeue",
            message_id,
            self.name,
            exc,
        )

    def settle_any(self, message_id: int) -> bool:
        """Mark ``message_id`` done wherever it is (leased, held, or not read yet).

        Used by tooling that removes messages by id (DLQ requeue and purge).
        Returns False if the id is not pending here.
        """
        leased = message_id in self._leased
        held = not leased and self._selector.holds(message_id)
        parked = not leased and not held and bool(self._delays) and message_id in self._delays
        aside = not leased and message_id in self._group_held
        held = held or parked or aside
        if not leased and not held:  # not read yet, or not pending here at all
            if message_id < self._cursor.next_id or message_id in self._skip:
                return False
            if not self._exists_unread(message_id):
                return False
        self.journal.append(_ACK, [message_id])  # first: if it fails, nothing changed
        if leased:
            del self._leased[message_id]
        elif aside:
            del self._group_held[message_id]
        elif parked:
            self._delays.discard(message_id)
            self._due_ns = self._delays.next_due_ns
        elif held:
            self._selector.discard(message_id)
        else:
            self._skip.add(message_id)
        self._forget(message_id)
        self.counters["acked"] += 1
        return True

    def purge(self, wanted: set[int] | None = None) -> tuple[list[int], int]:
        """Settle for good every pending message that is not leased (or those of
        ``wanted``); return their ids and the journal ticket.

        Pending is everything not finished and not leased: unread, ready, delayed,
        waiting for a retry, held behind its group.  A leased message is never purged:
        its holder's ack must still work.  One journal write for all of them (chunked
        records): if it fails, nothing changed.  Counted as acked (``stats()``).
        """
        parked = self._delays.ids() if self._delays else set()
        if wanted is None:
            candidates: Iterable[int] = self._pending_ids(parked)
        else:
            candidates = sorted(wanted)
        ids = [i for i in candidates if self._may_purge(i, parked)]
        if not ids:
            return [], 0
        records = [encode_ids_record(_ACK, ids[k : k + 8192]) for k in range(0, len(ids), 8192)]
        self.journal.append_record(b"".join(records))  # first: if it fails, nothing changed
        ticket = self.journal.commit.note_write()
        gone = set(ids)
        if parked:
            self._delays.discard_all(gone)
            self._due_ns = self._delays.next_due_ns
        for message_id in ids:  # in id order: a group's head first, then what it frees
            if message_id in self._group_held:
                del self._group_held[message_id]
            elif not self._selector.discard(message_id) and message_id >= self._cursor.next_id:
                self._skip.add(message_id)
            self._forget(message_id)  # (gives its group's next one back: group_freed)
        self.counters["acked"] += len(ids)
        for feature in self._hooks.settled:
            feature.settled(self, ids)
        return ids, ticket

    def _pending_ids(self, parked: set[int]) -> list[int]:
        """Every id this reader may still deliver (leased ones included), in id order."""
        held = set(self._group_held) | parked
        start = self._cursor.next_id
        behind = [i for i in range(self.head, start) if i in held or self._selector.holds(i)]
        unread: list[int] = []
        for seg in self._manager.segments:
            if seg.is_empty or seg.last_id < start:
                continue
            if not seg.missing:
                unread.extend(range(max(seg.first_id, start), seg.last_id + 1))
                continue
            cursor = LogCursor(self._manager, max(seg.first_id, start))  # a damaged segment
            while (entry := cursor.next()) is not None and entry.id <= seg.last_id:
                unread.append(entry.id)
        skip = self._skip
        return behind + [i for i in unread if i not in skip]

    def _may_purge(self, message_id: int, parked: set[int]) -> bool:
        """Whether ``message_id`` is pending here and not leased."""
        if message_id in self._leased:
            return False
        if message_id in self._group_held or message_id in parked:
            return True
        if self._selector.holds(message_id):
            return True
        if message_id < self._cursor.next_id or message_id in self._skip:
            return False
        return self._exists_unread(message_id)

    def drop_segment(self, first_id: int, last_id: int) -> tuple[int, int]:
        """Retention is deleting the oldest segment, ids ``first_id..last_id``: settle
        everything of it this reader had not settled; return (how many, how many leased).

        Unread messages, messages given back (held by the selector) and leased ones
        alike are dropped and counted in ``counters["dropped"]``.  A lease is revoked:
        its ack or nack raises :class:`UnknownMessageError` saying so (the message
        cannot be delivered again: its bytes are gone).  The reader's head moves past
        ``last_id``, so the caller's checkpoint records the drop durably.
        """
        revoked = [i for i in self._leased if i <= last_id]
        for message_id in revoked:
            del self._leased[message_id]
            self._revoked[message_id] = None
        while len(self._revoked) > _REVOKED_KEPT:
            del self._revoked[next(iter(self._revoked))]
        lost = len(revoked) + len(self._selector.drop_through(last_id))
        if self._delays:
            lost += self._delays.drop_through(last_id)
            self._due_ns = self._delays.next_due_ns
        if self._group_of:
            lost += self._drop_group_members(last_id)
        start = max(self._cursor.next_id, first_id)
        if start <= last_id:
            # Ids are contiguous inside a segment (as pending() counts them).
            lost += last_id - start + 1 - sum(1 for i in self._skip if start <= i <= last_id)
            self._cursor.seek(last_id + 1)
            self._forget_ahead()
        self._skip = {i for i in self._skip if i > last_id}
        failed = [i for i in self._deliveries if i <= last_id]
        for message_id in failed:
            self._forget(message_id)
        for feature in self._hooks.settled:  # e.g. the retry tracker forgets them
            feature.settled(self, failed)
        self.counters["dropped"] = self.counters.get("dropped", 0) + lost
        return lost, len(revoked)

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
