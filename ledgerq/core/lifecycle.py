"""Closing a queue: by ``close()``, by the collector when it was never closed, never twice.

A queue dropped without ``close()`` kept its directory locked for the life of the
process (its sync thread kept it alive): in a notebook, running
``q = ledgerq.open(path)`` again failed.  STYLE.md forbids closing files in
``__del__``, so an open queue registers a :func:`weakref.finalize` instead, which holds
its :class:`Holdings` - everything the close needs, and nothing that refers back to the
queue object:

* the background flusher reaches the queue through a weak reference;
* features get a weak proxy of the queue at ``attach`` (the DLQ feature keeps one);
* the counters the close saves live in a :class:`Tally`, not on the queue;
* the segment manager reports corruption to the tally, not to a bound method.

So an unclosed queue that nothing uses any more is collected, and its finalizer does
what ``close()`` does - sync, checkpoint every reader, flush and close the features (its
DLQ too), save ``meta.json`` as a clean close, release the lock - and then warns with a
``ResourceWarning``, as an unclosed file does.  At interpreter exit a queue still open
is closed through its own ``close()`` (waiters woken, the lock taken), also with the
warning.  In a process forked from the one that opened it, neither does anything: the
files and the lock are the parent's (see :mod:`ledgerq.core.processes`).
"""

from __future__ import annotations

import errno
import functools
import logging
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ledgerq._options import Options, storable_options
from ledgerq.segment.files import StorageError
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.meta import Meta, MetaStore, OptionsCopy, OptionsStore
from ledgerq.segment.reserve import DiskReserve
from ledgerq.segment.scanner import CorruptRegion
from ledgerq.segment.segment import Segment

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore
    from ledgerq.core.reader import ReaderCore
    from ledgerq.segment.lock import DirLock

__all__ = [
    "AloneClose",
    "CloseSession",
    "Holdings",
    "MetaKeeper",
    "Tally",
    "attempt",
    "finalize_unclosed",
    "make_room",
]

logger = logging.getLogger("ledgerq")


def attempt(errors: list[Exception], step: Callable[[], object]) -> None:
    """Run one step of a close; note its error in ``errors`` and go on."""
    try:
        step()
    except Exception as exc:
        errors.append(exc)


class Tally:
    """Queue-wide counters off the hot paths, saved in ``meta.json``."""

    __slots__ = ("corrupt_skipped", "dropped", "duplicates", "lost")

    def __init__(self, counters: dict[str, int]) -> None:
        self.duplicates = counters.get("duplicates", 0)
        self.dropped = counters.get("dropped", 0)
        self.corrupt_skipped = counters.get("corrupt_skipped", 0)
        self.lost = counters.get("lost", 0)  # ids found missing between segments

    def on_corrupt(self, seg: Segment, region: CorruptRegion) -> None:
        """The segment manager met a corrupt region (counted once per region)."""
        self.corrupt_skipped += 1


