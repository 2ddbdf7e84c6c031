"""The dead-letter queue: where messages go after ``max_retries`` failed deliveries.

A failed delivery is a nack, an expired visibility timeout, or a lease lost to a
crash or a reopen; the count comes from the reader's journal, so a message that
kills its worker every time still ends up here.  The DLQ is a full queue in
``<queue>/dlq/``, opened on first use.  A message moved there keeps its payload,
priority and headers and gains ``dlq.original_id``, ``dlq.retry_count``,
``dlq.failure_reason`` and ``dlq.last_failure`` (ns since the epoch, as text);
``dlq.reader`` names the reader when it is not the default one.

The move writes the message to the DLQ first - durably: with ``sync`` other than
``"always"`` the DLQ is fsynced - and only then settles it in the main queue: a
crash or a power cut in between can leave a copy in both (delivered again, then
dead-lettered again), never in neither.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ledgerq._errors import CorruptionError, QueueClosedError
from ledgerq._options import Options
from ledgerq.core.feature import FailedDelivery, Feature
from ledgerq.features.retry import RetryTracker
from ledgerq.segment.files import make_durable_dir
from ledgerq.segment.naming import DLQ_DIR, FEATURES_DIR

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore
    from ledgerq.core.reader import ReaderCore

__all__ = ["DLQ_HEADERS", "DeadLetterFeature", "DeadLetterStore"]

DLQ_HEADERS = ("dlq.original_id", "dlq.retry_count", "dlq.failure_reason", "dlq.last_failure")
_DEFAULT_READER = "default"

OpenConfigured = Callable[[str, Options], "QueueCore"]


class DeadLetterStore(Feature):
    """Owns the dead-letter queue (opened lazily); moves nothing by itself."""

    name = "dlq"

    def __init__(self, options: Options, open_configured: OpenConfigured) -> None:
        self._options = options
        self._open_configured = open_configured
        self._dlq: QueueCore | None = None
        self._lock = threading.Lock()
        self._path = ""

    def attach(self, queue: QueueCore) -> None:
        self._path = os.path.join(queue.path, DLQ_DIR)
        if os.path.isdir(self._path):
            self.queue()  # it exists: open it now, so stats and close cover it

    def queue(self) -> QueueCore:
        """The dead-letter queue, opened (and created) on first use."""
        with self._lock:
            if self._dlq is None:
                # The DLQ never dead-letters its own messages, and keeps them until
                # someone requeues or purges them.
                opts = Options(
                    sync=self._options.sync,
                    sync_interval=self._options.sync_interval,
                    max_retries=0,
                    segment_size=self._options.segment_size,
                    max_message_size=self._options.max_message_size,
                    compression=self._options.compression,
                    compression_level=self._options.compression_level,
                    compression_min_size=self._options.compression_min_size,
                )
                self._dlq = self._open_configured(self._path, opts)
            elif self._dlq.closed:
                raise QueueClosedError(f"dead-letter queue {self._path} is closed")
            return self._dlq

    def flush(self) -> None:
        if self._dlq is not None and not self._dlq.closed:
            self._dlq.sync()

    def close(self) -> None:
        if self._dlq is not None:
            self._dlq.close()

    def stats(self, counters: dict[str, Any]) -> None:
        if self._dlq is not None and not self._dlq.closed:
            counters["dlq_pending"] = len(self._dlq)


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
        directory = os.path.join(queue.path, FEATURES_DIR)
        make_durable_dir(directory)
        self._tracker = RetryTracker(os.path.join(directory, "retries.log"))

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
            tracker.record(reader, entry.id, delivery.now_ns, delivery.reason)
            return False
        try:
            payload = main._restore(entry)
        except CorruptionError:
            return False  # the core skips it as corrupt when it tries to deliver it
        headers = dict(entry.headers or {})
        headers["dlq.original_id"] = str(entry.id)
        headers["dlq.retry_count"] = str(delivery.failures)
        headers["dlq.failure_reason"] = delivery.reason
        headers["dlq.last_failure"] = str(delivery.now_ns)
        if reader != _DEFAULT_READER:
            headers["dlq.reader"] = reader
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
