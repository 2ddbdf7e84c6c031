"""``ledgerq.follow``: read a queue that another process owns, without taking its lock.

A follower is a read-only tail of the log, in the manner of SEJ's scanner: it opens
segment files read-only, never creates, writes, truncates or locks anything in the
queue directory, and reads what the owner appends, waiting (inotify, or polling where
that is missing) at the end of the newest segment.

The reading is :class:`ledgerq.segment.readonly.LogTail`'s, whose module sets out
what a reader without the lock may rely on from the owner and when it fails fast with
:class:`CorruptionError`; a follower adds the waiting, the timeout and the messages
(:func:`ledgerq.segment.readonly.view_message`, the rule every view shares).
"""

from __future__ import annotations

import os
import time

from ledgerq._types import Message
from ledgerq.core.args import check_timeout
from ledgerq.core.closing import Closing
from ledgerq.core.processes import track, untrack
from ledgerq.segment.encryption import check_key_type, sealer_for, stored_block
from ledgerq.segment.readonly import (
    DirectoryWatcher,
    LogTail,
    WatchMode,
    check_queue_dir,
    view_message,
    watch_segments,
)

__all__ = ["Follower", "follow"]

_WATCH_MODES = ("auto", "inotify", "poll")
_MAX_WAIT_SLICE_S = 86_400.0  # one wait of the watcher, at most


class Follower(Closing):
    """An iterator of the messages of a queue that another process owns.

    Returned by :func:`ledgerq.follow`; see there.  Not thread-safe.  Close it (or
    use it as a context manager) to release its file descriptors; it closes itself
    when the iteration ends or raises.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        from_id: int = 1,
        timeout: float | None = None,
        *,
        watch: WatchMode = "auto",
        encryption_key: bytes | None = None,
    ) -> None:
        key = check_key_type(encryption_key)
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        if isinstance(from_id, bool) or not isinstance(from_id, int):
            raise TypeError(f"from_id must be an int, got {type(from_id).__name__}")
        if from_id < 1:
            raise ValueError(f"from_id must be >= 1 (ids start at 1), got {from_id}")
        timeout = check_timeout(timeout)  # the queue's rule: NaN refused, infinity is None
        if watch not in _WATCH_MODES:
            raise ValueError(f"watch must be one of {_WATCH_MODES}, got {watch!r}")
        self.path = os.path.abspath(os.fspath(path))
        check_queue_dir(self.path)
        # An encrypted queue is followed with its key, checked here (ConfigError).
        self._sealer = sealer_for(stored_block(self.path) or {}, key, self.path)
        self._timeout = timeout
        self._tail = LogTail(self.path, from_id)
        # The watcher exists before the first look at the files, so no change between
        # a look and the next wait can be missed (see ledgerq.segment.watch).
        self._watch_mode: WatchMode = watch
        self._watcher: DirectoryWatcher | None = watch_segments(self.path, watch)
        self._watcher_inherited = False
        track(self)

    def _after_fork_in_child(self) -> None:
        """In a forked child: a follower reads with ``pread`` only and locks nothing, so
        it may go on; but an inotify watcher is one kernel queue of events shared with
        the parent (each would consume the other's wake-ups): the child opens its own
        at its next step."""
        self._watcher_inherited = True

    def _renew_watcher(self) -> None:
        old, self._watcher = self._watcher, None
        self._watcher_inherited = False
        if old is not None:
            old.close()  # this process's copy of the descriptor; the parent keeps its own
            self._watcher = watch_segments(self.path, self._watch_mode)

    # ------------------------------------------------------------------ public face

    @property
    def next_id(self) -> int:
        """The lowest id not yet passed: ``follow(path, from_id=f.next_id)`` resumes here."""
        return self._tail.next_id

    @property
    def watch(self) -> str:
        """How changes are waited for: ``"inotify"``, ``"poll"``, or ``"closed"``."""
        return self._watcher.kind if self._watcher is not None else "closed"

    @property
    def closed(self) -> bool:
        """Whether the follower has been closed (by :meth:`close`, its end or an error)."""
        return self._watcher is None

    def __iter__(self) -> Follower:
        return self

    def __next__(self) -> Message:
        """Return the next message; wait for it (up to ``timeout``) if it is not there yet.

        Raises ``StopIteration`` after ``timeout`` seconds without a message (and
        once closed); :class:`CorruptionError` when data was lost under the
        follower (the follower is then closed).
        """
        if self._watcher_inherited:
            self._renew_watcher()
        watcher = self._watcher
        if watcher is None:
            raise StopIteration
        timeout = self._timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                message = self._advance()
                if message is not None:
                    return message
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                patience = self._tail.patience_left()
                if patience is not None:
                    left = patience if left is None else min(left, patience)
                # poll() takes at most 2**31 ms (~24 days): wait in slices; the loop
                # looks again and waits again until the deadline.
                watcher.wait(_MAX_WAIT_SLICE_S if left is None else min(left, _MAX_WAIT_SLICE_S))
        except BaseException:
            self.close()
            raise
        self.close()
        raise StopIteration

    def close(self) -> None:
        """Release the open segment and the watcher; idempotent.  Iteration then stops."""
        untrack(self)
        watcher, self._watcher = self._watcher, None
        try:
            self._tail.close()
        finally:
            if watcher is not None:
                watcher.close()

    def __repr__(self) -> str:
        return f"<ledgerq.Follower {self.path!r} next_id={self.next_id} watch={self.watch}>"

    def _advance(self) -> Message | None:
        """The next message that is already on disk, or None (then wait and call again)."""
        tail = self._tail
        while (entry := tail.next_entry()) is not None:
            path = tail.segment_path
            assert path is not None
            message = view_message(entry, path, self._sealer)
            if message is not None:
                return message
        return None


def follow(
    path: str | os.PathLike[str],
    from_id: int = 1,
    timeout: float | None = None,
    *,
    watch: WatchMode = "auto",
    encryption_key: bytes | None = None,
) -> Follower:
    """Iterate over the messages of a queue another process owns, without its lock.

    Yields every message with id >= ``from_id`` in id order, across segments, then
    follows new appends and new segments as the owner writes them.  ``timeout``:
    seconds without a new message after which the iteration ends normally
    (``None`` waits forever; ``0`` yields what is there and stops).  Nothing in the
    directory is created, written, truncated or locked.  Messages carry their
    stored fields with ``attempts=0`` (a view delivers nothing: the rule
    ``ledgerq dump`` follows too); the follower does not lease, ack or skip expired
    messages (it is a view of the log).  ``watch``: ``"auto"`` (inotify
    where available, else polling), ``"inotify"`` or ``"poll"``.  An encrypted
    queue needs its ``encryption_key`` (32 bytes) to be followed.

    Raises :class:`NotAQueueError` if ``path`` is not a queue directory,
    :class:`ConfigError` for an encrypted queue without its key or with another (and
    a plain queue given a key), and (from
    the iteration) :class:`CorruptionError` if the file being read is truncated
    below what was read, replaced, or deleted while it is the newest segment, or a
    segment is deleted before the follower could read it.  Use it as a context
    manager, or call ``close()``, to release its file descriptors early.
    """
    return Follower(path, from_id, timeout, watch=watch, encryption_key=encryption_key)
