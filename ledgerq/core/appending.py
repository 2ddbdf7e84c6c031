"""Appending: ``enqueue``, ``enqueue_batch`` and the steps every append path shares
(a mixin of the queue core).

There are four append paths, for both modes: one plain payload (``_append_plain``), one
with a unique key (``_append_unique``), a plain batch - of bytes, or with a few Items
among them (``_append_plain_batch``) - and drafts with features (``_append``, the
checked path: core/admission.py); the hand-off's (core/handoff.py) is a plain batch or
drafts under a key.  They share their steps, in this order, under the queue lock:

1. begin (``_begin``): in shared mode the append session (core/shared_appends) takes
   the append lock and says the next id and the earliest stamp; exclusive mode owns the
   log and does nothing;
2. encode the entries (pure: a failure here has changed nothing);
3. reserve ids (``_reserve_ids``), when the durable reservation does not cover them;
4. write (the segment manager: one ``write()`` or ``writev``);
5. account (``_appended``): ids handed out, counters, the commit ticket, retention
   after a rotation; then end the session, and wake the waiters (``_after_append``);

and then, outside the lock, wait for the fsync with ``sync="always"``.  Steps 3 and 4
share one try: whatever fails there, ``_count_written`` hands out the ids of what did
reach the log (a rotation can fail after the write) and nothing more, and ``_append``
also rolls back the dedup ids its features admitted - outside the try, a failed meta
save would leave the dedup window remembering ids of messages never written, and a
retry would be swallowed as their duplicate.  A failed meta save therefore leaves
nothing appended and no id consumed.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Iterable, Mapping
from typing import NoReturn

from ledgerq._errors import StorageError
from ledgerq._options import MAX_SECONDS
from ledgerq._types import Item, Priority
from ledgerq.core.args import (
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
from ledgerq.core.feature import Draft, ReadersNeeded
from ledgerq.core.queue_state import QueueState
from ledgerq.core.tracing import TRACE_MODULE, traced_items, with_trace_context
from ledgerq.format.entry import encode_headers
from ledgerq.segment.meta import ID_BLOCK

__all__ = ["Appending"]

_MEDIUM = Priority.MEDIUM
_MODULES = sys.modules  # TRACE_MODULE in it: OpenTelemetry is in use (core/tracing)
_NS = 1_000_000_000
_BYTES = {bytes}
_BYTES_AND_ITEMS = {bytes, Item}


class Appending(QueueState):
    """The append paths of :class:`~ledgerq.core.queue.QueueCore` (a mixin: its methods
    take the queue as ``self``)."""

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
                # a str is the type asked): the checked way decides about any other (and
                # about a lone surrogate, which the digest cannot encode).
                if (
                    delay is None
                    and type(unique_key) is str
                    and 0 < len(unique_key) <= 256
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
        stores its record before the message is written (features/unique.py).  A new key
        takes no reader's step; a key a shared handle's view shows held goes the checked
        way, which holds every reader to judge it (ReadersNeeded)."""
        unique = self._unique
        assert unique is not None
        with self._lock:
            # (_begin, inlined as in _append_plain: this is every unique enqueue's path)
            if self._closed:
                self._ensure_open()
            now = self._clock_offset_ns + self._clock_mono()
            appends = self._appends
            if appends is None:
                message_id = self._next_id
            else:
                message_id, now = appends.begin(now)
            try:
                try:
                    held = unique.add_key(unique_key, now, message_id)
                except (ReadersNeeded, UnicodeEncodeError):
                    # Judged below, holding every reader (a key that is not unicode:
                    # refused there, saying so).
                    unique.rollback()
                    held = 0
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
                        if self._next_id <= message_id:
                            unique.undo_key()  # (else in the log all the same: held)
                        raise
                    # (_appended, inlined as in _append_plain)
                    self._next_id = message_id + 1
                    self._enqueued += 1
                    ticket = self._log_commit.note_write()
                    if rotated:
                        self._retire_after_rotation()
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
