"""Opening a queue: the directory, its lock, ``meta.json``, recovery and the first state.

:class:`Opening` is the part of :class:`~ledgerq.core.queue.QueueCore` that runs once,
in its constructor: it checks and locks the directory, loads (or rebuilds) ``meta.json``,
opens the sealer of an encrypted queue, recovers the segments (an exclusive open always
does; a shared one only when it is the first handle: core/shared_queue), reserves the
first ids, starts the queue's clock, sorts the features' hooks into the lists the
append paths walk, and opens every reader on disk.  Closing is core/lifecycle's; what
runs between the two is the queue's.

Every attribute these methods set is declared here, with its type.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING, cast

from ledgerq._errors import CorruptionError, NotAQueueError, QueueLockedError, StorageError
from ledgerq.core.args import READER_NAME
from ledgerq.core.backlog import Backlog
from ledgerq.core.clock import QueueClock
from ledgerq.core.feature import Feature, HandoffTaker, KeyAdmitter
from ledgerq.core.lifecycle import AloneClose, CloseSession, Holdings, MetaKeeper, Tally, make_room
from ledgerq.core.processes import tracked
from ledgerq.core.queue_state import QueueState
from ledgerq.core.reader import ReaderHooks
from ledgerq.core.waits import Waits
from ledgerq.format.entry import encode_delayed_entry, encode_plain_batch_parts, encode_plain_entry
from ledgerq.format.sealing import EntrySealer
from ledgerq.segment.encryption import digest_key_for, new_encryption_block, sealer_for
from ledgerq.segment.files import make_durable_dir, storage_errors
from ledgerq.segment.layout import subtract_ranges
from ledgerq.segment.lock import DirLock, LockFile, lock_mode_holding
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.meta import (
    ID_BLOCK,
    DamagedMetaError,
    Meta,
    MetaStore,
    OptionsCopy,
    OptionsStore,
    holds_queue_data,
)
from ledgerq.segment.meta_rebuild import rebuild_meta
from ledgerq.segment.naming import (
    META_NAME,
    OPENING_NAME,
    OPTIONS_NAME,
    QUEUE_NAMES,
    READERS_DIR,
    RESERVE_NAME,
    SHARED_DIR,
    STATE_SUFFIX,
)
from ledgerq.segment.readonly_state import replay_reader
from ledgerq.segment.reserve import DiskReserve
from ledgerq.segment.sync import GroupCommit

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["DEFAULT_READER", "Opening"]

logger = logging.getLogger("ledgerq")

DEFAULT_READER = "default"

_PERMISSION_HINT = (
    "this user needs read, write and search (x) permission on the "
    "queue directory and search permission on every directory above it; fix the owner "
    "or mode, or run as the user that owns the queue"
)


def _look_up(path: str, what: str) -> bool:
    """Whether ``path`` exists; :class:`StorageError` if this user may not know."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return False  # a file on the way: the caller reports what is there
    except OSError as exc:
        hint = _PERMISSION_HINT if exc.errno in (errno.EACCES, errno.EPERM) else None
        raise StorageError(f"look up {what}", path, exc, hint=hint) from exc
    return True


def _flush_in_background(
    queue_ref: weakref.ref[QueueCore], stop: threading.Event, interval: float
) -> None:
    """The ``sync="interval"`` thread: fsync what is dirty every ``interval`` seconds.

    It holds the queue only weakly, and strongly only during one flush: a queue
    dropped without ``close()`` is collected (and closed by its finalizer).
    """
    while not stop.wait(interval):
        queue = queue_ref()
        if queue is None:
            return
        try:
            queue._flush_once()
        except Exception:  # keep flushing; the next attempt may succeed
            logger.exception("ledgerq: background sync of %s failed", queue.path)
        del queue  # the last reference may go here: the finalizer then runs in this thread


