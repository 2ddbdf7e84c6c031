"""The housekeeper of a process's shared-mode handles: the others' liveness, and waking.

One daemon thread per process, started by the first shared-mode handle and ended when
the last one closes.  It holds the handles weakly (an unclosed handle is still
collected) and does two jobs:

* **Liveness.**  Every :data:`LIVENESS_PERIOD_S` it looks at ``shared/*.live`` of each
  queue: a handle whose file it can lock (``flock(LOCK_EX|LOCK_NB)``) is dead - the
  kernel dropped the lock with its process - and so is a holder of leases that has no
  file at all.  Their leases are reclaimed (RECLAIM records: failed deliveries) by one
  handle of this process, whose waiters are then woken; the dead file is removed.  So
  a ``kill -9``'d consumer's messages are back within about half a second, without a
  visibility timeout or a reopen.
* **Waking.**  While a handle has a blocked ``dequeue`` (or an asyncio waiter), its
  queue's ``segments/`` and ``readers/`` are watched with inotify; a write there by
  any process (an enqueue, a nack, a reclaim) wakes the handle's waiters, which look
  again.  Idle, the thread sleeps in ``poll()``: no CPU.  Where inotify is missing it
  polls the files instead, every 5 ms backing off to 200 ms while nothing changes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
import weakref
from typing import TYPE_CHECKING

from ledgerq.segment.files import StorageError
from ledgerq.segment.lock import LockFile
from ledgerq.segment.naming import (
    LOG_SUFFIX,
    READERS_DIR,
    SEGMENTS_DIR,
    STATE_SUFFIX,
    handle_live_path,
    list_live_handles,
)
from ledgerq.segment.watch import InotifyWatcher

if TYPE_CHECKING:
    from ledgerq.core.shared_queue import SharedQueueCore

__all__ = ["LIVENESS_PERIOD_S", "Housekeeper", "housekeeper"]

logger = logging.getLogger("ledgerq")

LIVENESS_PERIOD_S = 0.25
# A watch with no waiter for this long is dropped (inotify costs every writer a little).
_IDLE_WATCH_S = 1.0
_POLL_MIN_S = 0.005
_POLL_MAX_S = 0.2

# How a process's housekeeper watches the queues its handles wait on: inotify where it
# works, else polling; LEDGERQ_WATCH=poll always polls (file systems whose inotify
# misses other machines' or containers' writes, and the tests of the polling path).
WATCH_ENV = "LEDGERQ_WATCH"


def _watch_polls() -> bool:
    return os.environ.get(WATCH_ENV, "").strip().lower() == "poll"


class _Watch:
    """The watch of one queue's segments and journals while someone waits on it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.inotify: list[InotifyWatcher] = []
        self.interval = _POLL_MIN_S
        self.next_poll = 0.0
        if not _watch_polls():
            try:
                self.inotify = [
                    InotifyWatcher(os.path.join(path, SEGMENTS_DIR), suffix=LOG_SUFFIX),
                    InotifyWatcher(os.path.join(path, READERS_DIR), suffix=STATE_SUFFIX),
                ]
            except OSError:
                self.close()
                self.inotify = []
        self._snapshot = self._look() if not self.inotify else None

    @property
    def polling(self) -> bool:
        return not self.inotify

    def _look(self) -> object:
        """What polling compares: every log's and journal's identity and size."""
        seen = []
        for directory, suffix in ((SEGMENTS_DIR, LOG_SUFFIX), (READERS_DIR, STATE_SUFFIX)):
            try:
                with os.scandir(os.path.join(self.path, directory)) as entries:
                    for entry in entries:
                        if entry.name.endswith(suffix):
                            with contextlib.suppress(FileNotFoundError):
                                st = entry.stat()
                                seen.append((entry.name, st.st_ino, st.st_size))
            except FileNotFoundError:
                continue
        return sorted(seen)

    def poll_changed(self, now: float) -> bool:
        """Polling: whether the files changed since the last look (when due)."""
        if now < self.next_poll:
            return False
        snapshot = self._look()
        changed = snapshot != self._snapshot
        self._snapshot = snapshot
        self.interval = _POLL_MIN_S if changed else min(self.interval * 2, _POLL_MAX_S)
        self.next_poll = now + self.interval
        return changed

    def close(self) -> None:
        for watcher in self.inotify:
            watcher.close()


