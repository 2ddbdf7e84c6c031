"""The queue: ids, the append path, readers, waits and the sync policy.

Concurrency: one lock per queue guards the segment manager and every reader's
in-memory state; a condition on it wakes blocked dequeuers.  The lock is held
across the ``write()`` of an append (ids must reach the log in order) but never
across an fsync: durability waits happen after the lock is released, through
:class:`~ledgerq.segment.sync.GroupCommit`, so concurrent ``sync="always"``
callers share fsyncs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Self

from ledgerq._errors import (
    CorruptionError,
    NotAQueueError,
    QueueClosedError,
)
from ledgerq._options import Options
from ledgerq._types import Item, Message, Priority, Stats
from ledgerq.core.args import (
    check_dedup_id,
    check_payload,
    check_priority,
    check_ttl,
)
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
from ledgerq.segment.files import make_durable_dir, storage_errors
from ledgerq.segment.layout import subtract_ranges
from ledgerq.segment.lock import DirLock
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.meta import (
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
    OPTIONS_NAME,
    QUEUE_NAMES,
    READERS_DIR,
    STATE_SUFFIX,
    reader_state_path,
)
from ledgerq.segment.readonly_state import replay_reader
from ledgerq.segment.scanner import CorruptRegion
from ledgerq.segment.segment import Segment
from ledgerq.segment.sync import GroupCommit

__all__ = ["DEFAULT_READER", "QueueCore"]

logger = logging.getLogger("ledgerq")

DEFAULT_READER = "default"
_READER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\Z")
_MEDIUM = Priority.MEDIUM
_NS = 1_000_000_000
_COMPRESSED = int(EntryFlags.COMPRESSED)


def _check_reader_name(name: object) -> None:
    if not isinstance(name, str) or not _READER_NAME.match(name):
        raise ValueError(
            f"invalid reader name {name!r}: use 1-100 characters of letters, digits, "
            "'_', '-' and '.', not starting with '.' or '-'"
        )


def _attempt(errors: list[Exception], step: Callable[[], object]) -> None:
    """Run one step of a close; note its error in ``errors`` and go on."""
    try:
        step()
    except Exception as exc:
        errors.append(exc)


class QueueCore:
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
        self._options_store = OptionsStore(self.path)
        copy = self._options_store.load()
        self._copied_options = copy.options if copy is not None else None
        meta = self._load_meta(copy)
        self._meta = meta
        counters = meta.counters
        self._corrupt_skipped = counters.get("corrupt_skipped", 0)
        self._manager = SegmentManager(
            self.path,
            segment_size=opts.segment_size,
            index_interval=opts.index_interval,
            on_corrupt=self._on_corrupt,
            on_gap=self._record_gap,
            sync_on_rotate=opts.sync == "always",
        )
        # A corrupt region is counted once, however many times it is met (and reopened).
        self._manager.remember_reported(
            [(int(a), int(b)) for a, b in meta.corrupt_regions if isinstance(a, int)]
        )
        floor = meta.next_id if meta.clean else max(meta.next_id, meta.reserved_until)
        with storage_errors("open the segments in", self._manager.directory):
            self._manager.open(min_next_id=floor)
        if meta.gaps_from is None:
            # First open by a ledgerq that records its gaps: the gaps below this id (of
            # an older ledgerq) cannot be told from lost ids, so they raise no alarm.
            meta.gaps_from = self._manager.log_next_id
        self._lost = counters.get("lost", 0)
        self._next_id = self._manager.next_id
        # Entries appended after the last counter save were enqueued too (counted up to
        # the last entry in the log, not the reserved ids a crash made us skip).
        self._enqueued = counters.get("enqueued", 0) + max(
            0, self._manager.log_next_id - counters.get("enqueued_through", meta.next_id)
        )
        self._duplicates = counters.get("duplicates", 0)
        self._dropped = counters.get("dropped", 0)
        self._reserved_until = self._next_id + ID_BLOCK
        self._save_meta(clean=False)
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
            if stem != name and stem != DEFAULT_READER and _READER_NAME.match(stem):
                self._open_reader(stem, start_latest=False)
        counted = self._judge_gaps()
        if "enqueued" not in counters:
            # meta.json was rebuilt: what the default reader finished and what is retained
            # unfinished is what was enqueued, as far as the files tell.
            core = self._default._core
            finished = sum(core.counters[k] for k in ("acked", "dead_lettered", "expired"))
            self._enqueued = finished + core.pending() + core.in_flight()
        if counted or "enqueued" not in counters:
            self._save_meta(clean=False)  # the newly counted lost ids, counted once
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
            raise
        reader = Reader(self, core)
        self._readers[name] = reader
        return reader

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

    def _record_gap(self, first: int, last: int) -> None:
        """Record, durably, that ids ``first..last`` will never be written (a rotation
        skips them); called before the segment that leaves them out exists."""
        meta = self._meta
        if meta.gaps_from is None:
            meta.gaps_from = first
        meta.gaps.append([first, last])
        self._meta_store.save(meta)

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
                    self._lost += lost
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

    def _on_corrupt(self, seg: Segment, region: CorruptRegion) -> None:
        self._corrupt_skipped += 1

    def note_corrupt_skipped(self, count: int) -> None:
        """Count damaged records a feature skipped in its own files (``stats()``)."""
        self._corrupt_skipped += count

    def _save_meta(self, *, clean: bool) -> None:
        meta = self._meta
        meta.clean = clean
        meta.next_id = self._next_id
        meta.reserved_until = self._next_id if clean else self._reserved_until
        meta.counters = {
            "enqueued": self._enqueued,
            "enqueued_through": self._next_id,
            "duplicates": self._duplicates,
            "dropped": self._dropped,
            "corrupt_skipped": self._corrupt_skipped,
            "lost": self._lost,
        }
        meta.corrupt_regions = [list(key) for key in self._manager.reported_regions][-10_000:]
        # Ranges below the oldest segment are no longer between segments: forget them.
        oldest = self._manager.segments[0].first_id
        for ranges in (meta.gaps, meta.lost, meta.known_lost):
            ranges[:] = [r for r in ranges if r[1] >= oldest]
        meta.options = dataclasses.asdict(self.options)
        if meta.options != self._copied_options:
            # The second copy of the options, written only when they change: a lost or
            # damaged meta.json must not lose them (see segment.meta).
            self._options_store.save(OptionsCopy(created_ns=meta.created_ns, options=meta.options))
            self._copied_options = meta.options
        self._meta_store.save(meta)

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

    def _append_plain_batch(self, payloads: list[bytes]) -> list[int]:
        """:meth:`_append` for bytes payloads with no option and no feature hook.

        Each entry is three buffers (header, the payload itself, CRC) handed to one
        ``writev``: payloads are never copied.
        """
        count = len(payloads)
        with self._lock:
            if self._closed:
                raise QueueClosedError(f"queue {self.path} is closed")
            first = self._next_id
            if first + count > self._reserved_until:
                self._reserved_until = first + count + ID_BLOCK
                self._save_meta(clean=False)
            now = time.time_ns()
            parts, sizes = encode_plain_batch_parts(first, now, payloads)
            segments_before = len(self._manager.segments)
            try:
                self._manager.append(parts, sizes, first, now)
            except BaseException:
                self._count_written(first)
                raise
            self._next_id = first + count
            self._enqueued += count
            if len(self._manager.segments) != segments_before:
                self._retire_consumed()
            ticket = self._log_commit.note_write()
            if self._waiting or self._listeners:
                self._wake()
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        return list(range(first, first + count))

    def _append_plain(self, payload: bytes) -> int:
        """:meth:`_append` for one bytes payload with no option and no feature hook."""
        with self._lock:
            if self._closed:
                raise QueueClosedError(f"queue {self.path} is closed")
            message_id = self._next_id
            if message_id >= self._reserved_until:
                self._reserved_until = message_id + 1 + ID_BLOCK
                self._save_meta(clean=False)
            now = time.time_ns()
            try:
                rotated = self._manager.append_one(
                    encode_plain_entry(message_id, now, payload), message_id, now
                )
            except BaseException:
                self._count_written(message_id)
                raise
            if rotated:
                self._retire_consumed()  # a segment was sealed: retention may apply
            self._next_id = message_id + 1
            self._enqueued += 1
            ticket = self._log_commit.note_write()
            if self._waiting or self._listeners:
                self._wake()
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        return message_id

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
        with self._lock:
            if self._closed:
                raise QueueClosedError(f"queue {self.path} is closed")
            now = time.time_ns()
            existing: dict[int, int] = {}
            if self._admitters:
                fresh: list[Draft] = []
                for position, draft in enumerate(drafts):
                    candidate = self._next_id + len(fresh)
                    for feature in self._admitters:
                        found = feature.admit(draft, now, candidate)
                        if found is not None:
                            existing[position] = found
                            break
                    else:
                        fresh.append(draft)
                self._duplicates += len(existing)
                if not fresh:
                    return [existing[i] for i in range(len(drafts))]
                to_write = fresh
            else:
                to_write = drafts
            first = self._next_id
            count = len(to_write)
            segments_before = len(self._manager.segments)
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
                    self._reserved_until = first + count + ID_BLOCK
                    self._save_meta(clean=False)
                self._manager.append(records, [len(r) for r in records], first, now)
            except BaseException:
                for feature in self._admitters:
                    feature.rollback()
                self._count_written(first)
                raise
            self._next_id = first + count
            self._enqueued += count
            if len(self._manager.segments) != segments_before:
                self._retire_consumed()  # a segment was sealed: retention may apply
            for feature in self._recorders:
                feature.appended(to_write, first, now)
            ticket = self._log_commit.note_write()
            if self._waiting or self._listeners:
                self._wake()
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        if not existing:
            return list(range(first, first + count))
        ids = []
        new_id = first
        for position in range(len(drafts)):
            if position in existing:
                ids.append(existing[position])
            else:
                ids.append(new_id)
                new_id += 1
        return ids

    def _count_written(self, first: int) -> None:
        """An append from id ``first`` raised: count what it wrote all the same (lock held).

        A segment rotation that fails after the write leaves the entries in the log;
        the enqueue raised, so they may or may not be there (the promise), but their
        ids must never be given again: the next id moves past them.
        """
        written = self._manager.next_id - first
        if written > 0:
            self._next_id = first + written
            self._enqueued += written
            self._log_commit.note_write()

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
                    if reader._core.settle_any(entry.id):
                        reader._core.counters["acked"] -= 1
                continue
            messages.append(entry_to_message(entry, attempt, payload))
        return messages

    # ------------------------------------------------------------------ consuming

    def reader(self, name: str, start: str | int = "earliest") -> Reader:
        """Return the named reader (an independent consumer), creating it if new.

        A new reader starts at the oldest retained message, with ``start="latest"``
        at the tail, or with an id at the first message whose id is at least
        ``start`` (from 1 to the queue's next id; below the oldest retained message
        it starts there).  An existing reader is returned as it is.  Names are
        1-100 characters of ``[A-Za-z0-9_.-]`` not starting with a dot.  A new
        reader's state is durable when this returns.  Raises ``ValueError`` for a bad
        name or ``start``, ``TypeError`` for a ``start`` that is no str or int.
        """
        _check_reader_name(name)
        if isinstance(start, bool) or not isinstance(start, (str, int)):
            raise TypeError(f"start must be 'earliest', 'latest' or an id, got {start!r}")
        if isinstance(start, str) and start not in ("earliest", "latest"):
            raise ValueError(f"start must be 'earliest', 'latest' or an id, got {start!r}")
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
        _check_reader_name(name)
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
        if name == DEFAULT_READER:
            raise ValueError("the default reader cannot be removed")
        with self._lock:
            self._ensure_open()
            reader = self._readers.pop(name, None)
            if reader is None:
                return False
            reader._removed = True
            reader._core.journal.close()
            os.unlink(reader._core.journal.path)
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
            self._retire_consumed()
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
                lost=self._lost,
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
                    _attempt(errors, reader._core.close)
                    _attempt(errors, reader._core.journal.close)  # if its checkpoint failed
                for feature in self._features:
                    _attempt(errors, feature.flush)
                    _attempt(errors, feature.close)
                # "Clean" lets the next open trust next_id alone; after a failure it
                # skips the reserved ids as after a crash (ids are never reused).
                _attempt(errors, lambda: self._save_meta(clean=not errors))
                _attempt(errors, self._manager.close)
        finally:
            self._dirlock.release()
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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

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
