"""A queue belongs to the process that opened it: no pickling, no use after ``fork()``.

An open queue is this process's open files, its directory lock, its threads and its
in-memory state (the next id, leases).  A copy in another process - pickled and sent
to a worker, or inherited through ``fork()`` - would hand out the ids this process
hands out and write the same files without the lock: torn entries, an unreadable
``meta.json``.  So:

* pickling a queue (or a reader, a sharded or an asyncio queue) raises a ``TypeError``
  that says what to do instead (:func:`unpicklable`);
* every live queue-like object is registered here (:func:`track`); in a child created
  by ``fork()`` an ``os.register_at_fork`` hook tells each one, once, that it is a
  forked copy (its ``_after_fork_in_child``).  The objects mark themselves closed and
  forked, so any later call raises :class:`~ledgerq.ForkedQueueError` and their
  ``close()`` touches nothing of the parent's.  The hot paths pay nothing for it: they
  already look at their ``_closed`` flag, and no call asks for the pid (a syscall).

The hook runs in the child while it has a single thread; it only flips flags and
replaces locks (a lock another thread of the parent held at the fork would stay held
forever in the child).
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

from ledgerq._errors import ForkedQueueError

__all__ = ["Inheritable", "forked_error", "track", "tracked", "unpicklable", "untrack"]


class Inheritable(Protocol):
    """An object that must learn that it was inherited by a forked child."""

    def _after_fork_in_child(self) -> None:
        """Mark this copy unusable (runs in the child, single-threaded, right after fork)."""


_LIVE: weakref.WeakSet[Inheritable] = weakref.WeakSet()


def track(obj: Inheritable) -> None:
    """Tell ``obj`` if this process forks while it is alive (until :func:`untrack`)."""
    _LIVE.add(obj)


def untrack(obj: Inheritable) -> None:
    """Stop tracking ``obj`` (it was closed: a forked child has nothing of it to protect)."""
    _LIVE.discard(obj)


def tracked() -> list[Inheritable]:
    """The objects tracked now (open queues, sharded queues, followers of this process)."""
    return list(_LIVE)


def forked_error(what: str, path: str, owner_pid: int, *, shared: bool = False) -> ForkedQueueError:
    """The error for using ``what`` at ``path``, opened by ``owner_pid``, in a forked child.

    ``shared``: the parent opened it in shared mode, where the child may open its own
    handle beside the parent's (an exclusive parent's lock keeps the child out).
    """
    if shared:
        fix = (
            "open the child's own handle in the child: ledgerq.open(path, shared=True) - "
            "shared mode lets it work beside the parent's"
        )
    else:
        fix = (
            "open it in the child process instead (ledgerq.open(path) in the child; until "
            "the parent closes it, its exclusive lock keeps the child out - or open the "
            "queue with shared=True in both)"
        )
    return ForkedQueueError(
        f"{what} {path!r} was opened by process {owner_pid}; this process ({os.getpid()}) "
        "inherited it through fork() and cannot use it - both would hand out the same ids "
        f"and write the same files: {fix}"
    )


def _after_fork_in_child() -> None:
    inherited = list(_LIVE)
    _LIVE.clear()  # the child's own objects, opened later, are tracked afresh
    for obj in inherited:
        obj._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def unpicklable(what: str, path: str) -> TypeError:
    """The error for pickling (or copying) ``what``, an open queue-like object at ``path``."""
    return TypeError(
        f"cannot pickle {what} ({path!r}): it is this process's open files and lock; "
        "pass the path instead and open the queue in the other process "
        "(e.g. ledgerq.open(path) in the worker)"
    )
