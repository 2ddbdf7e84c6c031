"""The fold of a reader journal's records into a reader's state: the replay rules, once.

Two kinds of state are kept from the same records (``format.reader_state``):

* :class:`~ledgerq.segment.readonly_state.ReaderState`, the read-only replay - the
  queue's own recovery, ``ledgerq verify``, the console, the Spark source, ``follow``
  and ``ship`` - which folds a whole journal (or the records appended since its last
  look);
* ``core.shared_reader.SharedReaderCore``, the live reader of a shared-mode handle,
  which folds the records the other handles appended since its last step into its
  cursor, selector and lease tables.

Both are a :class:`JournalSink`, and :func:`fold_records` is the one walk of the records:
it decodes each record's body, applies the rules every reader state shares - the
delivery counts, the NOT_BEFORE times, the counters - to the sink's tables
(:meth:`JournalSink.fold_tables`), then tells the sink what the record means for the
rest of its state (who holds what lease, what is available again, what is finished).
So a count means the same in the console as in the queue that wrote it.

The shared rules (docs/format.md, "Reader state journal"):

===========  ==============================================================================
LEASE(_BY)   each id was delivered once more (count + 1); its NOT_BEFORE is void
RELEASE      each lease was given back unused: count - 1, not below 0 (then dropped)
NACK         counted in ``nacked``; the ids stay unfinished (a NOT_BEFORE may follow)
RECLAIM      nothing counted: the void lease stays a (failed) delivery
NOT_BEFORE   the ids wait until ``due_ns``
TOUCH        nothing counted
ACK, DEAD_LETTER, EXPIRE
             finished: count and NOT_BEFORE dropped, counted in ``acked``,
             ``dead_lettered`` or ``expired``
CHECKPOINT   the whole state again: the sink rebuilds itself, then the fold asks for its
             tables anew
===========  ==============================================================================

The lease rules the sinks apply each on their own tables: LEASE_BY makes ``holder`` the
holder of the ids (a plain LEASE, exclusive mode's, has none: holder 0); TOUCH moves the
deadline of the ids ``holder`` still holds; RECLAIM voids only the leases ``holder``
still holds (an id leased by another handle since stays leased); NACK, RELEASE and the
finishing records end whichever lease an id had.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from ledgerq.format.reader_state import Checkpoint, StateRecordType

__all__ = ["FoldTables", "JournalSink", "StateRecord", "fold_records"]

# One record of a journal: its type, its u64 fields (the ids of LEASE ... RELEASE; the
# holder, deadline or cause, then the ids, of LEASE_BY, RECLAIM and TOUCH; the due time,
# then the ids, of NOT_BEFORE; empty for a CHECKPOINT), its Checkpoint (None for the
# others) and its offset in the file.  A plain tuple: the queue replays many of them
# when it opens.
StateRecord = tuple[StateRecordType, tuple[int, ...], Checkpoint | None, int]

# The tables the fold updates itself: deliveries (id -> times delivered, unfinished ids
# only), not_before (id -> due_ns) and the counters (name -> count).
FoldTables = tuple[dict[int, int], dict[int, int], dict[str, int]]

_LEASE = StateRecordType.LEASE
_LEASE_BY = StateRecordType.LEASE_BY
_NACK = StateRecordType.NACK
_RELEASE = StateRecordType.RELEASE
_RECLAIM = StateRecordType.RECLAIM
_NOT_BEFORE = StateRecordType.NOT_BEFORE
_TOUCH = StateRecordType.TOUCH
_ACK = StateRecordType.ACK
_EXPIRE = StateRecordType.EXPIRE


class JournalSink(Protocol):
    """What :func:`fold_records` folds a journal into.

    Each ``on_*`` method is called once per record, after the fold applied the shared
    rules (see the module) to the sink's :meth:`fold_tables`; ``ids`` are the record's
    ids in the record's order.
    """

    def fold_tables(self) -> FoldTables:
        """The sink's ``(deliveries, not_before, counters)``, updated in place."""
        ...

    def on_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the whole state by ``checkpoint`` (new tables included)."""
        ...

    def on_lease(self, holder: int, deadline_ns: int, ids: Sequence[int]) -> None:
        """``ids`` are leased by ``holder`` (0: a plain LEASE) until ``deadline_ns``
        (0: no visibility timeout); each count has gone up by 1 already."""
        ...

    def on_touch(self, holder: int, deadline_ns: int, ids: Sequence[int]) -> None:
        """The leases ``holder`` still holds of ``ids`` now last until ``deadline_ns``."""
        ...

    def on_reclaim(self, holder: int, cause: int, ids: Sequence[int]) -> None:
        """The leases ``holder`` still holds of ``ids`` are void (``cause``: a
        ``ReclaimCause``); the messages are available again."""
        ...

    def on_nack(self, ids: Sequence[int]) -> None:
        """The leases of ``ids`` failed: available again (``nacked`` counted)."""
        ...

    def on_release(self, ids: Sequence[int]) -> None:
        """The leases of ``ids`` were given back unused (each count down by 1)."""
        ...

    def on_not_before(self, due_ns: int, ids: Sequence[int]) -> None:
        """``ids`` wait until ``due_ns`` (already in the not_before table)."""
        ...

    def on_finish(self, kind: StateRecordType, ids: Sequence[int]) -> None:
        """``ids`` are finished (ACK, DEAD_LETTER or EXPIRE ``kind``; counted, their
        counts and NOT_BEFORE times dropped)."""
        ...


def fold_records(records: Iterable[StateRecord], sink: JournalSink) -> None:
    """Fold ``records`` (in journal order) into ``sink``; see the module for the rules."""
    deliveries, not_before, counters = sink.fold_tables()
    for kind, body, checkpoint, _ in records:
        if checkpoint is not None:
            sink.on_checkpoint(checkpoint)
            deliveries, not_before, counters = sink.fold_tables()
            continue
        if kind is _LEASE_BY or kind is _LEASE:
            if kind is _LEASE_BY:
                holder, deadline_ns, ids = body[0], body[1], body[2:]
            else:
                holder, deadline_ns, ids = 0, 0, body
            for message_id in ids:
                deliveries[message_id] = deliveries.get(message_id, 0) + 1
            if not_before:
                for message_id in ids:
                    not_before.pop(message_id, None)
            sink.on_lease(holder, deadline_ns, ids)
        elif kind is _NACK:
            # Not a change of the count: the failed lease stays counted as a delivery.
            counters["nacked"] = counters.get("nacked", 0) + len(body)
            sink.on_nack(body)
        elif kind is _RELEASE:
            # Given back unused: the LEASE before it did not count as a delivery, so the
            # next one has the same attempt number and a crash after this record is no
            # failed delivery of that lease.  A count already 0 (a checkpoint that cannot
            # hold the lease it follows) stays 0.
            for message_id in body:
                count = deliveries.get(message_id, 0) - 1
                if count > 0:
                    deliveries[message_id] = count
                else:
                    deliveries.pop(message_id, None)
            sink.on_release(body)
        elif kind is _RECLAIM:
            # The void leases stay counted as deliveries (failed ones, like lost leases).
            sink.on_reclaim(body[0], body[1], body[2:])
        elif kind is _TOUCH:
            sink.on_touch(body[0], body[1], body[2:])
        elif kind is _NOT_BEFORE:
            due_ns, ids = body[0], body[1:]
            for message_id in ids:
                not_before[message_id] = due_ns
            sink.on_not_before(due_ns, ids)
        else:  # ACK, DEAD_LETTER, EXPIRE: finished for this reader, and counted
            for message_id in body:
                deliveries.pop(message_id, None)
            if not_before:
                for message_id in body:
                    not_before.pop(message_id, None)
            # (branches, not a dict keyed by the enum: an enum's hash is Python code)
            counter = "acked" if kind is _ACK else "expired" if kind is _EXPIRE else "dead_lettered"
            counters[counter] = counters.get(counter, 0) + len(body)
            sink.on_finish(kind, body)
