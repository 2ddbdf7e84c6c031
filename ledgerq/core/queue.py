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
import errno
import logging
import os
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NoReturn

from ledgerq._errors import (
    CorruptionError,
    QueueBusyError,
    QueueClosedError,
    QueueLockedError,
    StorageError,
)
from ledgerq._options import MAX_SECONDS, Options
from ledgerq._types import Item, Message, Priority, Stats
from ledgerq.core.admission import Admission
from ledgerq.core.args import (
    DEFAULT_LOCK_TIMEOUT,
    check_dedup_id,
    check_delay,
    check_group,
    check_headers_size,
    check_payload,
    check_priority,
    check_timeout,
    check_ttl,
    check_unique_key,
)
from ledgerq.core.clock import SYSTEM_CLOCK, Clock, check_clock
from ledgerq.core.closing import Closing
from ledgerq.core.feature import (
    Draft,
    Feature,
    ReadersNeeded,
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
from ledgerq.core.tracing import TRACE_MODULE, traced_items, with_trace_context
from ledgerq.core.waits import Waits
from ledgerq.format.entry import (
    Entry,
    EntryFlags,
    encode_headers,
)
from ledgerq.format.errors import CorruptRecord
from ledgerq.segment.cursor import LogCursor
from ledgerq.segment.encryption import check_key_before_open
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.meta import (
    ID_BLOCK,
)
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


class QueueCore(Opening, NamedReaders, Retention, Admission, HandOff, Closing):
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

    # ------------------------------------------------------------------ enqueue

    def _ensure_open(self) -> None:
        if self._closed:
            if self._holdings.forked:
                raise forked_error("queue", self.path, self._owner_pid, shared=self.shared)
            raise QueueClosedError(f"queue {self.path} is closed")

    def _prepare(
        self,
        payload: object,
        headers: Mapping[str, str] | None,
        priority: object,
        ttl: object,
        dedup_id: object,
        delay: object = None,
        group: object = None,
        sizes: list[int] | None = None,
        unique_key: object = None,
    ) -> Draft:
        """Validate one message and build its draft; append its payload size (as given,
        before any feature changes it) to ``sizes`` if given - for a bounded queue."""
        limit = self.options.max_message_size
        data = check_payload(payload, limit)
        if sizes is not None:
            sizes.append(len(data))
        blob = check_headers_size(encode_headers(headers), limit) if headers is not None else None
        level = check_priority(priority) if priority is not Priority.MEDIUM else 1
        seconds = check_ttl(ttl)
        delay_seconds = check_delay(delay)
        draft = Draft(
            data,
            blob,
            level,
            int(seconds * _NS) if seconds is not None else None,
            check_dedup_id(dedup_id),
            # A delay of 0 is no delay: the entry stays plain (and readable by any ledgerq).
            int(delay_seconds * _NS) if delay_seconds else None,
            check_group(group),
            check_unique_key(unique_key),
        )
        for feature in self._transformers:
            feature.transform(draft)
        return draft

    def _prepare_item(self, item: Item, sizes: list[int] | None = None) -> Draft:
        """:meth:`_prepare` for an :class:`~ledgerq.Item` (its fields checked, its
        payload size noted in ``sizes`` if given)."""
        return self._prepare(
            item.payload,
            item.headers,
            item.priority,
            item.ttl,
            item.dedup_id,
            item.delay,
            item.group,
            sizes,
            item.unique_key,
        )

    def enqueue(
        self,
        payload: bytes | bytearray | memoryview,
        *,
        headers: Mapping[str, str] | None = None,
        priority: Priority | int = Priority.MEDIUM,
        ttl: float | None = None,
        dedup_id: str | bytes | None = None,
        delay: float | None = None,
        group: str | None = None,
        timeout: float | None = 0,
        unique_key: str | None = None,
    ) -> int:
        """Append one message; return its id.

        The message has reached the OS when this returns (it survives a crash
        of this process); with ``sync="always"`` it is also on disk.  With ``delay``
        (seconds) it is not delivered, peeked or counted as ready before that much
        time has passed, across reopens and crashes (``stats().delayed`` counts it).
        With ``group`` (a str of 1 to 255 bytes of UTF-8) it is delivered after the
        earlier messages of its group are acked, dead-lettered or expired, one at a
        time; other groups and messages without one are not held up.
        With ``unique_key`` (a str of 1 to 1024 bytes of UTF-8) it is a unique job:
        while a message enqueued with that key is not yet acked, dead-lettered,
        expired or dropped by every reader, nothing is added and that message's id is
        returned - across processes (shared mode), reopens and crashes.
        Raises ``TypeError``/``ValueError`` for bad arguments and
        :class:`MessageTooLargeError` before anything is written.

        In a bounded queue (``max_pending``, ``max_pending_bytes``) an enqueue that
        would exceed a bound waits up to ``timeout`` seconds for room (0: not at all,
        None: forever), then raises :class:`QueueFullError` having written nothing.
        A payload larger than ``max_pending_bytes`` raises
        :class:`MessageTooLargeError` at once.

        Inside a current OpenTelemetry span, the message carries its W3C
        ``traceparent`` header (core/tracing; nothing without OpenTelemetry).
        """
        if TRACE_MODULE in _MODULES:
            headers = with_trace_context(headers)
        if (
            type(payload) is bytes
            and headers is None
            and priority is _MEDIUM
            and ttl is None
            and dedup_id is None
            and group is None
            and self._plain_path
            and len(payload) <= self._max_size
            and timeout == 0
        ):
            if unique_key is not None:
                # A key of at most 256 characters is at most 1024 bytes of UTF-8 (and
                # a str is the type asked): the checked way decides about any other.
                if (
                    delay is None
                    and type(unique_key) is str
                    and 0 < len(unique_key) <= 256
                    and unique_key.isprintable()  # (no lone surrogate: the checked way says)
                    and self._unique is not None
                ):
                    return self._append_unique(payload, unique_key)
            elif delay is None:
                return self._append_plain(payload)
            # A delay that check_delay would take as is (anything else goes the checked
            # way, which raises or, for 0, writes a plain entry).
            elif (type(delay) is float or type(delay) is int) and 0 < delay <= MAX_SECONDS:
                return self._append_plain(payload, int(delay * _NS))
        sizes: list[int] | None = [] if self._backlog is not None else None
        draft = self._prepare(
            payload, headers, priority, ttl, dedup_id, delay, group, sizes, unique_key
        )
        return self._append([draft], sizes, timeout)[0]

    # The four append paths below (one plain payload, one with a unique key, a plain
    # batch - of bytes, or with a few Items among them - and drafts with features) are
    # the only ones, for both modes.  They share their steps, in this order, under the
    # queue lock:
    #   1. begin: in shared mode the append session (core/shared_appends) takes the
    #      append lock and says the next id and the earliest stamp; exclusive mode owns
    #      the log and does nothing;
    #   2. encode the entries (pure: a failure here has changed nothing);
    #   3. reserve ids (_reserve_ids), when the durable reservation does not cover them;
    #   4. write (the segment manager: one write() or writev);
    #   5. account (_appended): ids handed out, counters, the commit ticket, retention
    #      after a rotation; then end the session, and wake the waiters (_after_append);
    # and then, outside the lock, wait for the fsync with sync="always".
    # Steps 3 and 4 share one try: whatever fails there, _count_written hands out the
    # ids of what did reach the log (a rotation can fail after the write) and nothing
    # more, and _append also rolls back the dedup ids its features admitted - outside
    # the try, a failed meta save would leave the dedup window remembering ids of
    # messages never written, and a retry would be swallowed as their duplicate.  A
    # failed meta save therefore leaves nothing appended and no id consumed.

    def _begin(self) -> tuple[int, int]:
        """Step 1 of an append path (lock held): the next id and the stamp to use - in
        shared mode, the append session begun (its ``end`` must follow)."""
        if self._closed:
            self._ensure_open()
        now = self._clock_offset_ns + self._clock_mono()  # the queue's time (core/clock)
        appends = self._appends
        if appends is None:
            return self._next_id, now
        return appends.begin(now)

    def _append_plain(self, payload: bytes, delay_ns: int = 0) -> int:
        """:meth:`_append` for one bytes payload with no option and no feature hook
        (but ``delay_ns`` > 0: a delayed message)."""
        with self._lock:
            # (_begin, inlined: this is the path of every plain enqueue)
            if self._closed:
                self._ensure_open()
            now = self._clock_offset_ns + self._clock_mono()  # the queue's time (core/clock)
            appends = self._appends
            if appends is None:
                message_id = self._next_id
            else:
                message_id, now = appends.begin(now)
            try:
                record = (
                    self._encode_delayed(message_id, now, payload, now + delay_ns)
                    if delay_ns
                    else self._encode_plain(message_id, now, payload)
                )
                try:
                    if message_id >= self._append_gate:
                        self._reserve_ids(message_id + 1)
                    rotated = self._manager.append_one(record, message_id, now)
                except BaseException:
                    self._count_written(message_id)
                    raise
                # _appended(message_id, 1, rotated), inlined: the call alone is 3% of a
                # plain enqueue (measured); the rare steps stay shared.
                self._next_id = message_id + 1
                self._enqueued += 1
                ticket = self._log_commit.note_write()
                if rotated:
                    self._retire_after_rotation()
            finally:
                if appends is not None:
                    appends.end()
            if rotated or self._waits.waiting or self._waits.listeners:
                self._after_append()
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        return message_id

    def _append_unique(self, payload: bytes, unique_key: str) -> int:
        """:meth:`_append_plain` with a unique key: the unique-jobs feature admits it and
        writes its record before the message (features/unique.py).  A new key takes no
        reader's step; a key a shared handle's view shows held goes the checked way,
        which holds every reader to judge it (ReadersNeeded)."""
        unique = self._unique
        assert unique is not None
        with self._lock:
            message_id, now = self._begin()
            appends = self._appends
            try:
                try:
                    held = unique.add_key(unique_key, now, message_id)
                except ReadersNeeded:
                    unique.rollback()
                    held = 0  # judged below, holding every reader
                except BaseException:
                    unique.rollback()
                    raise
                if held is None:
                    record = self._encode_plain(message_id, now, payload)
                    try:
                        if message_id >= self._append_gate:
                            self._reserve_ids(message_id + 1)
                        rotated = self._manager.append_one(record, message_id, now)
                    except BaseException:
                        self._count_written(message_id)
                        if self._next_id > message_id:
                            unique.key_added(message_id, now)  # in the log all the same: held
                        else:
                            unique.rollback()
                        raise
                    ticket = self._appended(message_id, 1, rotated)
                    unique.key_added(message_id, now)
            finally:
                if appends is not None:
                    appends.end()
            if held is None:
                if rotated or self._waits.waiting or self._waits.listeners:
                    self._after_append()
            elif held:
                self._tally.duplicates += 1
                return held
        if held is not None:
            return self._append(
                [self._prepare(payload, None, 1, None, None, unique_key=unique_key)]
            )[0]
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        return message_id

    def _append_plain_batch(
        self, payloads: list[bytes], runs: list[list[bytes] | Draft] | None = None
    ) -> list[int]:
        """:meth:`_append` for bytes payloads with no option and no feature hook - or
        for the ``runs`` of :meth:`_plain_runs` (a batch of bytes with a few Items
        among them; ``payloads`` is then that batch).

        Each entry is three buffers (header, the payload itself, CRC) handed to one
        ``writev``: payloads are never copied.
        """
        count = len(payloads)
        with self._lock:
            first, now = self._begin()
            appends = self._appends
            try:
                if runs is None:
                    rotated = self._write_plain(first, now, payloads)
                else:
                    rotated = self._write_runs(first, now, runs, count)
                ticket = self._appended(first, count, rotated)
            finally:
                if appends is not None:
                    appends.end()
            self._after_append()
        if self._sync_always:
            self._log_commit.wait_durable(ticket)
        return list(range(first, first + count))

    def _write_plain(self, first: int, now: int, payloads: list[bytes]) -> bool:
        """Write bytes ``payloads`` as the entries ``first``, ``first + 1``, ... stamped
        ``now`` (lock held, an append session begun): the ids reserved, one ``writev``.
        Returns whether the log rotated; on a failure, counts what reached the log
        (:meth:`_count_written`) and raises."""
        count = len(payloads)
        if count > 1:
            parts, sizes = self._encode_batch(first, now, payloads, False)
            return self._write_entries(first, count, now, parts, sizes)
        record = self._encode_plain(first, now, payloads[0])
        try:
            if first + 1 > self._append_gate:
                self._reserve_ids(first + 1)
            return self._manager.append_one(record, first, now)  # (whether it rotated)
        except BaseException:
            self._count_written(first)
            raise

    def _write_entries(
        self, first: int, count: int, now: int, parts: list[bytes], sizes: list[int]
    ) -> bool:
        """Write ``count`` encoded entries (``parts``, whose concatenation they are, and
        each one's size) from id ``first``, stamped ``now`` (lock held, an append session
        begun): the ids reserved, one ``writev``.  Returns whether the log rotated; on a
        failure, counts what reached the log (:meth:`_count_written`) and raises."""
        manager = self._manager
        segments = len(manager.segments)
        try:
            if first + count > self._append_gate:
                self._reserve_ids(first + count)
            manager.append(parts, sizes, first, now)
        except BaseException:
            self._count_written(first)
            raise
        return len(manager.segments) != segments

    def _plain_runs(
        self, batch: list[bytes | bytearray | memoryview | Item], limit: int
    ) -> list[list[bytes] | Draft] | None:
        """Split a batch of bytes and a few Items for :meth:`_append_plain_batch`: its runs of
        bytes payloads (to be encoded as a plain batch is) and a checked draft for each
        Item between them; or None for a batch the checked way must take (a payload
        over ``limit``, which it reports, or an Item with a ``unique_key``, which the
        unique-jobs feature admits).

        The plain path is taken (``_plain_path``): no feature looks at a draft without
        an option of its own, and the only one an Item can carry is a unique key, so
        the drafts need no admission and no feature hook.  Raises as the checked way
        does, before anything is written.
        """
        types = list(map(type, batch))  # bytes or Item: enqueue_batch checked the set
        runs: list[list[bytes] | Draft] = []
        start = 0
        end = len(batch)
        while start < end:
            try:
                at = types.index(Item, start)  # runs in C, as the checks of a plain batch
            except ValueError:
                at = end
            if at > start:
                run: list[bytes] = batch[start:at]  # type: ignore[assignment]
                if max(map(len, run)) > limit:
                    return None
                runs.append(run)
            if at == end:
                break
            item: Item = batch[at]  # type: ignore[assignment]
            if item.unique_key is not None:
                return None
            runs.append(self._prepare_item(item))
            start = at + 1
        return runs

    def _write_runs(
        self, first: int, now: int, runs: list[list[bytes] | Draft], count: int
    ) -> bool:
        """:meth:`_write_plain` for runs: each run of bytes encoded as a plain batch,
        each draft as the checked way encodes it, every entry but the very last with
        BATCH_CONTINUES (recovery keeps all of them or none)."""
        parts: list[bytes] = []
        sizes: list[int] = []
        message_id = first
        last = len(runs) - 1
        for i, run in enumerate(runs):
            if isinstance(run, list):
                more, lengths = self._encode_batch(message_id, now, run, i < last)
                parts += more
                sizes += lengths
                message_id += len(run)
            else:
                (record,) = self._encode_drafts([run], message_id, now, i < last)
                parts.append(record)
                sizes.append(len(record))
                message_id += 1
        return self._write_entries(first, count, now, parts, sizes)

    def enqueue_batch(
        self,
        items: Iterable[bytes | bytearray | memoryview | Item],
        timeout: float | None = 0,
    ) -> list[int]:
        """Append several messages with one write and at most one fsync; return their ids.

        Every item is validated first: if any is invalid, nothing is written.  In a
        bounded queue the batch waits up to ``timeout`` for room for all of it (as
        :meth:`enqueue`): all or nothing.  Inside a current OpenTelemetry span, each
        message carries its ``traceparent`` header (as :meth:`enqueue`).
        """
        if TRACE_MODULE in _MODULES:
            items = traced_items(items)
        if self._plain_path and timeout == 0:
            limit = self.options.max_message_size
            payloads = items if isinstance(items, list) else list(items)
            # set/map/max run in C: no Python-level loop over the batch for the check.
            kinds = set(map(type, payloads))
            if kinds == _BYTES:
                if max(map(len, payloads)) <= limit:
                    return self._append_plain_batch(payloads)  # type: ignore[arg-type]
            elif kinds == _BYTES_AND_ITEMS:
                runs = self._plain_runs(payloads, limit)
                if runs is not None:
                    return self._append_plain_batch(payloads, runs)  # type: ignore[arg-type]
            items = payloads
        prepared: list[Draft] = []
        sizes: list[int] | None = [] if self._backlog is not None else None
        for item in items:
            if isinstance(item, Item):
                prepared.append(self._prepare_item(item, sizes))
            else:
                prepared.append(self._prepare(item, None, Priority.MEDIUM, None, None, sizes=sizes))
        if not prepared:
            check_timeout(timeout)
            return []
        return self._append(prepared, sizes, timeout)

    def _refuse_full_disk(self) -> NoReturn:
        """Refuse an append while the disk reserve is spent (nothing written)."""
        raise StorageError(
            "append to",
            self._manager.directory,
            OSError(
                errno.ENOSPC,
                f"No space left for messages (the last {self._disk_reserve.size // 1024} KiB "
                "are kept for acks, which free space)",
            ),
        )

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
        if not self._restore_disk_reserve():
            self._refuse_full_disk()
        appends = self._appends
        if appends is not None:
            # Another handle may have raised the reservation already (the page's copy).
            self._ids_reserved_until = max(self._ids_reserved_until, appends.reserved_until())
        if end <= self._ids_reserved_until:  # the gate was closed for the reserve only
            self._append_gate = self._ids_reserved_until
            return
        previous = self._ids_reserved_until
        self._ids_reserved_until = end + ID_BLOCK
        try:
            self._save_meta(clean=False)
        except BaseException:
            self._ids_reserved_until = previous
            raise
        if appends is not None:
            appends.publish_reserved(self._ids_reserved_until)
        self._append_gate = self._ids_reserved_until

    def _appended(self, first: int, count: int, rotated: bool) -> int:
        """Account ``count`` entries from id ``first`` now in the log (lock held).

        Their ids are handed out (never given again), they count as enqueued,
        retention runs if the append sealed a segment, and waiting consumers are
        woken.  Returns the commit ticket to wait on for durability (outside the lock).
        """
        self._next_id = first + count
        self._enqueued += count
        ticket = self._log_commit.note_write()
        if rotated:
            self._retire_after_rotation()
        return ticket

    def _retire_after_rotation(self) -> None:
        """Apply retention: an append sealed a segment (lock held, the session begun)."""
        appends = self._appends
        if appends is None:
            self._retire_consumed()
        else:
            appends.retire()

    def _after_append(self) -> None:
        """After an append (lock held, the append session ended): wake the waiters, and
        in shared mode apply ``retention_max_bytes``."""
        if self._waits.waiting or self._waits.listeners:
            self._waits.wake()
        appends = self._appends
        if appends is not None:
            appends.after()

    def _count_written(self, first: int) -> None:
        """An append from id ``first`` raised: account what it wrote all the same (lock held).

        A segment rotation that fails after the write leaves the entries in the log;
        the enqueue raised, so they may or may not be there (the promise), but their
        ids must never be given again, and readers will deliver them.
        """
        written = self._manager.next_id - first
        if written > 0:
            self._appended(first, written, rotated=False)
            if self._waits.waiting or self._waits.listeners:
                self._waits.wake()

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