class Opening(QueueState):
    """The opening half of :class:`~ledgerq.core.queue.QueueCore` (a mixin: its methods
    take the queue as ``self``; shared mode's core overrides the locking, the log's
    opening and the disk reserve)."""

    def _prepare_directory(self) -> None:
        path = self.path
        # os.path.exists/isdir say False for a path this user may not reach: look with
        # stat, so that a permission problem is reported as one, not as a directory to
        # create (mkdir then fails with "permission denied" on a directory that exists).
        exists = _look_up(path, "the queue directory")
        if exists and not os.path.isdir(path):
            raise NotAQueueError(f"{path} exists and is not a directory")
        if not exists:
            try:
                make_durable_dir(path)  # its entry in the parent must survive a power cut too
            except StorageError as exc:
                cause = exc.__cause__
                if exc.errno not in (errno.EACCES, errno.EPERM) or not isinstance(cause, OSError):
                    raise
                # make_durable_dir creates missing parents too: say where it was refused.
                refused_in = os.path.dirname(exc.path)
                raise StorageError(
                    "create the queue directory",
                    path,
                    cause,
                    hint=f"this user may not create directories in {refused_in}; create "
                    f"{path} with the right owner, or open a path this user may write",
                ) from exc
        if not _look_up(os.path.join(path, META_NAME), "the meta file"):
            with storage_errors("list the queue directory", path):
                try:
                    names = os.listdir(path)
                except PermissionError as exc:
                    raise StorageError(
                        "list the queue directory", path, exc, hint=_PERMISSION_HINT
                    ) from exc
            foreign = [n for n in names if n not in QUEUE_NAMES]
            if foreign:
                raise NotAQueueError(
                    f"{path} is not a ledgerq queue (it holds {sorted(foreign)[:3]} but no "
                    f"{META_NAME}); use an empty or new directory"
                )

    def _lock_directory(self) -> DirLock:
        try:
            return DirLock(self.path)
        except QueueLockedError:
            pass
        if any(
            isinstance(obj, Opening)
            and obj.path == self.path
            and not obj._closed
            and not obj.shared
            for obj in tracked()
        ):
            # A queue of this process holds it.  Unclosed and unreferenced, it may be
            # garbage in a reference cycle, which its finalizer closes once collected.
            gc.collect()
            try:
                return DirLock(self.path)
            except QueueLockedError:
                raise QueueLockedError(self.path, in_this_process=True) from None
        opening_path = os.path.join(self.path, SHARED_DIR, OPENING_NAME)
        if os.path.exists(opening_path):
            # A shared-mode handle holds the lock exclusively while it recovers the queue
            # (under shared/OPENING): wait for that (up to lock_timeout: a stopped opener
            # must not hold this open forever), then look again.
            opening = LockFile(opening_path, create=False)
            try:
                if opening.acquire_by(self._budget.deadline()):
                    with contextlib.suppress(QueueLockedError):
                        return DirLock(self.path)
            finally:
                opening.close()
        raise QueueLockedError(self.path, held_by=lock_mode_holding(self.path))

    def _open_locked(self) -> None:
        queue = cast("QueueCore", self)  # what it is: opening is a part of it
        opts = self.options
        self._waits = waits = Waits()  # (readers share it: core/waits.py)
        waits.prepare_wait = self._prepare_wait
        waits.fire_timer = self._fire_timer
        self._lock = waits.lock
        self._closed = False
        self._meta_store = MetaStore(self.path)
        self._options_store = OptionsStore(self.path)
        copy = self._options_store.load()
        meta = self._load_meta(copy)
        self._meta = meta
        self._sealer = self._open_sealer(meta)
        self._keeper = MetaKeeper(
            self._meta_store,
            meta,
            self._options_store,
            copy.options if copy else None,
            copy.encryption if copy else None,
        )
        counters = meta.counters
        self._disk_reserve = self._new_disk_reserve()
        # Not a method of the queue (see lifecycle): the journals keep it.
        self._make_room = functools.partial(
            make_room, self._disk_reserve, self._cores, weakref.ref(queue), self.path
        )
        recovering = self._open_log(meta)
        self._log_commit = GroupCommit(self._manager.sync_active)
        self._sync_always = opts.sync == "always"
        self._register_hooks()
        # Periodic jobs (a Timer feature; its next due time is Waits.timer_ns).
        self._timer = None
        make_durable_dir(os.path.join(self.path, READERS_DIR))
        # A weak proxy: a feature that keeps it (the DLQ) must not keep the queue alive.
        this = cast("QueueCore", weakref.proxy(queue))
        for feature in self._features:
            with storage_errors(f"open the {feature.name} files of", self.path):
                feature.attach(this)
        self._default = self._open_reader(DEFAULT_READER, start_latest=False)
        # stats().dropped is the default reader's count, checkpointed with its state;
        # meta.json's copy (all an older ledgerq kept) may lag it after a crash.
        kept = self._default._core.counters
        if "dropped" not in kept and self._tally.dropped:
            kept["dropped"] = self._tally.dropped
        self._tally.dropped = kept.get("dropped", 0)
        # Every reader on disk holds back retention, opened or not in this run.
        with storage_errors("list the readers of", self.path):
            reader_files = sorted(os.listdir(os.path.join(self.path, READERS_DIR)))
        for name in reader_files:
            stem = name.removesuffix(STATE_SUFFIX)
            if stem != name and stem != DEFAULT_READER and READER_NAME.match(stem):
                self._open_reader(stem, start_latest=False)
        if recovering:
            counted = self._judge_gaps()
            if "enqueued" not in counters:
                # meta.json was rebuilt: what the default reader finished and what is
                # retained unfinished is what was enqueued, as far as the files tell.
                core = self._default._core
                finished = sum(core.counters[k] for k in ("acked", "dead_lettered", "expired"))
                self._enqueued = finished + core.pending() + core.in_flight()
            if counted or "enqueued" not in counters:
                self._save_meta(clean=False)  # the newly counted lost ids, counted once
        self._stop_flusher = threading.Event()
        self._flusher = None
        if opts.sync == "interval":
            self._flusher = threading.Thread(
                target=_flush_in_background,
                args=(weakref.ref(queue), self._stop_flusher, max(opts.sync_interval, 0.001)),
                name=f"ledgerq-sync:{os.path.basename(self.path)}",
                daemon=True,
            )
            self._flusher.start()
        self._holdings = self._new_holdings()

    def _open_sealer(self, meta: Meta) -> EntrySealer | None:
        """The sealer of an encrypted queue (None for a plain one), the key checked.

        A new queue opened with a key becomes an encrypted one: its ``encryption``
        object (identity, key check) is saved with the first ``meta.json``, before any
        entry is written.  Raises :class:`ConfigError` as ``segment.encryption`` says.
        """
        key = self.options.encryption_key
        if not meta.encryption and key is not None and self._is_new_meta(meta):
            meta.encryption = new_encryption_block(key)
        sealer = sealer_for(meta.encryption, key, self.path)
        self._digest_key = None
        if sealer is not None and key is not None:
            self._digest_key = digest_key_for(meta.encryption, key, self.path)
        return sealer

    def _is_new_meta(self, meta: Meta) -> bool:
        """Whether ``meta`` was just made for a new queue (no file behind it)."""
        return not self._meta_store.exists() and not holds_queue_data(self.path)

    def _open_log(self, meta: Meta) -> bool:
        """Open (and recover) the segments; set the ids, the clock and the counters.

        Returns whether this open recovered the queue (an exclusive open always does;
        see the shared mode's): then it judges the gaps between segments too.
        """
        opts = self.options
        counters = meta.counters
        self._tally = Tally(counters)
        self._manager = SegmentManager(
            self.path,
            segment_size=opts.segment_size,
            index_interval=opts.index_interval,
            on_corrupt=self._tally.on_corrupt,  # not methods of the queue: see lifecycle
            on_gap=self._keeper.record_gap,
            sync_on_rotate=opts.sync == "always",
        )
        self._recover_log(meta)
        self._reserve_first_ids()
        return True

    def _new_disk_reserve(self) -> DiskReserve:
        """The queue's disk reserve (shared mode's is one for every handle)."""
        return DiskReserve(os.path.join(self.path, RESERVE_NAME))

    def _recover_log(self, meta: Meta) -> None:
        """Recover the segments as an exclusive open does (the lock excludes every other)."""
        counters = meta.counters
        # A corrupt region is counted once, however many times it is met (and reopened).
        self._manager.remember_reported(
            [(int(a), int(b)) for a, b in meta.corrupt_regions if isinstance(a, int)]
        )
        self._keeper.note_loaded(self._manager, self._tally)
        floor = meta.next_id if meta.clean else max(meta.next_id, meta.reserved_until)
        self._disk_reserve.ensure()  # before recovery: its space can take recovery's writes
        self._open_segments(floor)
        if meta.gaps_from is None:
            # First open by a ledgerq that records its gaps: the gaps below this id (of
            # an older ledgerq) cannot be told from lost ids, so they raise no alarm.
            meta.gaps_from = self._manager.log_next_id
        self._next_id = self._manager.next_id
        self._start_clock()
        # Entries appended after the last counter save were enqueued too (counted up to
        # the last entry in the log, not the reserved ids a crash made us skip).
        self._enqueued = counters.get("enqueued", 0) + max(
            0, self._manager.log_next_id - counters.get("enqueued_through", meta.next_id)
        )

    def _reserve_first_ids(self) -> None:
        """Save the first id reservation, and open the append gate if the disk allows.

        The durable id reservation, and the gate of the append paths: an append of an
        id at or past _append_gate takes the slow path (_reserve_ids) first.  The
        gate is closed (set low) while the disk reserve is spent, or while the
        reservation could not be saved, so the fast paths pay nothing for either.
        """
        self._ids_reserved_until = self._append_gate = self._next_id
        try:
            self._ids_reserved_until = self._next_id + ID_BLOCK
            self._save_meta(clean=False)
        except StorageError as exc:
            # A full disk must not lock the user out: reading, dequeuing and acking need
            # no reservation.  The first enqueue saves it (or raises while it cannot).
            self._ids_reserved_until = self._next_id
            logger.warning("ledgerq: %s; the first enqueue will reserve ids", exc)
        else:
            if self._disk_reserve.is_held:  # else the gate stays closed: see _reserve_ids
                self._append_gate = self._ids_reserved_until

    def _new_holdings(self) -> Holdings:
        return Holdings(cast("QueueCore", self))

    def _close_session(self) -> CloseSession:
        """What this handle's close coordinates with the others: nothing, alone."""
        return AloneClose()

    def _start_clock(self) -> None:
        """Start the queue's clock (core/clock.py) at or after the newest stored timestamp."""
        newest = max(
            (seg.last_timestamp for seg in self._manager.segments if not seg.is_empty), default=0
        )
        clock = QueueClock(self._clock_source, newest)
        self._clock = clock
        # The append and dequeue paths add these inline: now = offset + monotonic_ns().
        self._clock_offset_ns = clock.offset_ns
        self._clock_mono = clock.monotonic_ns
        self._waits.start_clock(clock)

    def _register_hooks(self) -> None:
        def overriding(name: str) -> list[Feature]:
            base = getattr(Feature, name)
            return [f for f in self._features if getattr(type(f), name) is not base]

        def looking_at_plain(features: list[Feature]) -> list[Feature]:
            return [f for f in features if not f.ignores_plain]

        self._transformers = overriding("transform")
        self._admitters = overriding("admit")
        self._preparers = overriding("before_append")
        # No hook looks at a plain enqueue (bytes, no option): it may skip Draft building.
        self._max_size = self.options.max_message_size
        opts = self.options
        self._backlog = None
        if opts.max_pending is not None or opts.max_pending_bytes is not None:
            self._backlog = Backlog(opts.max_pending, opts.max_pending_bytes)
        # The plain paths skip admission: a bounded queue takes the checked one.
        self._plain_path = not (
            self._transformers
            or looking_at_plain(self._admitters)
            or looking_at_plain(overriding("appended"))
            or self._backlog
        )
        # The encoders of the plain paths: an encrypted queue's seal the entries.
        sealer = self._sealer
        self._encode_plain = encode_plain_entry if sealer is None else sealer.encode_plain
        self._encode_delayed = encode_delayed_entry if sealer is None else sealer.encode_delayed
        self._encode_batch = encode_plain_batch_parts if sealer is None else sealer.batch_parts
        self._recorders = overriding("appended")
        # The unique-jobs feature, for the path of a bytes payload with only a key.
        found = [f for f in self._features if isinstance(f, KeyAdmitter)]
        self._unique = found[0] if found else None
        # The hand-off feature, for the path of forwarded bytes payloads.
        takers = [f for f in self._features if isinstance(f, HandoffTaker)]
        self._handoff_taker = takers[0] if takers else None
        self._restorers = overriding("restore")
        self._flushers = overriding("flush")
        self._reader_hooks = ReaderHooks(self._features)

    def _load_meta(self, copy: OptionsCopy | None) -> Meta:
        """``meta.json``, or a new one for a new queue, or one rebuilt when it is lost.

        A missing or damaged ``meta.json`` in a directory that holds messages or reader
        state is rebuilt from the segments, the reader journals and ``options.json``
        (with a warning saying what could not be known); without ``options.json`` the
        stored options are lost too, and the queue refuses to open rather than start
        over with defaults: ``ledgerq verify --repair`` rebuilds it and says so.
        """
        store = self._meta_store
        try:
            if store.exists():
                return store.load()
            problem = "is missing"
        except DamagedMetaError as exc:
            problem = f"is damaged ({exc.reason})"
        if not holds_queue_data(self.path):
            return Meta()  # a new queue (or a first open killed before its meta.json)
        if copy is None:
            raise CorruptionError(
                f"{META_NAME} {problem}, and {OPTIONS_NAME}, the copy of the stored options, is "
                "missing or damaged too: opening now would lose the id reservation and the "
                "stored options. Run `ledgerq verify --repair` on the queue to rebuild "
                f"{META_NAME} from the segments and reader journals (it says what it cannot "
                "know), then open it with the options it should have",
                self.path,
            )
        meta, notes = rebuild_meta(self.path, copy, margin=ID_BLOCK)
        store.save(meta)
        logger.warning(
            "ledgerq: %s of %s %s; rebuilt it from the segments, the reader journals and %s: %s",
            META_NAME,
            self.path,
            problem,
            OPTIONS_NAME,
            "; ".join(notes),
        )
        return meta

    def _judge_gaps(self) -> bool:
        """Log the ids missing between segments that no record explains; count new ones.

        A gap is fine when the queue recorded it (``Meta.gaps``), when it lies below
        ``gaps_from`` (an older ledgerq's), or a repair accepted it as lost; ids that a
        set-aside file holds are reported as such.  The others were in a segment file
        that is gone: logged at every open until ``verify --repair`` accepts them, and
        counted once in ``stats().lost`` (those the default reader had not consumed).
        Returns whether a new range was counted.
        """
        meta = self._meta
        layout = self._manager.layout
        explained = [*meta.gaps, *meta.known_lost, *((a, b) for a, b, _ in layout.held_aside)]
        floor = meta.gaps_from if meta.gaps_from is not None else 1
        counted = False
        for first, last, before, after in layout.gaps:
            for lo, hi in subtract_ranges(max(first, floor), last, explained):
                news = ""
                if [lo, hi] not in meta.lost:  # counted once, however often reopened
                    lost = replay_reader(self.path, DEFAULT_READER).unfinished_in(lo, hi)
                    self._tally.lost += lost
                    meta.lost.append([lo, hi])
                    counted = True
                    news = f": {lost} not consumed by the default reader are lost"
                logger.warning(
                    "ledgerq: ids %d-%d are missing between the segment files %s and %s of %s "
                    "(a segment file deleted or moved?)%s; `ledgerq verify --repair` records "
                    "them as known lost",
                    lo,
                    hi,
                    before.file_name,
                    after.file_name,
                    self.path,
                    news,
                )
        for lo, hi, holder in layout.held_aside:
            logger.warning(
                "ledgerq: ids %d-%d of %s are only in the set-aside segment file %s, which "
                "starts inside another segment's ids: not read, and no repair can split it - "
                "move the overlapping file away by hand once its messages are consumed",
                lo,
                hi,
                self.path,
                holder.file_name,
            )
        return counted

    def _open_segments(self, floor: int) -> None:
        """Recover and open the segments; on a full disk, with the reserve's space.

        Recovery writes little (an index, after a crash a new segment), but on a disk
        with no free page even that fails: then the reserve is released and recovery
        runs once more, from the start, with its space.
        """
        try:
            with storage_errors("open the segments in", self._manager.directory):
                self._manager.open(min_next_id=floor)
        except StorageError as exc:
            if exc.errno != errno.ENOSPC or not self._disk_reserve.release():
                raise
            logger.warning("ledgerq: %s; opening again with the disk reserve's space", exc)
            self._manager.close()
            self._manager = self._manager.reopened()
            with storage_errors("open the segments in", self._manager.directory):
                self._manager.open(min_next_id=floor)
