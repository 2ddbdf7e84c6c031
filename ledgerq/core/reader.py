"""A reader: one consumer's position, leases, acks and delivery counts.

The model is Kestrel's: a reader's durable state is a *head* id (every id below
it is done) and the set of ids acked out of order above the head.  ledgerq adds
how many times each not-yet-acked message was delivered, so that a lease lost to
a crash counts as a failed delivery.

In memory:

* the *cursor* reads the log in id order;
* ``_outstanding`` holds every entry the cursor has passed that is not acked
  yet, in id order (the cursor only moves forward, so insertion order is id
  order and the head is simply its first key);
* ``_leased`` the ids currently handed out; ``_redeliver`` (a heap) the ids
  given back by nack or an expired lease, delivered again before new ones;
* ``_skip`` ids at or after the cursor that were acked in an earlier run.

Every method here runs with the queue lock held.
"""

from __future__ import annotations

import heapq
import os
from collections import OrderedDict
from typing import TYPE_CHECKING

from ledgerq._errors import UnknownMessageError
from ledgerq._types import ReaderStats
from ledgerq.core.journal import ReaderJournal
from ledgerq.format.entry import Entry
from ledgerq.format.reader_state import Checkpoint, StateRecordType
from ledgerq.segment.cursor import LogCursor

if TYPE_CHECKING:
    from ledgerq.segment.manager import SegmentManager

__all__ = ["ReaderCore"]

_LEASE = StateRecordType.LEASE
_ACK = StateRecordType.ACK
_NACK = StateRecordType.NACK


