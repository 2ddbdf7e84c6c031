"""The DLQ's retry tracker: why and when each message last failed, per reader.

Part of the dead-letter feature (only :mod:`ledgerq.features.dlq.feature` uses it).
How *many* times a message failed is not stored here: it is derived from the
reader's own journal (deliveries that did not end in an ack), which survives
crashes record by record.  This file adds the human part - the last failure's
reason and time - for the dead-letter headers.  It is an append-only log
``features/retries.log`` of framed msgpack records ``[reader, id, time_ns,
reason]``, each written to the OS before the nack returns, rewritten with only
the live entries when it holds four times as many records as live entries.
Its protocol (loading, damage, the version upgrade, shared mode, full disks) is
:class:`~ledgerq.segment.feature_log.FeatureLog`'s: in shared mode each handle
appends under the append lock after applying the others' records, so a failure
recorded by one process is the reason another's dead letter carries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ledgerq.format.feature_state import encode_feature_record
from ledgerq.segment.feature_log import FeatureHost, FeatureLog

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
    """Last failure reason and time of each failing message, per reader.

    A record that cannot be written does not fail the nack that reported it (the
    failure is counted in the reader's journal; this is its human part): it stays in
    memory and the table is written whole at the next sync or close.
    """

    def __init__(self, path: str, host: FeatureHost | None = None) -> None:
        """Load ``path`` (created if missing).  ``host``: the queue (None: a file read
        and written alone, by a tool or a test)."""
        self.path = path
        self._last: dict[tuple[str, int], tuple[int, str]] = {}
        self._log = FeatureLog(path, _MAGIC, "retry state", host, self)
        self._log.open(compact=True)  # drops the entries of messages that left

    def apply_record(self, value: Any) -> bool:
        """Take one record of the file (a FeatureTable); False if it is not one."""
        record = _failure_record(value)
        if record is None:
            return False  # not a record this library writes: corrupt, skip it
        reader, message_id, when, reason = record
        if reason is None:
            self._last.pop((reader, message_id), None)
        else:
            self._last[(reader, message_id)] = (when, reason)
        return True

    def clear_table(self) -> None:
        """Forget every entry (a FeatureTable: the file is read whole again)."""
        self._last.clear()

    def table_records(self) -> Iterator[bytes]:
        """The records of the entries (a FeatureTable: a rewrite)."""
        for (reader, message_id), (when, reason) in self._last.items():
            yield encode_feature_record([reader, message_id, when, reason])

    def record(self, reader: str, message_id: int, when_ns: int, reason: str) -> None:
        """Remember a failure (written to the OS before returning, if the disk takes it)."""
        reason = reason[:_MAX_REASON]
        record = encode_feature_record([reader, message_id, when_ns, reason])
        log = self._log
        with log.locked():  # (shared mode: after the others' records, which it applies)
            log.current()
            self._last[(reader, message_id)] = (when_ns, reason)
            if log.append_or_defer(record) and log.should_compact(
                len(self._last), factor=4, slack=1024
            ):
                log.compact()

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
        self._log.flush()

    def close(self) -> None:
        """Close the log."""
        self._log.close()

    def __len__(self) -> int:
        return len(self._last)
