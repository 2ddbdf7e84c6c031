"""ledgerq: an embedded, crash-safe, disk-backed message queue.

>>> import ledgerq
>>> with ledgerq.open("/tmp/jobs") as q:          # doctest: +SKIP
...     q.enqueue(b"hello")
...     msg = q.dequeue()
...     q.ack(msg.id)
"""

from __future__ import annotations

from ledgerq._api import open  # noqa: A004 - ledgerq.open is the public verb
from ledgerq._errors import (
    ConfigError,
    CorruptionError,
    IncompatibleFormatError,
    LedgerQError,
    MessageTooLargeError,
    NotAQueueError,
    QueueClosedError,
    QueueLockedError,
    UnknownMessageError,
)
from ledgerq._options import Options
from ledgerq._queue import Queue
from ledgerq._types import Item, Message, Priority, ReaderStats, Stats
from ledgerq.core.queue import Reader
from ledgerq.segment.files import StorageError

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "CorruptionError",
    "IncompatibleFormatError",
    "Item",
    "LedgerQError",
    "Message",
    "MessageTooLargeError",
    "NotAQueueError",
    "Options",
    "Priority",
    "Queue",
    "QueueClosedError",
    "QueueLockedError",
    "Reader",
    "ReaderStats",
    "Stats",
    "StorageError",
    "UnknownMessageError",
    "__version__",
    "open",
]
