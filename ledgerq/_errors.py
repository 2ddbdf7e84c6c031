"""The exception tree.  Every error ledgerq raises on purpose derives from LedgerQError::

LedgerQError
├── ConfigError (also ValueError)      an invalid option value
│   ├── NotAQueueError                 the path exists but is not a queue directory
│   └── IncompatibleFormatError        written by a newer ledgerq
├── QueueLockedError                   another open() holds the directory
├── QueueBusyError                     (shared mode) another process held a step's lock
│                                      past lock_timeout: stopped?  nothing was done
├── QueueClosedError                   use after close()
├── QueueFullError                     a bounded queue had no room in time (nothing written)
├── ForkedQueueError                   use in a process forked from the one that opened it
├── MessageTooLargeError (also ValueError)
├── CorruptionError                    data that cannot be skipped safely
├── UnknownMessageError (also KeyError) ack/nack of an id that is not leased
└── StorageError (also OSError)        the OS refused to read or write a queue file

Every one of them survives ``pickle`` (worker pools and ``multiprocessing`` send them
between processes) with its type, its ``str()`` and its attributes: see
:meth:`LedgerQError.__reduce__`.
"""

from __future__ import annotations

import errno
import os
from typing import Any

__all__ = [
    "ConfigError",
    "CorruptionError",
    "ForkedQueueError",
    "IncompatibleFormatError",
    "LedgerQError",
    "MessageTooLargeError",
    "NotAQueueError",
    "QueueBusyError",
    "QueueClosedError",
    "QueueFullError",
    "QueueLockedError",
    "StorageError",
    "UnknownMessageError",
]


def _rebuild(cls: type[LedgerQError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """Recreate a pickled error from its ``args`` and attributes, without its ``__init__``.

    ``__init__`` of an error class takes what the raiser knows (a path, an errno) and
    formats the message into ``args``; calling it again with that message would format
    it twice (or fail, when it takes other arguments).  The base class's ``__init__``
    only records ``args`` - and for an ``OSError`` sets ``errno``/``strerror`` from them.
    """
    exc = cls.__new__(cls, *args)
    base_init = OSError.__init__ if issubclass(cls, OSError) else BaseException.__init__
    base_init(exc, *args)
    exc.__dict__.update(state)
    return exc


class LedgerQError(Exception):
    """Base class of every error ledgerq raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The default, (type(self), self.args, state), calls __init__ with args: see _rebuild.
        return (_rebuild, (type(self), self.args, self.__dict__))


class ConfigError(LedgerQError, ValueError):
    """An option has an invalid value."""


class NotAQueueError(ConfigError):
    """The path exists but is not a ledgerq queue directory."""


class IncompatibleFormatError(ConfigError):
    """The queue was written by a newer version of ledgerq than this one."""


class QueueLockedError(LedgerQError):
    """Another open queue (in this or another process) holds the directory's lock.

    ``held_by`` is the mode that holds it when known: ``"exclusive"`` (one handle owns
    the queue) or ``"shared"`` (handles opened with ``shared=True``), else None.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        in_this_process: bool = False,
        held_by: str | None = None,
        detail: str | None = None,
    ) -> None:
        where = os.fspath(path)
        if detail is not None:
            message = f"queue {where!r} {detail}"
        elif in_this_process:
            message = (
                f"queue {where!r} is open in this process: a ledgerq.Queue of it "
                "was not closed; close it first (queue.close(), or open it in a `with` "
                "block), or read it with ledgerq.follow()"
            )
        elif held_by == "shared":
            message = (
                f"queue {where!r} is open in shared mode by other handles (this or other "
                "processes); open it with ledgerq.open(path, shared=True) to use it beside "
                "them, or close them first for an exclusive open"
            )
        elif held_by == "exclusive":
            message = (
                f"queue {where!r} is open exclusively by another handle (this or another "
                "process); close it first, or open every handle with shared=True to share "
                "it, or read it with ledgerq.follow()"
            )
        else:
            message = (
                f"queue {where!r} is locked by another open queue "
                "(this or another process); close it first, or read it with ledgerq.follow()"
            )
        super().__init__(message)
        self.path = where
        self.held_by = held_by


class QueueBusyError(LedgerQError):
    """Shared mode: another handle held a lock this call needed for longer than the
    call could wait (``lock_timeout``, an argument of ``open``, or the call's own
    timeout) - its process stopped (SIGSTOP, a debugger) or very slow, but alive, so its
    step is never taken over.  Nothing was done; the call may be retried.

    ``holder_pid`` is the process that held it (None when unknown), ``held`` what it
    held (``"the append lock"``, ``"reader 'default'"``).
    """

    def __init__(self, message: str, *, holder_pid: int | None = None, held: str = "") -> None:
        super().__init__(message)
        self.holder_pid = holder_pid
        self.held = held


class QueueClosedError(LedgerQError):
    """The queue (or reader) was used after ``close()``."""


class QueueFullError(LedgerQError):
    """A bounded queue (``max_pending``, ``max_pending_bytes``) had no room for an
    enqueue within its ``timeout``; nothing was written."""


class ForkedQueueError(LedgerQError):
    """A queue (or reader, sharded or asyncio queue) was used in a process forked from
    the one that opened it; open the queue in the child process instead."""


class MessageTooLargeError(LedgerQError, ValueError):
    """A payload, or a message's encoded headers, is larger than ``max_message_size``."""


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


_HINTS = {
    errno.ENOSPC: "the disk is full; free some space and retry",
    errno.EDQUOT: "the disk quota is exhausted; free some space and retry",
    errno.EROFS: "the file system is read-only",
    errno.EIO: "the device reported an I/O error; check the disk",
    errno.EACCES: "check the permissions of the queue directory",
    errno.EPERM: "check the permissions of the queue directory",
    errno.EMFILE: "the process has too many open files; raise its limit (ulimit -n)",
}


class StorageError(LedgerQError, OSError):
    """An operating-system error while reading or writing queue files.

    Carries the OS ``errno``, the file's ``path`` and the ``action`` that was not done;
    the message says what to do about the common causes (a full disk, permissions), or
    what ``hint`` says when the raiser knows better.
    """

    def __init__(self, action: str, path: str, exc: OSError, hint: str | None = None) -> None:
        if hint is None:
            hint = _HINTS.get(exc.errno or 0, "")
        reason = exc.strerror or str(exc)
        message = f"could not {action} {path}: {reason}" + (f" ({hint})" if hint else "")
        OSError.__init__(self, exc.errno or 0, message)
        self.path = path
        self.action = action

    def __str__(self) -> str:
        return str(self.args[1])
