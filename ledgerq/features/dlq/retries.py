"""The DLQ's retry tracker: why and when each message last failed, per reader.

Part of the dead-letter feature (only :mod:`ledgerq.features.dlq.feature` uses it).
How *many* times a message failed is not stored here: it is derived from the
reader's own journal (deliveries that did not end in an ack), which survives
crashes record by record.  This file adds the human part - the last failure's
reason and time - for the dead-letter headers.  It is an append-only log
``features/retries.log`` of framed msgpack records ``[reader, id, time_ns,
reason]``, each written to the OS before the nack returns, rewritten with only
the live entries when it holds four times as many records as live entries.
A record that cannot be written does not fail the nack (see :class:`RetryTracker`).

In shared mode the handles of every process append to it, each under the queue's
append lock after reading what the others appended (so a failed write is cut back to
the end of their records, never into them), and only a handle alone with the queue -
the first of a session, while it opens - rewrites it: a rewrite would lose the records
other handles append to the file it replaces.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from ledgerq.format.errors import DecodeError
from ledgerq.format.feature_state import (
    FEATURE_VERSION,
    decode_feature_file,
    decode_feature_records,
    encode_feature_file_header,
    encode_feature_record,
)
from ledgerq.segment.appendlog import AppendLog
from ledgerq.segment.files import StorageError, storage_errors

__all__ = ["RetryTracker"]

logger = logging.getLogger("ledgerq")

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
    """Last failure reason and time of each failing message, per reader.

    The log is an :class:`AppendLog`: a record a full disk cuts short is cut back, never
    left in the middle of the file.  A record that cannot be written does not fail the
    nack that reported it (the failure is counted in the reader's journal; this is its
    human part): it stays in memory, later records are appended as usual, and the
    table is rewritten whole at the next sync or close.
    """

    def __init__(
        self,
        path: str,
        *,
        shared_lock: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
        rewrite: bool = True,
    ) -> None:
        """Load ``path``.  ``shared_lock`` (shared mode): the queue's append lock, held
        across each append; ``rewrite`` False (shared mode, other handles live): the
        file is appended to as it is, never replaced."""
        self.path = path
        self._shared_lock = shared_lock
        self._may_rewrite = rewrite and shared_lock is None
        self._last: dict[tuple[str, int], tuple[int, str]] = {}
        self._log = AppendLog(path, "retry state")
        self._records = 0
        self._unsaved = False  # a record could not be written: rewrite the table whole
        values: list[Any] = []
        end = 0  # where the file's whole records end (0: no usable file)
        if os.path.exists(path):
            with open(path, "rb") as f:
                try:
                    found = decode_feature_file(f.read(), _MAGIC)
                except DecodeError:
                    pass
                else:
                    values = found.values
                    # A file of an older version (another checksum) is never appended
                    # to: only rewritten.
                    end = found.end if found.version == FEATURE_VERSION else 0
        for value in values:
            record = _failure_record(value)
            if record is None:
                continue  # not a record this library writes: corrupt, skip it
            reader, message_id, when, reason = record
            if reason is None:
                self._last.pop((reader, message_id), None)
            else:
                self._last[(reader, message_id)] = (when, reason)
        if not rewrite:
            self._join(end)
            return
        try:
            self._rewrite()  # drops the entries of messages that left
        except StorageError as exc:
            # A full disk must not make the queue unopenable: the file as it is holds the
            # table (with entries the rewrite would have dropped): append to it.
            self._keep_file(end, exc)

    def _join(self, end: int) -> None:
        """Shared mode, other handles live: append to the file as it is (created with its
        header if missing); records past ``end`` are the others' (see _follow_others)."""
        path = self.path
        with storage_errors("open retry state", path):
            if not end and self._shared_lock is not None:
                end = self._upgrade_locked()
                if self._log.is_open:
                    return  # upgraded: appending to the new file
            if not end:
                with open(path, "ab") as f:  # O_APPEND: another handle may be creating it too
                    if not f.tell():
                        f.write(encode_feature_file_header(_MAGIC))
                with open(path, "rb") as f:
                    try:
                        end = decode_feature_file(f.read(), _MAGIC).end
                    except DecodeError:
                        logger.warning(
                            "ledgerq: %s is unreadable; retry reasons are kept in memory only "
                            "until every handle has closed the queue",
                            path,
                        )
                        return
            self._log.open(end, cut=False)

    def _upgrade_locked(self) -> int:
        """Rewrite a file of an older version (CRC-32) as the newest, every record kept;
        return where its records end (0: no such file, or not one to rewrite).

        Shared mode, other handles live: a file still of an older version is one no live
        handle loaded (each that did upgraded it), and the append lock held here is the
        one each append to it takes, so no record can be lost to the rewrite."""
        assert self._shared_lock is not None
        with self._shared_lock():
            try:
                with open(self.path, "rb") as f:
                    found = decode_feature_file(f.read(), _MAGIC)
            except (OSError, DecodeError):
                return 0
            if found.version != FEATURE_VERSION:
                blob = encode_feature_file_header(_MAGIC) + b"".join(
                    encode_feature_record(value) for value in found.values
                )
                self._log.replace(blob)
                self._records = len(found.values)
                return len(blob)
            return found.end

    def _keep_file(self, end: int, exc: StorageError) -> None:
        """The rewrite at open failed: append to the file as it is, if it has a header."""
        if end:
            try:
                self._log.open(end)
                self._records = len(self._last)
                return
            except StorageError as again:
                exc = again
        self._not_saved(exc)

    def _rewrite(self) -> None:
        blob = encode_feature_file_header(_MAGIC) + b"".join(
            encode_feature_record([reader, mid, when, reason])
            for (reader, mid), (when, reason) in self._last.items()
        )
        self._log.replace(blob)
        self._records = len(self._last)
        self._unsaved = False

    def _follow_others(self) -> None:
        """Shared mode (append lock held): append after the others' records from now on.

        A torn record at the end - a handle killed while appending - is cut.  (Their
        records are not applied: this table only feeds this handle's reports.)
        """
        log = self._log
        news = log.news()
        if news is None:
            return
        data, replaced = news
        if replaced:  # (by the first handle of a session only: not while we are open)
            found = decode_feature_file(data, _MAGIC)
            log.settle(found.end)
        else:
            log.settle(log.size + decode_feature_records(data, 0).end)

    def _not_saved(self, exc: StorageError) -> None:
        logger.warning("ledgerq: %s; the retry reasons will be saved at the next sync", exc)
        self._unsaved = True

    def record(self, reader: str, message_id: int, when_ns: int, reason: str) -> None:
        """Remember a failure (written to the OS before returning, if the disk takes it)."""
        reason = reason[:_MAX_REASON]
        self._last[(reader, message_id)] = (when_ns, reason)
        if not self._log.is_open:
            return  # never opened (a full disk at open): rewritten whole at the next flush
        # After a record that could not be written, later ones are still appended: the
        # failed one was cut back, and a later record of the same message supersedes it.
        record = encode_feature_record([reader, message_id, when_ns, reason])
        try:
            if self._shared_lock is None:
                self._log.append_record(record)
            else:
                with self._shared_lock():
                    self._follow_others()
                    self._log.append_record(record)
        except StorageError as exc:
            self._not_saved(exc)
            return
        self._records += 1
        if self._may_rewrite and self._records > 4 * len(self._last) + 1024:
            try:
                self._rewrite()
            except StorageError as exc:
                self._not_saved(exc)

    def forget(self, reader: str, message_id: int) -> None:
        """The message succeeded or left: drop its entry (lazily persisted)."""
        self._last.pop((reader, message_id), None)

    def last(self, reader: str, message_id: int) -> tuple[int, str] | None:
        """(time_ns, reason) of the last recorded failure, if any."""
        return self._last.get((reader, message_id))

    def flush(self) -> None:
        """Make the log durable (rewriting it whole if a record could not be written).

        Raises :class:`StorageError` if the disk refuses.
        """
        if self._unsaved and self._may_rewrite:
            self._rewrite()
        self._log.sync()

    def close(self) -> None:
        """Close the log."""
        self._log.close()

    def __len__(self) -> int:
        return len(self._last)
