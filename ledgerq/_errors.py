"""The exception tree.  Every error ledgerq raises on purpose derives from LedgerQError::

LedgerQError
├── ConfigError (also ValueError)      an invalid option value
│   ├── NotAQueueError                 the path exists but is not a queue directory
│   └── IncompatibleFormatError        written by a newer ledgerq
├── QueueLockedError                   another open() holds the directory
├── QueueClosedError                   use after close()
├── MessageTooLargeError (also ValueError)
├── CorruptionError                    data that cannot be skipped safely
└── UnknownMessageError (also KeyError) ack/nack of an id that is not leased
"""

from __future__ import annotations

import os

__all__ = [
    "ConfigError",
    "CorruptionError",
    "IncompatibleFormatError",
    "LedgerQError",
    "MessageTooLargeError",
    "NotAQueueError",
    "QueueClosedError",
    "QueueLockedError",
    "UnknownMessageError",
]


class LedgerQError(Exception):
    """Base class of every error ledgerq raises on purpose."""


class ConfigError(LedgerQError, ValueError):
    """An option has an invalid value."""


class NotAQueueError(ConfigError):
    """The path exists but is not a ledgerq queue directory."""


class IncompatibleFormatError(ConfigError):
    """The queue was written by a newer version of ledgerq than this one."""


class QueueLockedError(LedgerQError):
    """Another open queue (in this or another process) holds the directory's lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(
            f"queue {os.fspath(path)!r} is locked by another open queue "
            "(this or another process); close it first, or read it with ledgerq.follow()"
        )
        self.path = os.fspath(path)


class QueueClosedError(LedgerQError):
    """The queue (or reader) was used after ``close()``."""


class MessageTooLargeError(LedgerQError, ValueError):
    """A payload is larger than ``max_message_size``."""


class CorruptionError(LedgerQError):
    """Stored data is damaged where it cannot be skipped safely.

    ``path`` and ``offset`` say where, when known.
    """

    def __init__(self, message: str, path: str | None = None, offset: int | None = None) -> None:
        where = ""
        if path is not None:
            where = f" in {path}" + (f" at offset {offset}" if offset is not None else "")
        super().__init__(message + where)
        self.path = path
        self.offset = offset


class UnknownMessageError(LedgerQError, KeyError):
    """``ack``/``nack`` named an id that is not currently leased by this reader."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""
