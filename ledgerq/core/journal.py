"""A reader's state journal on disk (see ``ledgerq.format.reader_state``)."""

from __future__ import annotations

import logging
import os
import threading

from ledgerq._errors import CorruptionError
from ledgerq.format.checksum import recovery_crc_allowance
from ledgerq.format.errors import CorruptRecord, IncompleteRecord
from ledgerq.format.reader_state import (
    MIN_STATE_RECORD_SIZE,
    Checkpoint,
    StateRecordType,
    decode_checkpoint,
    decode_state_file_header,
    decode_state_record,
    encode_checkpoint,
    encode_id_record,
    encode_ids_record,
    encode_state_file_header,
    plausible_record_length,
)
from ledgerq.segment.files import (
    StorageError,
    datasync,
    replace_and_open,
    storage_errors,
    write_all,
)
from ledgerq.segment.sync import GroupCommit

__all__ = ["ReaderJournal", "ReplayedState"]

logger = logging.getLogger("ledgerq")

_ONE_ID_RECORD_SIZE = len(encode_id_record(StateRecordType.ACK, 1))

# Rewrite the journal once it is this much larger than its last checkpoint.
_COMPACT_MIN_BYTES = 1 << 20

# Telling a torn tail from damage in the middle means making sure that no valid record
# starts at any offset after the bad one: checksumming each plausible record over the
# length it claims.  Honest tails - a torn append, zeroed or stale pages - hold few
# plausible headers, and short ones; a crafted file can hold one claiming the rest of
# the file at every offset, and checking them all is quadratic (a 1 MiB file: 137 GB of
# CRC).  So the bytes checksummed in vain are capped (format.checksum's
# recovery_crc_allowance of the bytes after the bad record); a candidate that does not fit
# in what is left makes the bad record count as damage (CorruptionError), the safe
# answer: nothing is cut that might have held acks.


class ReplayedState:
    """What replaying a journal yields."""

    def __init__(self) -> None:
        self.head = 1
        self.done: set[int] = set()
        self.deliveries: dict[int, int] = {}
        self.counters: dict[str, int] = {}


class ReaderJournal:
    """Append-only journal of one reader; the caller serialises appends (queue lock)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._fd_lock = threading.Lock()  # guards the fd against swap during compaction
        self.size = 0
        self._compact_at = _COMPACT_MIN_BYTES
        self.commit = GroupCommit(self._sync)

    def load(self) -> ReplayedState:
        """Replay the journal (creating it if missing) and open it for appending.

        A torn last record is cut off; a corrupt record in the middle raises
        :class:`CorruptionError` - skipping it could redeliver or lose acks.
        """
        state = ReplayedState()
        if not os.path.exists(self.path):
            self.rewrite(Checkpoint(1, [], [], {}))
            return state
        with open(self.path, "rb") as f:
            data = f.read()
        try:
            pos = decode_state_file_header(data)
        except (CorruptRecord, IncompleteRecord) as exc:
            raise CorruptionError(f"reader state file is damaged ({exc})", self.path, 0) from None
        end = pos
        while pos < len(data):
            try:
                kind, body, nxt = decode_state_record(data, pos)
            except (CorruptRecord, IncompleteRecord) as exc:
                # A record cut short, or damaged, with nothing valid after it is a torn
                # append at the tail (kill or power loss): cut it below.  One followed
                # by valid records is damage in the middle - even when its (flipped)
                # length claims to run past the end of the file.
                if self._only_garbage_follows(data, pos):
                    break
                raise CorruptionError(
                    f"reader state record is damaged ({exc}); restore the file or delete it "
                    "to restart this reader from the oldest message",
                    self.path,
                    pos,
                ) from None
            if kind is StateRecordType.CHECKPOINT:
                assert isinstance(body, bytes)
                try:
                    cp = decode_checkpoint(body, pos)
                except CorruptRecord as exc:
                    raise CorruptionError(
                        f"reader checkpoint is damaged ({exc}); restore the file or delete it "
                        "to restart this reader from the oldest message",
                        self.path,
                        pos,
                    ) from None
                state.head = cp.head
                state.done = set(cp.done)
                state.deliveries = dict(cp.deliveries)
                state.counters = dict(cp.counters)
            elif kind is StateRecordType.LEASE:
                assert isinstance(body, tuple)
                for message_id in body:
                    state.deliveries[message_id] = state.deliveries.get(message_id, 0) + 1
            elif kind is StateRecordType.ACK:
                assert isinstance(body, tuple)
                for message_id in body:
                    state.done.add(message_id)
                    state.deliveries.pop(message_id, None)
                state.counters["acked"] = state.counters.get("acked", 0) + len(body)
            elif kind is StateRecordType.NACK:
                assert isinstance(body, tuple)
                state.counters["nacked"] = state.counters.get("nacked", 0) + len(body)
            else:  # DEAD_LETTER, EXPIRE: done here, and counted
                assert isinstance(body, tuple)
                for message_id in body:
                    state.done.add(message_id)
                    state.deliveries.pop(message_id, None)
                counter = "dead_lettered" if kind is StateRecordType.DEAD_LETTER else "expired"
                state.counters[counter] = state.counters.get(counter, 0) + len(body)
            pos = end = nxt
        if end < len(data):
            logger.warning(
                "ledgerq: cutting %d bytes of torn data at the end of %s",
                len(data) - end,
                self.path,
            )
            with open(self.path, "r+b") as f:
                f.truncate(end)
        state.done = {i for i in state.done if i >= state.head}
        self._open(end)
        return state

    @staticmethod
    def _only_garbage_follows(data: bytes, pos: int) -> bool:
        """Whether no valid record starts at any offset after the damaged one at ``pos``.

        Also False - the damage is then reported, nothing is cut - when the bytes hold
        more plausible records than :func:`recovery_crc_allowance` lets it checksum.
        """
        budget = recovery_crc_allowance(len(data) - pos)
        for at in range(pos + 1, len(data) - MIN_STATE_RECORD_SIZE + 1):
            length = plausible_record_length(data, at)
            if not length:
                continue
            if length > budget:
                return False  # cannot rule it out within the budget: not provably torn
            try:
                decode_state_record(data, at)
            except (CorruptRecord, IncompleteRecord):
                budget -= length
                continue
            return False
        return True

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

    def rewrite(self, checkpoint: Checkpoint) -> None:
        """Replace the journal with one holding only ``checkpoint`` (durably).

        Raises :class:`StorageError` if it cannot; the journal then goes on appending to
        whichever file holds its name (see :func:`replace_and_open`), so no record is
        written where a reopen would not find it.
        """
        blob = encode_state_file_header() + encode_checkpoint(checkpoint)
        replace_and_open(self.path, blob, lambda fd: self._adopt(fd, len(blob)))
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
