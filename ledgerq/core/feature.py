"""The seam between the core queue and the optional features.

A feature subclasses :class:`Feature` and overrides the hooks it needs; the core
registers a feature for a hook only if the feature overrides it, so a hook no
feature uses costs nothing on the hot path.  The core calls hooks in the order
the features were given, at these points:

=================  ==========================  =======================================
hook               when                        may
=================  ==========================  =======================================
``attach``         open, after recovery        read options, load its state files
``transform``      enqueue, before the lock    replace the payload (compression)
``catch_up``       shared mode, before admit   read what other handles appended (dedup)
``admit``          enqueue, under the lock     return an existing id instead (dedup)
``unadmit``        a later admit refused       forget what ``admit`` noted for a draft
``before_append``  enqueue, before the write   make what admit noted durable (unique)
``appended``       enqueue, under the lock     record the new ids (dedup)
``rollback``       the append failed           forget what ``admit`` noted
``selector``       a reader is opened          replace the delivery order (priorities)
``deliverable``    before a lease              refuse delivery; the core settles it (TTL)
``restore``        building a Message          undo ``transform`` (flagged entries only)
``failed``         nack, lost or expired lease move the message elsewhere (DLQ)
``settled``        ack                         forget per-message state (retry tracker)
``flush``          sync, close                 make its state durable
``close``          close                       release files
=================  ==========================  =======================================

Features import core, format and errors, never each other.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import xxhash

from ledgerq.format.entry import Entry
from ledgerq.segment.feature_log import FeatureLog
from ledgerq.segment.key_table import KeyTable

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore
    from ledgerq.core.reader import ReaderCore

__all__ = [
    "Draft",
    "FailedDelivery",
    "Feature",
    "FeatureWithLog",
    "FeatureWithTable",
    "FifoSelector",
    "HandedOff",
    "HandoffTaker",
    "KeyAdmitter",
    "ReadersNeeded",
    "Selector",
    "Timer",
    "handoff_key",
    "handoff_prefix",
]


@dataclasses.dataclass(slots=True, eq=False)
class Draft:
    """One message on its way into the log; features may change its fields."""

    payload: bytes | bytearray | memoryview
    headers_blob: bytes | None
    priority: int
    expires_in_ns: int | None
    dedup_id: str | bytes | None
    delay_ns: int | None = None  # not delivered before enqueue time + this
    group: bytes | None = None  # the message group, as UTF-8
    unique_key: str | None = None  # a unique job's key (features/unique.py)
    compressed: bool = dataclasses.field(default=False, init=False)
    # A forwarded item: (hand-off key, position in the batch, batch size)
    # (features/forward.py); None for any other enqueue.
    handoff: tuple[bytes, int, int] | None = dataclasses.field(default=None, init=False)


class ReadersNeeded(Exception):
    """Raised by ``admit`` in shared mode when it needs every reader's current state
    (``QueueCore.readers_current()`` is False): the core rolls the admission back and
    admits again holding every reader."""


_xxh3_128 = xxhash.xxh3_128_digest


def handoff_prefix(source_path: str, reader: str) -> bytes:
    """What the hand-off keys of ``reader`` of the queue in ``source_path`` (absolute,
    resolved) start with: their UTF-8, each followed by NUL."""
    return f"{source_path}\0{reader}\0".encode()


def handoff_key(prefix: bytes, message_id: int) -> bytes:
    """The 16-byte hand-off key of message ``message_id`` of the reader of ``prefix``
    (:func:`handoff_prefix`): xxh3-128 of the prefix, the id in decimal and a NUL
    (docs/format.md, "Hand-off keys")."""
    return _xxh3_128(prefix + b"%d\0" % message_id)


class HandedOff(Exception):
    """Raised by ``admit`` for a forwarded batch whose hand-off already landed (a source
    message delivered again after a crash): nothing is written, and the forward returns
    ``ids``, those the batch got the first time (features/forward.py)."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__(ids)
        self.ids = ids


@dataclasses.dataclass(slots=True, eq=False)
class FailedDelivery:
    """What the core knows about a failed delivery, for the ``failed`` hook.

    ``again``: the failure was a nack that its nacker reported already - in another
    handle, or before a reopen - and this is the next taker checking it once more,
    because the nacker may have stopped before acting on it (a move to the DLQ).  The
    hook then does only what the failure calls for that cannot have happened twice;
    ``reason`` is then not the nack's own (the journal does not keep it).
    """

    reader: ReaderCore
    entry: Entry
    failures: int
    reason: str
    now_ns: int
    again: bool = dataclasses.field(default=False, kw_only=True)