class MetaKeeper:
    """``meta.json`` and the second copy of the stored options (``options.json``).

    Reachable without the queue (the finalizer saves through it).  ``options.json`` is
    rewritten only when the options change: a lost or damaged ``meta.json`` must not
    lose them (see ``segment.meta``).
    """

    __slots__ = (
        "copied_encryption",
        "copied_options",
        "meta",
        "options_store",
        "saved",
        "store",
    )

    def __init__(
        self,
        store: MetaStore,
        meta: Meta,
        options_store: OptionsStore,
        copied_options: dict[str, object] | None,
        copied_encryption: dict[str, str] | None = None,
    ) -> None:
        self.store = store
        self.meta = meta
        self.options_store = options_store
        self.copied_options = copied_options
        self.copied_encryption = copied_encryption or {}
        self.saved: tuple[object, ...] | None = None  # what the last save recorded

    @staticmethod
    def figures(
        manager: SegmentManager,
        tally: Tally,
        *,
        clean: bool,
        next_id: int,
        reserved_until: int,
        enqueued: int,
    ) -> tuple[object, ...]:
        """What a save records (to skip a save that would change nothing)."""
        return (
            clean,
            next_id,
            next_id if clean else reserved_until,  # as meta.json records it
            enqueued,
            tally.duplicates,
            tally.dropped,
            tally.corrupt_skipped,
            tally.lost,
            len(manager.reported_regions),
        )

    def note_loaded(self, manager: SegmentManager, tally: Tally) -> None:
        """Take the meta.json just loaded as the last save: a close that changes nothing
        then writes nothing (a read on a full disk must not spend the disk reserve)."""
        meta = self.meta
        self.saved = self.figures(
            manager,
            tally,
            clean=meta.clean,
            next_id=meta.next_id,
            reserved_until=meta.reserved_until,
            enqueued=int(meta.counters.get("enqueued", 0)),
        )

    def record_gap(self, first: int, last: int) -> None:
        """Record, durably, that ids ``first..last`` will never be written (a rotation
        skips them); called before the segment that leaves them out exists."""
        meta = self.meta
        if meta.gaps_from is None:
            meta.gaps_from = first
        meta.gaps.append([first, last])
        self.store.save(meta)

    def save(
        self,
        manager: SegmentManager,
        options: Options | None,
        tally: Tally,
        *,
        clean: bool,
        next_id: int,
        reserved_until: int,
        enqueued: int,
    ) -> None:
        """Durably record the id reservation, the counters and the options.

        ``options`` None keeps the options meta.json holds (a handle that does not
        remember the options it was opened with).
        """
        figures = self.figures(
            manager,
            tally,
            clean=clean,
            next_id=next_id,
            reserved_until=reserved_until,
            enqueued=enqueued,
        )
        meta = self.meta
        meta.clean = clean
        meta.next_id = next_id
        meta.reserved_until = next_id if clean else reserved_until
        meta.counters = {
            "enqueued": enqueued,
            "enqueued_through": next_id,
            "duplicates": tally.duplicates,
            "dropped": tally.dropped,
            "corrupt_skipped": tally.corrupt_skipped,
            "lost": tally.lost,
        }
        meta.corrupt_regions = [list(key) for key in manager.reported_regions][-10_000:]
        # Ranges below the oldest segment are no longer between segments: forget them.
        oldest = manager.segments[0].first_id
        for ranges in (meta.gaps, meta.lost, meta.known_lost):
            ranges[:] = [r for r in ranges if r[1] >= oldest]
        if options is not None:
            meta.options = storable_options(options)  # never the encryption key
        if (
            options is not None and meta.options != self.copied_options
        ) or meta.encryption != self.copied_encryption:
            self.options_store.save(
                OptionsCopy(
                    created_ns=meta.created_ns, options=meta.options, encryption=meta.encryption
                )
            )
            self.copied_options = meta.options
            self.copied_encryption = meta.encryption
        self.store.save(meta)
        self.saved = figures


class CloseSession(Protocol):
    """What the close of a handle (:meth:`Holdings.release`, the one close of both
    modes) coordinates with the queue's other handles, in the order it is called.

    :class:`AloneClose` is a handle alone with its queue (exclusive mode);
    ``core.shared_close.SharedCloseSession`` a shared handle's.
    """

    def is_last(self, errors: list[Exception]) -> bool:
        """Whether this handle is the queue's last live one (then its readers are
        checkpointed clean and ``meta.json`` saved as a clean close says); what
        decides it stays held until :meth:`release`.  A failure goes in ``errors``."""
        ...

    def forget_others(self) -> None:
        """As the last handle: forget the dead handles' traces."""
        ...

    def save_meta(
        self, holdings: Holdings, *, clean: bool, next_id: int, reserved_until: int, enqueued: int
    ) -> None:
        """As the last handle: save ``meta.json`` as a close leaves it."""
        ...

    def release(self, dirlock: DirLock) -> None:
        """Let go of what the handle holds to coordinate, and of the queue's ``LOCK``."""
        ...


