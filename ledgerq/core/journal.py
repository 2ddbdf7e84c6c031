"""A reader's state journal on disk (see ``ledgerq.format.reader_state``)."""

from __future__ import annotations

import logging
import os

from ledgerq.format.errors import DecodeError
from ledgerq.format.reader_state import (
    STATE_FILE_HEADER,
    STATE_VERSION,
    Checkpoint,
    ReclaimCause,
    StateRecordType,
    encode_checkpoint,
    encode_id_record,
    encode_ids_record,
    encode_lease_by_one,
    encode_lease_by_record,
    encode_not_before_record,
    encode_reclaim_record,
    encode_state_file_header,
    encode_touch_record,
    state_checksum,
    state_file_version,
)
from ledgerq.segment.appendlog import AppendLog
from ledgerq.segment.files import storage_errors
from ledgerq.segment.readonly_state import (
    JournalTail,
    ReaderState,
    StateRecord,
    StateRecords,
    journal_records,
)
from ledgerq.segment.shared_page import JournalSlot
from ledgerq.segment.sync import GroupCommit

__all__ = ["ReaderJournal", "ReaderRemovedError", "SharedReaderJournal"]

logger = logging.getLogger("ledgerq")

_ONE_ID_RECORD_SIZE = len(encode_id_record(StateRecordType.ACK, 1))
_LEASE = StateRecordType.LEASE

# Rewrite the journal once it is this much larger than its last checkpoint.
_COMPACT_MIN_BYTES = 1 << 20
# After a compaction failed (a full disk), the least growth before it is tried again.
_RETRY_COMPACTION_BYTES = 64 << 10
# While the disk is full (the queue's reserve spent): compact after this much growth.
_LOW_SPACE_GROWTH = 8 << 10


