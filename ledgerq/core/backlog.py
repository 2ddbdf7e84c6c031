"""The backlog a bounded queue limits (options ``max_pending``, ``max_pending_bytes``).

A reader's backlog is every message it has not finished: not acked, dead-lettered,
expired or dropped - its pending messages plus its leased ones.  A queue's backlog is
the largest of its readers': every reader holds back retention (a segment is deleted
only once all of them consumed it), so a slow named reader keeps, and bounds, what the
default reader already finished.  An enqueue that would take any reader's backlog past
a bound waits for room (core/queue.py) - room that acks, dead-letters, expiries, drops
and purges make.

Counting is the readers' own (``pending() + in_flight()``).  Bytes - the payloads as the
producers gave them, before compression - need each message's size, which the log does
not keep apart from compression: :class:`PayloadSizes` is a ledger of sizes by id from
the oldest head of any reader up, built when the bound is first checked (one read of the
backlog, which the bound itself keeps small) and extended by every append.  A prefix sum
gives the bytes of an id range in O(1); the ids a reader finished out of order above its
head are subtracted one by one (few, unless priorities reorder much of the backlog).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from ledgerq.format.entry import Entry, RecordType

if TYPE_CHECKING:
    from ledgerq.core.reader import ReaderCore

__all__ = ["Backlog", "PayloadSizes", "written_sizes"]

_DATA = int(RecordType.DATA)
_FORGET_AT = 4096  # ids below every head kept before the ledger is cut


def written_sizes(sizes: list[int], duplicates: Mapping[int, int]) -> list[int]:
    """``sizes`` without the positions an admission found to be duplicates (not written)."""
    if not duplicates:
        return sizes
    return [size for i, size in enumerate(sizes) if i not in duplicates]


class PayloadSizes:
    """The payload size of each message by id, from ``base`` up (a prefix sum)."""

    def __init__(self, base: int) -> None:
        self.base = base
        self._sums = array("q", [0])  # _sums[k]: bytes of ids base .. base + k - 1

    @property
    def end(self) -> int:
        """The first id not recorded yet."""
        return self.base + len(self._sums) - 1

    def add(self, message_id: int, size: int) -> None:
        """Record ``message_id`` (>= :attr:`end`); ids skipped on the way were never
        written (lost to a torn tail) and weigh nothing."""
        sums = self._sums
        last = sums[-1]
        for _ in range(message_id - self.end):
            sums.append(last)
        sums.append(last + size)

    def total(self, first: int, end: int) -> int:
        """Bytes of the ids from ``first`` up to ``end`` (exclusive) that are recorded."""
        low = min(max(first, self.base), self.end) - self.base
        high = min(max(end, self.base), self.end) - self.base
        return self._sums[high] - self._sums[low] if high > low else 0

    def size(self, message_id: int) -> int:
        """The payload size of ``message_id`` (0 if not recorded)."""
        return self.total(message_id, message_id + 1)

    def forget_below(self, message_id: int) -> None:
        """Drop the ids below ``message_id`` (no reader can need them again)."""
        cut = min(message_id, self.end) - self.base
        if cut >= _FORGET_AT and cut * 2 >= len(self._sums):
            start = self._sums[cut]
            self._sums = array("q", (s - start for s in self._sums[cut:]))
            self.base += cut


class LogAccess(Protocol):
    """What the backlog reads of the queue to build its ledger (the queue is one)."""

    def _entries_from(self, first_id: int) -> Iterable[Entry]:
        """The log's entries from ``first_id`` on, in id order."""
        ...

    def _given_size(self, entry: Entry) -> int:
        """A stored entry's payload size as its producer gave it (decompressed)."""
        ...


class Backlog:
    """Decide whether a batch fits the bounds; keep the payload ledger for bytes.

    Every method runs with the queue lock held.  The queue is passed in (``log``), not
    kept: the backlog belongs to the queue, and a reference back would make a cycle
    that keeps an unclosed queue alive until the cyclic collector runs.
    """

    def __init__(self, max_pending: int | None, max_pending_bytes: int | None) -> None:
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._sizes: PayloadSizes | None = None

    def refusal(self, count: int, size: int) -> str | None:
        """Why a batch of ``count`` messages, ``size`` payload bytes, can never fit
        (it is larger than a bound on its own), or None."""
        if self.max_pending is not None and count > self.max_pending:
            return f"a batch of {count} messages is more than max_pending={self.max_pending}"
        limit = self.max_pending_bytes
        if limit is not None and size > limit:
            what = "a message" if count == 1 else f"a batch of {count} messages"
            return f"{what} of {size} payload bytes is more than max_pending_bytes={limit}"
        return None

    def shortfall(
        self, log: LogAccess, cores: Iterable[ReaderCore], next_id: int, count: int, size: int
    ) -> str:
        """Why ``count`` more messages of ``size`` bytes do not fit now ("" if they do).

        ``next_id`` is the id the first of them would get: the log holds every id below.
        """
        cores = list(cores)
        if self.max_pending is not None:
            backlog = max(core.pending() + core.in_flight() for core in cores)
            if backlog + count > self.max_pending:
                return f"{backlog} messages pending of max_pending={self.max_pending}"
        if self.max_pending_bytes is not None:
            backlog_bytes = self._largest_bytes(log, cores, next_id)
            if backlog_bytes + size > self.max_pending_bytes:
                return (
                    f"{backlog_bytes} payload bytes pending of "
                    f"max_pending_bytes={self.max_pending_bytes}"
                )
        return ""

    def appended(self, first: int, sizes: Iterable[int]) -> None:
        """Record the payload sizes of ids ``first``, ``first + 1``, ... just written."""
        ledger = self._sizes
        if ledger is None or ledger.end != first:
            return  # not built yet, or behind: the next check reads the log up to here
        for offset, size in enumerate(sizes):
            ledger.add(first + offset, size)

    def _largest_bytes(self, log: LogAccess, cores: list[ReaderCore], next_id: int) -> int:
        heads = {core.name: core.head for core in cores}
        oldest = min(heads.values())
        ledger = self._sizes
        if ledger is None or oldest < ledger.base:
            # First check, or a new reader starts below the ledger: read the backlog.
            ledger = self._sizes = PayloadSizes(oldest)
        else:
            ledger.forget_below(oldest)
        if ledger.end < next_id:
            self._read(log, ledger, next_id)  # appends the ledger did not see (other handles)
        largest = 0
        for core in cores:
            head = heads[core.name]
            done = core.finished_from(head)
            backlog = ledger.total(head, next_id) - sum(map(ledger.size, done))
            largest = max(largest, backlog)
        return largest

    def _read(self, log: LogAccess, ledger: PayloadSizes, next_id: int) -> None:
        for entry in log._entries_from(ledger.end):
            if entry.id >= next_id:
                break
            if entry.type == _DATA:
                ledger.add(entry.id, log._given_size(entry))
        if ledger.end < next_id:
            ledger.add(next_id - 1, 0)  # a lost tail: those ids weigh nothing
