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
    ForkedQueueError,
    IncompatibleFormatError,
    LedgerQError,
    MessageTooLargeError,
    NotAQueueError,
    QueueBusyError,
    QueueClosedError,
    QueueFullError,
    QueueLockedError,
    StorageError,
    UnknownMessageError,
)
from ledgerq._follow import follow
from ledgerq._options import OpenOptions, Options
from ledgerq._queue import Queue
from ledgerq._types import (
    Compression,
    Item,
    Message,
    PeriodicJob,
    Priority,
    ReaderStart,
    ReaderStats,
    Stats,
    SyncMode,
)
from ledgerq.core.clock import Clock
from ledgerq.core.reader_handle import Reader
from ledgerq.shard import ShardedQueue, open_sharded

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
    "Clock",
    "Compression",
    "ConfigError",
    "CorruptionError",
    "ForkedQueueError",
    "IncompatibleFormatError",
    "Item",
    "LedgerQError",
    "Message",
    "MessageTooLargeError",
    "NotAQueueError",
    "OpenOptions",
    "Options",
    "PeriodicJob",
    "Priority",
    "Queue",
    "QueueBusyError",
    "QueueClosedError",
    "QueueFullError",
    "QueueLockedError",
    "Reader",
    "ReaderStart",
    "ReaderStats",
    "ShardedQueue",
    "Stats",
    "StorageError",
    "SyncMode",
    "UnknownMessageError",
    "__version__",
    "follow",
    "open",
    "open_sharded",
]


from ledgerq._public import publish as _publish  # noqa: E402

_publish(__name__, globals(), __all__)
