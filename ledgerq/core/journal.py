"""A reader's state journal on disk (see ``ledgerq.format.reader_state``)."""

from __future__ import annotations

import logging
import os
import threading

from ledgerq.format.errors import DecodeError
from ledgerq.format.reader_state import (
    STATE_FILE_HEADER,
    Checkpoint,
    StateRecordType,
    encode_checkpoint,
    encode_id_record,
    encode_ids_record,
    encode_state_file_header,
    state_file_version,
)
from ledgerq.segment.files import (
    StorageError,
    datasync,
    replace_and_open,
    storage_errors,
    write_all,
)
from ledgerq.segment.readonly_state import JournalTail, ReaderState
from ledgerq.segment.sync import GroupCommit

__all__ = ["ReaderJournal"]

logger = logging.getLogger("ledgerq")

_ONE_ID_RECORD_SIZE = len(encode_id_record(StateRecordType.ACK, 1))

# Rewrite the journal once it is this much larger than its last checkpoint.
_COMPACT_MIN_BYTES = 1 << 20


class ReaderJournal:
    """Append-only journal of one reader; the caller serialises appends (queue lock)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._fd_lock = threading.Lock()  # guards the fd against swap during compaction
        self.size = 0
        self._compact_at = _COMPACT_MIN_BYTES
        self.commit = GroupCommit(self._sync)
        self.version = 1  # of the file on disk: 2 once it may hold a newer record type

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
        state.apply(tail.read())
        end = tail.offset
        if end < tail.size:
            logger.warning(
                "ledgerq: cutting %d bytes of torn data at the end of %s",
                tail.size - end,
                self.path,
            )
            with open(self.path, "r+b") as f:
                f.truncate(end)
        state.done = {i for i in state.done if i >= state.head}
        self._open(end)
        return state

    def _open(self, size: int) -> None:
        self._adopt(os.open(self.path, os.O_WRONLY | os.O_APPEND), size)

    def _adopt(self, fd: int, size: int) -> None:
        """Append to ``fd`` (holding ``size`` bytes) from now on."""
        with self._fd_lock:
            old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)
        self.size = size
        self._compact_at = max(_COMPACT_MIN_BYTES, size * 4)

    def append(self, kind: StateRecordType, ids: list[int] | tuple[int, ...]) -> int:
        """Append a LEASE/ACK/NACK record; return the durability ticket."""
        record = encode_id_record(kind, ids[0]) if len(ids) == 1 else encode_ids_record(kind, ids)
        fd = self._fd
        assert fd is not None, "journal is closed"
        try:
            write_all(fd, record)
        except OSError as exc:
            raise StorageError("write reader state", self.path, exc) from exc
        self.size += len(record)
        return self.commit.note_write()

    def append_one(self, kind: StateRecordType, message_id: int) -> int:
        """:meth:`append` for one id (the dequeue/ack hot path)."""
        record = encode_id_record(kind, message_id)
        fd = self._fd
        assert fd is not None, "journal is closed"
        try:
            written = os.write(fd, record)
            if written != _ONE_ID_RECORD_SIZE:
                write_all(fd, record[written:])  # finish a short write
        except OSError as exc:
            raise StorageError("write reader state", self.path, exc) from exc
        self.size += _ONE_ID_RECORD_SIZE
        return self.commit.note_write()

    @property
    def wants_compaction(self) -> bool:
        """Whether the journal has grown enough to be rewritten from a checkpoint."""
        return self.size >= self._compact_at

    def rewrite(self, checkpoint: Checkpoint, *, version: int = 1) -> None:
        """Replace the journal with one holding only ``checkpoint`` (durably).

        ``version`` is the file's: 2 before records only version 2 knows are appended
        (a checkpoint alone is version 1, which every ledgerq reads).  Raises
        :class:`StorageError` if it cannot; the journal then goes on appending to
        whichever file holds its name (see :func:`replace_and_open`), so no record is
        written where a reopen would not find it.
        """
        blob = encode_state_file_header(version) + encode_checkpoint(checkpoint)
        replace_and_open(self.path, blob, lambda fd: self._adopt(fd, len(blob)))
        self.version = version
        # Everything before the rewrite is now durable (the checkpoint holds it).
        self.commit.note_write()
        self.commit.sync_now()

    def _sync(self) -> None:
        with self._fd_lock:
            fd = os.dup(self._fd) if self._fd is not None else None
        if fd is None:
            return
        try:
            with storage_errors("sync reader state", self.path):
                datasync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the journal file."""
        with self._fd_lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
