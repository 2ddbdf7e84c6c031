"""A queue's figures, read from its files without its lock.

The console runs beside the processes that use the queues, so it never opens a queue
to look at it: an exclusive open would fail while the application runs (and, worse,
make the application's own open fail while the console held it).  It reads what any
lock-free reader may read (``ledgerq.segment.readonly``, whose module docstring lists
what the owner guarantees):

* the segments, in content order: which ids are retained (ids inside a segment are
  consecutive, so a segment's count is ``last - first + 1``);
* each reader's state journal, replayed *incrementally* - a :class:`JournalTail`
  reads only the records appended since the last refresh (a compaction replaces the
  file with one that starts with a checkpoint, which the tail notices and reads whole);
* the newest segment's last complete id (an append in flight is not counted);
* for the oldest pending message's age, the first entry at or after the reader's head.

None of it is encrypted (docs/encryption.md: ids, counts, sizes and times stay
readable), so every figure is read without a key - an encrypted queue the console has
no key for has them all, and is marked (``encrypted``, ``key_problem``: ``_encryption``).
Only the messages themselves need the key (:meth:`QueueFiles.messages`).

So a refresh costs a directory listing, a journal read of what is new, and one or two
small preads per queue - never a scan of the log, never a lock.  The owner's memory
may be ahead of the files by what it has not written yet (nothing: every enqueue,
lease and ack is written to the OS before its call returns), never behind.

The figures match ``Queue.stats()`` of the default reader: ``pending`` (waiting, not
leased), ``in_flight`` (leased by a process that has the queue open; a queue closed
cleanly has none), the counters the journal keeps (acked, nacked, dead-lettered,
expired), and ``delayed``: messages waiting for a not-before time, their retry
delays from the journal and the delays they were enqueued with from the entries
appended since the last refresh (``ledgerq.ui._schedule``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ledgerq import ConfigError, CorruptionError, Message, tools
from ledgerq.segment.naming import DLQ_DIR, SEGMENTS_DIR, reader_state_path
from ledgerq.segment.readonly import (
    JournalTail,
    LogTail,
    ReaderState,
    RecordType,
    SegmentDirectory,
    is_cleanly_closed,
    is_queue_dir,
    last_complete_id,
    list_reader_names,
)
from ledgerq.ui._encryption import PLAIN, KeyNeeded, KeyState, key_state
from ledgerq.ui._schedule import ScheduleTail

__all__ = [
    "DEFAULT_READER",
    "DeliveryTimes",
    "QueueFigures",
    "QueueFiles",
    "ReaderFigures",
    "ReaderSnapshot",
    "RetainedIds",
]

DEFAULT_READER = "default"  # the reader Queue.dequeue uses (docs/usage.md)
_DATA = int(RecordType.DATA)  # the entries that are messages (the others are reserved)


@dataclass(frozen=True, slots=True)
class ReaderFigures:
    """One reader's figures, as its journal says."""

    name: str
    head: int
    pending: int
    in_flight: int
    delayed: int
    acked: int
    nacked: int
    dead_lettered: int
    expired: int


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """What the console shows of one queue, taken at ``taken_at`` (``time.time()``).

    ``pending``, ``in_flight``, ``delayed`` and the counters are the default reader's,
    as in ``Queue.stats()``; ``dlq`` counts the messages waiting in its dead-letter
    queue; ``last_id`` is the id of the newest complete message (what the enqueue rate
    is measured by); ``is_open`` says the queue was not closed cleanly: a process has
    it open (or died with it open).  ``problem`` says why figures are missing (a
    damaged journal, a queue removed while looked at); the numbers are 0 then.
    ``encrypted``: the queue's payloads and headers are encrypted; ``key_problem``:
    why the console cannot read them (``"key needed"``, ``"wrong key"``: see
    ``_encryption``), None when it can - the figures are there either way.
    """

    pending: int
    in_flight: int
    delayed: int
    dlq: int
    acked: int
    nacked: int
    dead_lettered: int
    expired: int
    last_id: int
    first_id: int
    segments: int
    disk_bytes: int
    oldest_pending_age: float
    is_open: bool
    readers: tuple[ReaderFigures, ...]
    taken_at: float
    problem: str | None = None
    encrypted: bool = False
    key_problem: str | None = None

    @property
    def is_locked(self) -> bool:
        """Whether the queue is encrypted and the console cannot read its messages."""
        return self.key_problem is not None


