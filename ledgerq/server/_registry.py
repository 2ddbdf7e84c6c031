"""The queues a server serves: one open ``ledgerq.Queue`` per name, and their waiters.

Concurrency: everything here runs on the event loop's thread, except the queue
listener (:meth:`QueueSlot._on_change`), which the queue calls under its lock in
whichever thread enqueued, nacked, released or closed.  That listener only reads two plain
attributes and schedules :meth:`QueueSlot._dispatch` on the loop; it never touches
the waiter lists.

Waiting (``get q/t=<ms>``) costs no thread and no polling: a request that finds
nothing parks a :class:`Waiter` (a future) at the back of its reader's FIFO.  When
the queue reports a change, the loop hands items to the waiters from the front, one
item each, until the queue is empty again - so waiters are served in arrival order,
and an enqueue wakes one waiter, not all of them.  A request that does not wait
lets the parked waiters go first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Executor
from typing import Any, TypeVar

import ledgerq
from ledgerq.segment.naming import META_NAME  # present in every queue directory
from ledgerq.server.protocol import is_valid_queue_name

__all__ = ["PEEK_SCAN_LIMIT", "QueueSlot", "ReaderSlot", "Registry", "Waiter"]

logger = logging.getLogger("ledgerq.server")

T = TypeVar("T")

DEFAULT_READER = "default"  # the reader Queue.dequeue uses (docs/usage.md)
PEEK_SCAN_LIMIT = 1024  # expired items a /peek looks past before answering "empty"
_DELETED_MARK = "~deleted-"  # '~' never appears in a queue name


class Waiter:
    """One parked request: resolved with a Message, None (timeout, gone) or an error."""

    __slots__ = ("future", "is_peek", "is_settled")

    def __init__(self, future: asyncio.Future[ledgerq.Message | None], is_peek: bool) -> None:
        self.future = future
        self.is_peek = is_peek
        self.is_settled = False


class ReaderSlot:
    """One reader of a served queue (the default one, or ``queue+name``)."""

    def __init__(self, queue_slot: QueueSlot, reader: ledgerq.Reader, name: str | None) -> None:
        self.queue_slot = queue_slot
        self.reader = reader
        self.name = name  # None: the queue's default reader
        self.label = queue_slot.name if name is None else f"{queue_slot.name}+{name}"
        self.is_dead = False  # deleted (queue or reader) or the server closed it
        self.open_reads = 0  # open reads held by connections, all together
        self.aborted = 0  # open reads given back (/abort, disconnect) since start
        self.flushes = 0
        self.waiting = 0  # parked waiters not yet settled
        self._waiters: deque[Waiter] = deque()
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ taking

    def take_now(self) -> ledgerq.Message | None:
        """Lease the next item without waiting (parked waiters go first).

        Runs inline on the loop: the non-blocking dequeue is a lock, an in-memory
        lease and one small journal ``write()`` (see docs/asyncio.md); running it
        here means a lease is never stranded between a thread and a vanished client.
        """
        if self.waiting:
            self.dispatch()
            if self.waiting:
                return None  # still waiters ahead of us: the queue is empty
        return self.reader.dequeue(0)

    def peek_now(self) -> ledgerq.Message | None:
        """The item a take would get now, without leasing it (expired ones skipped)."""
        now = time.time_ns()
        n = 1
        while True:
            found = self.reader.peek(n)
            for message in found:
                if message.expires_at is None or message.expires_at > now:
                    return message
            if len(found) < n or n >= PEEK_SCAN_LIMIT:
                return None
            n = min(n * 8, PEEK_SCAN_LIMIT)

    # ------------------------------------------------------------------ waiting

    def park(self, *, is_peek: bool) -> Waiter:
        """Queue a waiter at the back; the caller awaits ``waiter.future``."""
        waiter = Waiter(asyncio.get_running_loop().create_future(), is_peek)
        self._waiters.append(waiter)
        self.waiting += 1
        self.queue_slot.waiting += 1
        # Something may have arrived between the caller's look and now.
        self.dispatch()
        return waiter

    def settle(
        self,
        waiter: Waiter,
        message: ledgerq.Message | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Resolve a waiter (idempotent): timeouts, disconnects and dispatch all end here."""
        if waiter.is_settled:
            return
        waiter.is_settled = True
        self.waiting -= 1
        self.queue_slot.waiting -= 1
        if not waiter.future.done():
            if error is not None:
                waiter.future.set_exception(error)
            else:
                waiter.future.set_result(message)
        waiters = self._waiters
        if not self.waiting:
            waiters.clear()
        elif len(waiters) > 2 * self.waiting + 64:  # drop settled ones left behind
            self._waiters = deque(w for w in waiters if not w.is_settled)

    def dispatch(self) -> None:
        """Hand available items to parked waiters, oldest waiter first."""
        waiters = self._waiters
        while waiters:
            waiter = waiters[0]
            if waiter.is_settled:
                waiters.popleft()
                continue
            try:
                message = self.peek_now() if waiter.is_peek else self.reader.dequeue(0)
            except ledgerq.QueueClosedError:
                self.release_waiters()
                return
            except Exception as exc:  # a storage error: every waiter hears of it
                for parked in list(waiters):
                    self.settle(parked, error=exc)
                return
            if message is None:
                break
            waiters.popleft()
            self.settle(waiter, message)
        self._watch_expiry()

    def release_waiters(self) -> None:
        """Settle every waiter with "nothing" (the queue or reader went away)."""
        for waiter in list(self._waiters):
            self.settle(waiter)
        self._waiters.clear()

    def _watch_expiry(self) -> None:
        # A visibility timeout that expires makes an item available without any
        # enqueue, nack or release to wake us: wake up for it too.
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.waiting or self.is_dead:
            return
        try:
            seconds = self.reader.seconds_to_next_expiry()
        except ledgerq.LedgerQError:
            return
        if seconds is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(seconds + 0.001, self.dispatch)

    def close(self) -> None:
        """Mark dead and release the waiters."""
        self.is_dead = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.release_waiters()