class ReaderJournal(AppendLog):
    """Append-only journal of one reader; the caller serialises appends (queue lock).

    An :class:`AppendLog`: a record is appended whole or not at all - a write that a
    full disk cut short is cut back before the append raises, so no good record is
    ever written after a torn one (which the next open would refuse as damage).
    """

    def __init__(self, path: str) -> None:
        super().__init__(path, "reader state")
        self._compact_at = _COMPACT_MIN_BYTES
        self._low_space = False
        self._adopted_size = 0  # the size when it was opened or last rewritten
        self.commit = GroupCommit(self.sync)
        self.version = STATE_VERSION  # of the file on disk
        self.loaded: ReaderState | None = None  # what load() replayed

    _shared = False  # whether checkpoints carry the leases (shared mode)

    def load(self) -> ReaderState:
        """Replay the journal (creating it if missing) and open it for appending.

        A torn last record is cut off; a corrupt record in the middle raises
        :class:`CorruptionError` - skipping it could redeliver or lose acks.  (The
        replay is ``segment.readonly_state``'s, which lock-free readers share.)
        """
        state = ReaderState()
        if not os.path.exists(self.path):
            self.rewrite(Checkpoint(1, [], [], {}))
            return state
        with open(self.path, "rb") as f:
            header = f.read(STATE_FILE_HEADER.size)
        try:
            self.version = state_file_version(header)
        except DecodeError:
            self.version = 1  # the replay below reports the bad header
        tail = JournalTail(self.path)
        records = tail.read()
        state.apply(records)
        self.loaded = state
        end = tail.offset
        if end < tail.size:
            logger.warning(
                "ledgerq: cutting %d bytes of torn data at the end of %s",
                tail.size - end,
                self.path,
            )
        state.done = {i for i in state.done if i >= state.head}
        if self.version < STATE_VERSION:
            self._upgrade(records)
        else:
            self.open(end)  # cuts the torn bytes
        return state

    def _upgrade(self, records: list[StateRecord]) -> None:
        """Rewrite a journal of an older version (CRC-32) as the newest (CRC-32C).

        The same records in the same order, only checksummed anew, so the replay is
        the same; replaced atomically, before anything is appended, so that one file
        never mixes checksums (and an older ledgerq refuses it by its version).

        In shared mode this runs under the reader's lock (``SharedReaderCore`` loads
        the journal holding it): no other handle appends meanwhile, and one that has the
        file open sees it replaced and starts over from the new file, as after a
        compaction.  A handle that loaded the journal earlier upgraded it then, so the
        old file is met only by the first handle to load this reader - the session's
        first while it recovers alone, or the first to open a reader nobody had open.
        """
        blob = [encode_state_file_header(STATE_VERSION)]
        for kind, body, checkpoint, _ in records:
            if checkpoint is not None:
                # The five-element form where the file had leases, or is shared mode's.
                shared = self._shared or bool(checkpoint.leases)
                blob.append(encode_checkpoint(checkpoint, shared=shared))
            elif kind is StateRecordType.LEASE_BY:
                blob.append(encode_lease_by_record(body[0], body[1], body[2:]))
            elif kind is StateRecordType.RECLAIM:
                blob.append(encode_reclaim_record(body[0], body[1], body[2:]))
            # (Version 3 brought these two: no ledgerq wrote them in an older file, but
            # one that holds them is rewritten as it reads, not refused half-way.)
            elif kind is StateRecordType.TOUCH:
                blob.append(encode_touch_record(body[0], body[1], body[2:]))
            elif kind is StateRecordType.NOT_BEFORE:
                blob.append(encode_not_before_record(body[0], body[1:]))
            else:
                blob.append(encode_ids_record(kind, body))
        self.replace(b"".join(blob))
        self.version = STATE_VERSION

    def adopt(self, fd: int, size: int) -> None:
        """Append to ``fd`` (holding ``size`` bytes) from now on."""
        super().adopt(fd, size)
        self._adopted_size = size
        self._set_compaction_point()

    def _set_compaction_point(self) -> None:
        if self._low_space:
            self._compact_at = self.size + _LOW_SPACE_GROWTH
        else:
            self._compact_at = max(_COMPACT_MIN_BYTES, self.size * 4)

    def set_low_space(self, low: bool) -> None:
        """Compact after every few KiB of records while the disk is full (``low``).

        While the queue's disk reserve is spent, the journal must not grow into the
        last free pages: rewriting it as a checkpoint (small after in-order acks) gives
        back what its records took, so a drain can go on.
        """
        if low != self._low_space:
            self._low_space = low
            self._set_compaction_point()

    def append(self, kind: StateRecordType, ids: list[int] | tuple[int, ...]) -> int:
        """Append a LEASE/ACK/NACK/... record of ``ids``; return the durability ticket.

        Raises :class:`StorageError` having written nothing (see the class).
        """
        record = encode_id_record(kind, ids[0]) if len(ids) == 1 else encode_ids_record(kind, ids)
        self.append_record(record)
        return self.commit.note_write()

    def append_one(self, kind: StateRecordType, message_id: int) -> int:
        """:meth:`append` for one id (the dequeue/ack hot path, inlined)."""
        record = encode_id_record(kind, message_id)
        fd = self._fd
        if fd is None or self._fragment:
            fd = self._writable()
        try:
            written = os.write(fd, record)
            if written != _ONE_ID_RECORD_SIZE:
                self._finish_short_write(fd, record, written)
        except OSError as exc:
            self._append_after_failure(fd, record, exc)
        else:
            self.size += _ONE_ID_RECORD_SIZE
        return self.commit.note_write()

    def append_lease(self, ids: list[int], deadline_ns: int) -> int:
        """Append the LEASE of ``ids``; return the durability ticket.

        ``deadline_ns`` is the leases' visibility deadline (the queue's time; 0: none),
        which only shared mode journals (its LEASE_BY records, the holders' deadlines).
        """
        return self.append(_LEASE, ids)

    def append_lease_one(self, message_id: int, deadline_ns: int) -> int:
        """:meth:`append_lease` of one id (the dequeue hot path)."""
        return self.append_one(_LEASE, message_id)

    def postpone_compaction(self) -> None:
        """A compaction failed: try again once the journal has grown some more."""
        if self._low_space:
            self._compact_at = self.size + _LOW_SPACE_GROWTH
        else:
            self._compact_at = self.size + max(self.size // 4, _RETRY_COMPACTION_BYTES)

    @property
    def has_grown(self) -> bool:
        """Whether records were appended since it was opened or last rewritten."""
        return self.size != self._adopted_size

    @property
    def wants_compaction(self) -> bool:
        """Whether the journal has grown enough to be rewritten from a checkpoint."""
        return self.size >= self._compact_at

    def rewrite(self, checkpoint: Checkpoint) -> None:
        """Replace the journal with one holding only ``checkpoint`` (durably).

        The file is of the newest version (its records are CRC-32C).  Raises
        :class:`StorageError` if it cannot; the journal then goes on appending to
        whichever file holds its name (see :func:`replace_and_open`), so no record is
        written where a reopen would not find it.
        """
        self.replace(
            encode_state_file_header() + encode_checkpoint(checkpoint, shared=self._shared)
        )
        self.version = STATE_VERSION
        # Everything before the rewrite is now durable (the checkpoint holds it).
        self.commit.note_write()
        self.commit.sync_now()


class ReaderRemovedError(Exception):
    """The reader's journal was removed (``remove_reader`` by another handle)."""


class SharedReaderJournal(ReaderJournal):
    """A reader's journal that other shared-mode handles append to as well.

    The caller holds the reader's lock (``shared/<name>.reader``) across a catch-up
    (:meth:`read_new`) and the appends that follow it: then nobody else writes, the
    file ends where this handle's offset (:attr:`size`) says, and its own records land
    there.  Bytes after the last whole record found under the lock are the remains of
    a handle that died while appending (it held the lock): they are cut.  A failed
    append of this handle is cut back as in exclusive mode (:class:`AppendLog`).

    A lease is written as LEASE_BY (this handle's id as the holder, and the deadline
    the call passes to :meth:`append_lease`); checkpoints carry the live leases and the
    file is version 2.  Another handle's compaction replaces the file: the descriptor
    then refers to a file with no name left (``st_nlink == 0``), and :meth:`read_new`
    starts over from the new file.

    With a :attr:`slot` in the state page (``segment.shared_page.JournalSlot``), the
    holder of the reader's lock publishes there the length of the file's whole records
    and its *generation* (bumped by whoever replaces or removes the file), and
    :meth:`news` compares them with this handle's: no ``fstat`` on a step with nothing
    new.  A holder that did not end its step (it died; the lock says so) may have left
    bytes past the published length: then :meth:`changes` is told to ``repair``, and
    reads the file as :meth:`read_new` does.
    """

    _shared = True

    def __init__(self, path: str, holder: int) -> None:
        super().__init__(path)
        self.holder = holder
        self.slot: JournalSlot | None = None  # where the length is published, if anywhere
        self.generation = 0  # of the file this handle appends to (the slot's, or ahead)

    def attach_slot(self, slot: JournalSlot, *, replaced: bool) -> None:
        """Publish through ``slot`` from now on: this handle's view is the file's (it was
        just loaded, under the reader's lock).

        ``replaced``: the file may not be the one the slot's generation stands for - the
        holder before this load died mid-step (a compaction's rename done, its new
        generation never published), or this handle rewrote it while loading.  Then a
        new generation is published, so that every other handle reads the file whole
        rather than going on in the old one, unlinked, at the length published here.
        """
        self.slot = slot
        self.generation = slot.adopt(self.size, new_generation=replaced)

    def changes(self, *, repair: bool) -> tuple[list[StateRecord], bool] | None:
        """What other handles wrote since this handle's last step (reader lock held):
        ``(records, replaced)`` as :meth:`read_new` returns them, or None when nothing.

        Two reads of the page when the journal has a slot (unless ``repair``: a holder
        died or could not cut a failed write - then the file itself is looked at).
        """
        slot = self.slot
        if slot is None or repair:
            st = self.has_news()
            if st is None:
                return None
            caught_up = self.read_new(st)
            if slot is not None:
                self.generation = max(self.generation, slot.generation)
                if caught_up[1]:
                    # Replaced by a holder that died before it published so: a new
                    # generation, or the others go on with the file they have (same
                    # generation, a length to read in it that it does not hold).
                    self.generation += 1
            return caught_up
        length, generation = slot.read()
        if generation == self.generation:
            if length == self.size:
                return None
            if length > self.size:
                return self._read_published(length), False
            # Shorter than this handle's view: not what any holder publishes for the file
            # this handle has - look at the file itself.
            st = self.has_news()
            if st is None:
                return None
            reread = self.read_new(st)
            self.generation = max(self.generation, slot.generation) + (1 if reread[1] else 0)
            return reread
        self.generation = generation  # replaced (or removed): the new file, whole
        records, _ = self._adopt_new_file()
        whole = list(records)
        self.size = self._adopted_size = records.end
        self._set_compaction_point()
        return whole, True

    def _adopt_new_file(self) -> tuple[StateRecords, bytes]:
        """Open the file now at the journal's path (another handle replaced it) and
        take it as this handle's: its records and its bytes, read whole."""
        fd = self._reopen()
        try:
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            records = journal_records(data, self.path)
            self.version = state_file_version(data[: STATE_FILE_HEADER.size])
        except BaseException:
            os.close(fd)
            raise
        self.adopt(fd, 0)
        return records, data

    def _read_published(self, length: int) -> list[StateRecord]:
        """The whole records other handles appended, up to the published ``length``."""
        fd = self._fd
        assert fd is not None, "journal is closed"
        base = self.size
        data = os.pread(fd, length - base, base)
        records = StateRecords(data, 0, self.path, base=base, crc=state_checksum(self.version))
        found = list(records)
        self.size = records.end
        return found

    def publish(self) -> bool:
        """Publish this handle's length and generation (reader lock held, at the end of
        its step); True when a failed write's fragment may be left past it (the lock is
        then released SUSPECT: the next holder repairs)."""
        slot = self.slot
        if slot is not None:
            slot.publish(self.size, self.generation)
        return self._fragment

    def replace(self, blob: bytes) -> None:
        try:
            super().replace(blob)
        finally:
            # A new file (also when the replace raised after the rename: this handle may
            # append to the new file already): the others must read it whole, from its
            # checkpoint.  A bump too many only makes them read a file they had.
            slot = self.slot
            current = slot.generation if slot is not None else 0
            self.generation = max(self.generation, current) + 1

    def append_lease(self, ids: list[int], deadline_ns: int) -> int:
        """Append the LEASE_BY of ``ids``: this handle holds them until ``deadline_ns``
        (0: no visibility timeout)."""
        self.append_record(encode_lease_by_record(self.holder, deadline_ns, ids))
        return self.commit.note_write()

    def append_lease_one(self, message_id: int, deadline_ns: int) -> int:
        self.append_record(encode_lease_by_one(self.holder, deadline_ns, message_id))
        return self.commit.note_write()

    def append_one(self, kind: StateRecordType, message_id: int) -> int:
        self.append_record(encode_id_record(kind, message_id))
        return self.commit.note_write()

    def append_reclaim(self, holder: int, cause: ReclaimCause, ids: list[int]) -> int:
        """Append a RECLAIM of ``holder``'s leases of ``ids``; return the durability ticket."""
        self.append_record(encode_reclaim_record(holder, cause, ids))
        return self.commit.note_write()

    def append_touch(self, deadline_ns: int, ids: list[int]) -> int:
        """Append a TOUCH of this handle's leases of ``ids``; return the durability ticket.

        Every journal this ledgerq writes is version 3, which holds TOUCH."""
        self.append_record(encode_touch_record(self.holder, deadline_ns, ids))
        return self.commit.note_write()

    def has_news(self) -> os.stat_result | None:
        """The file's status when other handles wrote to it (or replaced it) since the
        last look, else None: one ``fstat`` (reader lock held)."""
        fd = self._fd
        assert fd is not None, "journal is closed"
        st = os.fstat(fd)
        return st if st.st_size != self.size or not st.st_nlink else None

    def read_new(self, st: os.stat_result | None = None) -> tuple[list[StateRecord], bool]:
        """The records other handles appended since the last look (reader lock held).

        Returns them and whether the file was replaced meanwhile (then they are the
        whole new file, from its CHECKPOINT).  ``st``: the file's status just taken.
        Raises :class:`ReaderRemovedError` when the journal is gone,
        :class:`CorruptionError` for damage in the middle.
        """
        fd = self._fd
        assert fd is not None, "journal is closed"
        if st is None:
            st = os.fstat(fd)
        restarted = st.st_nlink == 0
        if restarted:
            records, data = self._adopt_new_file()
            base = 0
        else:
            size = st.st_size
            if size == self.size:
                return [], False
            base = self.size
            data = os.pread(fd, size - base, base)
            crc = state_checksum(self.version)
            records = StateRecords(data, 0, self.path, base=base, crc=crc)
        found = list(records)
        end = records.end
        if end < base + len(data):
            # A handle died appending (under the lock), or this handle's own failed
            # append could not be cut back: either way nobody writes now - cut it.
            logger.warning(
                "ledgerq: cutting %d bytes a handle left half-written at the end of %s",
                base + len(data) - end,
                self.path,
            )
            with storage_errors("cut a torn record of", self.path):
                os.ftruncate(fd, end)
            self._fragment = False
        self.size = end
        if restarted:
            self._adopted_size = end
            self._set_compaction_point()
        return found, restarted

    def _reopen(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            raise ReaderRemovedError(self.path) from None