@dataclass(frozen=True, slots=True)
class RetainedIds:
    """The ids the segments hold: ``ranges`` of consecutive ids, oldest first; the
    number of segment files and their bytes (an empty newest segment counts)."""

    ranges: tuple[tuple[int, int], ...]
    segments: int
    disk_bytes: int

    @property
    def first_id(self) -> int:
        """The oldest retained id (0 when nothing is retained)."""
        return self.ranges[0][0] if self.ranges else 0

    @property
    def last_id(self) -> int:
        """The newest complete id (0 when nothing is retained)."""
        return self.ranges[-1][1] if self.ranges else 0

    def count_from(self, start: int) -> int:
        """How many retained ids are ``>= start``."""
        total = 0
        for first, last in self.ranges:
            if last >= start:
                total += last - max(first, start) + 1
        return total

    def holds(self, message_id: int) -> bool:
        """Whether a segment holds ``message_id``."""
        return any(first <= message_id <= last for first, last in self.ranges)


@dataclass(frozen=True, slots=True)
class ReaderSnapshot:
    """One reader's state, fixed: what the message views need to say what is done.

    ``head``: every id below it is finished; ``done``: finished ids above it;
    ``leased``: out for delivery now; ``deliveries``: deliveries of each unfinished id.
    """

    name: str
    head: int
    done: frozenset[int]
    leased: frozenset[int]
    deliveries: dict[int, int]

    def is_finished(self, message_id: int) -> bool:
        """Whether the reader is done with ``message_id`` (acked, dead-lettered, expired)."""
        return message_id < self.head or message_id in self.done

    def status(self, message_id: int) -> str:
        """``"finished"``, ``"in flight"`` or ``"pending"``."""
        if self.is_finished(message_id):
            return "finished"
        if message_id in self.leased:
            return "in flight"
        return "pending"


@dataclass(frozen=True, slots=True)
class DeliveryTimes:
    """The not-before times of one reader's messages at ``now_ns``, fixed: the retry
    delays of its journal (``retries``) and the delays the entries were enqueued with
    (``entries``), each only while ahead."""

    retries: dict[int, int]
    entries: dict[int, int]
    now_ns: int

    def not_before(self, message_id: int) -> int | None:
        """When ``message_id`` may be delivered next (ns), or None when nothing holds it
        back: a retry delay first (a message delivered once waits for that only), else
        the delay of its entry."""
        return self.retries.get(message_id) or self.entries.get(message_id)


class _Journal:
    """One reader's journal followed incrementally (see the module)."""

    __slots__ = ("state", "tail")

    def __init__(self, path: str) -> None:
        self.tail = JournalTail(path)
        self.state = ReaderState()

    def refresh(self) -> ReaderState:
        records = self.tail.read()
        if self.tail.restarted:
            self.state = ReaderState()  # a new file: its checkpoint is the whole state
        self.state.apply(records)
        return self.state