class Selector(Protocol):
    """The set of messages a reader may deliver next, and their order."""

    def take(self, now_ns: int) -> Entry | None:
        """Remove and return the next entry to deliver, or None."""

    def give_back(self, entry: Entry) -> None:
        """Make a previously taken entry available again (nack, lost lease); one
        already available stays available once (shared mode can give an id back twice)."""

    def discard(self, message_id: int) -> bool:
        """Forget an available id (it was settled elsewhere); True if it was held."""

    def drop_through(self, last_id: int) -> list[int]:
        """Forget every entry held with an id <= ``last_id`` (retention deleted their
        segment); return their ids."""

    def holds(self, message_id: int) -> bool:
        """Whether ``message_id`` is held available (what :meth:`discard` would forget)."""

    def held(self) -> int:
        """Entries held available beyond what the reader's cursor has not read yet."""

    def unexamined_from(self) -> int | None:
        """The smallest id the cursor has read that the selector holds unexamined (read
        ahead, not yet taken: a delayed one is not parked yet), if any."""

    def holds_unexamined(self, message_id: int) -> bool:
        """Whether ``message_id`` is read ahead and not yet taken (see above)."""

    def min_id(self) -> int | None:
        """Smallest id held, if any."""

    def peek(self, n: int, now_ns: int) -> list[Entry]:
        """The next ``n`` entries :meth:`take` would return, without removing them."""

    def oldest_timestamp(self) -> int | None:
        """Enqueue time of the oldest entry held or unread, if any."""


@runtime_checkable
class KeyAdmitter(Protocol):
    """A feature that admits a bare key without a :class:`Draft` (unique jobs): the core's
    path for a bytes payload with only a ``unique_key`` calls these, under the lock."""

    def add_key(self, unique_key: str, now_ns: int, candidate_id: int) -> int | None:
        """The id holding ``unique_key``; or None, having made ``candidate_id`` its
        holder durably (before the message is written: a success needs no call)."""

    def undo_key(self) -> None:
        """The message of the last :meth:`add_key` was not written: undo (and cut back)
        what add_key stored."""

    def rollback(self) -> None:
        """:meth:`add_key` raised: forget whatever it noted."""


@runtime_checkable
class HandoffTaker(Protocol):
    """The feature that takes forwarded batches (features/forward.py): the core's path
    for a batch of bytes payloads calls these, under the lock."""

    def take_handoff(self, key: bytes, first_id: int, count: int, now_ns: int) -> list[int] | None:
        """The ids the hand-off ``key`` landed before; or None, having made the record
        of ``count`` entries from ``first_id`` stamped ``now_ns`` durable (before them:
        a success needs no call)."""

    def undo_handoff(self) -> None:
        """The entries of the last :meth:`take_handoff` were not written: undo (and cut
        back) its record."""

    def handed_off(self, key: bytes) -> list[int] | None:
        """The ids the hand-off ``key`` landed, or None if it did not (writes nothing)."""

    def rollback(self) -> None:
        """:meth:`take_handoff` raised: forget whatever it noted."""


class Timer(Protocol):
    """A feature that enqueues by time (periodic jobs): the core tells it when to look.

    It keeps ``QueueCore.waits.timer_ns`` (queue time, ns) at its next due time, or None;
    the core calls :meth:`fire_due` - no lock held - from a dequeue (or a wait for one,
    which ends then) once that time has come, and :meth:`poll` at open and, in shared
    mode, from the housekeeper every 0.25 s (other handles' changes)."""

    def fire_due(self) -> None:
        """Enqueue what is due now (errors are logged, not raised)."""

    def poll(self) -> None:
        """Read what other handles changed, then :meth:`fire_due`."""


class FifoSelector:
    """The default order: entries given back first (smallest id first), then the log's."""

    def __init__(self, reader: ReaderCore) -> None:
        self._reader = reader
        self._returned: dict[int, Entry] = {}
        self._heap: list[int] = []

    def take(self, now_ns: int) -> Entry | None:
        returned = self._returned
        while self._heap:
            message_id = heapq.heappop(self._heap)
            entry = returned.pop(message_id, None)
            if entry is not None:
                return entry
        return self._reader.read_next()

    def give_back(self, entry: Entry) -> None:
        if entry.id not in self._returned:
            self._returned[entry.id] = entry
            heapq.heappush(self._heap, entry.id)

    def discard(self, message_id: int) -> bool:
        return self._returned.pop(message_id, None) is not None

    def drop_through(self, last_id: int) -> list[int]:
        dropped = [i for i in self._returned if i <= last_id]
        for message_id in dropped:
            del self._returned[message_id]  # their heap slots are skipped lazily
        return dropped

    def holds(self, message_id: int) -> bool:
        return message_id in self._returned

    def held(self) -> int:
        return len(self._returned)

    def unexamined_from(self) -> int | None:
        return None  # it reads one entry at a take, never ahead

    def holds_unexamined(self, message_id: int) -> bool:
        return False

    def min_id(self) -> int | None:
        heap = self._heap
        while heap and heap[0] not in self._returned:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def peek(self, n: int, now_ns: int) -> list[Entry]:
        found = [self._returned[i] for i in sorted(self._returned)[:n]]
        if len(found) < n:
            found.extend(self._reader.peek_unread(n - len(found)))
        return found

    def oldest_timestamp(self) -> int | None:
        stamps = [e.timestamp for e in self._returned.values()]
        nxt = self._reader.peek_unread(1)
        if nxt:
            stamps.append(nxt[0].timestamp)
        return min(stamps) if stamps else None


