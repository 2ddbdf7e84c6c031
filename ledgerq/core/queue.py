"""The queue: ids, the append path, readers, waits and the sync policy.

Concurrency: one lock per queue guards the segment manager and every reader's
in-memory state; a condition on it wakes blocked dequeuers.  The lock is held
across the ``write()`` of an append (ids must reach the log in order) but never
across an fsync: durability waits happen after the lock is released, through
:class:`~ledgerq.segment.sync.GroupCommit`, so concurrent ``sync="always"``
callers share fsyncs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from ledgerq._errors import (
    CorruptionError,
    NotAQueueError,
    QueueClosedError,
)
from ledgerq._options import Options
from ledgerq._types import Item, Message, Priority, ReaderStart, Stats
from ledgerq.core.args import (
    READER_NAME,
    check_dedup_id,
    check_payload,
    check_priority,
    check_reader_name,
    check_reader_start,
    check_ttl,
)
from ledgerq.core.closing import Closing
from ledgerq.core.feature import Draft, Feature
from ledgerq.core.journal import ReaderJournal
from ledgerq.core.meta import ID_BLOCK
from ledgerq.core.reader import (
    Reader,
    ReaderCore,
    ReaderHooks,
    entry_to_message,
    initial_checkpoint,
)
from ledgerq.format.entry import (
    Entry,
    EntryFlags,
    encode_entry,
    encode_headers,
    encode_plain_batch_parts,
    encode_plain_entry,
)
from ledgerq.segment.files import StorageError, make_durable_dir, storage_errors
from ledgerq.segment.lock import DirLock
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.meta import Meta, MetaStore
from ledgerq.segment.naming import (
    META_NAME,
    QUEUE_NAMES,
    READERS_DIR,
    RESERVE_NAME,
    STATE_SUFFIX,
    reader_state_path,
)
from ledgerq.segment.reserve import DiskReserve
from ledgerq.segment.scanner import CorruptRegion
from ledgerq.segment.segment import Segment
from ledgerq.segment.sync import GroupCommit

__all__ = ["DEFAULT_READER", "QueueCore"]

logger = logging.getLogger("ledgerq")

DEFAULT_READER = "default"
_MEDIUM = Priority.MEDIUM
_NS = 1_000_000_000
_COMPRESSED = int(EntryFlags.COMPRESSED)


def _attempt(errors: list[Exception], step: Callable[[], object]) -> None:
    """Run one step of a close; note its error in ``errors`` and go on."""
    try:
        step()
    except Exception as exc:
        errors.append(exc)


class QueueCore(Closing):
    """A durable message queue in one directory.  Use :func:`ledgerq.open` to get one."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        options: Options,
        features: Sequence[Feature] = (),
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.options = options
        self._features = list(features)
        self._readers: dict[str, Reader] = {}
        self._prepare_directory()
        self._dirlock = DirLock(self.path)
        try:
            self._open_locked()
        except BaseException:
            self._close_after_failed_open()
            raise

    # ------------------------------------------------------------------ opening

    def _prepare_directory(self) -> None:
        path = self.path
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotAQueueError(f"{path} exists and is not a directory")
        make_durable_dir(path)  # its entry in the parent must survive a power cut too
        if not os.path.exists(os.path.join(path, META_NAME)):
            with storage_errors("list the queue directory", path):
                names = os.listdir(path)
            foreign = [n for n in names if n not in QUEUE_NAMES]
            if foreign:
                raise NotAQueueError(
                    f"{path} is not a ledgerq queue (it holds {sorted(foreign)[:3]} but no "
                    f"{META_NAME}); use an empty or new directory"
                )

    def _open_locked(self) -> None:
        opts = self.options
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0
        self._listeners: dict[int, Callable[[], None]] = {}
        self._next_listener = 0
        self._closed = False
        self._meta_store = MetaStore(self.path)
        meta = self._meta_store.load() if self._meta_store.exists() else Meta()
        self._meta = meta
        counters = meta.counters
        self._corrupt_skipped = counters.get("corrupt_skipped", 0)
        self._manager = SegmentManager(
            self.path,
            segment_size=opts.segment_size,
            index_interval=opts.index_interval,
            on_corrupt=self._on_corrupt,
            sync_on_rotate=opts.sync == "always",
        )
        # A corrupt region is counted once, however many times it is met (and reopened).
        self._manager.remember_reported(
            [(int(a), int(b)) for a, b in meta.corrupt_regions if isinstance(a, int)]
        )
        floor = meta.next_id if meta.clean else max(meta.next_id, meta.reserved_until)
        self._reserve = DiskReserve(os.path.join(self.path, RESERVE_NAME))
        self._reserve.ensure()  # before recovery: its space can take recovery's writes
        self._open_segments(floor)
        self._next_id = self._manager.next_id
        # Entries appended after the last counter save were enqueued too (counted up to
        # the last entry in the log, not the reserved ids a crash made us skip).
        self._enqueued = counters.get("enqueued", 0) + max(
            0, self._manager.log_next_id - counters.get("enqueued_through", meta.next_id)
        )
        self._duplicates = counters.get("duplicates", 0)
        self._dropped = counters.get("dropped", 0)
        # The durable id reservation, and the gate of the append paths: an append of an
        # id at or past _reserved_until takes the slow path (_reserve_ids) first.  The
        # gate is closed (set low) while the disk reserve is spent, or while the
        # reservation could not be saved, so the fast paths pay nothing for either.
        self._ids_reserved_until = self._reserved_until = self._next_id
        self._disk_meta = (meta.clean, self._meta_figures())  # what meta.json says now
        try:
            self._ids_reserved_until = self._next_id + ID_BLOCK
            self._save_meta(clean=False)
        except StorageError as exc:
            # A full disk must not lock the user out: reading, dequeuing and acking need
            # no reservation.  The first enqueue saves it (or raises while it cannot).
            self._ids_reserved_until = self._next_id
            logger.warning("ledgerq: %s; the first enqueue will reserve ids", exc)
        else:
            if self._reserve.is_held:  # else the gate stays closed: see _reserve_ids
                self._reserved_until = self._ids_reserved_until
        self._log_commit = GroupCommit(self._manager.sync_active)
        self._sync_always = opts.sync == "always"
        self._register_hooks()
        make_durable_dir(os.path.join(self.path, READERS_DIR))
        for feature in self._features:
            with storage_errors(f"open the {feature.name} files of", self.path):
                feature.attach(self)
        self._default = self._open_reader(DEFAULT_READER, start_latest=False)
        # Every reader on disk holds back retention, opened or not in this run.
        with storage_errors("list the readers of", self.path):
            reader_files = sorted(os.listdir(os.path.join(self.path, READERS_DIR)))
        for name in reader_files:
            stem = name.removesuffix(STATE_SUFFIX)
            if stem != name and stem != DEFAULT_READER and READER_NAME.match(stem):
                self._open_reader(stem, start_latest=False)
        self._stop_flusher = threading.Event()
        self._flusher: threading.Thread | None = None
        if opts.sync == "interval":
            self._flusher = threading.Thread(
                target=self._flush_loop,
                name=f"ledgerq-sync:{os.path.basename(self.path)}",
                daemon=True,
            )
            self._flusher.start()

    def _register_hooks(self) -> None:
        def overriding(name: str) -> list[Feature]:
            base = getattr(Feature, name)
            return [f for f in self._features if getattr(type(f), name) is not base]

        self._transformers = overriding("transform")
        self._admitters = overriding("admit")
        # No hook looks at a plain enqueue (bytes, no option): it may skip Draft building.
        self._max_size = self.options.max_message_size
        self._plain_path = not (self._transformers or self._admitters or overriding("appended"))
        self._recorders = overriding("appended")
        self._restorers = overriding("restore")
        self._flushers = overriding("flush")
        self._reader_hooks = ReaderHooks(self._features)

    def _open_reader(self, name: str, *, start_latest: bool) -> Reader:
        journal = ReaderJournal(self._reader_path(name))
        journal.on_full = self._make_room
        journal.set_low_space(not self._reserve.is_held)
        is_new = not os.path.exists(journal.path)
        try:
            with storage_errors("open reader state", journal.path):
                core = ReaderCore(
                    name,
                    journal,
                    self._manager,
                    self._reader_hooks,
                    visibility_timeout=self.options.visibility_timeout,
                    start_latest=start_latest,
                )
        except BaseException:
            journal.close()
            if is_new:
                # A new reader whose first checkpoint failed half-way must not exist: its
                # file would make the next reader(name) start elsewhere than asked.
                with contextlib.suppress(OSError):
                    os.unlink(journal.path)
            raise
        reader = Reader(self, core)
        self._readers[name] = reader
        return reader

    def _on_corrupt(self, seg: Segment, region: CorruptRegion) -> None:
        self._corrupt_skipped += 1

    def note_corrupt_skipped(self, count: int) -> None:
        """Count damaged records a feature skipped in its own files (``stats()``)."""
        self._corrupt_skipped += count

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
            if exc.errno != errno.ENOSPC or not self._reserve.release():
                raise
            logger.warning("ledgerq: %s; opening again with the disk reserve's space", exc)
            self._manager.close()
            self._manager = self._manager.reopened()
            with storage_errors("open the segments in", self._manager.directory):
                self._manager.open(min_next_id=floor)

    # ------------------------------------------------------------------ the disk reserve

    def _make_room(self) -> bool:
        """A write that draining the queue needs met a full disk: release the reserve.

        True if that freed space (the write is tried again).  From then on enqueues
        refuse until the reserve can be written again, and journals compact early.
        Called with the queue lock held (a reader journal's ``on_full``).
        """
        if not self._reserve.release():
            return False
        logger.warning(
            "ledgerq: the disk of %s is full: released its %d KiB reserve so that acks can "
            "go on; enqueues refuse until that much space is free again",
            self.path,
            self._reserve.size // 1024,
        )
        self._reserved_until = 0  # close the append gate: _reserve_ids checks the reserve
        for reader in self._readers.values():
            reader._core.journal.set_low_space(True)
        return True

    def _restore_reserve(self) -> bool:
        """Write the reserve again if it was released and there is room; True if held."""
        if self._reserve.is_held:
            return True
        if not self._reserve.ensure():
            return False
        logger.warning("ledgerq: %s has room again: its disk reserve is back", self.path)
        for reader in self._readers.values():
            reader._core.journal.set_low_space(False)
        return True

    def _meta_figures(self) -> tuple[object, ...]:
        """What a meta.json save records beyond the clean flag (to skip needless saves)."""
        return (
            self._next_id,
            self._ids_reserved_until,
            self._enqueued,
            self._duplicates,
            self._dropped,
            self._corrupt_skipped,
            len(self._manager.reported_regions),
        )

    def _save_meta(self, *, clean: bool) -> None:
        meta = self._meta
        meta.clean = clean
        meta.next_id = self._next_id
        meta.reserved_until = self._next_id if clean else self._ids_reserved_until
        meta.counters = {
            "enqueued": self._enqueued,
            "enqueued_through": self._next_id,
            "duplicates": self._duplicates,
            "dropped": self._dropped,
            "corrupt_skipped": self._corrupt_skipped,
        }
        meta.corrupt_regions = [list(key) for key in self._manager.reported_regions][-10_000:]
        meta.options = dataclasses.asdict(self.options)
        self._meta_store.save(meta)
        self._disk_meta = (clean, self._meta_figures())

    # ------------------------------------------------------------------ durability

    def _flush_loop(self) -> None:
        interval = max(self.options.sync_interval, 0.001)
        while not self._stop_flusher.wait(interval):
            try:
                self._flush_once()
            except Exception:  # keep flushing; the next attempt may succeed
                logger.exception("ledgerq: background sync of %s failed", self.path)

    def _flush_once(self) -> None:
        if self._log_commit.is_dirty:
            self._log_commit.sync_now()
        for reader in list(self._readers.values()):
            commit = reader._core.journal.commit
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
        for reader in list(self._readers.values()):
            reader._core.journal.commit.sync_now()
        if self._flushers:
            with self._lock:
                for feature in self._flushers:
                    feature.flush()

    # ------------------------------------------------------------------ enqueue

    def _ensure_open(self) -> None:
        if self._closed:
            raise QueueClosedError(f"queue {self.path} is closed")

    def _prepare(
        self,
        payload: object,
        headers: Mapping[str, str] | None,
        priority: object,
        ttl: object,
        dedup_id: object,
    ) -> Draft:
        data = check_payload(payload, self.options.max_message_size)
        blob = encode_headers(headers) if headers is not None else None
        level = check_priority(priority) if priority is not Priority.MEDIUM else 1
        seconds = check_ttl(ttl)
        draft = Draft(
            data,
            blob,
            level,
            int(seconds * _NS) if seconds is not None else None,
            check_dedup_id(dedup_id),
        )
        for feature in self._transformers:
            feature.transform(draft)
        return draft

    def enqueue(
        self,
        payload: bytes | bytearray | memoryview,
        *,
        headers: Mapping[str, str] | None = None,
        priority: Priority | int = Priority.MEDIUM,
        ttl: float | None = None,
        dedup_id: str | bytes | None = None,
    ) -> int:
        """Append one message; return its id.

        The message has reached the OS when this returns (it survives a crash
        of this process); with ``sync="always"`` it is also on disk.  Raises
        ``TypeError``/``ValueError`` for bad arguments and
        :class:`MessageTooLargeError` before anything is written.
        """
        if (
            type(payload) is bytes
            and headers is None
            and priority is _MEDIUM
            and ttl is None
            and dedup_id is None
            and self._plain_path
            and len(payload) <= self._max_size
        ):
            return self._append_plain(payload)
        draft = self._prepare(payload, headers, priority, ttl, dedup_id)
        return self._append([draft])[0]

    # The three append paths below (one plain payload, a plain batch, drafts with
    # features) share their steps, in this order, under the queue lock:
    #   1. encode the entries (pure: a failure here has changed nothing);
    #   2. reserve ids (_reserve_ids), when the durable reservation does not cover them;
    #   3. write (the segment manager: one write() or writev);
    #   4. account (_appended): ids handed out, counters, the commit ticket, then
    #      retention after a rotation and waking waiters (_after_append);
    # and then, outside the lock, wait for the fsync with sync="always".
    # Steps 2 and 3 share one try: whatever fails there, _count_written hands out the
    # ids of what did reach the log (a rotation can fail after the write) and nothing
    # more, and _append also rolls back the dedup ids its features admitted - outside
    # the try, a failed meta save would leave the dedup window remembering ids of
    # messages never written, and a retry would be swallowed as their duplicate.  A
    # failed meta save therefore leaves nothing appended and no id consumed.

    def _append_plain(self, payload: bytes) -> int:
        """:meth:`_append` for one bytes payload with no option and no feature hook."""
        with self._lock:
            if self._closed:
                self._ensure_open()
            message_id = self._next_id
            now = time.time_ns()
            record = encode_plain_entry(message_id, now, payload)
            try:
                if message_id >= self._reserved_until:
                    self._reserve_ids(message_id + 1)
                rotated = self._manager.append_one(record, message_id, now)
            except BaseException:
                self._count_written(message_id)
                raise
            # _appended(message_id, 1, rotated), inlined: the call alone is 3% of a
            # plain enqueue (measured); the rare steps stay shared in _after_append.
            self._next_id = message_id + 1
            self._enqueued += 1
            ticket = self._log_commit.note_write()
            if rotated or self._waiting or self._listeners:
                self._after_append(rotated)
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        return message_id

    def _append_plain_batch(self, payloads: list[bytes]) -> list[int]:
        """:meth:`_append` for bytes payloads with no option and no feature hook.

        Each entry is three buffers (header, the payload itself, CRC) handed to one
        ``writev``: payloads are never copied.
        """
        count = len(payloads)
        with self._lock:
            if self._closed:
                self._ensure_open()
            first = self._next_id
            now = time.time_ns()
            parts, sizes = encode_plain_batch_parts(first, now, payloads)
            segments = len(self._manager.segments)
            try:
                if first + count > self._reserved_until:
                    self._reserve_ids(first + count)
                self._manager.append(parts, sizes, first, now)
            except BaseException:
                self._count_written(first)
                raise
            ticket = self._appended(first, count, len(self._manager.segments) != segments)
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        return list(range(first, first + count))

    def enqueue_batch(self, items: Iterable[bytes | bytearray | memoryview | Item]) -> list[int]:
        """Append several messages with one write and at most one fsync; return their ids.

        Every item is validated first: if any is invalid, nothing is written.
        """
        if self._plain_path:
            limit = self.options.max_message_size
            payloads = items if isinstance(items, list) else list(items)
            # set/map/max run in C: no Python-level loop over the batch for the check.
            if (
                payloads
                and set(map(type, payloads)) == {bytes}
                and max(map(len, payloads)) <= limit
            ):
                return self._append_plain_batch(payloads)  # type: ignore[arg-type]
            items = payloads
        prepared: list[Draft] = []
        for item in items:
            if isinstance(item, Item):
                prepared.append(
                    self._prepare(
                        item.payload, item.headers, item.priority, item.ttl, item.dedup_id
                    )
                )
            else:
                prepared.append(self._prepare(item, None, Priority.MEDIUM, None, None))
        if not prepared:
            return []
        return self._append(prepared)

    def _append(self, drafts: list[Draft]) -> list[int]:
        """Append ``drafts`` as one batch (all or nothing); return an id for each.

        A draft its features found to be a duplicate (dedup) is not written: its id
        is the original message's.
        """
        with self._lock:
            if self._closed:
                self._ensure_open()
            now = time.time_ns()
            to_write, existing = self._admit(drafts, now) if self._admitters else (drafts, {})
            if not to_write:
                return [existing[i] for i in range(len(drafts))]
            first = self._next_id
            count = len(to_write)
            segments = len(self._manager.segments)
            try:
                records = [
                    encode_entry(
                        first + i,
                        now,
                        draft.payload,
                        expires_at=None
                        if draft.expires_in_ns is None
                        else now + draft.expires_in_ns,
                        priority=draft.priority,
                        headers_blob=draft.headers_blob,
                        compressed=draft.compressed,
                        # Marks the batch's extent, so recovery can cut a partial one.
                        batch_continues=i < count - 1,
                    )
                    for i, draft in enumerate(to_write)
                ]
                if first + count > self._reserved_until:
                    self._reserve_ids(first + count)
                self._manager.append(records, [len(r) for r in records], first, now)
            except BaseException:
                for feature in self._admitters:
                    feature.rollback()
                self._count_written(first)
                raise
            ticket = self._appended(first, count, len(self._manager.segments) != segments)
            for feature in self._recorders:
                feature.appended(to_write, first, now)
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        if not existing:
            return list(range(first, first + count))
        fresh_ids = iter(range(first, first + count))
        return [existing[i] if i in existing else next(fresh_ids) for i in range(len(drafts))]

    def _admit(self, drafts: list[Draft], now: int) -> tuple[list[Draft], dict[int, int]]:
        """Ask the admitting features about each draft (lock held).

        Returns the drafts to write and, by position, the ids of those found to be
        duplicates (counted in ``stats().duplicates``).  Admitted drafts are noted
        by their features until the append succeeds or calls their ``rollback``.
        """
        fresh: list[Draft] = []
        existing: dict[int, int] = {}
        for position, draft in enumerate(drafts):
            candidate = self._next_id + len(fresh)  # the id it gets if written
            for feature in self._admitters:
                found = feature.admit(draft, now, candidate)
                if found is not None:
                    existing[position] = found
                    break
            else:
                fresh.append(draft)
        self._duplicates += len(existing)
        return fresh, existing

    def _reserve_ids(self, end: int) -> None:
        """The slow path before an append of ids up to ``end`` (exclusive) (lock held).

        Refuses (:class:`StorageError`, ENOSPC, nothing written) while the disk reserve
        is spent and cannot be written again: the last free space is for acks.

        Then reserves the ids durably, before they are written: ``meta.json`` records
        the ids handed out in blocks of ``ID_BLOCK`` ahead: a crash that loses a torn
        tail of the log (ids written, never fsynced) must not give those ids again, so
        the next open starts past the reservation.  An id may be written only once a
        reservation covering it is on disk.  If the save fails, the old reservation
        stays the one in memory too - otherwise the next append would believe itself
        covered and write ids no durable record reserves.
        """
        if not self._restore_reserve():
            raise StorageError(
                "append to",
                self._manager.directory,
                OSError(
                    errno.ENOSPC,
                    f"No space left for messages (the last {self._reserve.size // 1024} KiB "
                    "are kept for acks, which free space)",
                ),
            )
        if end <= self._ids_reserved_until:  # the gate was closed for the reserve only
            self._reserved_until = self._ids_reserved_until
            return
        previous = self._ids_reserved_until
        self._ids_reserved_until = end + ID_BLOCK
        try:
            self._save_meta(clean=False)
        except BaseException:
            self._ids_reserved_until = previous
            raise
        self._reserved_until = self._ids_reserved_until

    def _appended(self, first: int, count: int, rotated: bool) -> int:
        """Account ``count`` entries from id ``first`` now in the log (lock held).

        Their ids are handed out (never given again), they count as enqueued,
        retention runs if the append sealed a segment, and waiting consumers are
        woken.  Returns the commit ticket to wait on for durability (outside the lock).
        """
        self._next_id = first + count
        self._enqueued += count
        ticket = self._log_commit.note_write()
        if rotated or self._waiting or self._listeners:
            self._after_append(rotated)
        return ticket

    def _after_append(self, rotated: bool) -> None:
        """Apply retention if an append sealed a segment, and wake waiters (lock held)."""
        if rotated:
            self._retire_consumed()
        if self._waiting or self._listeners:
            self._wake()

    def _count_written(self, first: int) -> None:
        """An append from id ``first`` raised: account what it wrote all the same (lock held).

        A segment rotation that fails after the write leaves the entries in the log;
        the enqueue raised, so they may or may not be there (the promise), but their
        ids must never be given again, and readers will deliver them.
        """
        written = self._manager.next_id - first
        if written > 0:
            self._appended(first, written, rotated=False)

    def _restore(self, entry: Entry) -> bytes:
        """The payload as the producer gave it (undoing compression)."""
        payload = entry.payload
        if entry.flags & _COMPRESSED:
            if not self._restorers:
                raise CorruptionError(
                    f"message {entry.id} is compressed but no decompressor is available"
                )
            for feature in self._restorers:
                payload = feature.restore(entry, payload)
        return payload

    def _messages(self, reader: Reader, taken: list[tuple[Entry, int]]) -> list[Message]:
        """Build Messages; entries whose payload cannot be restored are settled as corrupt."""
        messages = []
        for entry, attempt in taken:
            try:
                payload = self._restore(entry)
            except CorruptionError as exc:
                logger.warning("ledgerq: skipping message %d in %s: %s", entry.id, self.path, exc)
                with self._lock:
                    self._corrupt_skipped += 1
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

    def reader(self, name: str, start: ReaderStart | int = "earliest") -> Reader:
        """Return the named reader (an independent consumer), creating it if new.

        A new reader starts at the oldest retained message, with ``start="latest"``
        at the tail, or with an id at the first message whose id is at least
        ``start`` (from 1 to the queue's next id; below the oldest retained message
        it starts there).  An existing reader is returned as it is.  Names are
        1-100 characters of ``[A-Za-z0-9_.-]`` not starting with a dot.  A new
        reader's state is durable when this returns.  Raises ``ValueError`` for a bad
        name or ``start``, ``TypeError`` for a ``start`` that is no str or int.
        """
        name = check_reader_name(name)
        start = check_reader_start(start)
        with self._lock:
            self._ensure_open()
            existing = self._readers.get(name)
            if existing is not None:
                return existing
            if isinstance(start, int):
                return self._open_new_reader(name, start, ())
            return self._open_reader(name, start_latest=start == "latest")

    def _create_reader(self, name: str, head: int, done: Iterable[int]) -> Reader:
        """Create the reader ``name`` with every id below ``head`` and in ``done`` done.

        For :func:`ledgerq.tools.create_reader`.  Refuses (``ValueError``) to touch a
        reader that exists; see :func:`~ledgerq.core.reader.initial_checkpoint` for
        the bounds of ``head`` and ``done``.
        """
        name = check_reader_name(name)
        with self._lock:
            self._ensure_open()
            path = self._reader_path(name)
            if name in self._readers or os.path.exists(path):
                raise ValueError(
                    f"reader {name!r} exists already ({path}); a reader's state is never "
                    "replaced: use queue.reader(name) to use it, or remove_reader(name) first"
                )
            return self._open_new_reader(name, head, done)

    def _open_new_reader(self, name: str, head: int, done: Iterable[int]) -> Reader:
        """Write a new reader's first checkpoint durably, then open it (lock held)."""
        checkpoint = initial_checkpoint(head, done, self._next_id)
        journal = ReaderJournal(self._reader_path(name))
        try:
            # temp file, fsync, rename, fsync of readers/: durable before the reader exists
            journal.rewrite(checkpoint)
        finally:
            journal.close()
        return self._open_reader(name, start_latest=False)

    def _reader_path(self, name: str) -> str:
        return reader_state_path(self.path, name)

    def remove_reader(self, name: str) -> bool:
        """Forget the named reader and its state, so it no longer holds back retention.

        Returns False if there is no such reader.  The default reader cannot be removed.
        """
        if check_reader_name(name) == DEFAULT_READER:
            raise ValueError("the default reader cannot be removed")
        with self._lock:
            self._ensure_open()
            reader = self._readers.get(name)
            if reader is None:
                return False
            with storage_errors("delete reader state", reader._core.journal.path):
                os.unlink(reader._core.journal.path)  # first: if it fails, nothing changed
            del self._readers[name]
            reader._removed = True
            reader._core.journal.close()
            self._retire_consumed()
            self._wake()  # its waiters must see that it is gone
            return True

    def dequeue(self, timeout: float | None = 0) -> Message | None:
        """Lease the next message (see :meth:`Reader.dequeue`)."""
        return self._default.dequeue(timeout)

    def dequeue_batch(self, n: int, timeout: float | None = 0) -> list[Message]:
        """Lease up to ``n`` messages (see :meth:`Reader.dequeue_batch`)."""
        return self._default.dequeue_batch(n, timeout)

    def ack(self, message_id: int) -> None:
        """Mark a leased message done (see :meth:`Reader.ack`)."""
        self._default.ack(message_id)

    def ack_batch(self, message_ids: Iterable[int]) -> None:
        """Mark several leased messages done at once (see :meth:`Reader.ack_batch`)."""
        self._default.ack_batch(message_ids)

    def nack(self, message_id: int, reason: str = "") -> None:
        """Give a leased message back as failed (see :meth:`Reader.nack`)."""
        self._default.nack(message_id, reason)

    def peek(self, n: int = 1) -> list[Message]:
        """The next ``n`` pending messages, without leasing them."""
        return self._default.peek(n)

    def __len__(self) -> int:
        with self._lock:
            self._ensure_open()
            return self._default._core.pending()

    # ------------------------------------------------------------------ waking

    def _wake(self) -> None:
        """Messages may have become available (or the queue closed): wake every waiter."""
        self._cond.notify_all()
        for callback in list(self._listeners.values()):
            callback()

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` whenever messages may have become available; return a remover.

        The callback runs with the queue lock held, in whichever thread enqueued,
        nacked or closed: it must be quick and must not call the queue (e.g.
        ``loop.call_soon_threadsafe``).  Used by ``ledgerq.aio`` to wait without threads.
        """
        with self._lock:
            key = self._next_listener
            self._next_listener += 1
            self._listeners[key] = callback

        def remove() -> None:
            with self._lock:
                self._listeners.pop(key, None)

        return remove

    # ------------------------------------------------------------------ tooling

    def _pending_entries(self, wanted: set[int] | None) -> list[tuple[Entry, bytes]]:
        """Entries (with restored payloads) the default reader has not acked, by id."""
        with self._lock:
            self._ensure_open()
            core = self._default._core
            entries = core.peek(1 << 62, time.time_ns()) + core.leased_entries()
        found = []
        for entry in sorted(entries, key=lambda e: e.id):
            if wanted is not None and entry.id not in wanted:
                continue
            try:
                found.append((entry, self._restore(entry)))
            except CorruptionError:
                continue
        return found

    def _settle(self, message_id: int) -> bool:
        """Settle ``message_id`` for the default reader wherever it is; True if it was pending."""
        with self._lock:
            self._ensure_open()
            settled = self._default._core.settle_any(message_id)
            if settled:
                self._retire_consumed()
        return settled

    # ------------------------------------------------------------------ retention

    def _retire_consumed(self) -> None:
        """Apply retention after a call whose effect has happened (lock held); never raises.

        Deleting a segment is housekeeping: a deletion the disk refuses is logged, and
        the segment, still listed, is tried again at the next settle or rotation.
        """
        segments = len(self._manager.segments)
        try:
            self._apply_retention()
        except StorageError as exc:
            logger.warning("ledgerq: retention could not delete a segment (%s)", exc)
        if len(self._manager.segments) < segments and not self._reserve.is_held:
            self._restore_reserve()  # the space of a deleted segment refills it first

    def _apply_retention(self) -> None:
        """Apply retention (lock held); cheap when there is nothing to delete.

        A sealed segment every reader has consumed is deleted at once, or - with
        ``retention_max_age`` - once its newest message is older than that.
        Unconsumed data is never deleted by age; only ``retention_max_bytes`` drops
        the oldest segments even if unconsumed, counting their unconsumed messages
        in ``stats().dropped``.  The active segment is never deleted.
        """
        manager = self._manager
        segments = manager.segments
        max_bytes = self.options.retention_max_bytes
        if len(segments) < 2:
            return
        head = min(r._core.head for r in self._readers.values())
        if segments[0].last_id < head:
            max_age = self.options.retention_max_age
            cutoff = None if max_age is None else time.time_ns() - int(max_age * _NS)
            while len(segments) > 1 and segments[0].last_id < head:
                if cutoff is not None and segments[0].last_timestamp >= cutoff:
                    break
                manager.delete_first()
        if max_bytes is not None:
            while len(segments) > 1 and manager.disk_bytes > max_bytes:
                seg = segments[0]
                lost = max(0, seg.last_id - max(seg.first_id, head) + 1) if seg.count else 0
                manager.delete_first()
                if lost:
                    self._dropped += lost
                    logger.warning(
                        "ledgerq: retention_max_bytes=%d dropped %d unconsumed messages "
                        "(ids %d-%d) of %s",
                        max_bytes,
                        lost,
                        max(seg.first_id, head),
                        seg.last_id,
                        self.path,
                    )

    def compact(self) -> None:
        """Apply retention now: delete segments that every reader has consumed."""
        with self._lock:
            self._ensure_open()
            self._apply_retention()
            self._restore_reserve()
            for reader in self._readers.values():
                reader._core.checkpoint()

    # ------------------------------------------------------------------ observing

    def stats(self) -> Stats:
        """A snapshot of the queue's figures (see :class:`ledgerq.Stats`)."""
        with self._lock:
            self._ensure_open()
            now = time.time_ns()
            readers = {name: r._core.stats(now) for name, r in self._readers.items()}
            default = readers[DEFAULT_READER]
            return Stats(
                pending=default.pending,
                in_flight=default.in_flight,
                enqueued=self._enqueued,
                acked=default.acked,
                nacked=default.nacked,
                dead_lettered=default.dead_lettered,
                expired=default.expired,
                duplicates=self._duplicates,
                dropped=self._dropped,
                corrupt_skipped=self._corrupt_skipped,
                segments=len(self._manager.segments),
                disk_bytes=self._manager.disk_bytes,
                oldest_pending_age=default.oldest_pending_age,
                next_id=self._next_id,
                readers=readers,
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
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake()
        self._stop_flusher.set()
        if self._flusher is not None:
            self._flusher.join()
        errors: list[Exception] = []
        try:
            with self._lock:
                _attempt(errors, self._manager.sync)
                for reader in self._readers.values():
                    _attempt(errors, functools.partial(self._close_reader, reader._core))
                    _attempt(errors, reader._core.journal.close)  # if its checkpoint failed
                for feature in self._features:
                    _attempt(errors, feature.flush)
                    _attempt(errors, feature.close)
                # "Clean" lets the next open trust next_id alone; after a failure it
                # skips the reserved ids as after a crash (ids are never reused).
                _attempt(errors, lambda: self._save_meta_at_close(clean=not errors))
                _attempt(errors, self._manager.close)
        finally:
            self._dirlock.release()
        if errors:
            raise errors[0]

    def _close_reader(self, core: ReaderCore) -> None:
        """Make a reader's journal durable at close, as one checkpoint if it grew.

        The checkpoint is compaction: on a full disk it may use the reserve, and if it
        still fails, the journal - which holds every record - is synced instead and
        the failure logged, not raised: a full disk must not fail the close of a queue
        that was only read (``ledgerq stats``), nor lose anything.
        """
        if not core.journal.has_grown:
            core.journal.commit.sync_now()
            core.journal.close()
            return
        try:
            self._with_room(core.checkpoint)
        except StorageError as exc:
            logger.warning("ledgerq: %s; the reader state is kept as it is (synced)", exc)
            core.journal.commit.sync_now()
        core.journal.close()

    def _save_meta_at_close(self, *, clean: bool) -> None:
        """Save meta.json as a close leaves it, unless it says that already.

        Like a checkpoint, the save may use the reserve on a full disk; if it still
        fails, the file on disk is safe to reopen with (its reservation covers every id
        written), so the failure is logged: only figures such as ``stats().dropped``
        may then be behind after the next open.
        """
        if self._disk_meta == (clean, self._meta_figures()):
            return
        try:
            self._with_room(lambda: self._save_meta(clean=clean))
        except StorageError as exc:
            logger.warning(
                "ledgerq: %s; the next open skips the ids reserved before (never reused) "
                "and its counters of duplicates and dropped messages may be behind",
                exc,
            )

    def _with_room(self, write: Callable[[], None]) -> None:
        """Run ``write``; if the disk is full, once more with the reserve's space."""
        try:
            write()
        except StorageError as exc:
            if exc.errno != errno.ENOSPC or not self._make_room():
                raise
            write()

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

    def _check(self) -> None:
        """Assert the queue's invariants (tests call this after every step)."""
        with self._lock:
            self._manager._check()
            assert self._next_id == self._manager.next_id
            for reader in self._readers.values():
                reader._core._check()
