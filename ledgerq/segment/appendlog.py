"""An append-only file of whole records: every append lands whole, or not at all.

Reader journals, the dedup table and the retry log are files of self-checking
records that the queue only appends to (and now and then replaces whole).  Their
readers cut a torn record at the *end* of a file - what a crash leaves - but a torn
record in the *middle*, with good records after it, is damage they must refuse (or
skip, losing what it held).  A failed ``write()`` makes exactly that: on a full disk
``write()`` stores what fits and fails on the rest, and once space is freed the next
append lands after the fragment.  So a failed append is cut back to the size before
it, here, before anything else is written; if even that fails (the device is gone),
the log refuses further appends until a cut succeeds, rather than write good records
after bad bytes.

The caller serialises appends (the queue lock); :meth:`sync` may run in any thread.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

from ledgerq.segment.files import StorageError, datasync, replace_and_open, storage_errors

__all__ = ["AppendLog"]


class AppendLog:
    """The open, append-only file at ``path``; ``what`` names it in errors ("reader state").

    ``size`` is the size of the file as far as whole appends go: after a failed append
    it is the size before it (the fragment cut off).
    """

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what
        self.size = 0
        self._fd: int | None = None
        self._fd_lock = threading.Lock()  # guards the fd against a swap during sync()
        self._fragment = False  # a failed append's bytes may still be there, uncut
        # Called when an append meets a full disk: True if it made room (the append is
        # then tried once more).  The queue gives its reader journals one (its reserve).
        self.on_full: Callable[[], bool] | None = None

    @property
    def is_open(self) -> bool:
        """Whether the log has a file to append to."""
        return self._fd is not None

    def open(self, size: int, *, cut: bool = True) -> None:
        """Append to the existing file, whose first ``size`` bytes are valid, from now on.

        Bytes past ``size`` (a torn tail the caller's recovery found) are cut first -
        unless ``cut`` is False (shared mode without the lock: they may be another
        handle's record in flight; :meth:`news` under the lock deals with them).
        """
        with storage_errors(f"open {self.what}", self.path):
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
            try:
                if cut and os.fstat(fd).st_size != size:
                    os.ftruncate(fd, size)
            except BaseException:
                os.close(fd)
                raise
        self.adopt(fd, size)

    def adopt(self, fd: int, size: int) -> None:
        """Append to ``fd`` (a file holding ``size`` valid bytes) from now on."""
        with self._fd_lock:
            old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)
        self.size = size
        self._fragment = False

    def append_record(self, record: bytes | bytearray | memoryview) -> None:
        """Write ``record`` whole, or raise :class:`StorageError` having written nothing.

        "Nothing" is what a reader sees: a partial write is cut back before this
        raises.  The record has reached the OS (not the disk) when this returns.
        """
        fd = self._fd
        if fd is None or self._fragment:
            fd = self._writable()
        size = len(record)
        try:
            written = os.write(fd, record)
            if written != size:
                self._finish_short_write(fd, record, written)
        except OSError as exc:
            self._append_after_failure(fd, record, exc)
        else:
            self.size += size

    # The helpers below are the slow paths of append_record(), shared with the inlined
    # fast paths of subclasses (the reader journal's one-id record on every dequeue/ack).

    def _writable(self) -> int:
        """The descriptor to append to when the fast path cannot: raise if closed, and
        cut a previous failure's fragment first (raising while that still fails)."""
        fd = self._fd
        if fd is None:
            raise StorageError(f"append to {self.what}", self.path, OSError(errno.EBADF, "closed"))
        if self._fragment:
            self._cut_back(fd)
        return fd

    @staticmethod
    def _finish_short_write(fd: int, record: bytes | bytearray | memoryview, written: int) -> None:
        """Write the rest of ``record`` after a short write (or raise the error that
        stopped it: typically ENOSPC, the disk full after the first bytes)."""
        view = memoryview(record)
        while written < len(view):
            written += os.write(fd, view[written:])

    def _append_after_failure(
        self, fd: int, record: bytes | bytearray | memoryview, exc: OSError
    ) -> None:
        """A write of ``record`` raised ``exc``: cut what it left, then append ``record``
        once more if the disk was full and :attr:`on_full` made room - or raise."""
        error = self._failed(fd, exc)
        if exc.errno != errno.ENOSPC or self.on_full is None or not self.on_full():
            raise error from exc
        fd = self._writable()
        try:
            written = os.write(fd, record)
            if written != len(record):
                self._finish_short_write(fd, record, written)
        except OSError as again:
            raise self._failed(fd, again) from again
        self.size += len(record)

    def _failed(self, fd: int, exc: OSError) -> StorageError:
        """A write raised ``exc``: cut what it left, and return the error to raise.

        On a full disk ``write()`` stores what fits before it fails: those bytes are
        cut off now.  If the cut fails too, the log remembers it and refuses every
        append until a cut succeeds (:meth:`_writable`): a good record must never land
        after a fragment, where a reader would take the fragment for damage.
        """
        self._fragment = True
        try:
            self._cut_back(fd)
        except StorageError:
            pass  # the append's own error is the one to report; the next one retries
        return StorageError(f"write {self.what}", self.path, exc)

    def news(self) -> tuple[bytes, bool] | None:
        """Shared mode, the caller's lock held: what other handles appended since
        :attr:`size` - ``(bytes, False)`` - or, when another handle replaced the file,
        the whole new file - ``(bytes, True)``, now appended to - or None if nothing.

        After decoding, the caller calls :meth:`settle` with where its whole records end.
        """
        fd = self._fd
        if fd is None:
            raise StorageError(f"read {self.what}", self.path, OSError(errno.EBADF, "closed"))
        with storage_errors(f"read {self.what}", self.path):
            st = os.fstat(fd)
            if not st.st_nlink:
                new_fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
                try:
                    data = os.pread(new_fd, os.fstat(new_fd).st_size, 0)
                except BaseException:
                    os.close(new_fd)
                    raise
                self.adopt(new_fd, 0)
                return data, True
            if st.st_size == self.size:
                return None
            return os.pread(fd, st.st_size - self.size, self.size), False

    def settle(self, end: int) -> None:
        """Whole records end at ``end`` (after :meth:`news`): cut what follows - the remains
        of a handle that died appending under the lock - and append from there."""
        fd = self._fd
        if fd is None:
            return
        with storage_errors(f"cut a torn record of {self.what}", self.path):
            if os.fstat(fd).st_size > end:
                os.ftruncate(fd, end)
        self.size = end

    def _cut_back(self, fd: int) -> None:
        """Cut the file to :attr:`size` (the end of the last whole append)."""
        with storage_errors(f"cut back a failed write of {self.what}", self.path):
            os.ftruncate(fd, self.size)
        self._fragment = False

    def replace(self, blob: bytes) -> None:
        """Durably replace the whole file with ``blob`` and append to the new file.

        Raises :class:`StorageError` if it cannot; the log then goes on appending to
        whichever file holds its name (see :func:`replace_and_open`).
        """
        replace_and_open(self.path, blob, lambda fd: self.adopt(fd, len(blob)))

    def sync(self) -> None:
        """fdatasync the file (callable from any thread)."""
        with self._fd_lock:
            fd = os.dup(self._fd) if self._fd is not None else None
        if fd is None:
            return
        try:
            with storage_errors(f"sync {self.what}", self.path):
                datasync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._fd_lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
