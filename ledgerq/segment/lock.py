"""The locks on a queue directory: SEJ's writer lock, and shared mode's locks.

``LOCK`` is locked for as long as the queue is open: ``flock(LOCK_EX | LOCK_NB)`` by
an exclusive open, ``flock(LOCK_SH | LOCK_NB)`` by every shared-mode handle, so the
two modes exclude each other.  flock locks belong to the open file description, so a
second open of the same directory fails even inside the same process (and two
shared handles of one process lock independently), and the kernel releases the lock
when the process dies (kill -9 included) - no stale lock files to clean up: in
shared mode too, no file's existence means anything, only its lock.

:class:`LockFile` is the other locks of shared mode (``shared/OPENING``,
``shared/APPEND``, ``shared/<reader>.reader``, each handle's ``.live`` file):
``flock(LOCK_EX)``, blocking, held for one step.

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
import time
import weakref

from ledgerq._errors import QueueLockedError
from ledgerq.segment.files import StorageError, storage_errors
from ledgerq.segment.naming import LOCK_NAME

__all__ = ["DirLock", "LockFile", "lock_mode_holding"]

_HELD: weakref.WeakSet[DirLock] = weakref.WeakSet()  # locks this process holds
_OPEN_FILES: weakref.WeakSet[LockFile] = weakref.WeakSet()  # lock files open here
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
_flock = fcntl.flock
_LOCK_EX = fcntl.LOCK_EX
_LOCK_UN = fcntl.LOCK_UN


class DirLock:
    """An acquired lock on ``directory/LOCK``; release it with :meth:`release`.

    Raises :class:`QueueLockedError` if another open holds it, :class:`StorageError`
    if the file cannot be opened or written (the lock is then not held).
    """

    def __init__(self, directory: str, *, mode: str = "exclusive") -> None:
        """Lock ``directory`` in ``mode``: ``"exclusive"`` (``LOCK_EX``), ``"shared"``
        (``LOCK_SH``, beside other shared holders) or ``"first"`` (``LOCK_EX`` taken by
        a shared-mode opener, which then downgrades with :meth:`downgrade`)."""
        self.path = os.path.join(directory, LOCK_NAME)
        self._directory = directory
        self.mode = mode
        with storage_errors("open the lock file", self.path):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._take(fd, fcntl.LOCK_SH if mode == "shared" else fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)  # nobody else can release it: the flock goes with the descriptor
            raise
        self._fd: int | None = fd
        _HELD.add(self)

    def _take(self, fd: int, operation: int) -> None:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _BUSY:
                raise QueueLockedError(self._directory) from None
            raise StorageError("lock", self.path, exc) from exc
        if operation == fcntl.LOCK_SH:
            return  # many holders: the pid of one would mislead
        # The pid is informational only (for people and `ledgerq stats`); the flock is the
        # lock.  Still, a disk that refuses this small write will refuse the queue's too -
        # except a full one, which must not lock the user out: a shared session's first
        # handle emptied the file (downgrade), so the pid may need a page the disk lacks.
        with storage_errors("write the pid to the lock file", self.path):
            os.ftruncate(fd, 0)
            try:
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise

    def downgrade(self) -> None:
        """Turn a ``"first"`` lock into a shared one (the shared opener's recovery is done).

        flock converts by dropping the lock and taking the new one: an exclusive open
        may win in between; then this raises :class:`QueueLockedError` (exclusive) and
        the lock is no longer held.
        """
        fd = self._fd
        assert fd is not None
        assert self.mode == "first"
        with storage_errors("clear the pid in the lock file", self.path):
            os.ftruncate(fd, 0)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            self.release()
            if exc.errno in _BUSY:
                raise QueueLockedError(self._directory, held_by="exclusive") from None
            raise StorageError("lock", self.path, exc) from exc
        self.mode = "shared"

    def try_upgrade(self) -> bool:
        """Whether this shared holder is the last one: True if ``LOCK_EX`` was taken.

        A refused conversion drops the lock (flock's rule): call this only when closing.
        """
        fd = self._fd
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _BUSY:
                return False
            raise StorageError("lock", self.path, exc) from exc
        self.mode = "first"
        return True

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


def lock_mode_holding(directory: str) -> str:
    """Which mode holds ``directory``'s lock, after an exclusive ``LOCK_EX`` was refused:
    ``"shared"`` when a shared lock can be taken beside the holders, else ``"exclusive"``
    (informational: the holders may change meanwhile)."""
    try:
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY)
    except OSError:
        return "exclusive"
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return "exclusive"
    else:
        return "shared"
    finally:
        os.close(fd)  # drops the probe's lock


class LockFile:
    """A file locked with ``flock(LOCK_EX)`` for one step at a time (shared mode).

    The descriptor stays open between steps.  :meth:`acquire` blocks (without holding
    the GIL) until the lock is free; the kernel releases it if the process dies while
    holding it.  A forked child closes its inherited copy at once (like
    :class:`DirLock`), so a lock held by the parent is never kept by a child.
    """

    __slots__ = ("__weakref__", "_fd", "path")

    def __init__(self, path: str, *, create: bool = True) -> None:
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        with storage_errors("open the lock file", path):
            self._fd: int | None = os.open(path, flags, 0o644)
        _OPEN_FILES.add(self)

    @property
    def fd(self) -> int:
        """The open descriptor (for small reads and writes of the file's content)."""
        fd = self._fd
        if fd is None:
            raise StorageError("use the lock file", self.path, OSError(errno.EBADF, "closed"))
        return fd

    def acquire(self) -> None:
        """Wait for the lock and take it."""
        try:
            _flock(self._fd, _LOCK_EX)  # type: ignore[arg-type] # None: closed, raises
        except (OSError, TypeError) as exc:
            cause = exc if isinstance(exc, OSError) else OSError(errno.EBADF, "closed")
            raise StorageError("lock", self.path, cause) from exc

    def acquire_by(self, deadline: float) -> bool:
        """Take the lock, waiting until ``deadline`` (``time.monotonic()``) at most;
        False if another still holds it then.  Polled (``LOCK_NB``, backing off from
        20 us to 5 ms): a blocking ``flock`` cannot be given a timeout."""
        pause = 20e-6
        while not self.try_acquire():
            now = time.monotonic()
            if now >= deadline:
                return False
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, 0.005)
        return True

    def try_acquire(self) -> bool:
        """Take the lock if it is free now; False if another holds it."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _BUSY:
                return False
            raise StorageError("lock", self.path, exc) from exc
        return True

    def release(self) -> None:
        """Release the lock (the file stays open)."""
        fd = self._fd
        if fd is not None:
            _flock(fd, _LOCK_UN)

    def close(self) -> None:
        """Close the file (idempotent), which releases a lock held through it."""
        fd, self._fd = self._fd, None
        _OPEN_FILES.discard(self)
        if fd is not None:
            os.close(fd)

    def _drop_inherited(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the parent's descriptor keeps its lock


def _after_fork_in_child() -> None:
    for lock in list(_HELD):
        lock._drop_inherited()
    _HELD.clear()
    for lock_file in list(_OPEN_FILES):
        lock_file._drop_inherited()
    _OPEN_FILES.clear()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
