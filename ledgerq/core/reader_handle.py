"""``Reader``: the public face of one reader of a queue.

A :class:`Reader` is what a user holds - the queue's default reader behind
``q.dequeue()``, or a named one from ``q.reader(name)``: its own position, leases, acks
and attempts.  It does the locking, the waiting (on the queue's :class:`Waits`) and
the building of :class:`~ledgerq.Message` values; every decision is its
:class:`~ledgerq.core.reader.ReaderCore`'s, the state machine in ``core/reader.py``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

from ledgerq._errors import CorruptionError, QueueBusyError, QueueClosedError
from ledgerq._types import Item, Message, ReaderStats
from ledgerq.core.args import check_count, check_delay, check_id, check_timeout
from ledgerq.core.feature import handoff_prefix
from ledgerq.core.processes import unpicklable
from ledgerq.core.reader import ReaderCore
from ledgerq.format.entry import EntryFlags
from ledgerq.segment.messages import entry_to_message

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["Reader"]

_NS = 1_000_000_000
_TIMER_RETRY_S = 0.25  # a periodic tick that could not be fired is tried again after this


# Entries whose stored payload is not the message (compressed, or sealed with its
# headers): the one flag test of the dequeue fast path.
_RESTORED_FLAGS = int(EntryFlags.COMPRESSED | EntryFlags.ENCRYPTED)


class Reader:
    """An independent consumer of a queue: its own position, leases, acks and attempts."""

    def __init__(self, queue: QueueCore, core: ReaderCore) -> None:
        self._queue = queue
        self._waits = queue.waits  # the queue's lock, waiters, wakers and clock
        self._core = core
        self._removed = False
        self.name = core.name
        self._handoff_prefix = b""  # (handoff_prefix, at the first forward)

    def handoff_prefix(self) -> bytes:
        """What this reader's hand-off keys start with (core/feature.handoff_prefix)."""
        prefix = self._handoff_prefix = handoff_prefix(self._queue._real_path(), self.name)
        return prefix

    def _ensure_usable(self) -> None:
        self._queue._ensure_open()
        if self._removed:
            raise QueueClosedError(f"reader {self.name!r} of {self._queue.path} was removed")

    def seek(self, message_id: int) -> None:
        """Deliver from the first message with id >= ``message_id`` next (inclusive).

        For replay (seek back over acked messages: they are delivered again) or to
        skip ahead.  Current leases of this reader are dropped and attempts start
        again.  A position before the oldest retained message means the oldest one.
        """
        message_id = check_id(message_id)
        with self._waits.lock:
            self._ensure_usable()
            self._core.seek(message_id)
            self._waits.wake()

    def seek_time(self, timestamp_ns: int) -> None:
        """Deliver from the first message enqueued at or after ``timestamp_ns`` next.

        Found through the sparse indexes (no full scan).  A time after the newest
        message means the tail: only messages enqueued later are delivered.
        """
        if isinstance(timestamp_ns, bool) or not isinstance(timestamp_ns, int):
            raise TypeError(f"timestamp_ns must be an int, got {type(timestamp_ns).__name__}")
        queue = self._queue
        with self._waits.lock:
            self._ensure_usable()
            queue._manager.refresh()
            found = queue._manager.first_id_at_or_after(timestamp_ns)
            self._core.seek(found if found is not None else queue._manager.next_id)
            self._waits.wake()

    def dequeue(self, timeout: float | None = 0) -> Message | None:
        """Lease the next message, or return None if none arrives in time.

        ``timeout=0`` returns at once, ``> 0`` waits up to that many seconds,
        ``None`` waits forever.  The message is delivered again (attempts + 1)
        if it is nacked, its visibility timeout passes, or the queue is
        reopened before it is acked.  Expired (TTL) messages are skipped.
        """
        if timeout == 0 and timeout is not False:  # the common polling call: no wait, no list
            queue = self._queue
            waits = self._waits
            core = self._core
            timer_ns = waits.timer_ns  # a periodic job's next tick (None: no job)
            if timer_ns is not None and timer_ns <= waits.offset_ns + waits.monotonic_ns():
                waits.fire_timer()
            with waits.lock:
                if queue._closed or self._removed:
                    self._ensure_usable()
                # One read of the queue's clock (core/clock): lease time and stamp time.
                monotonic_ns = waits.monotonic_ns()
                taken = core.take_one(monotonic_ns * 1e-9, waits.offset_ns + monotonic_ns)
                if taken is not None:
                    core.maybe_compact()
                if waits.room_waiting:  # a take may expire or dead-letter messages
                    waits.wake()
            if taken is None:
                return None
            entry, attempt = taken
            if not entry.flags & _RESTORED_FLAGS and queue._sealer is None:
                return entry_to_message(entry, attempt, entry.payload)
            messages = queue._messages(self, [taken])
            return messages[0] if messages else self.dequeue(0)
        messages = self.dequeue_batch(1, timeout)
        return messages[0] if messages else None

    def dequeue_batch(self, n: int, timeout: float | None = 0) -> list[Message]:
        """Lease up to ``n`` messages; wait (as :meth:`dequeue`) only while there are none."""
        n = check_count("n", n)
        wait = check_timeout(timeout)
        queue = self._queue
        # The call's own wait is real time; leases and stamps are the queue's clock's.
        deadline = None if wait is None else time.monotonic() + wait
        # (Shared mode: a wait for another handle's step lock ends by the deadline too.)
        before = queue._budget.limit(deadline)
        try:
            return self._dequeue_batch(n, deadline)
        except QueueBusyError:
            if deadline is not None and time.monotonic() >= deadline:
                return []  # a stopped process held a lock for the whole wait: nothing came
            raise
        finally:
            queue._budget.limit(before)

    def _dequeue_batch(self, n: int, deadline: float | None) -> list[Message]:
        """:meth:`dequeue_batch`'s loop: take, or wait until ``deadline``."""
        queue = self._queue
        waits = self._waits
        core = self._core
        while True:
            timer_ns = waits.timer_ns  # a periodic job's next tick (None: no job)
            tried = None
            if timer_ns is not None and timer_ns <= waits.offset_ns + waits.monotonic_ns():
                waits.fire_timer()  # (not under the lock: it appends)
                tried = timer_ns
            with waits.cond:
                while True:
                    self._ensure_usable()
                    monotonic_ns = waits.monotonic_ns()
                    lease_now = monotonic_ns * 1e-9
                    taken = core.take(n, lease_now, waits.offset_ns + monotonic_ns)
                    if waits.room_waiting:  # a take may expire or dead-letter messages
                        waits.wake()
                    if taken:
                        core.maybe_compact()
                        break
                    if deadline is None:
                        remaining = None
                    else:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            return []
                    lease_deadline = core.next_deadline()
                    if lease_deadline is not None:
                        until = max(lease_deadline - lease_now, 0.0)
                        remaining = until if remaining is None else min(remaining, until)
                    due_ns = core.next_due_ns()
                    if due_ns is not None:
                        # A timer on the earliest delayed message: it falls due then.
                        until = max(due_ns - waits.offset_ns - monotonic_ns, 0) / 1e9
                        remaining = until if remaining is None else min(remaining, until)
                    timer_ns = waits.timer_ns
                    if timer_ns is not None:
                        # A periodic job's next tick: fired (outside the lock) at the top.
                        until = (timer_ns - waits.offset_ns - monotonic_ns) / 1e9
                        if until <= 0:
                            if timer_ns != tried:
                                break
                            # Fired and still due (a full bounded queue, a full disk):
                            # tried again later, not in a busy loop.
                            until = _TIMER_RETRY_S
                        remaining = until if remaining is None else min(remaining, until)
                    if waits.prepare_wait():
                        continue  # now watching for other processes' changes: look once more
                    waits.waiting += 1
                    try:
                        waits.cond.wait(remaining)
                    finally:
                        waits.waiting -= 1
            messages = queue._messages(self, taken)
            if messages:
                return messages
            # Every leased entry was unreadable (and settled): look again.

    def ack(self, message_id: int) -> None:
        """Mark a leased message done: it is never delivered again.

        With ``sync="always"`` this returns after the ack is on disk; otherwise a
        crash may deliver the message again (at-least-once), never lose it.
        Raises :class:`UnknownMessageError` if the id is not leased by this reader.
        """
        if type(message_id) is not int:  # the common case needs no call
            message_id = check_id(message_id)
        queue = self._queue
        core = self._core
        with self._waits.lock:
            if queue._closed or self._removed:
                self._ensure_usable()
            ticket = core.ack_one(message_id)
            core.maybe_compact()
            self._retire_if_passed_oldest()
            if self._waits.room_waiting or core.group_freed:
                # A bounded queue's enqueue waits for this room, or the ack made the next
                # message of its group deliverable: a blocked dequeue may take it.
                core.group_freed = False
                self._waits.wake()
        if queue._sync_always:
            core.journal.commit.wait_durable(ticket)

    def forward(
        self,
        message_id: int,
        target: QueueCore,
        items: Iterable[bytes | bytearray | memoryview | Item] | bytes | Item,
        *,
        timeout: float | None = 0,
    ) -> list[int]:
        """Finish a leased message by handing its work on: enqueue ``items`` into the
        queue ``target`` and ack ``message_id``, exactly once; return the ids in ``target``.

        ``items``: bytes, an :class:`~ledgerq.Item`, or a list of them, written as one
        batch (all or nothing), as :meth:`~ledgerq.Queue.enqueue_batch` writes them.
        A message delivered again after a crash (kill -9 at any instant, in either
        mode) whose items already landed adds nothing: this only acks it and returns
        the ids its items got then.  Durability is ``target``'s (its ``sync``) for the
        items and this queue's for the ack.  ``timeout`` is the wait for room in a
        bounded ``target`` (as ``enqueue_batch``'s).

        Raises, having written nothing: :class:`UnknownMessageError` if ``message_id``
        is not leased by this reader (by this handle), ``ValueError`` if ``target`` is
        this queue itself or an item carries ``dedup_id``/``unique_key``,
        :class:`QueueClosedError` if ``target`` is closed, ``TypeError`` for anything
        that is not a queue or items.
        """
        return self._queue._hand_off(self, message_id, target, items, timeout)

    def ack_batch(self, message_ids: Iterable[int]) -> None:
        """Ack several leased messages with one journal record (and at most one fsync).

        All or nothing: if any id is not an int, not leased by this reader, or given
        twice, nothing is acked and the error says which.  The ``dequeue_batch``
        companion: with ``sync="always"`` a batch costs one fsync instead of one per
        message.
        """
        ids = [check_id(message_id) for message_id in message_ids]
        if len(set(ids)) != len(ids):
            twice = next(i for i, count in Counter(ids).items() if count > 1)
            raise ValueError(f"ack_batch got message id {twice} twice; nothing was acked")
        if not ids:
            return
        queue = self._queue
        core = self._core
        with self._waits.lock:
            self._ensure_usable()
            for message_id in ids:
                core.check_leased(message_id)
            ticket = core.ack(ids)
            core.maybe_compact()
            self._retire_if_passed_oldest()
            if self._waits.room_waiting or core.group_freed:  # (see ack)
                core.group_freed = False
                self._waits.wake()
        if queue._sync_always:
            core.journal.commit.wait_durable(ticket)

    def _retire_if_passed_oldest(self) -> None:
        """After a settle (queue lock held): apply retention if it can have work.

        Only once this reader has read past the oldest segment can a settle of its
        finish that segment; checking first spares computing every reader's head on
        each ack.
        """
        segments = self._queue._manager.segments
        if len(segments) > 1 and self._core.has_read_past(segments[0].last_id):
            self._queue._retire_after_settle(self._core)

    def nack(self, message_id: int, reason: str = "", *, delay: float | None = None) -> None:
        """Give a leased message back as failed: it is delivered again with attempts + 1.

        Not before ``delay`` seconds from now; with ``delay=None`` after the retry
        policy's delay for this attempt (options ``retry_delay``, ``retry_backoff``,
        ``retry_delay_max``, ``retry_jitter``; none by default).  The delay is durable
        with the nack: a reopen does not shorten it.  After ``max_retries`` failed
        deliveries it moves to the dead-letter queue instead.  Raises
        :class:`UnknownMessageError` if the id is not leased by this reader,
        ``TypeError``/``ValueError`` for a bad ``delay`` (nothing changed).
        """
        message_id = check_id(message_id)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        seconds = check_delay(delay)
        delay_ns = None if seconds is None else int(seconds * 1_000_000_000)
        queue = self._queue
        core = self._core
        with self._waits.lock:
            self._ensure_usable()
            core.check_leased(message_id)
            ticket = core.nack([message_id], reason, self._waits.clock.now_ns(), delay_ns)
            self._retire_if_passed_oldest()  # a move to the DLQ may finish the oldest segment
            if self._waits.waiting or self._waits.listeners:
                self._waits.wake()
        if queue._sync_always:
            core.journal.commit.wait_durable(ticket)

    def release(self, message_id: int, *, delay: float | None = None) -> None:
        """Give a leased message back unused: it is not a failed delivery.

        For a consumer that took a message it will not process (it is shutting down,
        or could not pass the message on): the message is available again at once -
        or, with ``delay``, no earlier than that many seconds from now (durably, as a
        nack's delay) - ahead of newer ones as after a nack, its next delivery has the
        same ``attempts``, and it moves no closer to the dead-letter queue.  With
        ``sync="always"`` this returns after the release is on disk; otherwise a crash
        before the next sync may count the lease as a failed delivery after all.
        Raises :class:`UnknownMessageError` if the id is not leased by this reader,
        ``TypeError``/``ValueError`` for a bad ``delay`` (nothing changed).
        """
        message_id = check_id(message_id)
        seconds = check_delay(delay)
        queue = self._queue
        core = self._core
        with self._waits.lock:
            self._ensure_usable()
            core.check_leased(message_id)
            now_ns = self._waits.clock.now_ns()
            due_ns = now_ns + int(seconds * _NS) if seconds else None
            ticket = core.release([message_id], now_ns, due_ns)
            core.maybe_compact()
            if self._waits.waiting or self._waits.listeners:
                self._waits.wake()
        if queue._sync_always:
            core.journal.commit.wait_durable(ticket)

    def touch(self, message_id: int, seconds: float | None = None) -> None:
        """Keep a lease: it now expires ``seconds`` from now (default: the visibility
        timeout; with neither, a lease lasts until it is settled and this does nothing).

        For a task that runs long: call it before the lease expires.  Not a delivery:
        ``attempts`` does not change.  In shared mode the other handles learn of the new
        deadline (a journal record).  Raises :class:`UnknownMessageError` if the id is
        not leased by this reader (by this handle), ``TypeError``/``ValueError`` for bad
        ``seconds``.
        """
        message_id = check_id(message_id)
        wait = check_delay(seconds, "seconds")
        core = self._core
        with self._waits.lock:
            self._ensure_usable()
            core.check_leased(message_id)
            monotonic_ns = self._waits.monotonic_ns()
            core.touch(message_id, wait, monotonic_ns * 1e-9, self._waits.offset_ns + monotonic_ns)

    def peek(self, n: int = 1) -> list[Message]:
        """The next ``n`` messages this reader would get, without leasing them."""
        n = check_count("n", n)
        queue = self._queue
        with self._waits.lock:
            self._ensure_usable()
            entries = self._core.peek(n, self._waits.clock.now_ns())
            attempts = [self._core.deliveries(e.id) + 1 for e in entries]
        messages = []
        for entry, attempt in zip(entries, attempts, strict=True):
            try:
                plain, payload = queue._restore_entry(entry)
            except CorruptionError:
                continue
            messages.append(entry_to_message(plain, attempt, payload))
        return messages

    def stats(self) -> ReaderStats:
        """This reader's figures."""
        with self._waits.lock:
            self._ensure_usable()
            return self._core.stats(self._waits.clock.now_ns())

    def seconds_to_next_expiry(self) -> float | None:
        """Seconds until a message may become available by time alone (None: none will).

        The next lease whose visibility timeout expires, or the next delayed message
        that falls due.  A waiter that is not blocked in :meth:`dequeue` (e.g.
        ``ledgerq.aio``) uses this to retry when time makes a message available.
        """
        with self._waits.lock:
            deadline = self._core.next_deadline()
            now = self._waits.clock.lease_time()
            due_ns = self._core.next_due_ns()
            now_ns = self._waits.clock.now_ns()
        waits = []
        timer_ns = self._waits.timer_ns
        if timer_ns is not None:  # a periodic job's next tick: a dequeue then fires it
            # (Past already: the caller's dequeue tried to fire it - a full bounded
            # queue, a full disk - so not at once again, in a busy loop.)
            waits.append((timer_ns - now_ns) / 1e9 if timer_ns > now_ns else _TIMER_RETRY_S)
        if deadline is not None:
            waits.append(max(0.0, deadline - now))
        if due_ns is not None:
            waits.append(max(0.0, (due_ns - now_ns) / 1e9))
        return min(waits) if waits else None

    def __len__(self) -> int:
        with self._waits.lock:
            return self._core.pending()

    def __repr__(self) -> str:
        return f"<ledgerq.Reader {self.name!r} of {self._queue.path!r}>"

    def __reduce__(self) -> NoReturn:
        raise unpicklable(f"ledgerq.Reader {self.name!r}", self._queue.path)
