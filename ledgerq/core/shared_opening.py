"""How a shared-mode handle opens: as the first of a session, or joining one (a part of
the shared queue core written apart).

``SharedOpening`` overrides the opening of :class:`~ledgerq.core.opening.Opening`:

* the directory lock: ``LOCK`` held shared by every handle, exclusively by the first
  handle of a session while it recovers the queue as an exclusive open does;
  ``shared/OPENING`` serialises the opens (``_lock_directory``, ``_open_locked``);
* this handle's liveness file, ``shared/<id>.live``, locked before it has its name
  (``_create_live_file``), and the dead handles' files cleaned up;
* the state page, ``shared/state``: made by the first handle, joined by the others,
  its lock words or flock files (``_join_page``, ``_step_lock``), the counters an older
  page kept carried over;
* the log, through the shared segment manager, and the disk reserve every handle
  shares (``_open_log``, ``_new_disk_reserve``).

``SharedTally`` is the queue-wide counters, kept in the page once it exists.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import struct
from typing import TYPE_CHECKING, cast

from ledgerq._errors import (
    CorruptionError,
    IncompatibleFormatError,
    QueueLockedError,
    StorageError,
)
from ledgerq.core.lifecycle import Tally
from ledgerq.core.opening import Opening
from ledgerq.core.shared_appends import SharedAppends
from ledgerq.core.shared_appends import enqueued_count as _enqueued
from ledgerq.core.shared_reader import SharedReaderCore
from ledgerq.format.shared_state import (
    APPEND_LOCK,
    LOCKING_FLOCK,
    LOCKING_WORDS,
    OLD_PAGE_SIZE,
    SHARED_VERSION,
    SLOT_CORRUPT_SKIPPED,
    SLOT_DUPLICATES,
    SLOT_ENQUEUED_BASE,
    SLOT_ENQUEUED_THROUGH,
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
)
from ledgerq.segment.scanner import CorruptRegion
from ledgerq.segment.segment import Segment
from ledgerq.segment.shared_manager import SharedSegmentManager
from ledgerq.segment.shared_page import SharedPage, write_page
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

if TYPE_CHECKING:
    from ledgerq.core.shared_queue import SharedQueueCore

__all__ = ["SharedOpening", "SharedTally"]


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


class SharedOpening(Opening):
    """The opening of :class:`~ledgerq.core.shared_queue.SharedQueueCore` (a mixin over
    the exclusive opening: its methods take the shared queue as ``self``)."""

    # The shared handle's own state (set by SharedQueueCore's constructor, and here).
    handle_id: int  # the holder of its leases, the owner its lock words hold
    _first: bool  # this handle started the session (no other had the queue open)
    _alone: bool  # ... and it is still opening: no other handle exists yet
    _opening: LockFile | None  # shared/OPENING, held while opening
    _live: LockFile | None  # shared/<id>.live, locked while the handle lives
    _page: SharedPage | None  # the state page, once made or joined
    _locking: int  # how the session locks: LOCKING_WORDS or LOCKING_FLOCK
    _liveness: Liveness
    _append_file: LockFile
    _append_lock: StepLock

    if TYPE_CHECKING:  # the shared queue's own methods, which opening calls

        def appends_locked(self) -> contextlib.AbstractContextManager[None]: ...

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

    def _new_disk_reserve(self) -> SharedDiskReserve:
        return SharedDiskReserve(os.path.join(self.path, RESERVE_NAME))

    def _attach_disk_reserve(self, page: SharedPage) -> None:
        reserve = self._disk_reserve
        assert isinstance(reserve, SharedDiskReserve)
        reserve.attach(page, self.appends_locked)
        manager = self._manager
        assert isinstance(manager, SharedSegmentManager)
        self._appends = SharedAppends(
            cast("SharedQueueCore", self), manager, page
        )  # the append pipeline's session

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
