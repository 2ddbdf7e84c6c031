"""Reader state journals (``readers/<name>.state``) replayed, whole or incrementally.

One replay serves the queue's own recovery (``core.journal.ReaderJournal.load``) and
every reader that works without the queue's lock (``ledgerq ship``'s durable heads,
the Spark source's ``state`` column, ``ledgerq verify``, the console): the reading
rules below live here only, and the fold of the records into state is
``segment.journal_fold``'s (which the live shared reader folds with too).  The record
format is ``ledgerq.format.reader_state``.

What a replay may rely on from the owner:

* it appends records (one ``write()`` per record or group of records), so the bytes
  of a journal below a size once seen never change - with two exceptions:
* when the queue opens, its recovery cuts a torn last record (a kill or a power cut
  during an append), and nothing else;
* when the journal has grown, the owner replaces it whole (temp file, fsync, rename)
  with a file that starts with a CHECKPOINT of the reader's whole state.  A
  :class:`JournalTail` notices another file at the path and reads it from its start;
  the checkpoint resets what was replayed before.

Bytes that are no record are either a *torn tail* - nothing valid after them: a record
still being appended, or the remains of one that never finished - which a replay stops
at without error (the owner's recovery cuts it; an incremental reader reads on from
there later), or *damage in the middle* - valid records after them - which raises
:class:`CorruptionError`: skipping a record could lose acks or redeliver, so the queue
refuses to open then, and every replay here agrees.  Telling the two apart checksums
each plausible record after the bad bytes; that work is capped by
``format.checksum.recovery_crc_allowance``, and a tail that cannot be ruled out within
the cap counts as damage (the safe answer: nothing is cut that might hold acks).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence

from ledgerq._errors import CorruptionError
from ledgerq.format.checksum import Checksum, checksum, recovery_crc_allowance
from ledgerq.format.errors import CorruptRecord, DecodeError, IncompleteRecord
from ledgerq.format.reader_state import (
    MIN_STATE_RECORD_SIZE,
    STATE_FILE_HEADER,
    STATE_MAGIC,
    Checkpoint,
    StateRecordType,
    decode_checkpoint,
    decode_state_file_header,
    decode_state_record,
    plausible_record_length,
    state_checksum,
    state_file_version,
)
from ledgerq.segment.journal_fold import FoldTables, StateRecord, fold_records
from ledgerq.segment.naming import list_reader_names, reader_state_path

__all__ = [
    "HEADER_ADVICE",
    "JournalTail",
    "ReaderState",
    "StateRecord",
    "StateRecords",
    "has_valid_header",
    "journal_records",
    "next_record_after",
    "reader_heads",
    "replay_reader",
]

# What to do about damage in the middle: called with the file offset of the bad bytes,
# the offset where valid records go on (-1: none found within the allowance) and what
# is wrong; return True to go on reading there (``ledgerq verify``), False to stop.
# Without one, damage raises CorruptionError.
DamageHandler = Callable[[int, int, str], bool]

_ADVICE = "restore the file or delete it to restart this reader from the oldest message"
# An empty or headerless file holds no state to keep: the repair restarts the reader.
HEADER_ADVICE = (
    "run `ledgerq verify --repair` on the queue, which restarts this reader at the oldest "
    "retained message (at-least-once: what it had finished is delivered again, nothing is "
    "lost), or restore the file from a backup"
)


def next_record_after(data: bytes, pos: int, crc: Checksum = checksum) -> int:
    """Where the first valid record after the bad bytes at ``pos`` starts.

    ``len(data)`` when only garbage follows (a torn tail), -1 when the bytes hold more
    plausible records than :func:`recovery_crc_allowance` lets it checksum (damage
    that cannot be told from a tail: treated as damage).  ``crc`` is the file's
    checksum.
    """
    budget = recovery_crc_allowance(len(data) - pos)
    for at in range(pos + 1, len(data) - MIN_STATE_RECORD_SIZE + 1):
        length = plausible_record_length(data, at)
        if not length:
            continue
        if length > budget:
            return -1  # cannot rule it out within the budget: not provably torn
        try:
            decode_state_record(data, at, crc)
        except (CorruptRecord, IncompleteRecord):
            budget -= length
            continue
        return at
    return len(data)


class StateRecords:
    """The records of a journal's bytes ``data`` from ``pos``, in order (iterate once).

    ``base`` is the file offset of ``data[0]``: offsets in records and errors are file
    offsets.  Iteration stops at a torn tail; once it has stopped, :attr:`end` is the
    file offset where the bytes read stop being whole records (``base + len(data)`` when
    they all are).  Damage in the middle goes to ``on_damage`` (see ``DamageHandler``),
    or raises :class:`CorruptionError` naming ``path`` and the offset.  ``crc`` is
    the checksum of the file's version (``format.reader_state.state_checksum``).
    """

    def __init__(
        self,
        data: bytes,
        pos: int,
        path: str,
        *,
        base: int = 0,
        on_damage: DamageHandler | None = None,
        crc: Checksum = checksum,
    ) -> None:
        self.crc = crc
        self._data = data
        self._pos = pos
        self.path = path
        self.base = base
        self.end = base + pos
        self._on_damage = on_damage

    def __iter__(self) -> Iterator[StateRecord]:
        data, base, pos = self._data, self.base, self._pos
        size = len(data)
        decode = decode_state_record
        crc = self.crc
        try:
            while pos < size:
                try:
                    kind, body, nxt = decode(data, pos, crc)
                except (CorruptRecord, IncompleteRecord) as exc:
                    # A record cut short, or damaged, with nothing valid after it is a
                    # torn append at the tail (or one in flight).  One followed by valid
                    # records is damage in the middle - even when its (flipped) length
                    # claims to run past the end of the data.
                    resume = next_record_after(data, pos, crc)
                    if resume == size:
                        return
                    if not self._damaged(pos, resume, f"reader state record is damaged ({exc})"):
                        return
                    pos = resume
                    continue
                if isinstance(body, tuple):  # LEASE ... RELEASE: the ids
                    yield kind, body, None, base + pos
                else:  # a CHECKPOINT's msgpack body
                    try:
                        checkpoint = decode_checkpoint(body, base + pos)
                    except CorruptRecord as exc:
                        if not self._damaged(pos, nxt, f"reader checkpoint is damaged ({exc})"):
                            return
                    else:
                        yield kind, (), checkpoint, base + pos
                pos = nxt
        finally:
            self.end = base + pos  # where the whole records read end (or the walk stopped)

    def _damaged(self, pos: int, resume: int, problem: str) -> bool:
        at = self.base + pos
        if self._on_damage is None:
            raise CorruptionError(f"{problem}; {_ADVICE}", self.path, at)
        return self._on_damage(at, self.base + resume if resume >= 0 else -1, problem)


def has_valid_header(data: bytes) -> bool | None:
    """Whether a journal's bytes start with a valid file header: True; False when they
    are empty or start with anything but the magic (no state to keep: a repair restarts
    the reader); None for the magic of another version (not this ledgerq's to touch)."""
    try:
        decode_state_file_header(data)
    except DecodeError:
        if data[: len(STATE_MAGIC)] == STATE_MAGIC and len(data) >= STATE_FILE_HEADER.size:
            return None
        return False
    return True


def journal_records(
    data: bytes, path: str, *, on_damage: DamageHandler | None = None
) -> StateRecords:
    """The records of a whole journal file's bytes ``data`` (read from ``path``).

    Raises :class:`CorruptionError` at once when its 8-byte file header is bad.
    """
    try:
        pos = decode_state_file_header(data)
    except DecodeError as exc:
        if has_valid_header(data) is None:
            raise CorruptionError(
                f"reader state file is of another version ({exc}): written by a newer "
                "ledgerq? Open the queue with that version",
                path,
                0,
            ) from None
        raise CorruptionError(
            f"reader state file has no valid header ({'empty' if not data else exc}); "
            f"{HEADER_ADVICE}",
            path,
            0,
        ) from None
    crc = state_checksum(state_file_version(data))
    return StateRecords(data, pos, path, on_damage=on_damage, crc=crc)


class JournalTail:
    """Reads one reader's journal incrementally, without the queue's lock.

    Each :meth:`read` returns the whole records appended since the previous one (all
    of them the first time), stopping without error at a record still being written;
    the next read goes on from there.  When the owner has replaced the file (a
    compaction), the read starts over from the new file's beginning and
    :attr:`restarted` is True: its first record is a CHECKPOINT of the whole state.

    A replaced file is told by its inode *and* by the bytes before the offset read to:
    a file system hands a freed inode number to the next new file (ext4 alternates
    two numbers between compactions that rename a fresh file over the journal), so
    two compactions between reads leave the same ``(st_dev, st_ino)``.  The last
    bytes of the last whole record read (its CRC among them) are kept and must be
    found at the same place again, or the file is another one.
    """

    SEAL_BYTES = 16  # of the last whole record read: its CRC and what precedes it

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0  # file offset of the next record to read (0: the header first)
        self.size = 0  # the file's size at the last read
        self.restarted = False
        self._identity: tuple[int, int] | None = None
        self._seal = b""  # the SEAL_BYTES before ``offset`` at the last read
        self._crc = checksum  # that of the file's version, known from its header

    def read(self) -> list[StateRecord]:
        """The records appended since the last read; see the class.

        Raises ``FileNotFoundError`` when the journal does not exist (any more), and
        :class:`CorruptionError` for damage in the middle (or a bad file header).
        """
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            identity = (st.st_dev, st.st_ino)
            seal = self._seal
            self.restarted = identity != self._identity or st.st_size < self.offset
            if not self.restarted:
                f.seek(self.offset - len(seal))
                data = f.read()
                self.restarted = data[: len(seal)] != seal
                data = data[len(seal) :]
            if self.restarted:
                self._identity = identity
                self.offset, seal = 0, b""
                f.seek(0)
                data = f.read()
        base = self.offset
        self.size = base + len(data)
        if base == 0:
            records = journal_records(data, self.path)
            self._crc = records.crc
        else:
            records = StateRecords(data, 0, self.path, base=base, crc=self._crc)
        found = list(records)
        self.offset = records.end
        self._seal = _last_bytes(seal, data, self.offset - base, self.SEAL_BYTES)
        return found


def _last_bytes(before: bytes, data: bytes, end: int, count: int) -> bytes:
    """The ``count`` bytes (fewer near the file's start) before offset ``end`` of
    ``data``, which follows the bytes ``before`` in the file."""
    if end >= count:
        return data[end - count : end]
    return (before + data[:end])[-count:]


class ReaderState:
    """One reader's state as its journal says: the fold of its records
    (:func:`~ledgerq.segment.journal_fold.fold_records`, whose sink it is).

    ``head``: every id below it is done; ``done``: ids acked (or dead-lettered, or
    expired) out of order; ``deliveries``: times each unfinished id was delivered
    (a released lease not counted);
    ``counters``: acked, nacked, dead_lettered, expired, ...; ``leased``: ids leased
    since the last checkpoint and not settled since, and the live leases a shared-mode
    checkpoint lists (a checkpoint's deliveries are counts, not live leases; none is
    live once the queue has closed cleanly); ``holders``: of those, the ones a
    shared-mode handle holds (LEASE_BY, or a checkpoint's leases), as
    ``id -> (holder, deadline_ns)`` - live only while that handle is, and void by a
    RECLAIM of that holder (not of another); ``not_before``:
    ``id -> due_ns`` of failed deliveries retried no earlier than that (NOT_BEFORE),
    until the id is leased again or finished.
    """

    __slots__ = ("counters", "deliveries", "done", "head", "holders", "leased", "not_before")

    def __init__(self) -> None:
        self.head = 1
        self.done: set[int] = set()
        self.deliveries: dict[int, int] = {}
        self.counters: dict[str, int] = {}
        self.leased: set[int] = set()
        self.holders: dict[int, tuple[int, int]] = {}
        self.not_before: dict[int, int] = {}

    def apply(self, records: Iterable[StateRecord]) -> None:
        """Fold ``records`` (in journal order) into this state (``journal_fold``)."""
        fold_records(records, self)

    # ------------------------------------------------------------------ the fold's sink

    def fold_tables(self) -> FoldTables:
        return self.deliveries, self.not_before, self.counters

    def on_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.head = checkpoint.head
        self.done = set(checkpoint.done)
        self.deliveries = dict(checkpoint.deliveries)
        self.counters = dict(checkpoint.counters)
        self.holders = {i: (h, d) for i, h, d in checkpoint.leases}
        self.leased = set(self.holders)
        self.not_before = dict(checkpoint.not_before)

    def on_lease(self, holder: int, deadline_ns: int, ids: Sequence[int]) -> None:
        self.leased.update(ids)
        if holder:
            lease = (holder, deadline_ns)
            holders = self.holders
            for message_id in ids:
                holders[message_id] = lease
        elif self.holders:
            for message_id in ids:  # (a plain LEASE: the newest lease has no holder)
                self.holders.pop(message_id, None)

    def on_touch(self, holder: int, deadline_ns: int, ids: Sequence[int]) -> None:
        holders = self.holders
        for message_id in ids:
            held = holders.get(message_id)
            if held is not None and held[0] == holder:
                holders[message_id] = (holder, deadline_ns)

    def on_reclaim(self, holder: int, cause: int, ids: Sequence[int]) -> None:
        # Only the leases ``holder`` still holds: one another handle took since (after
        # this one's deadline passed) is that handle's, and stays.
        holders, leased = self.holders, self.leased
        for message_id in ids:
            held = holders.get(message_id)
            if held is not None and held[0] == holder:
                del holders[message_id]
                leased.discard(message_id)

    def on_nack(self, ids: Sequence[int]) -> None:
        self._end_leases(ids)

    def on_release(self, ids: Sequence[int]) -> None:
        self._end_leases(ids)

    def on_not_before(self, due_ns: int, ids: Sequence[int]) -> None:
        pass  # (the fold keeps the table)

    def on_finish(self, kind: StateRecordType, ids: Sequence[int]) -> None:
        self.done.update(ids)
        self._end_leases(ids)

    def _end_leases(self, ids: Sequence[int]) -> None:
        self.leased.difference_update(ids)
        holders = self.holders
        if holders:
            for message_id in ids:
                holders.pop(message_id, None)

    def unfinished_in(self, first: int, last: int) -> int:
        """How many of ids ``first..last`` the reader has not finished (at or above its
        head and not done): what it loses when those messages are gone."""
        lo = max(first, self.head)
        if lo > last:
            return 0
        return last - lo + 1 - sum(1 for i in self.done if lo <= i <= last)

    def durable_head(self) -> int:
        """The lowest id the reader may still need: ``head`` moved past done ids."""
        head, done = self.head, self.done
        while head in done:
            head += 1
        return head


def replay_reader(queue_dir: str, name: str) -> ReaderState:
    """Replay ``readers/<name>.state`` of the queue at ``queue_dir``, read-only.

    A reader without a journal yet is at the start (head 1, nothing done).  Raises
    :class:`CorruptionError` for damage in the middle; a torn last record is ignored.
    """
    state = ReaderState()
    try:
        state.apply(JournalTail(reader_state_path(queue_dir, name)).read())
    except FileNotFoundError:
        pass
    return state


def reader_heads(queue_dir: str) -> dict[str, int]:
    """Each reader's durable head (:meth:`ReaderState.durable_head`) as its journal says.

    The owner's memory may be ahead of its journal; never behind.  Raises
    :class:`CorruptionError` for a damaged journal.
    """
    heads = {}
    for name in list_reader_names(queue_dir):
        try:
            records = JournalTail(reader_state_path(queue_dir, name)).read()
        except FileNotFoundError:
            continue  # removed meanwhile (remove_reader)
        state = ReaderState()
        state.apply(records)
        heads[name] = state.durable_head()
    return heads
