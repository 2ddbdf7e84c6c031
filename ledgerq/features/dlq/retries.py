"""The DLQ's retry tracker: why and when each message last failed, per reader.

Part of the dead-letter feature (only :mod:`ledgerq.features.dlq.feature` uses it).
How *many* times a message failed is not stored here: it is derived from the
reader's own journal (deliveries that did not end in an ack), which survives
crashes record by record.  This file adds the human part - the last failure's
reason and time - for the dead-letter headers.  It is an append-only log
``features/retries.log`` of framed msgpack records ``[reader, id, time_ns,
reason]``, each written to the OS before the nack returns, rewritten with only
the live entries when it holds four times as many records as live entries.

In shared mode the handles of every process append to it (each record one
``write()`` on an ``O_APPEND`` descriptor: records never interleave), and only a
handle alone with the queue - the first of a session, while it opens - rewrites it:
a rewrite would lose the records other handles append to the file it replaces.
"""

from __future__ import annotations

import os
from typing import Any

from ledgerq.format.errors import DecodeError
from ledgerq.format.feature_state import (
    decode_feature_file,
    encode_feature_file_header,
    encode_feature_record,
)
from ledgerq.segment.files import StorageError, replace_and_open, storage_errors, write_all

__all__ = ["RetryTracker"]

_MAGIC = b"LQRT"
_MAX_REASON = 4096


def _failure_record(value: Any) -> tuple[str, int, int, str | None] | None:
    """``(reader, id, time_ns, reason)`` of a decoded ``retries.log`` record; None if not one.

    Exact types only, checked before anything is converted: the file may be damaged
    or hostile, and coercing its values is how a float infinity became an
    ``OverflowError`` out of ``open()``.
    """
    if type(value) is not list or len(value) != 4:
        return None
    reader, message_id, when, reason = value
    if type(reader) is not str or type(message_id) is not int or type(when) is not int:
        return None
    if reason is not None and type(reason) is not str:
        return None
    return reader, message_id, when, reason


class RetryTracker:
    """Last failure reason and time of each failing message, per reader."""

    def __init__(self, path: str, *, rewrite: bool = True) -> None:
        """Load ``path``; with ``rewrite`` False (shared mode, other handles live) the
        file is appended to as it is and never replaced."""
        self.path = path
        self._may_rewrite = rewrite
        self._last: dict[tuple[str, int], tuple[int, str]] = {}
        self._fd: int | None = None
        self._records = 0
        values: list[Any] = []
        if os.path.exists(path):
            with open(path, "rb") as f:
                try:
                    values = decode_feature_file(f.read(), _MAGIC).values
                except DecodeError:
                    values = []
        for value in values:
            record = _failure_record(value)
            if record is None:
                continue  # not a record this library writes: corrupt, skip it
            reader, message_id, when, reason = record
            if reason is None:
                self._last.pop((reader, message_id), None)
            else:
                self._last[(reader, message_id)] = (when, reason)
        if rewrite:
            self._rewrite()
        else:
            with storage_errors("open retry state", path):
                if not os.path.exists(path):
                    with open(path, "ab") as f:  # O_APPEND: another handle may be writing too
                        f.write(encode_feature_file_header(_MAGIC))
                self._adopt(os.open(path, os.O_WRONLY | os.O_APPEND))

    def _rewrite(self) -> None:
        blob = encode_feature_file_header(_MAGIC) + b"".join(
            encode_feature_record([reader, mid, when, reason])
            for (reader, mid), (when, reason) in self._last.items()
        )
        replace_and_open(self.path, blob, self._adopt)
        self._records = len(self._last)

    def _adopt(self, fd: int) -> None:
        """Append to ``fd``, the rewritten file, from now on."""
        old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)

    def record(self, reader: str, message_id: int, when_ns: int, reason: str) -> None:
        """Remember a failure (written to the OS before returning)."""
        reason = reason[:_MAX_REASON]
        self._last[(reader, message_id)] = (when_ns, reason)
        self._append([reader, message_id, when_ns, reason])

    def forget(self, reader: str, message_id: int) -> None:
        """The message succeeded or left: drop its entry (lazily persisted)."""
        self._last.pop((reader, message_id), None)

    def last(self, reader: str, message_id: int) -> tuple[int, str] | None:
        """(time_ns, reason) of the last recorded failure, if any."""
        return self._last.get((reader, message_id))

    def _append(self, value: list[Any]) -> None:
        assert self._fd is not None
        try:
            write_all(self._fd, encode_feature_record(value))
        except OSError as exc:
            raise StorageError("write retry state", self.path, exc) from exc
        self._records += 1
        if self._may_rewrite and self._records > 4 * len(self._last) + 1024:
            self._rewrite()

    def flush(self) -> None:
        """fsync the log; raises :class:`StorageError` if the disk refuses."""
        if self._fd is not None:
            with storage_errors("sync retry state", self.path):
                os.fsync(self._fd)

    def close(self) -> None:
        """Close the log."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __len__(self) -> int:
        return len(self._last)