class Housekeeper:
    """See the module.  :func:`housekeeper` is the process's one instance."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[str, weakref.WeakSet[SharedQueueCore]] = {}
        self._watches: dict[str, _Watch] = {}
        self._probes: dict[tuple[str, int], LockFile] = {}
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)

    # ------------------------------------------------------------------ handles

    def register(self, handle: SharedQueueCore) -> None:
        """Look after ``handle`` until :meth:`unregister` (or it is collected)."""
        with self._lock:
            self._handles.setdefault(handle.path, weakref.WeakSet()).add(handle)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="ledgerq-shared-housekeeper", daemon=True
                )
                self._thread.start()

    def unregister(self, handle: SharedQueueCore) -> None:
        """Stop looking after ``handle`` (it closed)."""
        with self._lock:
            handles = self._handles.get(handle.path)
            if handles is not None:
                handles.discard(handle)
        self._poke()

    def arm(self, handle: SharedQueueCore) -> bool:
        """Watch ``handle``'s queue for a waiter; True if the watch starts now (the waiter
        must then look once more: a change just before the watch is not reported)."""
        with self._lock:
            if handle.path in self._watches:
                return False
            self._watches[handle.path] = _Watch(handle.path)
        self._poke()
        return True

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        next_liveness = time.monotonic() + LIVENESS_PERIOD_S
        while True:
            with self._lock:
                queues = {path: list(handles) for path, handles in self._handles.items()}
                for path in [p for p, hs in queues.items() if not hs]:
                    del self._handles[path]
                    del queues[path]
                    self._drop_watch(path)
                if not queues:
                    self._thread = None
                    self._close_probes()
                    return
                watches = dict(self._watches)
            del queues  # no strong references while sleeping
            now = time.monotonic()
            timeout = max(0.0, next_liveness - now)
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            by_fd: dict[int, str] = {}
            for path, watch in watches.items():
                if watch.polling:
                    timeout = min(timeout, max(0.0, watch.next_poll - now))
                for watcher in watch.inotify:
                    fd = watcher.fileno()
                    by_fd[fd] = path
                    poller.register(fd, select.POLLIN)
            events = poller.poll(int(timeout * 1000) + 1)
            changed: set[str] = set()
            for fd, _ in events:
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wake_r, 4096):
                            pass
                    continue
                path = by_fd[fd]
                for watcher in watches[path].inotify:
                    if watcher.fileno() == fd and watcher.drain():
                        changed.add(path)
            now = time.monotonic()
            for path, watch in watches.items():
                if watch.polling and watch.poll_changed(now):
                    changed.add(path)
            for path in changed:
                for handle in self._live_handles(path):
                    try:
                        handle._wake_from_outside()
                    except Exception:  # the thread serves every queue: it must not end
                        logger.exception("ledgerq: waking the waiters of %s failed", path)
            if now >= next_liveness:
                next_liveness = now + LIVENESS_PERIOD_S
                self._liveness_round()
                self._drop_idle_watches(now)

    def _live_handles(self, path: str) -> list[SharedQueueCore]:
        with self._lock:
            handles = self._handles.get(path)
            return [h for h in handles if not h.closed] if handles else []

    def _drop_watch(self, path: str) -> None:
        watch = self._watches.pop(path, None)
        if watch is not None:
            watch.close()

    def _drop_idle_watches(self, now: float) -> None:
        with self._lock:
            for path in list(self._watches):
                handles = self._handles.get(path)
                busy = handles is not None and any(
                    h._waits.waiting or h._waits.listeners or now - h._last_wait < _IDLE_WATCH_S
                    for h in handles
                )
                if not busy:
                    self._drop_watch(path)

    # ------------------------------------------------------------------ liveness

    def _liveness_round(self) -> None:
        with self._lock:
            paths = list(self._handles)
        for path in paths:
            handles = self._live_handles(path)
            if not handles:
                continue
            try:
                self._check_queue(path, handles)
            except Exception:  # a failing disk must not end the thread: next round
                logger.exception("ledgerq: checking the shared-mode handles of %s failed", path)
            self._poll_timers(handles)

    def _poll_timers(self, handles: list[SharedQueueCore]) -> None:
        """Periodic jobs: each handle reads the others' changes and fires what is due -
        so a tick comes on time (within a round) even where no handle dequeues."""
        for handle in handles:
            try:
                handle.poll_timer()
            except Exception:  # (fire_due logs its own errors): never end the thread
                logger.exception("ledgerq: the periodic jobs of %s failed", handle.path)

    def _check_queue(self, path: str, handles: list[SharedQueueCore]) -> None:
        own = {h.handle_id for h in handles}
        listed = set(list_live_handles(path))
        dead: list[int] = []
        for handle_id in sorted(listed - own):
            probe = self._probe(path, handle_id)
            if probe is not None and probe.try_acquire():
                dead.append(handle_id)
        # A holder of leases without a liveness file died (or never lived) too: a handle
        # creates its file before its first lease and removes it after returning them.
        holders: set[int] = set()
        for handle in handles:
            holders.update(handle._foreign_holders())
        for holder in sorted(holders - own - listed):
            if not os.path.exists(handle_live_path(path, holder)):
                dead.append(holder)
        for holder in dead:
            reclaimed = handles[0]._reclaim_dead(holder)
            if reclaimed:
                logger.warning(
                    "ledgerq: the shared-mode handle %016x of %s is gone; its %d leases "
                    "are back as failed deliveries",
                    holder,
                    path,
                    reclaimed,
                )
            probe = self._probes.pop((path, holder), None)
            if probe is not None:
                with contextlib.suppress(OSError):
                    os.unlink(probe.path)  # under its lock: nobody else reclaims it now
                probe.close()
        for key in [k for k in self._probes if k[0] == path and k[1] not in listed]:
            self._probes.pop(key).close()

    def _probe(self, path: str, handle_id: int) -> LockFile | None:
        key = (path, handle_id)
        probe = self._probes.get(key)
        if probe is None:
            try:
                probe = LockFile(handle_live_path(path, handle_id), create=False)
            except StorageError:
                return None  # removed meanwhile: that handle closed
            self._probes[key] = probe
        return probe

    def _close_probes(self) -> None:
        for probe in self._probes.values():
            probe.close()
        self._probes.clear()


_HOUSEKEEPER: Housekeeper | None = None
_CREATE = threading.Lock()


def housekeeper() -> Housekeeper:
    """The process's housekeeper (created on first use)."""
    global _HOUSEKEEPER
    keeper = _HOUSEKEEPER
    if keeper is None:
        with _CREATE:
            keeper = _HOUSEKEEPER
            if keeper is None:
                keeper = _HOUSEKEEPER = Housekeeper()
    return keeper


def _after_fork_in_child() -> None:
    # The thread is not in the child, and the handles are the parent's (unusable here).
    global _HOUSEKEEPER, _CREATE
    _HOUSEKEEPER = None
    _CREATE = threading.Lock()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