class AloneClose:
    """The close of a handle alone with its queue: the last, nothing to coordinate."""

    __slots__ = ()

    def is_last(self, errors: list[Exception]) -> bool:
        return True

    def forget_others(self) -> None:
        pass

    def save_meta(
        self, holdings: Holdings, *, clean: bool, next_id: int, reserved_until: int, enqueued: int
    ) -> None:
        holdings.save_meta_at_close(
            clean=clean, next_id=next_id, reserved_until=reserved_until, enqueued=enqueued
        )

    def release(self, dirlock: DirLock) -> None:
        dirlock.release()


class Holdings:
    """What an open queue must release, reachable without the queue object.

    ``cores`` is the queue's own dict of reader cores (readers opened later are in
    it too); ``queue`` a weak reference to the queue, alive only when the finalizer
    runs at interpreter exit; ``session`` what the close coordinates with the other
    handles (the queue's ``_close_session()``).
    """

    __slots__ = (
        "cores",
        "dirlock",
        "disk_reserve",
        "features",
        "flusher",
        "forked",
        "keeper",
        "lock",
        "manager",
        "options",
        "path",
        "queue",
        "session",
        "stop_flusher",
        "tally",
    )

    def __init__(self, queue: QueueCore) -> None:
        # Taken from the queue once, at open: the finalizer must not keep it alive.
        self.path = queue.path
        # None: the handle does not store its options (``remember_options=False``).
        self.options: Options | None = queue.options if queue._remember_options else None
        self.queue = weakref.ref(queue)
        self.lock = queue._lock
        self.manager = queue._manager
        self.cores = queue._cores
        self.features = queue._features
        self.keeper = queue._keeper
        self.tally = queue._tally
        self.dirlock = queue._dirlock
        self.stop_flusher = queue._stop_flusher
        self.flusher = queue._flusher
        self.disk_reserve = queue._disk_reserve
        self.session: CloseSession = queue._close_session()
        self.forked = False  # set in a forked child: nothing here is this process's

    def release(self, *, next_id: int, reserved_until: int, enqueued: int) -> list[Exception]:
        """Stop the flusher, sync, close the features and every reader, save, unlock.

        The close of both modes; what differs is the :class:`CloseSession`'s.  The
        features first (in shared mode they write under the append lock, which must
        not be taken while ``shared/OPENING`` is held); then the session says whether
        this is the queue's last handle: the last checkpoints each reader clean (no
        leases: they are all lost) and saves ``meta.json``; any other returns its
        leases (RECLAIM) and leaves the rest to the handles that stay.  Every step
        runs even if an earlier one fails - each file is closed, the DLQ too, and the
        lock is released; returns the errors in order.
        """
        self.stop_flusher.set()
        flusher = self.flusher
        # The finalizer may run in the flusher itself (it dropped the last reference).
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join()
        errors: list[Exception] = []
        session = self.session
        try:
            with self.lock:
                attempt(errors, self.manager.sync)
                for feature in self.features:
                    attempt(errors, feature.flush)
                    attempt(errors, feature.close)
                last = session.is_last(errors)
                for core in self.cores.values():
                    if last:
                        attempt(errors, functools.partial(core.close_last, self.with_room))
                    else:
                        attempt(errors, core.close)
                    attempt(errors, core.journal.close)  # if its checkpoint failed
                if last:
                    attempt(errors, session.forget_others)
                    # "Clean" lets the next open trust next_id alone; after a failure it
                    # skips the reserved ids as after a crash (ids are never reused).
                    attempt(
                        errors,
                        lambda: session.save_meta(
                            self,
                            clean=not errors,
                            next_id=next_id,
                            reserved_until=reserved_until,
                            enqueued=enqueued,
                        ),
                    )
                attempt(errors, self.manager.close)
        finally:
            session.release(self.dirlock)
        return errors

    def save_meta_at_close(
        self,
        *,
        clean: bool,
        next_id: int,
        reserved_until: int,
        enqueued: int,
        save: Callable[[], object] | None = None,
    ) -> None:
        """Save meta.json as a close leaves it, unless it says that already.

        ``save`` writes it (default: the keeper's save of these figures; a shared handle
        merges with the file first).  Like a checkpoint, the save may use the reserve on
        a full disk; if it still fails, the file on disk is safe to reopen with (its
        reservation covers every id written), so the failure is logged: only figures
        such as ``stats().dropped`` may then be behind after the next open.
        """
        keeper = self.keeper
        figures = keeper.figures(
            self.manager,
            self.tally,
            clean=clean,
            next_id=next_id,
            reserved_until=reserved_until,
            enqueued=enqueued,
        )
        if keeper.saved == figures:
            return
        if save is None:

            def save() -> None:
                keeper.save(
                    self.manager,
                    self.options,
                    self.tally,
                    clean=clean,
                    next_id=next_id,
                    reserved_until=reserved_until,
                    enqueued=enqueued,
                )

        try:
            self.with_room(save)
        except StorageError as exc:
            logger.warning(
                "ledgerq: %s; the next open skips the ids reserved before (never reused) "
                "and its counters of duplicates and dropped messages may be behind",
                exc,
            )

    def with_room(self, write: Callable[[], object]) -> None:
        """Run ``write``; if the disk is full, once more with the reserve's space."""
        try:
            write()
        except StorageError as exc:
            if exc.errno != errno.ENOSPC or not self.make_room():
                raise
            write()

    def make_room(self) -> bool:
        """See :func:`make_room`."""
        return make_room(self.disk_reserve, self.cores, self.queue, self.path)


