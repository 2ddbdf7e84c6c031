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
import errno
import functools
import logging
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator

from ledgerq._errors import (
    CorruptionError,
    IncompatibleFormatError,
    QueueBusyError,
    QueueClosedError,
    QueueLockedError,
    StorageError,
)
from ledgerq._options import Options
from ledgerq.core.args import DEFAULT_LOCK_TIMEOUT, READER_NAME
from ledgerq.core.clock import Clock
from ledgerq.core.feature import Feature
from ledgerq.core.journal import ReaderJournal, ReaderRemovedError, SharedReaderJournal
from ledgerq.core.lifecycle import CloseSession, Tally
from ledgerq.core.queue import QueueCore
from ledgerq.core.reader import ReaderCore, initial_checkpoint
from ledgerq.core.reader_handle import Reader
from ledgerq.core.retry import RetryPolicy
from ledgerq.core.shared_appends import SharedAppends
from ledgerq.core.shared_appends import enqueued_count as _enqueued
from ledgerq.core.shared_close import SharedCloseSession, save_shared_meta
from ledgerq.core.shared_reader import SharedReaderCore, read_published_head
from ledgerq.format.shared_state import (
    APPEND_LOCK,
    LOCK_BLOCK_SIZE,
    LOCKING_FLOCK,
    LOCKING_WORDS,
    OLD_PAGE_SIZE,
    SHARED_VERSION,
    SLOT_CORRUPT_SKIPPED,
    SLOT_DUPLICATES,
    SLOT_ENQUEUED_BASE,
    SLOT_ENQUEUED_THROUGH,
    SLOT_LOCK,
    SLOT_LOCKING,
    SLOT_RESERVED_UNTIL,
    encode_page,
    page_problem,
    page_version,
)
from ledgerq.segment.files import make_durable_dir, storage_errors
from ledgerq.segment.lock import DirLock, LockFile
from ledgerq.segment.meta import DamagedMetaError, Meta
from ledgerq.segment.naming import (
    APPEND_NAME,
    LIVE_SUFFIX,
    OPENING_NAME,
    RESERVE_NAME,
    SHARED_DIR,
    SHARED_STATE_NAME,
    TMP_SUFFIX,
    handle_live_path,
    list_live_handles,
    list_reader_names,
    reader_lock_path,
)
from ledgerq.segment.readonly_state import replay_reader
from ledgerq.segment.scanner import CorruptRegion
from ledgerq.segment.segment import Segment
from ledgerq.segment.shared_manager import SharedSegmentManager
from ledgerq.segment.shared_page import FeatureLogWord, JournalSlot, SharedPage, write_page
from ledgerq.segment.shared_reserve import SharedDiskReserve
from ledgerq.segment.steplock import (
    Alone,
    FileStepLock,
    Liveness,
    LockHolder,
    StepLock,
    WordLock,
    decode_liveness,
    encode_liveness,
    wants_lock_words,
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


class _PageCounter:
    """A counter of :class:`SharedTally`: the state page's slot once the tally is
    attached to the page, a value of the tally's own before (``local``)."""

    __slots__ = ("local", "slot")

    def __init__(self, slot: int, local: str) -> None:
        self.slot = slot
        self.local = local

    def __get__(self, tally: SharedTally, owner: object = None) -> int:
        page = tally._page
        return page.get(self.slot) if page is not None else int(getattr(tally, self.local))

    def __set__(self, tally: SharedTally, value: int) -> None:
        page = tally._page
        if page is not None:
            page.set(self.slot, value)
        else:
            setattr(tally, self.local, value)


class SharedTally(Tally):
    """The queue-wide counters of a shared-mode handle: the state page's, once attached.

    ``duplicates`` and ``corrupt_skipped`` live in the page (changed under the append
    lock), so every handle reports the same; until the page exists (the first
    handle's recovery) they are kept here.
    """

    __slots__ = ("_corrupt", "_dups", "_page")

    duplicates = _PageCounter(SLOT_DUPLICATES, "_dups")
    corrupt_skipped = _PageCounter(SLOT_CORRUPT_SKIPPED, "_corrupt")

    def __init__(self, counters: dict[str, int]) -> None:
        self._page: SharedPage | None = None
        self._dups = counters.get("duplicates", 0)
        self._corrupt = counters.get("corrupt_skipped", 0)
        self.dropped = counters.get("dropped", 0)
        self.lost = counters.get("lost", 0)

    def attach(self, page: SharedPage) -> None:
        """Count in ``page`` from now on (it holds the values already)."""
        self._page = page

    def on_corrupt(self, seg: Segment, region: CorruptRegion) -> None:
        self.corrupt_skipped += 1


class SharedQueueCore(QueueCore):
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

    def _lock_directory(self) -> DirLock:
        shared_dir = os.path.join(self.path, SHARED_DIR)
        make_durable_dir(shared_dir)
        opening = LockFile(os.path.join(shared_dir, OPENING_NAME))
        try:
            # Opens are one at a time (the first one recovers alone); an opener or a
            # closer stopped under OPENING keeps this one waiting lock_timeout at most.
            if not opening.acquire_by(self._budget.deadline()):
                raise QueueLockedError(
                    self.path,
                    held_by="shared",
                    detail=f"is being opened or closed by a shared-mode handle that has held "
                    f"shared/{OPENING_NAME} for more than {self._budget.lock_timeout:g} s "
                    "(a stopped process?); try again later, or open with a larger "
                    "lock_timeout",
                )
            try:
                lock = DirLock(self.path, mode="first")
                self._first = self._alone = True
            except QueueLockedError:
                try:
                    lock = DirLock(self.path, mode="shared")
                except QueueLockedError:
                    raise QueueLockedError(self.path, held_by="exclusive") from None
            try:
                # Before any lock word is taken: a waiter that finds this handle owning
                # one judges its liveness by this file (segment.steplock).
                self._live = self._create_live_file()
            except BaseException:
                lock.release()
                raise
        except BaseException:
            opening.close()
            raise
        self._opening = opening
        return lock

    def _open_locked(self) -> None:
        try:
            super()._open_locked()
            page = self._page
            assert page is not None
            if self._first:
                # The counters as the recovery found them (meta.json may have been rebuilt).
                page.set(SLOT_ENQUEUED_BASE, self._enqueued)
                page.set(SLOT_ENQUEUED_THROUGH, self._next_id)
                for core in self._cores.values():
                    assert isinstance(core, SharedReaderCore)
                    core.publish_head(moved=True)  # a new session: forget older values
                self._alone = False
                self._dirlock.downgrade()  # now others may join
            self._holdings = self._new_holdings()
        finally:
            opening, self._opening = self._opening, None
            if opening is not None:
                opening.close()

    def _create_live_file(self) -> LockFile:
        """Create this handle's liveness file, locked before it has its name.

        Another process's housekeeper may look at ``shared/`` at any moment: a ``.live``
        file it could lock, it would take for a dead handle's.  So the file is locked
        under a temporary name and renamed into place (the lock stays with the file).
        """
        final = handle_live_path(self.path, self.handle_id)
        live = LockFile(final + TMP_SUFFIX)
        try:
            if not live.try_acquire():  # pragma: no cover - a 64-bit random id taken
                raise StorageError(
                    "lock the liveness file", live.path, OSError(0, "held by another handle")
                )
            with contextlib.suppress(OSError):
                # Who this handle is, for a waiter deciding whether it is dead (its pid
                # gone, or reused by a process that started at another time).  On a full
                # disk the file stays empty: its flock says it all (segment.steplock).
                os.ftruncate(live.fd, 0)
                os.pwrite(live.fd, encode_liveness(), 0)
            with storage_errors("name the liveness file", final):
                os.replace(live.path, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(live.path)
            live.close()
            raise
        live.path = final
        return live

    def _open_log(self, meta: Meta) -> bool:
        shared_dir = os.path.join(self.path, SHARED_DIR)
        self._append_file = LockFile(os.path.join(shared_dir, APPEND_NAME))
        self._append_lock: StepLock = Alone()  # (the first handle: until the page exists)
        tally = SharedTally(meta.counters)
        self._tally = tally
        page_path = os.path.join(shared_dir, SHARED_STATE_NAME)
        if self._first:
            self._manager = self._new_shared_manager(None)
            self._recover_log(meta)
            # (not before: a recovery that met a full disk ran again, with the disk
            # reserve's space, on a new manager - the first one is closed)
            manager = self._manager
            assert isinstance(manager, SharedSegmentManager)
            self._reserve_first_ids()
            self._forget_dead_handles()
            old = self._old_page_counters(page_path)
            counters = {
                "duplicates": max(tally.duplicates, old.get("duplicates", 0)),
                "corrupt_skipped": max(tally.corrupt_skipped, old.get("corrupt_skipped", 0)),
                "enqueued_base": self._enqueued,
                "enqueued_through": self._next_id,
            }
            manager.generation = 1
            # How the session's handles exclude each other, for every one that joins.
            self._locking = LOCKING_WORDS if wants_lock_words() else LOCKING_FLOCK

            def write() -> None:
                counters["reserve_spent"] = 0 if self._disk_reserve.is_held else 1
                write_page(
                    page_path,
                    encode_page(
                        manager.current_tail(),
                        reserved_until=self._ids_reserved_until,
                        counters=counters,
                        locking=self._locking,
                    ),
                )

            try:
                write()
            except StorageError as exc:
                # A full disk must not lock the user out (a drain opens shared too, e.g.
                # `ledgerq dequeue`): the page's first block comes from the disk reserve.
                if exc.errno != errno.ENOSPC or not self._make_room():
                    raise
                write()
            page = SharedPage(page_path)
            self._page = page
            manager.page = page
            self._append_lock = self._step_lock(APPEND_LOCK, self._append_file, "the append lock")
            manager.set_append_lock(self._append_lock)
            tally.attach(page)
            self._attach_disk_reserve(page)
            manager.set_claim_region(self._claim_region)
            return True
        page = SharedPage(page_path)
        self._page = page
        self._locking = self._join_page(page, page_path)
        self._append_lock = self._step_lock(APPEND_LOCK, self._append_file, "the append lock")
        manager = self._new_shared_manager(page)
        self._manager = manager
        tally.attach(page)
        with storage_errors("open the segments in", manager.directory):
            manager.join()
        self._next_id = manager.next_id
        self._start_clock()
        self._attach_disk_reserve(page)
        self._disk_reserve.ensure()  # the queue's: written if missing and there is room
        self._ids_reserved_until = page.get(SLOT_RESERVED_UNTIL)
        # The append gate (see QueueCore._reserve_first_ids): closed while the reserve
        # is spent (the page's word is checked at every append too).
        self._append_gate = self._ids_reserved_until if self._disk_reserve.is_held else 0
        self._enqueued = _enqueued(page, self._next_id)  # (stats() reads the page)
        return False

    def _join_page(self, page: SharedPage, page_path: str) -> int:
        """Check the page of a session this handle joins; return how its handles lock.

        Nothing is written when it refuses: a page of another ledgerq's session (older:
        its handles would not see our lock words, or read format 1; newer: we would not
        know its layout), a damaged page, or one that asks for lock words where the
        ``atomicshm`` package cannot be imported here.
        """
        version = page_version(page.memory[:64])
        if version is not None and version != SHARED_VERSION:
            if version < SHARED_VERSION:
                why = {
                    3: "which write the feature logs without saying so in the page, so this "
                    "ledgerq's handles would miss what they write",
                    2: "which lock with flock, and this ledgerq's lock words do not exclude them",
                }.get(version, "which write format 1, and this ledgerq writes format 2")
                age = f"an older ledgerq (state page version {version}), {why}"
            else:
                age = (
                    f"a newer ledgerq (state page version {version}, this one knows "
                    f"{SHARED_VERSION})"
                )
            raise IncompatibleFormatError(
                f"queue {self.path!r} is open in shared mode by handles of {age}: close them, "
                "then open the queue here (or open it with that ledgerq); nothing was written"
            )
        problem = page.problem()
        if problem and not problem.startswith("the published tail"):
            raise CorruptionError(
                f"the shared-mode state page is damaged ({problem}); close every handle of "
                "the queue and open it again (the first handle rebuilds it)",
                page_path,
            )
        locking = page.get(SLOT_LOCKING)
        if locking == LOCKING_WORDS and page.atomics is None:
            raise IncompatibleFormatError(
                f"queue {self.path!r} is open in shared mode by handles that lock with lock "
                "words, which need the atomicshm package, and it cannot be imported here: "
                "install it (pip install atomicshm; ledgerq depends on it), or close the "
                "other handles first (a session started here locks with flock files)"
            )
        return locking

    def _step_lock(self, offset: int, lock_file: LockFile, what: str) -> StepLock:
        """The lock whose block is at ``offset`` of the page, as the session locks."""
        page = self._page
        assert page is not None
        if self._locking == LOCKING_WORDS:
            return WordLock(page.atomics, page.address, offset, self._lock_holder, what=what)
        return FileStepLock(lock_file, page.memory, offset, self._lock_holder, what=what)

    @functools.cached_property
    def _lock_holder(self) -> LockHolder:
        """This handle as its step locks know it (made at the first lock, once the
        budget exists)."""
        return LockHolder(self.handle_id, self.path, self._budget, self._liveness)

    def _describe_handle(self, handle_id: int) -> tuple[int, int | None] | None:
        """What another handle's liveness file says of it (None: there is none; (0,
        None): it says nothing)."""
        try:
            with open(handle_live_path(self.path, handle_id), "rb") as f:
                return decode_liveness(f.read(64)) or (0, None)
        except FileNotFoundError:
            return None

    def _probe_handle(self, handle_id: int) -> bool:
        """Whether another handle's liveness file can be locked: its holder is dead."""
        try:
            probe = LockFile(handle_live_path(self.path, handle_id), create=False)
        except StorageError:
            return True  # gone meanwhile
        try:
            return probe.try_acquire()
        finally:
            probe.close()

    def feature_log_word(self, path: str) -> FeatureLogWord | None:
        """The change word of the feature log ``path`` in the session's page."""
        page = self._page
        return None if page is None else FeatureLogWord.of(page, os.path.basename(path))

    def _new_disk_reserve(self) -> SharedDiskReserve:
        return SharedDiskReserve(os.path.join(self.path, RESERVE_NAME))

    def _attach_disk_reserve(self, page: SharedPage) -> None:
        reserve = self._disk_reserve
        assert isinstance(reserve, SharedDiskReserve)
        reserve.attach(page, self.appends_locked)
        manager = self._manager
        assert isinstance(manager, SharedSegmentManager)
        self._appends = SharedAppends(self, manager, page)  # the append pipeline's session

    def _new_shared_manager(self, page: SharedPage | None) -> SharedSegmentManager:
        opts = self.options
        return SharedSegmentManager(
            self.path,
            page=page,  # type: ignore[arg-type] # set once the first handle wrote it
            append_lock=self._append_lock,
            segment_size=opts.segment_size,
            index_interval=opts.index_interval,
            on_corrupt=self._tally.on_corrupt,
            on_gap=self._keeper.record_gap,
            claim_region=self._claim_region if page is not None else None,
            sync_on_rotate=opts.sync == "always",
        )

    @staticmethod
    def _old_page_counters(path: str) -> dict[str, int]:
        """The counters a previous session's page holds (it may be ahead of meta.json)."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return {}
        # A format-1 page (version 1: its tail's checksum is CRC-32) holds the same slots.
        version = page_version(data)
        if version is None or version > SHARED_VERSION or len(data) < OLD_PAGE_SIZE:
            return {}
        if version == SHARED_VERSION and page_problem(data):
            return {}
        return {
            "duplicates": struct.unpack_from("<Q", data, SLOT_DUPLICATES)[0],
            "corrupt_skipped": struct.unpack_from("<Q", data, SLOT_CORRUPT_SKIPPED)[0],
        }

    def _forget_dead_handles(self) -> None:
        """The first handle: every ``.live`` file there but its own is a dead handle's (and
        every ``.live.tmp``: a handle that died while creating its own)."""
        for handle in list_live_handles(self.path):
            if handle == self.handle_id:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(handle_live_path(self.path, handle))
        shared_dir = os.path.join(self.path, SHARED_DIR)
        for name in os.listdir(shared_dir):
            if name.endswith(LIVE_SUFFIX + TMP_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(shared_dir, name))

    def _claim_region(self, first_id: int, offset: int) -> bool:
        """Whether a corrupt region is new to the queue; record it (append lock held)."""
        store = self._meta_store
        try:
            meta = store.load()
        except (DamagedMetaError, CorruptionError):
            meta = self._meta
        if [first_id, offset] in meta.corrupt_regions:
            return False
        meta.corrupt_regions.append([first_id, offset])
        meta.corrupt_regions[:] = meta.corrupt_regions[-10_000:]
        store.save(meta)
        self._keeper.meta = meta
        return True

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
        """
        with self._lock:
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
