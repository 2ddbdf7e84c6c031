"""Hand-offs: ``forward(id, target, items)`` lands ``items`` in the target exactly once.

A forward names its source message by a 16-byte *hand-off key*, the xxh3-128 digest
of (source queue directory, source reader, source message id; ``core.feature.handoff_key``).
The target keeps the keys it took in ``features/forwards.log`` (framed msgpack records
``[key, first_id, count, timestamp_ns]``, format/feature_state.py), created at the first
forward into the queue: a queue that never receives one has no file and its enqueues pay nothing.

Crash safety (docs/architecture.md, "Exactly-once hand-off").  Under the target's append
lock the record is written *before* the items, which are one batch (all or nothing in
the log: recovery cuts a partial batch); then the source acks.  So whatever instant a
kill -9 hits, a source message that is delivered again either finds no record (nothing
landed: the items are written now) or a record whose items are in the log (only the ack
is done now, and the ids that landed are returned).  A record whose batch never reached
the log (a kill between the two writes) is told apart as unique keys' are: it is
*unverified* once read back from the file, until the entry it names is found in the log
with the record's exact timestamp - one indexed read, when its key comes again (ids are
never reused; an id another handle took after a dead one carries another timestamp).
A record known to be verified - written by this handle, or rewritten - needs no read;
one read back whose entry retention has deleted since (the items consumed, then their
segment) cannot be told from one never written and counts as not landed: a duplicate
is possible then, never a loss, and only after a kill between the items and the ack
followed by that deletion before the redelivery.  A failed item write cuts its record
back.  With ``sync="always"`` the record is fsynced before the items are
written, so a power loss cannot keep the items and lose their record.

The file keeps the newest ``KEEP_RECORDS`` keys: it is rewritten (temp file, rename)
once it holds twice as many.  A source message delivered again after that many later
forwards into the same target is not recognised.

The file's protocol (loading, damage, a torn tail, the version upgrade, shared mode, a
full disk) is :class:`~ledgerq.segment.feature_log.FeatureLog`'s; the record is one it
writes *ahead* (``append_ahead``, then ``keep_ahead`` or ``undo_ahead``).  Shared mode:
every handle appends under the append lock and reads what the others appended before
looking a key up; a rewrite replaces the file and the others, seeing theirs unlinked,
read the new one whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ledgerq.core.feature import Draft, FeatureWithLog, HandedOff, handoff_key
from ledgerq.format.feature_state import keyed_record_encoder
from ledgerq.segment.feature_log import FeatureLog
from ledgerq.segment.naming import FORWARDS_NAME, feature_log_path

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["FORWARDS_MAGIC", "KEEP_RECORDS", "ForwardFeature", "handoff_key"]

FORWARDS_MAGIC = b"LQFW"
KEEP_RECORDS = 65536  # hand-off keys kept after a rewrite
_KEY_SIZE = 16
# The timestamp of a rewritten record whose items this handle knew to be in the log.
_VERIFIED = -1

# One record, ``[key, first_id, count, timestamp]``: one struct.pack and one CRC.
_encode_record = keyed_record_encoder("QQq")


def _record(value: Any) -> tuple[bytes, int, int, int] | None:
    """``(key, first_id, count, timestamp)`` of a decoded record, or None (damaged or
    hostile: exact types only)."""
    if type(value) is not list or len(value) != 4:
        return None
    key, first_id, count, timestamp = value
    if type(key) is not bytes or len(key) != _KEY_SIZE:
        return None
    if not all(type(x) is int for x in (first_id, count, timestamp)):
        return None
    if first_id < 1 or count < 1:
        return None
    return key, first_id, count, timestamp


class ForwardFeature(FeatureWithLog):
    """Take each hand-off key once (always on; see the module)."""

    name = "forward"
    ignores_plain = True  # only drafts with a hand-off key: the plain paths skip this

    def __init__(self) -> None:
        # key -> (first id, count, timestamp or _VERIFIED), oldest first
        self._taken: dict[bytes, tuple[int, int, int]] = {}
        # (key, first id, count, stamp) admitted in the current call, not yet written
        self._provisional: tuple[bytes, int, int, int] | None = None
        self._queue: QueueCore | None = None
        self._sync_always = False

    def attach(self, queue: QueueCore) -> None:
        # Nothing is read or created here: at the first forward into the queue (_current).
        self._queue = queue
        self._sync_always = queue.options.sync == "always"
        self._log = FeatureLog(
            feature_log_path(queue.path, FORWARDS_NAME),
            FORWARDS_MAGIC,
            "hand-off keys",
            queue,
            self,
        )

    # ------------------------------------------------------------------ the table

    def apply_record(self, value: Any) -> bool:
        record = _record(value)
        if record is None:
            return False
        key, first_id, count, timestamp = record
        taken = self._taken
        taken.pop(key, None)  # to the end: the table stays in file order
        taken[key] = (first_id, count, timestamp)
        return True

    def clear_table(self) -> None:
        self._taken.clear()

    def table_records(self) -> Iterator[bytes]:
        """The records of the newest KEEP_RECORDS keys (a rewrite)."""
        taken = self._taken
        while len(taken) > KEEP_RECORDS:
            del taken[next(iter(taken))]
        for key, noted in taken.items():
            yield _encode_record(key, *noted)

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
            landed = self._look_up(key)
            if landed is not None:
                raise HandedOff(landed)
            self._provisional = (key, candidate_id, count, now_ns)  # (now_ns: the items' stamp)
        return None

    def handed_off(self, key: bytes) -> list[int] | None:
        """The ids ``key`` landed, or None (lock held): a forward of no items."""
        log = self._log
        assert log is not None
        if not log.is_loaded and not os.path.exists(log.path):
            return None  # never forwarded into: nothing to look up, no file to make
        return self._look_up(key)

    def _look_up(self, key: bytes) -> list[int] | None:
        """The file's news (created at the first forward), then :meth:`_landed` (lock
        held)."""
        log = self._log
        assert log is not None
        log.current(create=True)
        return self._landed(key)

    def take_handoff(self, key: bytes, first_id: int, count: int, now_ns: int) -> list[int] | None:
        """The core's path for a batch of bytes payloads (lock held): the ids ``key``
        landed before; or None, having written its record - the entries come next, then
        :meth:`handoff_taken` (or :meth:`rollback`)."""
        log = self._log
        assert log is not None
        if log.stale:  # (exclusive mode, once loaded: no call at all)
            log.current(create=True)
        if key in self._taken:
            landed = self._landed(key)
            if landed is not None:
                return landed
        self._provisional = (key, first_id, count, now_ns)
        log.append_ahead(_encode_record(key, first_id, count, now_ns))  # (or raises)
        if self._sync_always:
            log.sync()  # before the entries (see before_append)
        # Noted now (at the end: the table stays in file order), taken back by rollback
        # if the entries fail; the key is not there (or _landed just dropped it).
        self._taken[key] = (first_id, count, _VERIFIED)
        return None

    def handoff_taken(self) -> None:
        """The entries of :meth:`take_handoff` are written (lock held)."""
        self._provisional = None  # (in the table since take_handoff)
        log = self._log
        assert log is not None
        log.keep_ahead()
        if log.records >= 2 * KEEP_RECORDS:
            log.compact()  # to the newest KEEP_RECORDS (if it fails, later)

    def before_append(self) -> None:
        provisional = self._provisional
        if provisional is None:
            return
        log = self._log
        assert log is not None
        log.append_ahead(_encode_record(*provisional))  # raises having written nothing
        if self._sync_always:
            # Before the items: a power loss must not keep them and lose the record.
            log.sync()

    def appended(self, drafts: list[Draft], first_id: int, now_ns: int) -> None:
        provisional = self._provisional
        if provisional is None:
            return
        self._provisional = None
        key, noted_first, count, _ = provisional
        log = self._log
        assert log is not None
        log.keep_ahead()
        taken = self._taken
        taken.pop(key, None)  # (an unverified record of it, found never written)
        taken[key] = (noted_first, count, _VERIFIED)
        if log.records >= 2 * KEEP_RECORDS:
            log.compact()  # to the newest KEEP_RECORDS (if it fails, later)

    def rollback(self) -> None:
        provisional, self._provisional = self._provisional, None
        queue, log = self._queue, self._log
        if log is None:
            return
        if provisional is not None and queue is not None and queue._next_id > provisional[1]:
            # The items reached the log all the same (a rotation failed after the
            # write): the hand-off happened, its record stays.
            log.keep_ahead()
            self._taken[provisional[0]] = (provisional[1], provisional[2], _VERIFIED)
            return
        if provisional is not None:
            self._taken.pop(provisional[0], None)  # (noted by take_handoff)
        # The record is written, its items not: cut it back.  If that fails too it
        # stays, unverifiable - no entry has its id and timestamp.
        log.undo_ahead()

    # ------------------------------------------------------------------ lifecycle
