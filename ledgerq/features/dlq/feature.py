"""Moving a message to the dead-letter queue after ``max_retries`` failed deliveries.

A failed delivery is a nack, an expired visibility timeout, or a lease lost to a
crash or a reopen; the count comes from the reader's journal, so a message that
kills its worker every time still ends up here.  A message moved there keeps its
payload, priority and headers and gains ``dlq.original_id``, ``dlq.retry_count``,
``dlq.failure_reason`` and ``dlq.last_failure`` (ns since the epoch, as text);
``dlq.reader`` names the reader when it is not the default one.

The move writes the message to the DLQ first - durably: with ``sync`` other than
``"always"`` the DLQ is fsynced - and only then settles it in the main queue: a
crash or a power cut in between can leave a copy in both (delivered again, then
dead-lettered again), never in neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledgerq._errors import CorruptionError
from ledgerq._options import Options
from ledgerq.core.feature import FailedDelivery
from ledgerq.features.dlq.retries import RetryTracker
from ledgerq.features.dlq.store import DeadLetterStore, OpenConfigured
from ledgerq.segment.naming import RETRIES_NAME, feature_log_path

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore
    from ledgerq.core.reader import ReaderCore

__all__ = ["DeadLetterFeature"]

_DEFAULT_READER = "default"


class DeadLetterFeature(DeadLetterStore):
    """Move messages to the dead-letter queue after ``max_retries`` failed deliveries."""

    def __init__(self, options: Options, open_configured: OpenConfigured) -> None:
        super().__init__(options, open_configured)
        self._max_retries = options.max_retries
        self._tracker: RetryTracker | None = None
        self._main: QueueCore | None = None

    def attach(self, queue: QueueCore) -> None:
        super().attach(queue)
        self._main = queue
        self._tracker = RetryTracker(feature_log_path(queue.path, RETRIES_NAME), queue)

    def failed(self, delivery: FailedDelivery) -> bool:
        """Record the failure, or move the message to the DLQ after ``max_retries``.

        Raises (a :class:`StorageError`, or :class:`QueueClosedError` for a closed DLQ)
        if the tracker or the DLQ cannot take it; the reader then keeps the message and
        reports this failure again before delivering it.  A move that raised after the
        DLQ got its copy is redone: the DLQ can then hold it twice, never zero times.
        """
        tracker = self._tracker
        main = self._main
        assert tracker is not None
        assert main is not None
        entry = delivery.entry
        reader = delivery.reader.name
        if delivery.failures < self._max_retries:
            if not delivery.again:  # (its nacker recorded it, with its real reason)
                tracker.record(reader, entry.id, delivery.now_ns, delivery.reason)
            return False
        try:
            # In clear: the DLQ seals it again under its own identity (same key).
            plain, payload = main._restore_entry(entry)
        except CorruptionError:
            return False  # the core skips it as corrupt when it tries to deliver it
        headers = dict(plain.headers or {})
        headers["dlq.original_id"] = str(entry.id)
        headers["dlq.retry_count"] = str(delivery.failures)
        headers["dlq.failure_reason"] = delivery.reason
        headers["dlq.last_failure"] = str(delivery.now_ns)
        if reader != _DEFAULT_READER:
            headers["dlq.reader"] = reader
        if entry.group is not None:
            # Not the DLQ copy's own group (the DLQ would hold it up): a requeue restores it.
            headers["dlq.group"] = entry.group
        dlq = self.queue()
        dlq.enqueue(payload, headers=headers, priority=entry.priority)
        if self._options.sync != "always":
            # The DEAD_LETTER record the main queue writes when this returns could reach
            # the disk before this copy (writeback keeps no order between files): a power
            # cut would then lose a message that sync() had made durable.
            dlq.sync()
        tracker.forget(reader, entry.id)
        return True

    def settled(self, reader: ReaderCore, ids: list[int]) -> None:
        tracker = self._tracker
        assert tracker is not None
        if len(tracker):
            for message_id in ids:
                tracker.forget(reader.name, message_id)

    def flush(self) -> None:
        super().flush()
        if self._tracker is not None:
            self._tracker.flush()

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._tracker is not None:
                self._tracker.close()
