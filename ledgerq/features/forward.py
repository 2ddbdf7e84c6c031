"""Hand-offs: ``forward(id, target, items)`` lands ``items`` in the target exactly once.

A forward names its source message by a 16-byte *hand-off key*, the xxh3-128 digest
of (source queue directory, source reader, source message id; ``core.feature.handoff_key``).
The target keeps the keys it took in ``features/forwards.table``: fixed-size records
``(key, first_id, count, timestamp_ns)`` in a file mapped into memory
(segment/key_table.py, as the unique keys'), created at the first forward into the
queue: a queue that never receives one has no file and its enqueues pay nothing.  A
record is a store into the mapping, not a ``write()`` - a forward writes its items and
its ack already, and a third system call was most of what a hand-off cost beyond them
(benchmarks/forward_bench.py).

Crash safety (docs/architecture.md, "Exactly-once hand-off").  Under the target's append
lock the record is stored *before* the items are written, which are one batch (all or
nothing in the log: recovery cuts a partial batch); then the source acks.  So whatever
instant a kill -9 hits, a source message that is delivered again either finds no record
(nothing landed: the items are written now) or a record whose items are in the log (only
the ack is done now, and the ids that landed are returned) - a store into a shared
mapping is in the page cache when it is done, so a killed process loses none.  A record
whose batch never reached the log (a kill between the two) is told apart as unique keys'
are: it is *unverified* once read back from the file, until the entry it names is found
in the log with the record's exact timestamp - one indexed read, when its key comes again
(ids are never reused; an id another handle took after a dead one carries another
timestamp).  A record known to be verified - stored by this handle, or rewritten - needs
no read; one read back whose entry retention has deleted since (the items consumed, then
their segment) cannot be told from one never written and counts as not landed: a
duplicate is possible then, never a loss, and only after a kill between the items and
the ack followed by that deletion before the redelivery.  A failed item write cuts its
record back.  With ``sync="always"`` the record's page is synced before the items are
written, so a power loss cannot keep the items and lose their record.

The file keeps the newest ``KEEP_RECORDS`` keys: it is rewritten (temp file, rename)
once it holds twice as many.  A source message delivered again after that many later
forwards into the same target is not recognised.  The ``features/forwards.log`` (framed
msgpack records of the same four values) a ledgerq before the table kept is read into it
at the first forward, and removed.

Shared mode: every handle maps the file and stores into it under the append lock,
having first taken the records the others stored since its last look (a read of
memory); a rewrite marks the old file replaced, and the others read the new one whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ledgerq._errors import StorageError
from ledgerq.core.feature import Draft, FeatureWithTable, HandedOff, handoff_key
from ledgerq.segment.key_table import KEY_RECORD, KEY_TABLE_HEADER_SIZE, KeyRecord, KeyTable
from ledgerq.segment.naming import FORWARDS_NAME, FORWARDS_TABLE_NAME, feature_log_path

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = [
    "FORWARDS_MAGIC",
    "FORWARDS_TABLE_MAGIC",
    "KEEP_RECORDS",
    "ForwardFeature",
    "handoff_key",
]

FORWARDS_MAGIC = b"LQFW"  # features/forwards.log, read to move its records into the table
FORWARDS_TABLE_MAGIC = b"LQFT"
KEEP_RECORDS = 65536  # hand-off keys kept after a rewrite
_KEY_SIZE = 16
_RECORD_SIZE = KEY_RECORD.size
# The timestamp of a record whose items this handle knew to be in the log.
_VERIFIED = -1


def _record(value: Any) -> KeyRecord | None:
    """``(key, first_id, count, timestamp)`` of a record of ``forwards.log``, or None
    (damaged or hostile: exact types only)."""
    if type(value) is not list or len(value) != 4:
        return None
    key, first_id, count, timestamp = value
    if type(key) is not bytes or len(key) != _KEY_SIZE:
        return None
    if not all(type(x) is int for x in (first_id, count, timestamp)):
        return None
    if not (1 <= first_id < 1 << 64 and 1 <= count < 1 << 63 and -(1 << 63) <= timestamp < 1 << 63):
        return None
    return key, first_id, count, timestamp


class ForwardFeature(FeatureWithTable):
    """Take each hand-off key once (always on; see the module)."""

    name = "forward"
    ignores_plain = True  # only drafts with a hand-off key: the plain paths skip this

    def __init__(self) -> None:
        # key -> (first id, count, timestamp or _VERIFIED), oldest first
        self._taken: dict[bytes, tuple[int, int, int]] = {}
        # (key, first id, count, stamp) admitted in the current call, not yet written
        self._provisional: tuple[bytes, int, int, int] | None = None
        self._ahead: int | None = None  # the table's end before a batch's record
        # The key the last take_handoff stored, and the table's end before it.
        self._handoff_undo: tuple[bytes, int] = (b"", 0)
        self._queue: QueueCore | None = None
        self._sync_always = False

    def attach(self, queue: QueueCore) -> None:
        # Nothing is read or created here: at the first forward into the queue (_current).
        self._queue = queue
        self._sync_always = queue.options.sync == "always"
        self._table = KeyTable(
            feature_log_path(queue.path, FORWARDS_TABLE_NAME),
            FORWARDS_TABLE_MAGIC,
            "hand-off keys",
            queue,
            older=(feature_log_path(queue.path, FORWARDS_NAME), FORWARDS_MAGIC, _record),
        )

    # ------------------------------------------------------------------ the table

    def _current(self) -> KeyTable:
        """The file, created if missing, with the other handles' records taken (lock
        held; shared mode: the append lock)."""
        table = self._table
        assert table is not None
        if not table.is_loaded:
            # The first use in this handle: the file read whole (the records of a
            # forwards.log an older ledgerq wrote moved into it first).
            records = table.open(create=True)
            assert records is not None
            self._taken.clear()
            self._take(records)
        else:
            replaced, records = table.news()
            if replaced:
                self._taken.clear()
            if records:
                self._take(records)
        return table

    def _take(self, records: list[KeyRecord]) -> None:
        taken = self._taken
        for key, first_id, count, timestamp in records:
            taken.pop(key, None)  # to the end: the table stays in store order
            taken[key] = (first_id, count, timestamp)

    def _newest(self) -> Iterator[KeyRecord]:
        """The records of the newest KEEP_RECORDS keys (a rewrite)."""
        taken = self._taken
        while len(taken) > KEEP_RECORDS:
            del taken[next(iter(taken))]
        for key, (first_id, count, timestamp) in taken.items():
            yield key, first_id, count, timestamp

    def _compact(self, table: KeyTable) -> None:
        """To the newest KEEP_RECORDS keys (if it fails, later: the file holds them)."""
        try:
            table.rewrite(self._newest())
        except StorageError:
            pass

    # ------------------------------------------------------------------ deciding

    def _landed(self, key: bytes) -> list[int] | None:
        """The ids the hand-off ``key`` landed, or None if it did not (lock held)."""
        noted = self._taken.get(key)
        if noted is None:
            return None
        first_id, count, timestamp = noted
        if timestamp != _VERIFIED:
            queue = self._queue
            assert queue is not None
            entry = queue.entry_of(first_id)
            if entry is None or entry.timestamp != timestamp:
                # Never written (a kill between the record and the items; the id may
                # have gone to another append since) - or, past retention, deleted:
                # a duplicate then, never a loss (see the module).
                del self._taken[key]
                return None
            self._taken[key] = (first_id, count, _VERIFIED)
        return list(range(first_id, first_id + count))

    def admit(self, draft: Draft, now_ns: int, candidate_id: int) -> int | None:
        handoff = draft.handoff
        if handoff is None:
            return None
        key, position, count = handoff
        if position == 0:
            self._current()
            landed = self._landed(key)
            if landed is not None:
                raise HandedOff(landed)
            self._provisional = (key, candidate_id, count, now_ns)  # (now_ns: the items' stamp)
        return None

    def handed_off(self, key: bytes) -> list[int] | None:
        """The ids ``key`` landed, or None (lock held): a forward of no items."""
        table = self._table
        assert table is not None
        if not table.is_loaded and not os.path.exists(table.path):
            queue = self._queue
            assert queue is not None
            if not os.path.exists(feature_log_path(queue.path, FORWARDS_NAME)):
                return None  # never forwarded into: nothing to look up, no file to make
        self._current()
        return self._landed(key)

    def take_handoff(self, key: bytes, first_id: int, count: int, now_ns: int) -> list[int] | None:
        """The core's path for a batch of bytes payloads (lock held): the ids ``key``
        landed before; or None, having stored its record - the entries come next;
        :meth:`undo_handoff` if they are not written."""
        table = self._table
        assert table is not None
        # Not loaded yet, or shared mode (no call otherwise); then only if there is news.
        if table.stale and not table.unchanged():
            self._current()
        taken = self._taken
        end = table.end
        if key in taken:
            landed = self._landed(key)
            if landed is not None:
                return landed
        elif end >= KEY_TABLE_HEADER_SIZE + 2 * KEEP_RECORDS * _RECORD_SIZE:
            # (table.records >= 2 * KEEP_RECORDS, without the property's call)
            self._compact(table)  # to the newest KEEP_RECORDS (if it fails, later)
            end = table.end
        # (table.append, inlined: this is every forward's path)
        if end + _RECORD_SIZE > table.size:
            table.grow()  # raises having stored nothing
        area = table.area
        assert area is not None
        table.pack(area, end, key, first_id, count, now_ns)
        table.end = end + _RECORD_SIZE
        # Noted now (at the end: the table stays in store order), taken back by
        # undo_handoff if the entries fail; the key is not there (or _landed dropped it).
        taken[key] = (first_id, count, _VERIFIED)
        self._handoff_undo = (key, end)
        if self._sync_always:
            try:
                table.sync(end)  # before the entries: a power loss must not keep them alone
            except StorageError:
                self.undo_handoff()
                raise
        return None

    def undo_handoff(self) -> None:
        """The entries of the last :meth:`take_handoff` were not written (lock held): the
        key did not land, and its record is cut back."""
        key, end = self._handoff_undo
        self._handoff_undo = (b"", 0)
        if key:
            self._taken.pop(key, None)
            assert self._table is not None
            self._table.undo(end)

    def before_append(self) -> None:
        provisional = self._provisional
        if provisional is None:
            return
        table = self._table
        assert table is not None
        end = table.end
        table.append(*provisional)  # raises having stored nothing
        self._ahead = end
        if self._sync_always:
            # Before the items: a power loss must not keep them and lose the record.
            table.sync(end)

    def appended(self, drafts: list[Draft], first_id: int, now_ns: int) -> None:
        provisional = self._provisional
        if provisional is None:
            return
        self._provisional = None
        self._ahead = None
        key, noted_first, count, _ = provisional
        taken = self._taken
        taken.pop(key, None)  # (an unverified record of it, found never written)
        taken[key] = (noted_first, count, _VERIFIED)
        table = self._table
        assert table is not None
        if table.records >= 2 * KEEP_RECORDS:
            self._compact(table)

    def rollback(self) -> None:
        provisional, self._provisional = self._provisional, None
        end, self._ahead = self._ahead, None
        queue, table = self._queue, self._table
        if table is None:
            return
        if provisional is not None and queue is not None and queue._next_id > provisional[1]:
            # The items reached the log all the same (a rotation failed after the
            # write): the hand-off happened, its record stays.
            self._taken[provisional[0]] = (provisional[1], provisional[2], _VERIFIED)
            return
        if provisional is not None:
            self._taken.pop(provisional[0], None)  # (noted by take_handoff)
        if end is not None:
            table.undo(end)  # the record is stored, its items not written: cut it back
