"""The exclusive lock on a queue directory (SEJ's writer lock).

``LOCK`` is locked with ``flock(LOCK_EX | LOCK_NB)`` for as long as the queue is
open.  flock locks belong to the open file description, so a second open of the
same directory fails even inside the same process, and the kernel releases the
lock when the process dies (kill -9 included) - no stale lock files to clean up.
"""

from __future__ import annotations

import errno
import fcntl
import os

from ledgerq._errors import QueueLockedError

__all__ = ["DirLock"]


class DirLock:
    """An acquired lock on ``directory/LOCK``; release it with :meth:`release`."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "LOCK")
        self._directory = directory
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise QueueLockedError(directory) from None
            raise
        self._fd: int | None = fd
        # The pid is informational only (for people and `ledgerq stats`); the flock is the lock.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    @property
    def is_held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Release the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the flock
