"""The exclusive lock on a queue directory (SEJ's writer lock).

``LOCK`` is locked with ``flock(LOCK_EX | LOCK_NB)`` for as long as the queue is
open.  flock locks belong to the open file description, so a second open of the
same directory fails even inside the same process, and the kernel releases the
lock when the process dies (kill -9 included) - no stale lock files to clean up.

The description is shared with every process forked while it is open: a child
(a worker pool's, ``multiprocessing``'s) would keep the queue locked after its parent
closed it, for as long as the child lives.  So a child closes its copy at once, in
an ``os.register_at_fork`` hook: only the process that opened the queue holds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import weakref

from ledgerq._errors import QueueLockedError
from ledgerq.segment.files import StorageError, storage_errors
from ledgerq.segment.naming import LOCK_NAME

__all__ = ["DirLock"]

_HELD: weakref.WeakSet[DirLock] = weakref.WeakSet()  # locks this process holds


class DirLock:
    """An acquired lock on ``directory/LOCK``; release it with :meth:`release`.

    Raises :class:`QueueLockedError` if another open holds it, :class:`StorageError`
    if the file cannot be opened or written (the lock is then not held).
    """

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LOCK_NAME)
        self._directory = directory
        with storage_errors("open the lock file", self.path):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._take(fd)
        except BaseException:
            os.close(fd)  # nobody else can release it: the flock goes with the descriptor
            raise
        self._fd: int | None = fd
        _HELD.add(self)

    def _take(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise QueueLockedError(self._directory) from None
            raise StorageError("lock", self.path, exc) from exc
        # The pid is informational only (for people and `ledgerq stats`); the flock is the
        # lock.  Still, a disk that refuses this small write will refuse the queue's too.
        with storage_errors("write the pid to the lock file", self.path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    @property
    def is_held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Release the lock (idempotent)."""
        fd, self._fd = self._fd, None
        _HELD.discard(self)
        if fd is not None:
            # Unlock before closing: a child forked a moment ago may still hold a copy of
            # the descriptor (its at-fork hook has not closed it yet), and the flock goes
            # with the last descriptor of the open file description, not with ours.
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _drop_inherited(self) -> None:
        """In a forked child: close the copy of the descriptor, keeping the parent's lock."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the parent's descriptor still holds the flock


def _after_fork_in_child() -> None:
    for lock in list(_HELD):
        lock._drop_inherited()
    _HELD.clear()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
