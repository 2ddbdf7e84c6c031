"""Waiting, without spinning, until something changes in a directory.

:class:`InotifyWatcher` asks the Linux kernel (``inotify``, through ``ctypes``) to
report creations, deletions, renames and writes of the directory's entries, and
sleeps in ``poll()`` until one arrives: a waiting follower costs no CPU.
:class:`PollingWatcher` is the portable fallback: it compares the names in the
directory and the identity, size and mtime of its newest file, sleeping between
looks with a backoff from 5 ms to 200 ms.

Both are *level-triggered against a baseline*: the baseline is taken when the
watcher is created and after every change it reports, so a change that happens
between the caller's last look at the files and its call to :meth:`wait` is never
lost - :meth:`wait` returns at once instead.  Create the watcher before the
first look at the files.  A watcher may wake its caller without a relevant
change (the caller looks again and waits again); it never sleeps through one.
"""

from __future__ import annotations

import ctypes
import errno
import io
import math
import os
import select
import struct
import sys
import time
from typing import Literal

__all__ = ["DirectoryWatcher", "InotifyWatcher", "PollingWatcher", "open_watcher"]

WatchMode = Literal["auto", "inotify", "poll"]

# <sys/inotify.h>
_IN_MODIFY = 0x00000002
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_WATCH_MASK = (
    _IN_CREATE
    | _IN_MOVED_TO
    | _IN_MOVED_FROM
    | _IN_MODIFY
    | _IN_DELETE
    | _IN_CLOSE_WRITE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
)
# Events about the directory itself (or lost events): always relevant, whatever the name.
_ALWAYS = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_Q_OVERFLOW | _IN_IGNORED
# struct inotify_event { int wd; uint32_t mask, cookie, len; char name[len]; } (native order)
_EVENT = struct.Struct("=iIII")
assert _EVENT.size == 16
_READ_SIZE = 64 * 1024  # many events per read(); at least one event of NAME_MAX fits

_POLL_MIN_S = 0.005
_POLL_MAX_S = 0.2


class DirectoryWatcher:
    """Base of the watchers: :meth:`wait` for a change, :meth:`close` when done."""

    kind = "none"

    def wait(self, timeout: float | None) -> bool:
        """Block until something may have changed (True) or ``timeout`` seconds pass (False).

        ``None`` waits without limit.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release the watcher's resources (idempotent)."""

    def __enter__(self) -> DirectoryWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


class InotifyWatcher(DirectoryWatcher):
    """Kernel notifications for ``directory`` (Linux); only names ending in ``suffix`` count.

    Raises ``OSError`` when inotify is not available (another platform, a missing
    libc symbol, or the per-user instance limit reached).
    """

    kind = "inotify"

    def __init__(self, directory: str, *, suffix: str = "") -> None:
        libc = _libc()
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1 failed: {os.strerror(code)}")
        # Owned by a FileIO so the descriptor is closed (with a ResourceWarning) even if
        # close() is forgotten.
        self._file: io.FileIO | None = io.FileIO(fd, "rb", closefd=True)
        try:
            wd = libc.inotify_add_watch(fd, os.fsencode(directory), _WATCH_MASK)
            if wd < 0:
                code = ctypes.get_errno()
                raise OSError(code, f"cannot watch {directory}: {os.strerror(code)}", directory)
            self._poller = select.poll()
            self._poller.register(fd, select.POLLIN)
        except BaseException:
            self.close()
            raise
        self._suffix = os.fsencode(suffix)

    def wait(self, timeout: float | None) -> bool:
        file = self._file
        if file is None:
            raise ValueError("watcher is closed")
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            left = _remaining(deadline)
            # poll() takes whole milliseconds; round up so a short wait does not spin.
            ms = -1 if left is None else max(0, math.ceil(left * 1000))
            if self._poller.poll(ms) and self._drain(file.fileno()):
                return True
            left = _remaining(deadline)
            if left is not None and left <= 0:
                return False

    def fileno(self) -> int:
        """The inotify descriptor: readable when events wait (for a caller's own poll)."""
        file = self._file
        if file is None:
            raise ValueError("watcher is closed")
        return file.fileno()

    def drain(self) -> bool:
        """Read the events that wait, without blocking; True if one of them matters."""
        return self._drain(self.fileno())

    def _drain(self, fd: int) -> bool:
        """Read every queued event; True if one of them matters."""
        relevant = False
        while True:
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                return relevant
            except InterruptedError:  # pragma: no cover - PEP 475 retries reads
                continue
            if not data:  # pragma: no cover - an inotify fd never reports EOF
                return relevant
            at = 0
            while at + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + length].rstrip(b"\0")
                at += _EVENT.size + length
                if mask & _ALWAYS or not name or name.endswith(self._suffix):
                    relevant = True

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()  # also removes the watch