def make_room(
    reserve: DiskReserve,
    cores: dict[str, ReaderCore],
    queue_ref: weakref.ref[QueueCore],
    path: str,
) -> bool:
    """A write that draining the queue needs met a full disk: release the reserve.

    True if that freed space (the write is tried again).  From then on enqueues refuse
    until the reserve can be written again (the append gate is closed: the queue's slow
    append path checks the reserve), and journals compact early.  Called with the queue
    lock held (a reader journal's ``on_full``).  Holds the queue only weakly.
    """
    if not reserve.release():
        return False
    logger.warning(
        "ledgerq: the disk of %s is full: released its %d KiB reserve so that acks can "
        "go on; enqueues refuse until that much space is free again",
        path,
        reserve.size // 1024,
    )
    queue = queue_ref()
    if queue is not None:
        queue._append_gate = 0  # close the append gate: _reserve_ids checks the reserve
    for core in cores.values():
        core.journal.set_low_space(True)
    return True


def finalize_unclosed(holdings: Holdings) -> None:
    """Close a queue that was never closed (``weakref.finalize``), then warn.

    Called when the queue is collected (it is gone: the holdings are all there is) or
    at interpreter exit (it may still be alive: then its own ``close()`` runs).
    """
    if holdings.forked:
        return
    queue = holdings.queue()
    errors: list[Exception] = []
    if queue is not None:
        attempt(errors, queue.close)
    else:
        manager = holdings.manager
        meta = holdings.keeper.meta
        counters = meta.counters
        next_id = manager.next_id
        # Every id handed out since the last save was one enqueued message.
        enqueued = counters.get("enqueued", 0) + next_id - counters.get("enqueued_through", next_id)
        errors = holdings.release(
            next_id=next_id, reserved_until=meta.reserved_until, enqueued=enqueued
        )
    for exc in errors:  # nobody to raise them to
        logger.error("ledgerq: closing the unclosed queue %s: %s", holdings.path, exc)
    # After the close: where warnings are errors, the files are closed all the same.
    warnings.warn(
        f"unclosed ledgerq queue {holdings.path!r}: closed when collected; call close() "
        "or open it in a `with` block",
        ResourceWarning,
        stacklevel=2,
    )