class Feature:
    """Base class of feature modules: every hook is a no-op until overridden."""

    name: ClassVar[str] = "feature"
    # True for a feature whose enqueue hooks (admit, before_append, appended) only look
    # at drafts that carry an option of its own: the plain paths (bytes, no option) may
    # skip it, so a feature that is always on costs a plain enqueue nothing (unique).
    ignores_plain: ClassVar[bool] = False

    def attach(self, queue: QueueCore) -> None:
        """Called once at open, after the log and the readers were recovered."""

    def transform(self, draft: Draft) -> None:
        """Change a draft before it is encoded (no lock held)."""

    def catch_up(self) -> None:
        """Shared mode: read what other handles appended to the feature's files (append
        lock held); called before :meth:`admit`, once per enqueue call."""

    def admit(self, draft: Draft, now_ns: int, candidate_id: int) -> int | None:
        """Return an existing id to add nothing, or None to go on (queue lock held).

        ``candidate_id`` is the id the draft gets if every admitted draft of the
        call is appended; :meth:`appended` or :meth:`rollback` follows.
        """
        return None

    def unadmit(self, draft: Draft) -> None:
        """A feature after this one found ``draft`` to be a duplicate: forget what
        :meth:`admit` noted for it (it will not be written)."""

    def before_append(self) -> None:
        """The drafts :meth:`admit` let through are about to be written (lock held): make
        what it noted durable first, or raise to write nothing (:meth:`rollback` follows)."""

    def appended(self, drafts: list[Draft], first_id: int, now_ns: int) -> None:
        """The drafts were appended with ids ``first_id``, ``first_id + 1``, ... (lock held)."""

    def rollback(self) -> None:
        """The append after :meth:`admit` failed: forget what admit provisionally noted."""

    def selector(self, reader: ReaderCore) -> Selector | None:
        """Return a delivery order for ``reader``, or None to keep the default."""
        return None

    # Entry flags that can make :meth:`deliverable` refuse: an entry with none of
    # them set is delivered without calling it (TTL: only entries with an expiry).
    deliverable_flags: ClassVar[int] = 0xFF

    def deliverable(self, reader: ReaderCore, entry: Entry, now_ns: int) -> bool:
        """False to settle ``entry`` without delivering it (lock held)."""
        return True

    def restore(self, entry: Entry, payload: bytes) -> bytes:
        """Undo :meth:`transform` on a payload read back from the log."""
        return payload

    def failed(self, delivery: FailedDelivery) -> bool:
        """A delivery failed; True if the feature moved the message away (lock held)."""
        return False

    def settled(self, reader: ReaderCore, ids: list[int]) -> None:
        """``ids`` were acked by ``reader`` (lock held)."""

    def stats(self, counters: dict[str, Any]) -> None:
        """Add this feature's figures to ``counters``."""

    def flush(self) -> None:
        """Make the feature's state durable."""

    def close(self) -> None:
        """Release the feature's resources (after a final flush)."""


class FeatureWithLog(Feature):
    """A feature whose state is a table kept in one feature log (segment/feature_log):
    made durable and closed with it.  ``_log`` is set at attach."""

    _log: FeatureLog | None = None

    def flush(self) -> None:
        """fdatasync the log, first writing the table whole if a record could not be
        written; raises :class:`StorageError` while the disk is still full."""
        if self._log is not None:
            self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


class FeatureWithTable(Feature):
    """A feature whose state is a mapped key table (segment/key_table: unique keys,
    hand-offs): synced and closed with it.  ``_table`` is set at attach."""

    _table: KeyTable | None = None

    def flush(self) -> None:
        """Write the table's pages to disk (a sync, a close)."""
        if self._table is not None:
            self._table.sync()

    def close(self) -> None:
        if self._table is not None:
            self._table.close()