class QueueFiles:
    """The files of one queue directory, followed from refresh to refresh.

    Thread-safe: the console's request threads and its sampler share one per queue;
    a short lock of its own serialises their reads (never the queue's lock).

    ``encryption_key``: the console's key, used for this queue (and its DLQ) only if
    the queue is encrypted (see ``_encryption``).
    """

    def __init__(self, path: str, *, encryption_key: bytes | None = None) -> None:
        self.path = path
        self._key = encryption_key
        self._segments = SegmentDirectory(os.path.join(path, SEGMENTS_DIR), last_ids=True)
        self._journals: dict[str, _Journal] = {}
        self._dlq: QueueFiles | None = None
        self._schedule = ScheduleTail()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ reading

    def retained(self) -> RetainedIds:
        """The ids the segments hold now, and the bytes of the segment files."""
        with self._lock:
            return self._retained()

    def reader(self, name: str = DEFAULT_READER) -> ReaderSnapshot:
        """The reader ``name`` as its journal says now (at the start if it has none).

        Raises :class:`CorruptionError` for a journal damaged in the middle.
        """
        with self._lock:
            state = self._reader_state(name)
            leased = frozenset() if is_cleanly_closed(self.path) else frozenset(state.leased)
            return ReaderSnapshot(
                name,
                state.durable_head(),
                frozenset(state.done),
                leased,
                dict(state.deliveries),
            )

    def reader_names(self) -> list[str]:
        """The readers with a state journal, the default one first."""
        names = list_reader_names(self.path)
        if DEFAULT_READER in names:
            names.remove(DEFAULT_READER)
        return [DEFAULT_READER, *names]

    def dlq(self) -> QueueFiles | None:
        """The files of the dead-letter queue (``None`` while it has none)."""
        if self._dlq is None:
            path = os.path.join(self.path, DLQ_DIR)
            if not is_queue_dir(path):
                return None
            self._dlq = QueueFiles(path, encryption_key=self._key)
        return self._dlq

    # ------------------------------------------------------------------ encryption

    def key_state(self) -> KeyState:
        """Whether the queue is encrypted, and whether the console's key opens it
        (reads ``meta.json`` only)."""
        return key_state(self.path, self._key)

    def key_for_open(self) -> bytes | None:
        """The ``encryption_key`` to open this queue with: the console's key for an
        encrypted queue, None for a plain one.  Raises :class:`KeyNeeded` when the key
        does not open it."""
        state = self.key_state()
        if state.is_locked:
            raise KeyNeeded(state)
        return self._key if state.encrypted else None

    def messages(self, from_id: int = 1) -> Iterator[Message]:
        """The messages retained in the log from ``from_id`` on: ``tools.iter_messages``
        with the key this queue takes.  Raises :class:`KeyNeeded` (when iterated) for a
        queue the console cannot read."""
        key = self.key_for_open()
        try:
            yield from tools.iter_messages(self.path, from_id, encryption_key=key)
        except ConfigError:
            # The queue's key check changed since it was read (a rekey started): say
            # what it is now, or let any other refusal through as it is.
            state = self.key_state()
            if state.is_locked:
                raise KeyNeeded(state) from None
            raise

    def figures(self) -> QueueFigures:
        """The queue's figures now (see :class:`QueueFigures`).

        A damaged journal or a queue removed while read gives figures of 0 with a
        ``problem`` instead of an exception: the overview goes on with the others.
        """
        taken_at = time.time()
        sealing = self.key_state()
        try:
            with self._lock:
                retained = self._retained()
                is_open = not is_cleanly_closed(self.path)
                names = self.reader_names()
                now_ns = time.time_ns()
                self._follow_schedule(names, now_ns)
                readers = tuple(
                    self._reader_figures(name, retained, is_open, now_ns) for name in names
                )
                state = self._reader_state(DEFAULT_READER)
                skip = state.done | state.leased if is_open else state.done
            default = readers[0]
            dlq = self.dlq()
            dead = 0 if dlq is None else dlq.pending_count()
            oldest = self._oldest_pending_age(default.head, skip, taken_at)
        except CorruptionError as exc:
            return _unreadable(taken_at, f"a reader journal is damaged: {exc}", sealing)
        except (FileNotFoundError, NotADirectoryError) as exc:
            return _unreadable(taken_at, f"the queue's files went away while read ({exc})", sealing)
        return QueueFigures(
            pending=default.pending,
            in_flight=default.in_flight,
            delayed=default.delayed,
            dlq=dead,
            acked=default.acked,
            nacked=default.nacked,
            dead_lettered=default.dead_lettered,
            expired=default.expired,
            last_id=retained.last_id,
            first_id=retained.first_id,
            segments=retained.segments,
            disk_bytes=retained.disk_bytes,
            oldest_pending_age=oldest,
            is_open=is_open,
            readers=readers,
            taken_at=taken_at,
            encrypted=sealing.encrypted,
            key_problem=sealing.problem,
        )

    def pending_count(self) -> int:
        """Messages the default reader has not finished (pending and in flight)."""
        with self._lock:
            retained = self._retained()
            state = self._reader_state(DEFAULT_READER)
            return _unfinished(retained, state.durable_head(), state.done)

    # ------------------------------------------------------------------ the parts

    def _retained(self) -> RetainedIds:
        seg_dir = self._segments.path
        try:
            files = self._segments.layout().used
        except FileNotFoundError:
            return RetainedIds((), 0, 0)
        ranges: list[tuple[int, int]] = []
        for position, f in enumerate(files):
            if position + 1 < len(files):
                # A sealed segment: its index says its last id, else the next one's
                # first id bounds it (ids only increase between segments).
                last = f.last_id or files[position + 1].first_id - 1
            else:
                last = last_complete_id(self.path)
                if last < f.first_id:
                    continue  # an empty newest segment (just rotated, or no message yet)
            if last >= f.first_id:
                ranges.append((f.first_id, last))
        disk = 0  # bytes of the log files, as Stats.disk_bytes counts them
        for f in files:
            if f.size >= 0:
                disk += f.size
                continue
            try:
                disk += os.stat(os.path.join(seg_dir, f.file_name)).st_size
            except FileNotFoundError:
                continue  # deleted by retention meanwhile
        return RetainedIds(tuple(ranges), len(files), disk)

    def _reader_state(self, name: str) -> ReaderState:
        journal = self._journals.get(name)
        if journal is None:
            journal = self._journals[name] = _Journal(reader_state_path(self.path, name))
        try:
            return journal.refresh()
        except FileNotFoundError:
            del self._journals[name]  # no journal (yet, or removed): at the start
            return ReaderState()

    def _follow_schedule(self, names: list[str], now_ns: int) -> None:
        """Read the delays of the entries appended since the last refresh."""
        lowest_head = min(self._reader_state(name).durable_head() for name in names)
        self._schedule.refresh(self.path, lowest_head, now_ns)

    def delivery_times(self, reader: str = DEFAULT_READER) -> DeliveryTimes:
        """When the messages of ``reader`` may be delivered next, as the files say now.

        The journals and the log's new entries are read once here; a listing looks up
        every message it shows in the answer (:meth:`DeliveryTimes.not_before`), so it
        costs the same whatever number of messages are delayed.
        """
        now_ns = time.time_ns()
        with self._lock:
            state = self._reader_state(reader)
            self._follow_schedule(self.reader_names(), now_ns)
            retries = {i: due for i, due in state.not_before.items() if due > now_ns}
            entries = self._schedule.ahead(now_ns)
        return DeliveryTimes(retries, entries, now_ns)

    def not_before(self, message_id: int, reader: str = DEFAULT_READER) -> int | None:
        """When ``message_id`` may be delivered next (ns), if that is still ahead: its
        retry delay for ``reader``, else the delay it was enqueued with.  For one
        message; a listing takes :meth:`delivery_times` once."""
        return self.delivery_times(reader).not_before(message_id)

    def _reader_figures(
        self, name: str, retained: RetainedIds, is_open: bool, now_ns: int
    ) -> ReaderFigures:
        state = self._reader_state(name)
        head = state.durable_head()
        unfinished = _unfinished(retained, head, state.done)
        leased = state.leased if is_open else frozenset()
        in_flight = sum(1 for i in leased if i >= head and i not in state.done)
        counters = state.counters
        return ReaderFigures(
            name=name,
            head=head,
            pending=max(unfinished - in_flight, 0),
            in_flight=in_flight,
            delayed=self._schedule.delayed(state, leased, now_ns),
            acked=counters.get("acked", 0),
            nacked=counters.get("nacked", 0),
            dead_lettered=counters.get("dead_lettered", 0),
            expired=counters.get("expired", 0),
        )

    def _oldest_pending_age(self, head: int, skip: set[int], now: float) -> float:
        """Seconds since the enqueue of the oldest message waiting for the default
        reader (0.0 when there is none): the first one at or after its head that is
        neither finished nor leased (``skip``).

        Read from the entries, whose times are never encrypted: no payload is opened
        for it, and a queue the console has no key for has this figure too.
        """
        tail = LogTail(self.path, head)
        try:
            while (entry := tail.next_entry()) is not None:
                if entry.type != _DATA or entry.id in skip:
                    continue
                return max(0.0, now - entry.timestamp / 1e9)
        except CorruptionError:
            # Retention deleted the segment the walk was about to read, or the queue
            # is being removed: no figure this time (the next refresh walks again).
            return 0.0
        finally:
            tail.close()
        return 0.0


def _unfinished(retained: RetainedIds, head: int, done: set[int]) -> int:
    """Retained ids at or above ``head`` that are not in ``done``."""
    return max(retained.count_from(head) - sum(1 for i in done if i >= head), 0)


def _unreadable(taken_at: float, problem: str, sealing: KeyState = PLAIN) -> QueueFigures:
    return QueueFigures(
        pending=0,
        in_flight=0,
        delayed=0,
        dlq=0,
        acked=0,
        nacked=0,
        dead_lettered=0,
        expired=0,
        last_id=0,
        first_id=0,
        segments=0,
        disk_bytes=0,
        oldest_pending_age=0.0,
        is_open=False,
        readers=(),
        taken_at=taken_at,
        problem=problem,
        encrypted=sealing.encrypted,
        key_problem=sealing.problem,
    )
