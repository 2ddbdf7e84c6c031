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


def _publish(names: list[str]) -> None:
    """Give the public classes and functions the public path ``ledgerq.<name>``.

    Reprs, tracebacks, docs and pickles then name what users import, not the private
    module that defines it (pickle finds a class by ``__module__`` + ``__qualname__``,
    so ``ledgerq.Message`` must resolve - it does).  A class's string annotations
    (``from __future__ import annotations``) are resolved first, in the module that
    wrote them: ``typing.get_type_hints`` looks names up in ``sys.modules[__module__]``,
    where a name like ``Mapping`` is not.
    """
    import inspect
    import typing

    namespace = globals()
    for name in names:
        obj = namespace[name]
        if isinstance(obj, type):
            own = inspect.get_annotations(obj)
            if own:
                hints = typing.get_type_hints(obj, include_extras=True)
                obj.__annotations__ = {key: hints[key] for key in own}
        elif not callable(obj):
            continue  # type aliases and __version__ have no module of their own
        obj.__module__ = __name__


_publish(__all__)