class QueueSlot:
    """A served queue: the open ``ledgerq.Queue`` and its reader slots."""

    def __init__(self, name: str, queue: ledgerq.Queue, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.queue = queue
        self.is_dead = False
        # With sync="always" every write waits for an fsync: such work goes to threads.
        self.is_sync_always = queue.options.sync == "always"
        self.waiting = 0  # parked waiters over all readers (read by the listener thread)
        self._loop = loop
        self._armed = True
        self.readers: dict[str | None, ReaderSlot] = {
            None: ReaderSlot(self, queue.reader(DEFAULT_READER), None)
        }
        self._remove_listener = queue.add_listener(self._on_change)

    def _on_change(self) -> None:
        # Any thread, queue lock held: only schedule (at most one pending dispatch).
        if self.waiting and self._armed:
            self._armed = False
            try:
                self._loop.call_soon_threadsafe(self._dispatch)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _dispatch(self) -> None:
        # Re-arm before looking, so a change made after the look schedules again.
        self._armed = True
        for slot in list(self.readers.values()):
            if slot.waiting:
                slot.dispatch()

    def close(self) -> None:
        """Stop listening and release every waiter (the queue is closed by the caller)."""
        self.is_dead = True
        self._remove_listener()
        for slot in self.readers.values():
            slot.close()


class ServerClosingError(ledgerq.LedgerQError):
    """The server is shutting down: no queue is opened any more."""


class Registry:
    """Opens each queue of the data directory once and hands out its slots.

    Blocking work (opening, closing, deleting, creating readers) runs in
    ``executor``; opens and deletes of one name are serialised by a lock of that
    name, so a queue is never opened twice (``ledgerq.open`` locks the directory).
    Every queue is opened with ``queue_options`` over what it stored, for this run
    only: they are not stored (``remember_options=False``), so the server changes
    no queue's configuration.  With ``shared`` every queue is opened in shared mode
    (other processes use it meanwhile); a queue is deleted only once an exclusive open
    proves that no other process has it open.
    """

    def __init__(
        self,
        data_dir: str,
        *,
        executor: Executor,
        queue_options: Mapping[str, Any],
        shared: bool = False,
    ) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self._executor = executor
        self._options = {**queue_options, "remember_options": False, "shared": shared}
        self._slots: dict[str, QueueSlot] = {}
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self.is_closing = False
        self.creates = 0
        self.deletes = 0

    async def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking ``func`` in the server's thread pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(func, *args, **kwargs))

    def path_of(self, name: str) -> str:
        """The directory of queue ``name`` (a validated name: never a path)."""
        assert is_valid_queue_name(name), name
        return os.path.join(self.data_dir, name)

    def slots(self) -> list[QueueSlot]:
        """The open queues, by name."""
        return [self._slots[name] for name in sorted(self._slots)]

    @contextlib.asynccontextmanager
    async def _exclusive(self, name: str) -> AsyncIterator[None]:
        entry = self._locks.get(name)
        if entry is None:
            entry = self._locks[name] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[name]

    # ------------------------------------------------------------------ opening

    async def open_existing(self) -> list[str]:
        """Open every queue already in the data directory; return the names opened."""
        names = await self.run(self._scan)
        opened = []
        for name in names:
            try:
                slot = await self.queue(name, create=False)
            except (ledgerq.LedgerQError, OSError) as exc:
                logger.warning("ledgerq serve: not serving %s for now: %s", name, exc)
                continue
            if slot is not None:
                opened.append(name)
        return opened

    def _scan(self) -> list[str]:
        os.makedirs(self.data_dir, exist_ok=True)
        names = []
        for entry in sorted(os.listdir(self.data_dir)):
            path = os.path.join(self.data_dir, entry)
            if _DELETED_MARK in entry:
                shutil.rmtree(path, ignore_errors=True)  # a delete cut short by a crash
            elif is_valid_queue_name(entry) and os.path.isfile(os.path.join(path, META_NAME)):
                names.append(entry)
        return names

    def _exists(self, name: str) -> bool:
        return os.path.isfile(os.path.join(self.path_of(name), META_NAME))

    async def queue(self, name: str, *, create: bool) -> QueueSlot | None:
        """The slot of queue ``name``, opening it if needed; None if missing and not ``create``.

        Raises what ``ledgerq.open`` raises (``QueueLockedError``, ``NotAQueueError``,
        ...), and :class:`ServerClosingError` during shutdown.
        """
        slot = self._slots.get(name)
        if slot is not None:
            return slot
        if not create and not self._exists(name):
            return None
        async with self._exclusive(name):
            return await self._open_locked(name, create=create)

    async def _open_locked(self, name: str, *, create: bool) -> QueueSlot | None:
        slot = self._slots.get(name)
        if slot is not None:
            return slot
        if self.is_closing:
            raise ServerClosingError("the server is shutting down")
        is_new = not self._exists(name)
        if is_new and not create:
            return None
        queue = await self.run(ledgerq.open, self.path_of(name), **self._options)
        if self.is_closing:  # shutdown began while we opened: do not leak the lock
            await self.run(queue.close)
            raise ServerClosingError("the server is shutting down")
        slot = QueueSlot(name, queue, asyncio.get_running_loop())
        self._slots[name] = slot
        if is_new:
            self.creates += 1
        return slot

    async def reader(self, name: str, reader: str | None, *, create: bool) -> ReaderSlot | None:
        """The slot of ``name`` (``reader`` None) or of reader ``reader`` of it.

        The queue is opened if it exists, created only if ``create``.  A named
        reader is created on first reference (starting at the tail, like a Kestrel
        fan-out child: it sees items set from then on).
        """
        slot = await self.queue(name, create=create)
        if slot is None:
            return None
        found = slot.readers.get(reader)
        if found is not None:
            return found
        assert reader is not None
        try:
            handle = await self.run(slot.queue.reader, reader, "latest")
        except ledgerq.QueueClosedError:
            return None  # the queue was deleted meanwhile
        found = slot.readers.get(reader)  # another request may have made it meanwhile
        if found is None:
            if slot.is_dead:
                return None
            found = slot.readers[reader] = ReaderSlot(slot, handle, reader)
        return found

    # ------------------------------------------------------------------ deleting

    async def delete(self, name: str, reader: str | None) -> None:
        """Drop queue ``name`` and its files, or forget reader ``reader`` of it.

        Parked waiters get "nothing"; open reads on it are gone with it.  A missing
        queue or reader is not an error (Kestrel answers DELETED either way).
        """
        async with self._exclusive(name):
            if reader is not None:
                slot = await self._open_locked(name, create=False)
                if slot is None:
                    return
                reader_slot = slot.readers.pop(reader, None)
                if reader_slot is not None:
                    reader_slot.close()
                await self.run(slot.queue.remove_reader, reader)
                return
            slot = self._slots.pop(name, None)
            if slot is None:
                if not self._exists(name):
                    return
                queue = None
            else:
                slot.close()
                queue = slot.queue
            await self.run(self._remove, queue, name)
            self.deletes += 1

    def _remove(self, queue: ledgerq.Queue | None, name: str) -> None:
        """Delete the files of queue ``name`` once an open proves nobody else uses it.

        Exclusively: a shared handle (this server's own, closed first) would prove only
        that no process holds the queue exclusively.  If another process has it open,
        ``QueueLockedError`` is raised and nothing is deleted.
        """
        if queue is not None:
            queue.close()
        if queue is None or self._options["shared"]:
            exclusive = {**self._options, "shared": False}
            ledgerq.open(self.path_of(name), **exclusive).close()
        path = self.path_of(name)
        # Rename first, so a crash part-way leaves no half-deleted queue behind.
        doomed = os.path.join(self.data_dir, f"{name}{_DELETED_MARK}{time.time_ns()}")
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    # ------------------------------------------------------------------ closing

    async def close_all(self) -> None:
        """Release every waiter, then sync and close every queue (in parallel)."""
        self.is_closing = True
        slots = list(self._slots.values())
        self._slots.clear()
        for slot in slots:
            slot.close()
        results = await asyncio.gather(
            *(self.run(slot.queue.close) for slot in slots), return_exceptions=True
        )
        for slot, result in zip(slots, results, strict=True):
            if isinstance(result, BaseException):
                logger.error("ledgerq serve: closing queue %s failed: %s", slot.name, result)
