"""Failed deliveries: nacks, releases, leases that time out, and what the features are
told of them (a part of the reader's state machine).

:class:`~ledgerq.core.reader.ReaderCore` hands messages out and takes acks; these are
the ways a lease ends without one, written apart:

* **nack** - a failed delivery its consumer reports: the NACK record and the message's
  retry time (a NOT_BEFORE record, in the same write) first, then the features hear of
  it (``failed``: the DLQ may move it away), then it is parked for its retry delay or
  given back at once;
* **release** - a lease given back unused: not a failure, its delivery count undone;
* **lease expiry** - a visibility timeout that passed (``expire_leases``, the
  deadlines' heap, ``touch`` pushing a deadline later): a failed delivery each, once
  the other handles are told (shared mode's RECLAIM: ``_note_expired``);
* **the report** (``_report_failure``) - the features' ``failed`` hook; when a feature
  raises (the DLQ could not be written) the entry is given back, never dropped, and
  the failure is reported again before the message is delivered again.
"""

from __future__ import annotations

import heapq
import logging
from typing import TYPE_CHECKING, cast

from ledgerq._errors import LedgerQError
from ledgerq.core.feature import FailedDelivery
from ledgerq.core.journal import ReaderJournal
from ledgerq.core.retry import RetryPolicy
from ledgerq.format.entry import Entry
from ledgerq.format.reader_state import StateRecordType, encode_ids_record
from ledgerq.segment.files import StorageError

if TYPE_CHECKING:
    from ledgerq.core.reader import ReaderCore, ReaderHooks

__all__ = ["NO_WAIT", "FailedDeliveries"]

logger = logging.getLogger("ledgerq")

_NACK = StateRecordType.NACK
_DEAD = StateRecordType.DEAD_LETTER
_RELEASE = StateRecordType.RELEASE
# The due time of a NOT_BEFORE record that asks for no wait: it only says that the
# failures before it were reported (see FailedDeliveries.nack).
NO_WAIT = 0
_TIMED_OUT = "visibility timeout expired"


class FailedDeliveries:
    """The failed deliveries of :class:`~ledgerq.core.reader.ReaderCore` (a mixin: its
    methods take the reader's state machine as ``self``)."""

    # The reader's state they read (set by ReaderCore's constructor).
    name: str
    journal: ReaderJournal
    counters: dict[str, int]
    _hooks: ReaderHooks
    _retry_policy: RetryPolicy | None
    _visibility: float | None
    _leased: dict[int, tuple[Entry, int]]  # id -> (entry, delivery number)
    _deliveries: dict[int, int]
    _deadlines: list[tuple[float, int, int]]  # (monotonic deadline, id, delivery)
    _touched: dict[int, float]  # id -> its lease's deadline since a touch
    _reported: dict[int, int]  # id -> failures already passed to `failed`
    _nacked: dict[int, int]  # id -> failures a NACK reported, to check again
    _unreported: dict[int, tuple[int, str]]  # id -> a report whose feature raised
    _not_before: dict[int, int]  # id -> its retry time (NOT_BEFORE), the queue's ns

    if TYPE_CHECKING:  # the reader's own methods, which these call

        def _give_back(self, entry: Entry) -> None: ...
        def _finish(self, message_id: int, kind: StateRecordType, counter: str) -> int: ...
        def _park(self, due_ns: int, message_id: int) -> None: ...
        def _retry_later(self, message_id: int, due_ns: int, now_ns: int) -> bool: ...
        def _append_with_not_before(self, record: bytes, dues: dict[int, int]) -> int: ...

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
            delivery = FailedDelivery(
                cast("ReaderCore", self), entry, failures, reason, now_ns, again=again
            )
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
