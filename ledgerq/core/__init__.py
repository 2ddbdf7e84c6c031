"""The queue without features: ids, readers, leases, acks, waits and the sync policy."""

from __future__ import annotations

from ledgerq.core.queue import DEFAULT_READER, QueueCore
from ledgerq.core.reader_handle import Reader

__all__ = ["DEFAULT_READER", "QueueCore", "Reader"]
