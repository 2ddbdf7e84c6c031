"""How a shared handle closes: what its close coordinates with the queue's other handles.

There is one close, ``Holdings.release`` (core/lifecycle.py): flush and close the
features, then close every reader - as the queue's last handle (one clean checkpoint,
no leases) or as one of several (its leases returned: RECLAIM) - save ``meta.json`` if
last, close the log, unlock.  :class:`SharedCloseSession` is what shared mode adds:

* whether this is the last handle is decided under ``shared/OPENING``, held from then
  to the end, so that no handle can start meanwhile: every other handle's liveness file
  can be locked (none lives).  The last then checkpoints each reader and saves
  ``meta.json`` clean, as an exclusive close does, and forgets the dead handles'
  liveness files; one that is not leaves them to the handles that stay (the
  reservation was saved when it was made, the queue's counters are in the page, which
  the last close saves);
* ``meta.json`` is read again and merged before it is saved (:func:`save_shared_meta`):
  other handles save it too;
* at the end, the handle lets go of its liveness file, the lock words' files, the
  reader locks, ``LOCK``, the state page, and ``OPENING`` last.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING

from ledgerq._errors import CorruptionError
from ledgerq._options import Options
from ledgerq.core.lifecycle import Holdings, MetaKeeper, Tally
from ledgerq.core.queue import DEFAULT_READER
from ledgerq.core.shared_appends import enqueued_count
from ledgerq.format.shared_state import SLOT_RESERVED_UNTIL
from ledgerq.segment.files import StorageError
from ledgerq.segment.lock import DirLock, LockFile
from ledgerq.segment.meta import DamagedMetaError
from ledgerq.segment.naming import OPENING_NAME, SHARED_DIR, handle_live_path, list_live_handles
from ledgerq.segment.shared_manager import SharedSegmentManager

if TYPE_CHECKING:
    from ledgerq.core.shared_queue import SharedQueueCore

__all__ = ["SharedCloseSession", "save_shared_meta"]

logger = logging.getLogger("ledgerq")


def save_shared_meta(
    keeper: MetaKeeper,
    manager: SharedSegmentManager,
    tally: Tally,
    options: Options | None,
    *,
    clean: bool,
    reserved_until: int = 0,
    dropped: int | None = None,
) -> None:
    """Save ``meta.json`` from a shared handle: read, merge, replace (append lock taken).

    Other handles save it too, so it is read again first: their corrupt regions and
    reservation are kept, ours (``reserved_until``: the ids this handle reserves) added.
    """
    manager.lock_appends()
    try:
        manager.refresh()
        store = keeper.store
        try:
            # (none yet: a new queue whose first save failed - this one writes it)
            fresh = store.load() if store.exists() else keeper.meta
        except (DamagedMetaError, CorruptionError):
            fresh = keeper.meta
        manager.remember_reported(
            [(int(a), int(b)) for a, b in fresh.corrupt_regions if isinstance(a, int)]
        )
        keeper.meta = fresh
        if dropped is not None:
            tally.dropped = dropped
        tally.lost = max(tally.lost, fresh.counters.get("lost", 0))
        page = manager.page
        next_id = manager.next_id
        reserved = max(page.get(SLOT_RESERVED_UNTIL), fresh.reserved_until, reserved_until)
        keeper.save(
            manager,
            options,
            tally,
            clean=clean,
            next_id=next_id,
            reserved_until=reserved,
            enqueued=enqueued_count(page, next_id),
        )
    finally:
        manager.unlock_appends()


class SharedCloseSession:
    """The close of shared ``queue``'s handle, coordinated with the others (see the module)."""

    __slots__ = (
        "_opening",
        "_opening_path",
        "_path",
        "append_file",
        "append_lock",
        "live",
        "page",
        "reader_locks",
    )

    def __init__(self, queue: SharedQueueCore) -> None:
        # Taken from the queue once, at open: the finalizer must not keep it alive.
        assert queue._live is not None  # (made once both are open: _close_session)
        assert queue._page is not None
        self._path = queue.path
        self.live = queue._live
        self.append_lock = queue._append_lock
        self.append_file = queue._append_file
        self.page = queue._page
        self.reader_locks = queue._reader_locks
        self._opening_path = os.path.join(queue.path, SHARED_DIR, OPENING_NAME)
        self._opening: LockFile | None = None

    def is_last(self, errors: list[Exception]) -> bool:
        try:
            opening = LockFile(self._opening_path)
        except StorageError as exc:
            errors.append(exc)
            return False
        self._opening = opening
        try:
            opening.acquire()
        except StorageError as exc:
            errors.append(exc)
            return False
        # (Not after a failure: the state is left as it is to the handles to come.)
        return not errors and self._others_gone()

    def _others_gone(self) -> bool:
        """Whether every other handle's liveness file can be locked: none lives (``OPENING``
        is held, so none can start meanwhile)."""
        own = self.live.path
        for handle in list_live_handles(self._path):
            path = handle_live_path(self._path, handle)
            if path == own:
                continue
            try:
                other = LockFile(path, create=False)
            except StorageError:
                continue  # gone meanwhile: closed
            try:
                if not other.try_acquire():
                    return False
            finally:
                other.close()
        return True

    def forget_others(self) -> None:
        for handle in list_live_handles(self._path):
            path = handle_live_path(self._path, handle)
            if path != self.live.path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def save_meta(
        self, holdings: Holdings, *, clean: bool, next_id: int, reserved_until: int, enqueued: int
    ) -> None:
        """Save meta.json as the last handle leaves it, by the rules of an exclusive close
        (``Holdings.save_meta_at_close``): not at all when it says that already (a read
        on a full disk keeps the disk reserve), with the reserve's room if needed, and a
        failure only logged (the file on disk is safe to reopen with).  ``next_id`` and
        ``enqueued`` are the log's and the page's, not this handle's."""
        manager = holdings.manager
        assert isinstance(manager, SharedSegmentManager)
        default = holdings.cores.get(DEFAULT_READER)
        dropped = default.counters.get("dropped", 0) if default is not None else None
        manager.lock_appends()
        try:
            manager.refresh()
            if dropped is not None:
                holdings.tally.dropped = dropped
            page = manager.page
            next_id = manager.next_id
            holdings.save_meta_at_close(
                clean=clean,
                next_id=next_id,
                reserved_until=max(page.get(SLOT_RESERVED_UNTIL), reserved_until),
                enqueued=enqueued_count(page, next_id),
                save=lambda: save_shared_meta(
                    holdings.keeper,
                    manager,
                    holdings.tally,
                    holdings.options,
                    clean=clean,
                    reserved_until=reserved_until,
                    dropped=dropped,
                ),
            )
        finally:
            manager.unlock_appends()

    def release(self, dirlock: DirLock) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.live.path)
        self.live.close()
        self.append_lock.close()
        self.append_file.close()
        for lock in self.reader_locks.values():
            lock.close()
        dirlock.release()
        self.page.close()
        opening, self._opening = self._opening, None
        if opening is not None:
            opening.close()
