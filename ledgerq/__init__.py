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
from ledgerq._follow import follow
from ledgerq._options import Options
from ledgerq._queue import Queue
from ledgerq._types import Item, Message, Priority, ReaderStats, Stats
from ledgerq.core.reader import Reader
from ledgerq.segment.files import StorageError
from ledgerq.shard import open_sharded

__version__ = "0.1.0"

_LAZY_MODULES = ("aio", "kestrel", "metrics", "ship", "tools", "workers")


def __getattr__(name: str) -> object:
    # ledgerq.aio / .metrics / .workers load on first use: importing ledgerq stays cheap
    # and never imports optional dependencies (prometheus_client) by itself.
    if name in _LAZY_MODULES:
        import importlib

        return importlib.import_module(f"ledgerq.{name}")
    raise AttributeError(f"module 'ledgerq' has no attribute {name!r}")


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
    "follow",
    "open",
    "open_sharded",
]
