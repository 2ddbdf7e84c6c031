"""Shared mode: a queue open in any number of processes (and handles) at once.

``ledgerq.open(path, shared=True)`` returns a handle whose every decision is made on
the state of the files, brought up to date under a short OS lock (docs/architecture.md,
"Shared mode", has the whole design and why it survives kill -9 at every step):

* ``LOCK`` is held shared (``LOCK_SH``) by every handle: an exclusive open and a
  shared one exclude each other.  The first shared handle of a session - no other has
  the queue open - takes it exclusively while it recovers the queue exactly as an
  exclusive open does, then shares it; ``shared/OPENING`` serialises the opens.
* appends take ``shared/APPEND`` (:class:`~ledgerq.segment.shared_manager.SharedSegmentManager`):
  catch-up of the tail, id reservation, dedup admission, the ``write()``, rotation,
  retention - never the fsync of ``sync="always"``, which waits after the lock;
* every step of a reader takes ``shared/<name>.reader`` and catches up with the
  reader's journal first (:class:`~ledgerq.core.shared_reader.SharedReaderCore`);
* each handle holds ``shared/<id>.live`` locked while it lives: a handle whose file
  can be locked by another is dead, and its leases are reclaimed as failed deliveries
  by the process housekeeper (:mod:`ledgerq.core.shared_process`) within a second;
* waits: a blocked ``dequeue`` is woken by the housekeeper, which watches the
  segments and journals (inotify, or polling) while someone waits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator

from ledgerq._errors import (
    QueueBusyError,
    QueueClosedError,
    StorageError,
)
from ledgerq._options import Options
from ledgerq.core.args import DEFAULT_LOCK_TIMEOUT, READER_NAME
from ledgerq.core.clock import Clock
from ledgerq.core.feature import Feature
from ledgerq.core.journal import ReaderJournal, ReaderRemovedError, SharedReaderJournal
from ledgerq.core.lifecycle import CloseSession
from ledgerq.core.queue import QueueCore
from ledgerq.core.reader import ReaderCore, initial_checkpoint
from ledgerq.core.reader_handle import Reader
from ledgerq.core.retry import RetryPolicy
from ledgerq.core.shared_close import SharedCloseSession, save_shared_meta
from ledgerq.core.shared_opening import SharedOpening, SharedTally
from ledgerq.core.shared_reader import SharedReaderCore, read_published_head
from ledgerq.format.shared_state import (
    LOCK_BLOCK_SIZE,
    LOCKING_FLOCK,
    SLOT_LOCK,
)
from ledgerq.segment.lock import LockFile
from ledgerq.segment.naming import (
    list_reader_names,
    reader_lock_path,
)
from ledgerq.segment.readonly_state import replay_reader
from ledgerq.segment.shared_manager import SharedSegmentManager
from ledgerq.segment.shared_page import FeatureLogWord, JournalSlot, SharedPage
from ledgerq.segment.steplock import (
    FileStepLock,
    Liveness,
    StepLock,
)

__all__ = ["SharedQueueCore", "SharedTally"]

logger = logging.getLogger("ledgerq")

_NS = 1_000_000_000
# The longest the housekeeper thread waits for a lock (a stopped process holds it).
_HOUSEKEEPING_WAIT_S = 0.1


def _new_handle_id() -> int:
    """A random 64-bit id, at least 2: the holder of this handle's leases and the owner
    its lock words hold (0 and 1 mean a free word: ``format.shared_state``)."""
    while (handle_id := int.from_bytes(os.urandom(8), "little")) < 2:
        pass
    return handle_id


class SharedQueueCore(SharedOpening, QueueCore):
    """A queue handle in shared mode (see the module).  Use ``ledgerq.open(path, shared=True)``."""

    shared = True
    _every_reader_held = False  # while an append holds every reader (_holding_every_reader)

    def __init__(
        self,
        path: str | os.PathLike[str],
        options: Options,
        features: Iterable[Feature] = (),
        clock: Clock | None = None,
        *,
        remember_options: bool = True,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        self.handle_id = _new_handle_id()
        self._first = False  # this handle started the session (no other had the queue open)
        self._alone = False  # ... and it is still opening: no other handle exists yet
        self._opening: LockFile | None = None
        self._reader_locks: dict[str, LockFile] = {}
        self._reader_steps: dict[str, tuple[StepLock, JournalSlot | None]] = {}
        self._live: LockFile | None = None
        self._page: SharedPage | None = None
        self._last_wait = 0.0
        self._max_bytes = options.retention_max_bytes is not None
        self._locking = LOCKING_FLOCK  # how the session locks (the first handle decides)
        self._liveness = Liveness(self._describe_handle, self._probe_handle)
        super().__init__(
            path,
            options,
            list(features),
            clock,
            remember_options=remember_options,
            lock_timeout=lock_timeout,
        )
        from ledgerq.core.shared_process import housekeeper

        housekeeper().register(self)

    # ------------------------------------------------------------------ opening

    @property
    def is_alone(self) -> bool:
        return self._alone

    @contextlib.contextmanager
    def appends_locked(self) -> Iterator[None]:
        manager = self._manager
        assert isinstance(manager, SharedSegmentManager)
        manager.lock_appends()
        try:
            yield
        finally:
            manager.unlock_appends()

    def feature_log_word(self, path: str) -> FeatureLogWord | None:
        """The change word of the feature log ``path`` in the session's page."""
        page = self._page
        return None if page is None else FeatureLogWord.of(page, os.path.basename(path))

    def _new_journal(self, name: str) -> ReaderJournal:
        return SharedReaderJournal(self._reader_path(name), self.handle_id)

    @contextlib.contextmanager
    def holding_reader(self, name: str) -> Iterator[None]:
        with self._lock:
            self._ensure_open()
            reader = self._readers.get(name)
            if reader is None:
                raise KeyError(name)
            core = reader._core
            assert isinstance(core, SharedReaderCore)
            core.session.enter()
        try:
            yield
        finally:
            with self._lock:
                core.session.leave()

    def _foreign_holders(self) -> set[int]:
        """The other handles this handle knows to hold leases (for the housekeeper)."""
        holders: set[int] = set()
        for core in list(self._cores.values()):
            if isinstance(core, SharedReaderCore):
                holders |= core.foreign_holders()
        return holders

    def _reclaim_dead(self, holder: int) -> int:
        """Return the leases of the dead handle ``holder`` in every reader; how many.

        The housekeeper's call: it waits a moment at most for a reader's lock (a process
        stopped in a step holds it) and tries again at its next round, rather than
        hold up the wake-ups it also delivers.
        """
        with self._lock:
            if self._closed:
                return 0
            before = self._budget.limit(time.monotonic() + _HOUSEKEEPING_WAIT_S)
            try:
                self._open_readers_on_disk()
                reclaimed = 0
                for reader in list(self._readers.values()):
                    core = reader._core
                    assert isinstance(core, SharedReaderCore)
                    with contextlib.suppress(QueueClosedError):  # removed by another handle
                        reclaimed += core.reclaim_holder(holder)
            except QueueBusyError:
                return 0  # (the leases stay: the next round reclaims them)
            finally:
                self._budget.limit(before)
            if reclaimed and (self._waits.waiting or self._waits.listeners):
                self._waits.wake()
            return reclaimed

    def _reader_lock(self, name: str) -> LockFile:
        """The reader's lock file: its published head (and its flock, without a word)."""
        lock = self._reader_locks.get(name)
        if lock is None:
            lock = LockFile(reader_lock_path(self.path, name))
            self._reader_locks[name] = lock
        return lock

    def _reader_step(self, name: str) -> tuple[StepLock, JournalSlot | None]:
        """The step lock of reader ``name`` and its journal's slot in the page.

        The slot is claimed (under the append lock) by the first handle of the session
        that opens the reader; one beyond the page's slots locks with the reader's file
        and has no slot (its journal is looked at with ``fstat``, as before pages had
        slots).
        """
        known = self._reader_steps.get(name)
        if known is not None:
            return known
        page = self._page
        assert page is not None
        lock_file = self._reader_lock(name)
        offset = page.reader_slot(name)
        if offset is None:
            with self.appends_locked():
                offset = page.claim_reader_slot(name)
        what = f"reader {name!r}"
        if offset is None:
            step: StepLock = FileStepLock(
                lock_file,
                bytearray(LOCK_BLOCK_SIZE),  # (no block in the page to name the holder)
                0,
                self._lock_holder,
                what=what,
            )
            found: tuple[StepLock, JournalSlot | None] = (step, None)
        else:
            found = (
                self._step_lock(offset + SLOT_LOCK, lock_file, what),
                JournalSlot(page, offset),
            )
        self._reader_steps[name] = found
        return found

    def _new_reader_core(
        self, name: str, journal: ReaderJournal, *, start_latest: bool
    ) -> ReaderCore:
        assert isinstance(journal, SharedReaderJournal)
        manager = self._manager
        assert isinstance(manager, SharedSegmentManager)
        step, slot = self._reader_step(name)
        return SharedReaderCore(
            name,
            journal,
            manager,
            self._reader_hooks,
            visibility_timeout=self.options.visibility_timeout,
            start_latest=start_latest,
            lock=self._reader_lock(name),
            step=step,
            slot=slot,
            clock=self._clock,
            first=self.is_alone,
            retry_policy=RetryPolicy.from_options(self.options),
        )

    def _close_session(self) -> CloseSession:
        if self._live is None or self._page is None:
            return super()._close_session()  # still opening: a failed open closes alone
        return SharedCloseSession(self)

    def _close_after_failed_open(self) -> None:
        super()._close_after_failed_open()
        for lock in self._reader_locks.values():
            lock.close()
        for name in ("_append_file", "_live", "_opening"):
            held = getattr(self, name, None)
            if isinstance(held, LockFile):
                if name == "_live":
                    with contextlib.suppress(OSError):
                        os.unlink(held.path)
                held.close()
        if self._page is not None:
            self._page.close()

    # ------------------------------------------------------------------ meta.json

    def _save_meta(self, *, clean: bool) -> None:
        manager = self._manager
        assert isinstance(manager, SharedSegmentManager)
        if self._page is None:  # the first handle, recovering alone
            super()._save_meta(clean=clean)
            return
        save_shared_meta(
            self._keeper,
            manager,
            self._tally,
            self.options if self._remember_options else None,
            clean=clean,
            reserved_until=self._ids_reserved_until,
        )
        self._meta = self._keeper.meta

    # ------------------------------------------------------------------ appending

    def readers_current(self) -> bool:
        """While an append holds every reader; or when each reader's journal is, as the
        page says, what this handle's view has applied: a unique key found held in the
        view is then held, with no reader's step taken (a second enqueue of a pending
        job costs a read of the page per reader).  A reader another handle created since
        is not asked: it can only hold a message longer."""
        if self._every_reader_held:
            return True
        for core in self._cores.values():
            assert isinstance(core, SharedReaderCore)
            if not core.view_is_current():
                return False
        return True

    @contextlib.contextmanager
    def _holding_every_reader(self) -> Iterator[None]:
        """Hold every reader's step (in name order, before the append lock, as every step
        takes them), for an append that the append session says must judge them
        (core/shared_appends: a bounded queue's, a unique key's held in this view)."""
        self._open_readers_on_disk()
        entered: list[SharedReaderCore] = []
        try:
            for name in sorted(self._cores):
                core = self._cores[name]
                assert isinstance(core, SharedReaderCore)
                core.session.enter()
                entered.append(core)
            self._every_reader_held = True
            yield
        finally:
            self._every_reader_held = False
            for core in reversed(entered):
                core.session.leave()

    # ------------------------------------------------------------------ retention

    def _published_heads(self) -> list[int]:
        """Each reader's published head (a lower bound of its true head)."""
        heads = []
        for name in list_reader_names(self.path):
            lock = self._reader_locks.get(name)
            head: int | None = None
            if lock is None:
                with contextlib.suppress(StorageError):
                    lock = self._reader_lock(name)
            if lock is not None:
                head = read_published_head(lock)
            if head is None:
                # Never published (a reader no shared handle has opened): its journal.
                head = replay_reader(self.path, name).durable_head()
            heads.append(head)
        return heads

    def _retire_locked(self) -> None:
        """Delete the sealed segments every reader has consumed (append lock held)."""
        manager = self._manager
        assert isinstance(manager, SharedSegmentManager)
        manager.catch_up_locked()  # (it publishes below: a dead appender's tail first)
        if len(manager.segments) < 2:
            return
        if self._delete_consumed(min(self._published_heads(), default=0)):
            manager.publish()

    def _enforce_max_bytes(self) -> None:
        """``retention_max_bytes``: drop the oldest segments, settled in every reader.

        The readers' locks are taken (in name order) before the append lock, as every
        step takes them: no two handles wait for each other.
        """
        max_bytes = self.options.retention_max_bytes
        manager = self._manager
        assert isinstance(manager, SharedSegmentManager)
        if max_bytes is None or manager.disk_bytes <= max_bytes:
            return
        self._open_readers_on_disk()
        cores = [self._cores[name] for name in sorted(self._cores)]
        entered: list[SharedReaderCore] = []
        try:
            for core in cores:
                assert isinstance(core, SharedReaderCore)
                core.session.enter()
                entered.append(core)
            manager.lock_appends()
            try:
                manager.catch_up_locked()  # (it publishes below: see _retire_locked)
                self._drop_oldest_while_over()
            finally:
                manager.unlock_appends()
        finally:
            for core in reversed(entered):
                core.session.leave()

    def _open_readers_on_disk(self) -> None:
        """Open the readers other handles created since this one opened."""
        for name in list_reader_names(self.path):
            if name not in self._readers and READER_NAME.match(name):
                with contextlib.suppress(FileNotFoundError, ReaderRemovedError):
                    self._open_reader(name, start_latest=False)

    # ------------------------------------------------------------------ readers

    def _open_reader(self, name: str, *, start_latest: bool) -> Reader:
        new = not os.path.exists(self._reader_path(name))
        reader = super()._open_reader(name, start_latest=start_latest)
        core = reader._core
        assert isinstance(core, SharedReaderCore)
        if new or read_published_head(core._lock_file) is None:
            core.publish_head(moved=True)  # (a removed reader's lock file may remain)
        return reader

    def _open_new_reader(self, name: str, head: int, done: Iterable[int]) -> Reader:
        """Create a reader under its lock: another handle may be creating it too."""
        step, _ = self._reader_step(name)
        repair = step.acquire()
        try:
            if repair:
                # A holder died mid-step: the repair is the next step's (the open below
                # loads the file whole and publishes a new generation).
                step.mark_suspect()
            path = self._reader_path(name)
            if not os.path.exists(path):
                checkpoint = initial_checkpoint(head, done, self._manager.next_id)
                journal = self._new_journal(name)
                try:
                    journal.rewrite(checkpoint)
                finally:
                    journal.close()
        finally:
            step.release()
        reader = self._open_reader(name, start_latest=False)
        reader._core.publish_head(moved=True)
        return reader

    def remove_reader(self, name: str) -> bool:
        with self._lock:
            self._ensure_open()
            self._open_readers_on_disk()  # another handle's reader is the queue's too
        removed = super().remove_reader(name)
        if removed:
            _, slot = self._reader_steps.pop(name, (None, None))
            if slot is not None:
                slot.mark_removed()  # the other handles' next step finds the file gone
            lock = self._reader_locks.pop(name, None)
            if lock is not None:
                with contextlib.suppress(OSError):
                    os.unlink(lock.path)
                lock.close()
        return removed

    # ------------------------------------------------------------------ observing

    # ------------------------------------------------------------------ waiting

    def _prepare_wait(self) -> bool:
        from ledgerq.core.shared_process import housekeeper

        self._last_wait = time.monotonic()
        armed = housekeeper().arm(self)
        manager = self._manager
        assert isinstance(manager, SharedSegmentManager)
        if manager.wait_for_appender():
            return True  # another handle published an append we were woken for: look again
        return armed

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        remove = super().add_listener(callback)
        with self._lock:
            self._prepare_wait()
        return remove

    def _wake_from_outside(self) -> None:
        """Another process (or handle) may have made messages available: wake waiters.

        A listener (``ledgerq.aio``, the Celery transport) looks at once, in the thread it
        is woken into; an appender's write fires the file event before it publishes its
        tail, so the listener may find nothing yet.  A blocked ``dequeue`` waits for the
        appender before it sleeps (``_prepare_wait``); for the listeners that is done
        here: once the append under way is published, they are woken again.

        The housekeeper picks the live handles before it wakes them: one may close in
        between, and its files are gone then (the close woke its waiters already).
        """
        with self._lock:
            if self._closed:
                return
            if self._waits.waiting or self._waits.listeners:
                self._waits.wake()
                if self._waits.listeners:
                    manager = self._manager
                    assert isinstance(manager, SharedSegmentManager)
                    before = self._budget.limit(time.monotonic() + _HOUSEKEEPING_WAIT_S)
                    try:
                        if manager.wait_for_appender():
                            self._waits.wake()
                    except QueueBusyError:
                        pass  # a stopped appender: its bytes are not published anyway
                    finally:
                        self._budget.limit(before)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        from ledgerq.core.shared_process import housekeeper

        try:
            super().close()
        finally:
            housekeeper().unregister(self)

    def _check(self) -> None:
        with self._lock:
            self._manager.refresh()
            self._manager._check()
            for reader in self._readers.values():
                core = reader._core
                assert isinstance(core, SharedReaderCore)
                core.catch_up()
                core._check()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"handle={self.handle_id:016x}"
        return f"<ledgerq.Queue {self.path!r} shared {state}>"