class ReaderCore:
    """The state machine of one reader (no locking, no waiting: the queue does those)."""

    def __init__(
        self,
        name: str,
        journal: ReaderJournal,
        manager: SegmentManager,
        *,
        visibility_timeout: float | None,
        start_latest: bool = False,
    ) -> None:
        self.name = name
        self.journal = journal
        self._manager = manager
        self._visibility = visibility_timeout
        is_new = not os.path.exists(journal.path)
        state = journal.load()
        self.counters = {"acked": 0, "nacked": 0, "expired": 0, "dead_lettered": 0}
        self.counters.update(state.counters)
        self._deliveries = state.deliveries
        head = state.head
        if is_new and start_latest:
            head = manager.next_id
        oldest = manager.segments[0].first_id
        if head < oldest:
            head = oldest
        self._skip = {i for i in state.done if i >= head}
        self._done: set[int] = set()
        self._cursor = LogCursor(manager, head)
        self._outstanding: OrderedDict[int, Entry] = OrderedDict()
        self._leased: dict[int, int] = {}  # id -> delivery number of the current lease
        self._redeliver: list[int] = []
        self._redeliver_set: set[int] = set()
        self._deadlines: list[tuple[float, int, int]] = []  # (monotonic deadline, id, delivery)
        if is_new:
            self.checkpoint()

    # ------------------------------------------------------------------ positions

    @property
    def head(self) -> int:
        """The lowest id that may still need delivering."""
        for message_id in self._outstanding:
            return message_id
        return self._cursor.next_id

    def deliveries(self, message_id: int) -> int:
        """How many times ``message_id`` has been delivered so far."""
        return self._deliveries.get(message_id, 0)

    # ------------------------------------------------------------------ delivery

    def expire_leases(self, now: float) -> list[int]:
        """Give back leases whose visibility timeout passed; return their ids."""
        expired: list[int] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, message_id, delivery = heapq.heappop(deadlines)
            if self._leased.get(message_id) == delivery:
                del self._leased[message_id]
                self._give_back(message_id)
                expired.append(message_id)
        return expired

    def next_deadline(self) -> float | None:
        """Monotonic time of the next visibility-timeout expiry, if any."""
        deadlines = self._deadlines
        while deadlines and self._leased.get(deadlines[0][1]) != deadlines[0][2]:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else None

    def _give_back(self, message_id: int) -> None:
        if message_id not in self._redeliver_set:
            self._redeliver_set.add(message_id)
            heapq.heappush(self._redeliver, message_id)

    def next_candidate(self) -> Entry | None:
        """The next entry to consider delivering (not yet leased), in id order; or None."""
        while self._redeliver:
            message_id = heapq.heappop(self._redeliver)
            self._redeliver_set.discard(message_id)
            entry = self._outstanding.get(message_id)
            if entry is not None and message_id not in self._leased:
                return entry
        skip = self._skip
        while True:
            entry = self._cursor.next()
            if entry is None:
                return None
            if skip and entry.id in skip:
                skip.discard(entry.id)
                self._done.add(entry.id)
                continue
            self._outstanding[entry.id] = entry
            return entry

    def lease(self, entries: list[Entry], now: float) -> list[int]:
        """Lease ``entries`` (from :meth:`next_candidate`); return each one's attempt number."""
        ids = [e.id for e in entries]
        self.journal.append(_LEASE, ids)
        attempts = []
        deliveries = self._deliveries
        visibility = self._visibility
        for message_id in ids:
            n = deliveries.get(message_id, 0) + 1
            deliveries[message_id] = n
            self._leased[message_id] = n
            attempts.append(n)
            if visibility is not None:
                heapq.heappush(self._deadlines, (now + visibility, message_id, n))
        return attempts

    def settle(self, message_id: int) -> None:
        """Mark a not-leased outstanding entry done without delivering it (e.g. expired)."""
        self._remove(message_id)
        self.journal.append(_ACK, [message_id])

    def is_leased(self, message_id: int) -> bool:
        """Whether ``message_id`` is currently leased by this reader."""
        return message_id in self._leased

    def leased_entry(self, message_id: int) -> Entry:
        """The entry of a leased id; raises UnknownMessageError if it is not leased."""
        if message_id not in self._leased:
            raise UnknownMessageError(
                f"message {message_id} is not leased by reader {self.name!r} "
                "(never dequeued, already acked or nacked, or its lease expired)"
            )
        return self._outstanding[message_id]

    def ack(self, ids: list[int]) -> int:
        """Ack leased ids (validated by the caller); return the journal ticket."""
        for message_id in ids:
            del self._leased[message_id]
            self._remove(message_id)
        self.counters["acked"] += len(ids)
        return self.journal.append(_ACK, ids)

    def _remove(self, message_id: int) -> None:
        self._outstanding.pop(message_id, None)
        self._deliveries.pop(message_id, None)
        self._redeliver_set.discard(message_id)
        if self._outstanding:
            head = next(iter(self._outstanding))
            if message_id > head:
                self._done.add(message_id)

    def nack(self, ids: list[int]) -> int:
        """Give leased ids back for redelivery; return the journal ticket."""
        for message_id in ids:
            del self._leased[message_id]
            self._give_back(message_id)
        self.counters["nacked"] += len(ids)
        return self.journal.append(_NACK, ids)

    def drop(self, message_id: int) -> int:
        """Remove a leased or outstanding id for good without counting an ack (DLQ moves)."""
        self._leased.pop(message_id, None)
        self._remove(message_id)
        return self.journal.append(_ACK, [message_id])

    # ------------------------------------------------------------------ reading ahead

    def peek_entries(self, n: int) -> list[Entry]:
        """The next ``n`` entries that would be delivered, without leasing them."""
        found: list[Entry] = []
        for message_id in sorted(self._redeliver_set):
            entry = self._outstanding.get(message_id)
            if entry is not None and message_id not in self._leased:
                found.append(entry)
                if len(found) >= n:
                    return found
        cursor = self._cursor.clone()
        while len(found) < n:
            entry = cursor.next()
            if entry is None:
                break
            if entry.id not in self._skip:
                found.append(entry)
        return found

    def pending(self) -> int:
        """Messages waiting to be delivered (not leased, not acked)."""
        unread = 0
        start = self._cursor.next_id
        for seg in self._manager.segments:
            if seg.is_empty or seg.last_id < start:
                continue
            if seg.first_id >= start:
                unread += seg.count
            else:
                unread += seg.last_id - start + 1
        skip_ahead = sum(1 for i in self._skip if i >= start) if self._skip else 0
        return max(unread - skip_ahead, 0) + len(self._redeliver_set)

    def in_flight(self) -> int:
        """Messages leased and not yet acked or nacked."""
        return len(self._leased)

    def oldest_pending_timestamp(self) -> int | None:
        """Enqueue time (ns) of the oldest pending message, if any."""
        oldest: int | None = None
        for message_id in self._redeliver_set:
            entry = self._outstanding.get(message_id)
            if entry is not None and (oldest is None or entry.timestamp < oldest):
                oldest = entry.timestamp
        nxt = self.peek_entries_from_cursor()
        if nxt is not None and (oldest is None or nxt.timestamp < oldest):
            oldest = nxt.timestamp
        return oldest

    def peek_entries_from_cursor(self) -> Entry | None:
        """The next unread entry, without moving the cursor."""
        cursor = self._cursor.clone()
        while True:
            entry = cursor.next()
            if entry is None or entry.id not in self._skip:
                return entry

    # ------------------------------------------------------------------ persistence

    def checkpoint(self) -> None:
        """Rewrite the journal as one checkpoint of the current state (durable)."""
        head = self.head
        done = sorted({i for i in self._done if i >= head} | {i for i in self._skip if i >= head})
        self._done = {i for i in self._done if i >= head}
        deliveries = sorted((i, n) for i, n in self._deliveries.items() if i >= head)
        self.journal.rewrite(Checkpoint(head, done, deliveries, dict(self.counters)))

    def maybe_compact(self) -> None:
        """Checkpoint if the journal has grown enough."""
        if self.journal.wants_compaction:
            self.checkpoint()

    def stats(self, now_ns: int) -> ReaderStats:
        """This reader's figures."""
        oldest = self.oldest_pending_timestamp()
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
        )

    def _check(self) -> None:
        """Assert invariants (tests call this after every step)."""
        ids = list(self._outstanding)
        assert ids == sorted(ids), "outstanding entries out of id order"
        assert all(i in self._outstanding for i in self._leased), "a lease without its entry"
        assert not (set(self._leased) & self._redeliver_set), "an id both leased and returned"
        assert all(i < self._cursor.next_id for i in self._outstanding)

    def close(self) -> None:
        """Persist a final checkpoint and close the journal."""
        self.checkpoint()
        self.journal.close()
