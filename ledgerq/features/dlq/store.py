"""The dead-letter queue itself: a full queue in ``<queue>/dlq/``, opened on first use.

Every queue has one (``Queue.dlq``, ``requeue_dlq``), even with ``max_retries=0``,
when nothing moves there by itself; :mod:`ledgerq.features.dlq.feature` moves
messages into it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ledgerq._errors import QueueClosedError
from ledgerq._options import Options
from ledgerq.core.feature import Feature
from ledgerq.segment.naming import DLQ_DIR

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["DLQ_DIR", "DLQ_HEADERS", "DeadLetterStore", "OpenConfigured"]

DLQ_HEADERS = ("dlq.original_id", "dlq.retry_count", "dlq.failure_reason", "dlq.last_failure")
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
                    # The DLQ of an encrypted queue is encrypted with the same key (its
                    # own identity: a sealed entry cannot be moved between the two).
                    encryption_key=self._options.encryption_key,
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
