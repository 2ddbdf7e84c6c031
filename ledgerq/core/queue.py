"""The queue core: its constructor, and what its parts share - waits, the sync policy,
payloads restored, the default reader's calls, ``stats()`` and ``close()``.

The parts, one concern each, are mixins in modules of their own (see
core/queue_state.py, which declares the state they share): opening and recovery,
the named readers, the append paths, the checked append path, the hand-off,
retention and closing.

Concurrency: one lock per queue guards the segment manager and every reader's
in-memory state; a condition on it wakes blocked dequeuers.  The lock is held
across the ``write()`` of an append (ids must reach the log in order) but never
across an fsync: durability waits happen after the lock is released, through
:class:`~ledgerq.segment.sync.GroupCommit`, so concurrent ``sync="always"``
callers share fsyncs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NoReturn

from ledgerq._errors import (
    CorruptionError,
    QueueBusyError,
    QueueClosedError,
    QueueLockedError,
    StorageError,
)
from ledgerq._options import Options
from ledgerq._types import Item, Message, Priority, Stats
from ledgerq.core.admission import Admission
from ledgerq.core.appending import Appending
from ledgerq.core.args import (
    DEFAULT_LOCK_TIMEOUT,
)
from ledgerq.core.clock import SYSTEM_CLOCK, Clock, check_clock
from ledgerq.core.closing import Closing
from ledgerq.core.feature import (
    Feature,
    Timer,
)
from ledgerq.core.handoff import HandOff
from ledgerq.core.lifecycle import attempt as _attempt
from ledgerq.core.lifecycle import finalize_unclosed
from ledgerq.core.named_readers import NamedReaders
from ledgerq.core.opening import DEFAULT_READER, Opening
from ledgerq.core.processes import forked_error, track, unpicklable, untrack
from ledgerq.core.reader import ReaderCore, entry_to_message
from ledgerq.core.reader_handle import Reader
from ledgerq.core.retention import Retention
from ledgerq.core.shared_appends import SharedAppends
from ledgerq.core.waits import Waits
from ledgerq.format.entry import (
    Entry,
    EntryFlags,
)
from ledgerq.format.errors import CorruptRecord
from ledgerq.format.sealing import keyed_digest
from ledgerq.segment.cursor import LogCursor
from ledgerq.segment.encryption import check_key_before_open
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.shared_page import FeatureLogWord
from ledgerq.segment.steplock import Budget

__all__ = ["DEFAULT_READER", "QueueCore"]

logger = logging.getLogger("ledgerq")

_MEDIUM = Priority.MEDIUM
_MODULES = sys.modules  # TRACE_MODULE in it: OpenTelemetry is in use (core/tracing)
_NO_READERS = contextlib.nullcontext()  # an exclusive append holds no reader's step
_NS = 1_000_000_000
_BYTES = {bytes}
_BYTES_AND_ITEMS = {bytes, Item}
_COMPRESSED = int(EntryFlags.COMPRESSED)
_ENCRYPTED = int(EntryFlags.ENCRYPTED)
_RESTORED_FLAGS = _COMPRESSED | _ENCRYPTED  # entries whose stored payload is not the message


class QueueCore(Opening, NamedReaders, HandOff, Appending, Admission, Retention, Closing):
    """A durable message queue in one directory.  Use :func:`ledgerq.open` to get one."""

    shared = False  # shared mode (``ledgerq.open(path, shared=True)``): see core/shared_queue
    # The append session of shared mode (core/shared_appends), once the handle has joined
    # the session's page; None in exclusive mode: its appends are the uncontended case.
    _appends: SharedAppends | None = None

    def __init__(
        self,
        path: str | os.PathLike[str],
        options: Options,
        features: Sequence[Feature] = (),
        clock: Clock | None = None,
        *,
        remember_options: bool = True,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.options = options
        # How long a call may wait for another handle's step (shared mode), or for a
        # shared opener's recovery (an exclusive open): see ledgerq.open.
        self._budget = Budget(lock_timeout)
        self._clock_source = SYSTEM_CLOCK if clock is None else check_clock(clock)
        # False: meta.json keeps the options it held (a one-run override, e.g. the CLI's -o).
        self._remember_options = remember_options
        self._features = list(features)
        self._readers: dict[str, Reader] = {}
        self._cores: dict[str, ReaderCore] = {}  # the readers' state, for closing
        self._prepare_directory()
        # A missing, unexpected or wrong key is refused before the lock file is touched
        # or anything written (read-only); checked again under the lock at open.
        check_key_before_open(self.path, options.encryption_key)
        self._dirlock = self._lock_directory()
        try:
            try:
                self._open_locked()
            except QueueBusyError as exc:
                # A shared handle stopped in a step holds a lock the open needs: the open
                # is refused, as one beside an exclusive owner is.
                raise QueueLockedError(
                    self.path,
                    held_by="shared",
                    detail=f"cannot be joined now: {exc.held} is held by process "
                    f"{exc.holder_pid} past lock_timeout (stopped?); resume or end that "
                    "process, or open with a larger lock_timeout",
                ) from exc
        except BaseException:
            self._close_after_failed_open()
            raise
        # Closed when collected if never closed (core/lifecycle); unusable in a fork.
        self._finalizer = weakref.finalize(self, finalize_unclosed, self._holdings)
        self._owner_pid = os.getpid()
        track(self)
        if self._timer is not None:
            self._timer.poll()  # what fell due while the queue was closed: one message

    def make_room(self) -> bool:
        """A feature's state write met a full disk: release the disk reserve for it.

        True if that freed space (the write is then tried once more).  Enqueues refuse
        from then on until the reserve can be written again (docs/reliability.md).
        For the features' append logs (``AppendLog.on_full``); lock held.
        """
        return self._make_room()

    def keyed_digest(self, size: int) -> Callable[[str | bytes], bytes] | None:
        """The ``size``-byte keyed digest of an encrypted queue's dedup ids and unique keys
        (None on a plain queue): under the key a key rotation kept (segment/encryption),
        so the digests a feature stored before ``ledgerq rekey`` still match after it."""
        key = self.options.encryption_key
        if key is None or self._digest_key is None:
            return None
        return keyed_digest(key, size, self._digest_key)

    def entry_of(self, message_id: int) -> Entry | None:
        """The log's entry ``message_id``, or None if the log does not hold it (lock held)."""
        entry = LogCursor(self._manager, message_id).next()
        return entry if entry is not None and entry.id == message_id else None

    @property
    def waits(self) -> Waits:
        """How this queue's callers wait and are woken (core/waits.py): readers and the
        features that enqueue by time share it."""
        return self._waits

    def set_timer(self, timer: Timer) -> None:
        """Register the feature that enqueues by time (see :class:`Timer`; at attach)."""
        self._timer = timer

    @contextlib.contextmanager
    def extra_hooks(self, feature: Feature) -> Iterator[None]:
        """Call ``feature``'s enqueue hooks (catch_up, admit, before_append, appended,
        rollback) too, after the others, while the block runs: a Timer's fire registers
        its hooks only for its own append, so that no other enqueue pays for them.  The
        lists are replaced, never changed in place: a call iterating one is unaffected."""
        with self._lock:
            self._admitters = [*self._admitters, feature]
            self._preparers = [*self._preparers, feature]
            self._recorders = [*self._recorders, feature]
        try:
            yield
        finally:
            with self._lock:
                self._admitters = [f for f in self._admitters if f is not feature]
                self._preparers = [f for f in self._preparers if f is not feature]
                self._recorders = [f for f in self._recorders if f is not feature]

    def _fire_timer(self) -> None:
        """Let the timer feature enqueue what is due (no lock held)."""
        timer = self._timer
        if timer is not None:
            timer.fire_due()

    def poll_timer(self) -> None:
        """Shared mode's housekeeper: let the timer feature see the others' changes."""
        timer = self._timer
        if timer is not None and not self._closed:
            timer.poll()

    def note_corrupt_skipped(self, count: int) -> None:
        """Count damaged records a feature skipped in its own files (``stats()``)."""
        self._tally.corrupt_skipped += count

    def feature_log_word(self, path: str) -> FeatureLogWord | None:
        """The change word of a feature log in shared mode's page: none here, where no
        other handle writes the file (``segment/feature_log``)."""
        return None

    # ------------------------------------------------------------------ the disk reserve

    def _restore_disk_reserve(self) -> bool:
        """Write the reserve again if it was released and there is room; True if held."""
        if self._disk_reserve.is_held:
            return True
        if not self._disk_reserve.ensure():
            return False
        logger.warning("ledgerq: %s has room again: its disk reserve is back", self.path)
        for reader in self._readers.values():
            reader._core.journal.set_low_space(False)
        return True

    def _save_meta(self, *, clean: bool) -> None:
        self._keeper.save(
            self._manager,
            self.options if self._remember_options else None,
            self._tally,
            clean=clean,
            next_id=self._next_id,
            reserved_until=self._ids_reserved_until,
            enqueued=self._enqueued,
        )

    # ------------------------------------------------------------------ durability

    def _flush_once(self) -> None:
        if self._log_commit.is_dirty:
            self._log_commit.sync_now()
        for core in list(self._cores.values()):
            commit = core.journal.commit
            if commit.is_dirty:
                commit.sync_now()
        if self._flushers:
            with self._lock:  # a feature may swap its files under the lock
                for feature in self._flushers:
                    feature.flush()

    def sync(self) -> None:
        """Make everything enqueued, acked and nacked so far durable (fsync)."""
        self._ensure_open()
        self._log_commit.sync_now()
        for core in list(self._cores.values()):
            core.journal.commit.sync_now()
        if self._flushers:
            with self._lock:
                for feature in self._flushers:
                    feature.flush()

    # ------------------------------------------------------------------ payloads

    def _ensure_open(self) -> None:
        if self._closed:
            if self._holdings.forked:
                raise forked_error("queue", self.path, self._owner_pid, shared=self.shared)
            raise QueueClosedError(f"queue {self.path} is closed")

    def _restore(self, entry: Entry) -> bytes:
        """The payload as the producer gave it (undoing encryption and compression)."""
        return self._restore_entry(entry)[1]

    def _restore_entry(self, entry: Entry) -> tuple[Entry, bytes]:
        """``entry`` in clear (headers included) and its payload as the producer gave it.

        Raises :class:`CorruptionError` when the payload cannot be restored: a sealed
        entry that fails authentication (tampered, moved, another key), or a damaged
        zstd frame - the callers skip and count such a message as corrupt.
        """
        sealer = self._sealer
        if sealer is not None:  # every entry of an encrypted queue: an unsealed one is corrupt
            try:
                entry = sealer.open(entry)
            except CorruptRecord as exc:
                raise CorruptionError(str(exc).removesuffix(" at offset 0")) from None
        elif entry.flags & _ENCRYPTED:
            raise CorruptionError(f"message {entry.id} is encrypted but queue {self.path} is not")
        payload = entry.payload
        if entry.flags & _COMPRESSED:
            if not self._restorers:
                raise CorruptionError(
                    f"message {entry.id} is compressed but no decompressor is available"
                )
            for feature in self._restorers:
                payload = feature.restore(entry, payload)
        return entry, payload

    def _messages(self, reader: Reader, taken: list[tuple[Entry, int]]) -> list[Message]:
        """Build Messages; entries whose payload cannot be restored are settled as corrupt."""
        messages = []
        as_given = self._sealer is None  # in an encrypted queue every entry is opened
        for taken_entry, attempt in taken:
            if as_given and not taken_entry.flags & _RESTORED_FLAGS:  # nothing to restore
                messages.append(entry_to_message(taken_entry, attempt, taken_entry.payload))
                continue
            try:
                entry, payload = self._restore_entry(taken_entry)
            except CorruptionError as exc:
                entry = taken_entry
                logger.warning("ledgerq: skipping message %d in %s: %s", entry.id, self.path, exc)
                with self._lock:
                    self._tally.corrupt_skipped += 1
                    try:
                        if reader._core.settle_any(entry.id):
                            reader._core.counters["acked"] -= 1
                    except StorageError as settle_error:
                        # Left leased: it comes back (and is skipped again) after its lease.
                        logger.warning("ledgerq: could not settle it: %s", settle_error)
                continue
            messages.append(entry_to_message(entry, attempt, payload))
        return messages

    # ------------------------------------------------------------------ consuming

    def dequeue(self, timeout: float | None = 0) -> Message | None:
        """Lease the next message (see :meth:`Reader.dequeue`)."""
        return self._default.dequeue(timeout)

    def dequeue_batch(self, n: int, timeout: float | None = 0) -> list[Message]:
        """Lease up to ``n`` messages (see :meth:`Reader.dequeue_batch`)."""
        return self._default.dequeue_batch(n, timeout)

    def ack(self, message_id: int) -> None:
        """Mark a leased message done (see :meth:`Reader.ack`)."""
        self._default.ack(message_id)

    def forward(
        self,
        message_id: int,
        target: QueueCore,
        items: Iterable[bytes | bytearray | memoryview | Item] | bytes | Item,
        *,
        timeout: float | None = 0,
    ) -> list[int]:
        """Hand a leased message's work on, exactly once (see :meth:`Reader.forward`)."""
        return self._hand_off(self._default, message_id, target, items, timeout)

    def ack_batch(self, message_ids: Iterable[int]) -> None:
        """Mark several leased messages done at once (see :meth:`Reader.ack_batch`)."""
        self._default.ack_batch(message_ids)

    def nack(self, message_id: int, reason: str = "", *, delay: float | None = None) -> None:
        """Give a leased message back as failed (see :meth:`Reader.nack`)."""
        self._default.nack(message_id, reason, delay=delay)

    def release(self, message_id: int, *, delay: float | None = None) -> None:
        """Give a leased message back unused, not as a failure (see :meth:`Reader.release`)."""
        self._default.release(message_id, delay=delay)

    def touch(self, message_id: int, seconds: float | None = None) -> None:
        """Extend a lease (see :meth:`Reader.touch`)."""
        self._default.touch(message_id, seconds)

    def peek(self, n: int = 1) -> list[Message]:
        """The next ``n`` pending messages, without leasing them."""
        return self._default.peek(n)

    def __len__(self) -> int:
        with self._lock:
            self._ensure_open()
            return self._default._core.pending()

    # ------------------------------------------------------------------ waking

    def _prepare_wait(self) -> bool:
        """Before a dequeue blocks (queue lock held): True if it must look once more.

        An exclusive queue learns of every change through its own lock; a shared-mode
        handle starts watching the other processes' writes here.
        """
        return False

    def appends_locked(self) -> contextlib.AbstractContextManager[None]:
        """A block no other handle appends in: nothing to take for an exclusive queue (its
        own lock serialises the appends); shared mode's append lock otherwise.  For
        features that replace their files outside an append (a flush)."""
        return contextlib.nullcontext()

    def holding_reader(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A block in which no other handle changes reader ``name`` (tooling that reads
        its pending messages, then settles them: requeue, purge).  Nothing to take for
        an exclusive queue; shared mode holds the reader's lock."""
        return contextlib.nullcontext()

    @property
    def is_alone(self) -> bool:
        """Whether no other handle can have this queue open (exclusive mode, or the first
        shared handle while it opens): features may then rewrite their files freely."""
        return True

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` whenever messages may have become available; return a remover.

        The callback runs with the queue lock held, in whichever thread enqueued,
        nacked or closed: it must be quick and must not call the queue (e.g.
        ``loop.call_soon_threadsafe``).  Used by ``ledgerq.aio`` to wait without threads.
        """
        return self._waits.add_listener(callback)

    def add_room_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """:meth:`add_listener` for a waiter of room in a bounded queue: ``callback`` is
        also called when messages leave the backlog (acks, dead-letters, expiries,
        drops, purges), here or - in shared mode - in another handle or process.
        Used by ``ledgerq.aio`` to wait for room without a thread."""
        return self._waits.add_room_listener(callback)

    # ------------------------------------------------------------------ tooling

    def _pending_entries(self, wanted: set[int] | None) -> list[tuple[Entry, bytes]]:
        """Entries (with restored payloads) the default reader has not acked, by id."""
        with self._lock:
            self._ensure_open()
            core = self._default._core
            entries = core.peek(1 << 62, self._clock.now_ns()) + core.leased_entries()
        found = []
        for entry in sorted(entries, key=lambda e: e.id):
            if wanted is not None and entry.id not in wanted:
                continue
            try:
                found.append(self._restore_entry(entry))
            except CorruptionError:
                continue
        return found

    def _settle(self, message_id: int) -> bool:
        """Settle ``message_id`` for the default reader wherever it is; True if it was pending."""
        with self._lock:
            self._ensure_open()
            core = self._default._core
            settled = core.settle_any(message_id)
            if settled:
                self._retire_consumed()
                self._waits.room_made()
                if core.group_freed:  # the next of its group is deliverable now
                    core.group_freed = False
                    self._waits.wake()
        return settled

    # ------------------------------------------------------------------ observing

    def stats(self) -> Stats:
        """A snapshot of the queue's figures (see :class:`ledgerq.Stats`)."""
        with self._lock:
            self._ensure_open()
            appends = self._appends
            if appends is not None:
                appends.look()  # the readers other handles created, the log's tail
            now = self._clock.now_ns()
            readers = {name: r._core.stats(now) for name, r in self._readers.items()}
            default = readers[DEFAULT_READER]
            return Stats(
                pending=default.pending,
                in_flight=default.in_flight,
                enqueued=self._enqueued if appends is None else appends.enqueued(),
                acked=default.acked,
                nacked=default.nacked,
                dead_lettered=default.dead_lettered,
                expired=default.expired,
                duplicates=self._tally.duplicates,
                dropped=self._default._core.counters.get("dropped", 0),
                corrupt_skipped=self._tally.corrupt_skipped,
                segments=len(self._manager.segments),
                disk_bytes=self._manager.disk_bytes,
                oldest_pending_age=default.oldest_pending_age,
                next_id=self._manager.next_id,
                readers=readers,
                lost=self._tally.lost,
                delayed=default.delayed,
            )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Sync, persist every reader's state, and release the directory lock.

        Idempotent.  Blocked ``dequeue`` calls raise :class:`QueueClosedError`.  Every
        step runs even if an earlier one fails - each file is closed, the DLQ too, and
        the lock is released - and then the first error is raised (a
        :class:`StorageError` if the disk refused something); the queue is closed anyway.

        In a process forked from the one that opened the queue, this does nothing: the
        files and the lock are the parent's.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._waits.wake()
        self._finalizer.detach()
        untrack(self)
        errors = self._holdings.release(
            next_id=self._next_id, reserved_until=self._ids_reserved_until, enqueued=self._enqueued
        )
        if errors:
            raise errors[0]

    def _close_after_failed_open(self) -> None:
        """Close whatever a failed open had opened (its DLQ included) and unlock.

        Errors here are dropped: the open's own error is the one to raise.
        """
        ignored: list[Exception] = []
        for reader in self._readers.values():
            _attempt(ignored, reader._core.journal.close)
        for feature in self._features:
            _attempt(ignored, feature.close)  # each closes only what its attach opened
        manager: SegmentManager | None = getattr(self, "_manager", None)  # set mid-open
        if manager is not None:
            _attempt(ignored, manager.close)
        self._dirlock.release()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"next_id={self._next_id}"
        return f"<ledgerq.Queue {self.path!r} {state}>"

    def __reduce__(self) -> NoReturn:
        raise unpicklable("a ledgerq.Queue", self.path)

    def _after_fork_in_child(self) -> None:
        """In a forked child (core/processes): this copy is closed, its files the parent's.

        Every call then raises :class:`ForkedQueueError`; ``close()`` and the finalizer
        do nothing.  The locks are new ones: a thread of the parent may have held the
        old ones at the fork, and it does not exist here to release them.
        """
        self._holdings.forked = True
        self._closed = True
        self._waits.after_fork()
        self._lock = self._waits.lock

    def _check(self) -> None:
        """Assert the queue's invariants (tests call this after every step)."""
        with self._lock:
            self._manager._check()
            assert self._next_id == self._manager.next_id
            for reader in self._readers.values():
                reader._core._check()