class PollingWatcher(DirectoryWatcher):
    """Look at ``directory`` every 5 ms, backing off to every 200 ms while nothing changes.

    A change is a name ending in ``suffix`` appearing or disappearing, or the
    newest such name (in sorted order) changing identity, size or mtime - the
    files are append-only and only the newest grows, so that is every change a
    follower needs to see.  A directory that disappears counts as a change.
    """

    kind = "poll"

    def __init__(
        self,
        directory: str,
        *,
        suffix: str = "",
        min_interval: float = _POLL_MIN_S,
        max_interval: float = _POLL_MAX_S,
    ) -> None:
        self._directory = directory
        self._suffix = suffix
        self._min = min_interval
        self._max = max(max_interval, min_interval)
        self._closed = False
        self._baseline = self._snapshot()

    def _snapshot(self) -> object:
        try:
            names = sorted(n for n in os.listdir(self._directory) if n.endswith(self._suffix))
        except FileNotFoundError:
            return None
        if not names:
            return ()
        try:
            st = os.stat(os.path.join(self._directory, names[-1]))
        except FileNotFoundError:
            return (tuple(names), None)
        return (tuple(names), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def wait(self, timeout: float | None) -> bool:
        if self._closed:
            raise ValueError("watcher is closed")
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        interval = self._min
        while True:
            snapshot = self._snapshot()
            if snapshot != self._baseline:
                self._baseline = snapshot
                return True
            left = _remaining(deadline)
            if left is not None and left <= 0:
                return False
            time.sleep(interval if left is None else min(interval, left))
            interval = min(interval * 2, self._max)

    def close(self) -> None:
        self._closed = True


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    """The C library, with the inotify functions; ``OSError`` where there is none."""
    global _LIBC
    if _LIBC is None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "inotify is only available on Linux")
        libc = ctypes.CDLL(None, use_errno=True)  # the running process's symbols: libc
        try:
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_init1.restype = ctypes.c_int
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            libc.inotify_add_watch.restype = ctypes.c_int
        except AttributeError as exc:
            raise OSError(errno.ENOSYS, f"the C library has no inotify ({exc})") from None
        _LIBC = libc
    return _LIBC


def open_watcher(directory: str, mode: WatchMode = "auto", *, suffix: str = "") -> DirectoryWatcher:
    """Return a watcher of ``directory``: inotify when possible (``"auto"``), or as asked.

    ``"inotify"`` raises ``OSError`` where inotify is unavailable; ``"poll"`` always
    polls.  ``FileNotFoundError`` if the directory does not exist.
    """
    if mode == "poll":
        if not os.path.isdir(directory):
            raise FileNotFoundError(errno.ENOENT, "no such directory", directory)
        return PollingWatcher(directory, suffix=suffix)
    if mode == "inotify":
        return InotifyWatcher(directory, suffix=suffix)
    if mode != "auto":
        raise ValueError(f"watch must be 'auto', 'inotify' or 'poll', got {mode!r}")
    try:
        return InotifyWatcher(directory, suffix=suffix)
    except FileNotFoundError:
        raise
    except OSError:
        # Not Linux, or out of inotify instances (fs.inotify.max_user_instances): poll.
        return open_watcher(directory, "poll", suffix=suffix)
