"""A reader's state journal on disk (see ``ledgerq.format.reader_state``)."""

from __future__ import annotations

import logging
import os

from ledgerq.format.errors import DecodeError
from ledgerq.format.reader_state import (
    STATE_FILE_HEADER,
    STATE_VERSION,
    Checkpoint,
    StateRecordType,
    encode_checkpoint,
    encode_id_record,
    encode_ids_record,
    encode_state_file_header,
    state_file_version,
)
from ledgerq.segment.appendlog import AppendLog
from ledgerq.segment.readonly_state import JournalTail, ReaderState, StateRecord
from ledgerq.segment.sync import GroupCommit

__all__ = ["ReaderJournal"]

logger = logging.getLogger("ledgerq")

_ONE_ID_RECORD_SIZE = len(encode_id_record(StateRecordType.ACK, 1))

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
        """
        blob = [encode_state_file_header(STATE_VERSION)]
        for kind, ids, checkpoint, _ in records:
            if checkpoint is not None:
                blob.append(encode_checkpoint(checkpoint))
            else:
                blob.append(encode_ids_record(kind, ids))
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
        self.replace(encode_state_file_header() + encode_checkpoint(checkpoint))
        self.version = STATE_VERSION
        # Everything before the rewrite is now durable (the checkpoint holds it).
        self.commit.note_write()
        self.commit.sync_now()
