"""The asyncio face of a queue: ``ledgerq.aio.open``.

>>> async with ledgerq.aio.open("data/jobs") as q:      # doctest: +SKIP
...     await q.enqueue(b"hello")
...     msg = await q.dequeue(timeout=5)
...     await q.ack(msg.id)

Where each call runs (see docs/asyncio.md for the measurements):

* Calls that may fsync or do real file I/O - ``enqueue``, ``enqueue_batch``,
  ``ack``, ``nack``, ``release`` (an fsync with ``sync="always"``, a segment rotation or a
  journal checkpoint in any mode), ``stats``, ``peek``, ``close``, opening -
  run in the default executor through :func:`asyncio.to_thread`.  Cancelling
  such a call while it runs does not stop it: it completes in its thread (a
  cancelled ``ack`` may have acked).  Cancelled before a thread picked it up,
  it does not happen at all.
* The *non-blocking* dequeue attempt runs inline on the event loop's thread.
  It takes the queue lock, leases in memory and appends one small LEASE record
  to the reader's journal (a ``write()``, no fsync), and reads the entry (a
  ``pread`` when it is not cached): ~10 microseconds.  Because it runs between
  two ``await`` points, a cancellation cannot land between "leased" and
  "handed to the caller", so a cancelled ``dequeue`` never strands a leased
  message.  Run in a thread, a cancellation arriving while the thread leases
  would leave a message leased by nobody until its visibility timeout, or
  until the queue is reopened - and count that as a failed delivery.
* Waiting never blocks the loop and never polls: an empty ``dequeue`` with a
  timeout registers a listener on the queue (:meth:`ledgerq.Queue.add_listener`),
  which wakes the coroutine through ``loop.call_soon_threadsafe`` when an
  enqueue, a nack or ``close`` happens in any thread; the wait is also bounded
  by the reader's next visibility-timeout expiry, so an expired lease is picked
  up on time.  Nothing is leased while waiting.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Generator, Iterable, Mapping
from types import TracebackType
from typing import Any, NoReturn, TypeVar, Unpack

import ledgerq
from ledgerq import Queue
from ledgerq._errors import QueueClosedError, QueueFullError
from ledgerq._types import Item, Message, Priority, ReaderStart, ReaderStats, Stats
from ledgerq.core.args import check_count, check_delay, check_ids, check_timeout

__all__ = ["AsyncQueue", "AsyncReader", "open"]

_DEFAULT_READER = "default"  # the reader ``Queue.dequeue`` uses (docs/usage.md)
_T = TypeVar("_T")


class _Wait:
    """One coroutine's wait for a change of the queue, up to a deadline on the loop.

    Used as a context manager: it registers ``wake`` with ``add_listener`` (the queue's
    :meth:`~ledgerq.Queue.add_listener` or ``add_room_listener``) on entry and removes
    it on exit.  ``wake`` runs under the queue lock in the thread that changed the
    queue; it only schedules ``event.set`` on the loop.  ``armed`` makes a burst of
    changes schedule one wake-up, not one per message: the waiter calls :meth:`arm`
    (on the loop) *before* it looks at the queue, so a change made after that look
    always finds it armed - no wake-up is lost.
    """

    __slots__ = ("_add_listener", "_deadline", "_remove", "armed", "event", "loop")

    def __init__(
        self,
        add_listener: Callable[[Callable[[], None]], Callable[[], None]],
        wait: float | None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        self.armed = True
        self._deadline = None if wait is None else self.loop.time() + wait
        self._add_listener = add_listener
        self._remove: Callable[[], None] | None = None

    def __enter__(self) -> _Wait:
        self._remove = self._add_listener(self.wake)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._remove is not None
        self._remove()

    def wake(self) -> None:
        if not self.armed:
            return
        self.armed = False
        try:
            self.loop.call_soon_threadsafe(self.event.set)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def arm(self) -> None:
        """Re-arm and clear *before* looking, so a change after the look wakes us."""
        self.armed = True
        self.event.clear()

    def seconds_left(self) -> float | None:
        """Seconds to the deadline (None: there is none; <= 0: it has passed)."""
        return None if self._deadline is None else self._deadline - self.loop.time()

    async def sleep(self, seconds: float | None) -> None:
        """Return on a wake-up, or after ``seconds`` (None: only on a wake-up)."""
        try:
            async with asyncio.timeout(seconds):
                await self.event.wait()
        except TimeoutError:
            pass


class AsyncReader:
    """The asyncio face of a :class:`ledgerq.Reader` (an independent consumer)."""

    def __init__(self, queue: Queue, reader: ledgerq.Reader) -> None:
        self._queue = queue
        self._reader = reader

    @property
    def name(self) -> str:
        """The reader's name (``"default"`` for the queue's own dequeue)."""
        return self._reader.name

    @property
    def sync_reader(self) -> ledgerq.Reader:
        """The underlying synchronous :class:`ledgerq.Reader`."""
        return self._reader

    async def dequeue(self, timeout: float | None = 0) -> Message | None:
        """Lease the next message, or return None if none arrives in time.

        ``timeout=0`` returns at once, ``> 0`` waits up to that many seconds,
        ``None`` waits forever - without blocking the event loop.  Raises
        :class:`ledgerq.QueueClosedError` if the queue is (or gets) closed.
        Cancelling a waiting dequeue leases nothing.
        """
        messages = await self.dequeue_batch(1, timeout)
        return messages[0] if messages else None

    async def dequeue_batch(self, n: int, timeout: float | None = 0) -> list[Message]:
        """Lease up to ``n`` messages; wait (as :meth:`dequeue`) only while there are none."""
        # The checks of the synchronous reader (the same error for the same bad value).
        check_count("n", n)
        wait = check_timeout(timeout)
        reader = self._reader
        # Inline, not in a thread: see the module docstring (cancellation safety).
        messages = reader.dequeue_batch(n, 0)
        if messages or wait == 0:
            return messages
        with _Wait(self._queue.add_listener, wait) as waiting:
            while True:
                waiting.arm()
                messages = reader.dequeue_batch(n, 0)
                if messages:
                    return messages
                left = waiting.seconds_left()
                if left is not None and left <= 0:
                    return []
                # An expiring visibility timeout, or a delayed message falling due,
                # makes a message available without any enqueue or nack to wake us:
                # wake up for it too.
                expiry = reader.seconds_to_next_expiry()
                await waiting.sleep(min((t for t in (left, expiry) if t is not None), default=None))

    async def ack(self, message_id: int) -> None:
        """Mark a leased message done (see :meth:`ledgerq.Reader.ack`); runs in a thread."""
        await asyncio.to_thread(self._reader.ack, message_id)

    async def ack_batch(self, message_ids: Iterable[int]) -> None:
        """Ack several leased messages at once (see :meth:`ledgerq.Reader.ack_batch`)."""
        await asyncio.to_thread(self._reader.ack_batch, list(message_ids))

    async def nack(self, message_id: int, reason: str = "", *, delay: float | None = None) -> None:
        """Give a leased message back as failed (see :meth:`ledgerq.Reader.nack`)."""
        await asyncio.to_thread(self._reader.nack, message_id, reason, delay=delay)

    async def release(self, message_id: int, *, delay: float | None = None) -> None:
        """Give a leased message back unused, not a failure (see :meth:`ledgerq.Reader.release`)."""
        await asyncio.to_thread(self._reader.release, message_id, delay=delay)

    async def touch(self, message_id: int, seconds: float | None = None) -> None:
        """Extend a lease (see :meth:`ledgerq.Reader.touch`); runs in a thread."""
        await asyncio.to_thread(self._reader.touch, message_id, seconds)

    async def peek(self, n: int = 1) -> list[Message]:
        """The next ``n`` messages this reader would get, without leasing them."""
        return await asyncio.to_thread(self._reader.peek, n)

    async def seek(self, message_id: int) -> None:
        """Deliver from the first message with id >= ``message_id`` next (durable)."""
        await asyncio.to_thread(self._reader.seek, message_id)

    async def seek_time(self, timestamp_ns: int) -> None:
        """Deliver from the first message enqueued at or after ``timestamp_ns`` next."""
        await asyncio.to_thread(self._reader.seek_time, timestamp_ns)

    async def stats(self) -> ReaderStats:
        """This reader's figures."""
        return await asyncio.to_thread(self._reader.stats)

    def __len__(self) -> int:
        return len(self._reader)

    def __aiter__(self) -> AsyncReader:
        return self

    async def __anext__(self) -> Message:
        """Lease the next message, waiting as long as it takes; stop when the queue closes."""
        try:
            messages = await self.dequeue_batch(1, None)
        except QueueClosedError:
            raise StopAsyncIteration from None
        return messages[0]

    def __repr__(self) -> str:
        return f"<ledgerq.aio.AsyncReader {self.name!r} of {self._queue.path!r}>"

    def __reduce__(self) -> NoReturn:
        self._reader.__reduce__()  # raises: the reader's TypeError says what to do instead
        raise AssertionError  # pragma: no cover


class AsyncQueue:
    """The asyncio face of a :class:`ledgerq.Queue`; get one from :func:`ledgerq.aio.open`.

    Wrapping an already open queue works too: ``AsyncQueue(ledgerq.open(path))``.
    Every method has the meaning and the errors of the synchronous one.
    """

    def __init__(self, queue: Queue) -> None:
        if not isinstance(queue, Queue):
            raise TypeError(f"AsyncQueue wraps a ledgerq.Queue, got {type(queue).__name__}")
        self._queue = queue
        self._default = AsyncReader(queue, queue.reader(_DEFAULT_READER))

    @property
    def sync_queue(self) -> Queue:
        """The underlying synchronous :class:`ledgerq.Queue`."""
        return self._queue

    @property
    def path(self) -> str:
        """The queue directory (absolute)."""
        return self._queue.path

    @property
    def closed(self) -> bool:
        """Whether the queue has been closed."""
        return self._queue.closed

    async def enqueue(
        self,
        payload: bytes | bytearray | memoryview,
        *,
        headers: Mapping[str, str] | None = None,
        priority: Priority | int = Priority.MEDIUM,
        ttl: float | None = None,
        dedup_id: str | bytes | None = None,
        delay: float | None = None,
        timeout: float | None = 0,
        unique_key: str | None = None,
    ) -> int:
        """Append one message in a thread; return its id (see :meth:`ledgerq.Queue.enqueue`).

        Returns when the message has reached the OS, and with ``sync="always"``
        after it is on disk.  In a bounded queue, waits up to ``timeout`` seconds
        for room (0: not at all, None: forever) on the loop, not in a thread: a
        cancelled enqueue never writes its message later.
        """
        enqueue = functools.partial(
            self._queue.enqueue,
            payload,
            headers=headers,
            priority=priority,
            ttl=ttl,
            dedup_id=dedup_id,
            delay=delay,
            unique_key=unique_key,
        )
        return await self._when_room(enqueue, timeout)

    async def enqueue_batch(
        self,
        items: Iterable[bytes | bytearray | memoryview | Item],
        timeout: float | None = 0,
    ) -> list[int]:
        """Append several messages with one write and at most one fsync; return their ids.

        All or nothing; in a bounded queue it waits for room as :meth:`enqueue`.
        """
        return await self._when_room(
            functools.partial(self._queue.enqueue_batch, list(items)), timeout
        )

    async def _when_room(self, append: Callable[[], _T], timeout: float | None) -> _T:
        """Run ``append`` (never waiting itself) in a thread; while the queue is full,
        wait on the loop up to ``timeout`` for room and try again."""
        wait = check_timeout(timeout)
        if wait == 0:
            return await asyncio.to_thread(append)
        with _Wait(self._queue.add_room_listener, wait) as waiting:
            while True:
                waiting.arm()
                try:
                    return await asyncio.to_thread(append)
                except QueueFullError:
                    left = waiting.seconds_left()
                    if left is not None and left <= 0:
                        raise
                await waiting.sleep(left)

    async def dequeue(self, timeout: float | None = 0) -> Message | None:
        """Lease the next message (see :meth:`AsyncReader.dequeue`)."""
        return await self._default.dequeue(timeout)

    async def dequeue_batch(self, n: int, timeout: float | None = 0) -> list[Message]:
        """Lease up to ``n`` messages (see :meth:`AsyncReader.dequeue_batch`)."""
        return await self._default.dequeue_batch(n, timeout)

    async def ack(self, message_id: int) -> None:
        """Mark a leased message done; with ``sync="always"`` returns after fsync."""
        await self._default.ack(message_id)

    async def ack_batch(self, message_ids: Iterable[int]) -> None:
        """Ack several leased messages with one record and at most one fsync."""
        await self._default.ack_batch(message_ids)

    async def nack(self, message_id: int, reason: str = "", *, delay: float | None = None) -> None:
        """Give a leased message back as failed: delivered again (after ``delay`` seconds,
        or the retry policy's), or dead-lettered."""
        await self._default.nack(message_id, reason, delay=delay)

    async def release(self, message_id: int, *, delay: float | None = None) -> None:
        """Give a leased message back unused: same ``attempts`` next time, no step to the DLQ."""
        await self._default.release(message_id, delay=delay)

    async def touch(self, message_id: int, seconds: float | None = None) -> None:
        """Keep a lease: it now expires ``seconds`` (default the visibility timeout) from now."""
        await self._default.touch(message_id, seconds)

    async def peek(self, n: int = 1) -> list[Message]:
        """The next ``n`` pending messages, without leasing them."""
        return await self._default.peek(n)

    async def stats(self) -> Stats:
        """A snapshot of the queue's figures (see :class:`ledgerq.Stats`)."""
        return await asyncio.to_thread(self._queue.stats)

    async def reader(self, name: str, start: ReaderStart = "earliest") -> AsyncReader:
        """The named reader (created on first use, which writes its state file durably)."""
        reader = await asyncio.to_thread(self._queue.reader, name, start)
        return AsyncReader(self._queue, reader)

    async def remove_reader(self, name: str) -> bool:
        """Forget the named reader and its state (see :meth:`ledgerq.Queue.remove_reader`)."""
        return await asyncio.to_thread(self._queue.remove_reader, name)

    async def requeue_dlq(
        self, ids: Iterable[int] | None = None, *, delay: float | None = None
    ) -> int:
        """Move dead-lettered messages back (see :meth:`ledgerq.Queue.requeue_dlq`)."""
        wanted = None if ids is None else check_ids(ids)  # in the caller: errors raise here
        delay = check_delay(delay)
        return await asyncio.to_thread(
            functools.partial(self._queue.requeue_dlq, wanted, delay=delay)
        )

    async def sync(self) -> None:
        """Make everything enqueued, acked and nacked so far durable (fsync)."""
        await asyncio.to_thread(self._queue.sync)

    async def compact(self) -> None:
        """Apply retention now."""
        await asyncio.to_thread(self._queue.compact)

    async def close(self) -> None:
        """Sync, persist state and unlock (in a thread).  Idempotent.

        Coroutines waiting in ``dequeue`` raise :class:`ledgerq.QueueClosedError`;
        ``async for`` loops end.
        """
        await asyncio.to_thread(self._queue.close)

    def __len__(self) -> int:
        return len(self._queue)

    def __aiter__(self) -> AsyncReader:
        """Lease messages forever, until the queue is closed; acking them is yours."""
        return self._default

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._queue.closed else "open"
        return f"<ledgerq.aio.AsyncQueue {self._queue.path!r} {state}>"

    def __reduce__(self) -> NoReturn:
        self._queue.__reduce__()  # raises: the queue's TypeError says what to do instead
        raise AssertionError  # pragma: no cover


class _OpenJob:
    """Opens a queue in a worker thread; closes it again if the opener was cancelled.

    A cancelled ``await asyncio.to_thread(...)`` does not stop the thread, so
    without this a cancelled open would leave a queue open - and its directory
    locked - with no owner.
    """

    def __init__(self, open_queue: Callable[[], Queue]) -> None:
        self._open_queue = open_queue
        self._lock = threading.Lock()
        self._abandoned = False
        self._queue: Queue | None = None

    def run(self) -> Queue | None:
        queue = self._open_queue()
        with self._lock:
            if not self._abandoned:
                self._queue = queue
                return queue
        queue.close()  # the opener went away while we opened: release the lock
        return None

    def abandon(self) -> Queue | None:
        """Mark the job unwanted; return the queue if it was already opened."""
        with self._lock:
            self._abandoned = True
            queue, self._queue = self._queue, None
        return queue


async def _open(open_queue: Callable[[], Queue]) -> AsyncQueue:
    job = _OpenJob(open_queue)
    try:
        queue = await asyncio.to_thread(job.run)
    except asyncio.CancelledError:
        orphan = job.abandon()
        if orphan is not None:
            await asyncio.to_thread(orphan.close)
        raise
    assert queue is not None  # only an abandoned job returns None
    return AsyncQueue(queue)


class _Opener:
    """What :func:`open` returns: await it, or use it with ``async with``."""

    def __init__(self, open_queue: Callable[[], Queue]) -> None:
        self._open_queue = open_queue
        self._queue: AsyncQueue | None = None

    def __await__(self) -> Generator[Any, None, AsyncQueue]:
        return _open(self._open_queue).__await__()

    async def __aenter__(self) -> AsyncQueue:
        self._queue = await _open(self._open_queue)
        return self._queue

    async def __aexit__(self, *exc_info: Any) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            await queue.__aexit__(*exc_info)


def open(  # noqa: A001 - mirrors ledgerq.open
    path: str | os.PathLike[str],
    options: ledgerq.Options | None = None,
    *,
    clock: ledgerq.Clock | None = None,
    shared: bool = False,
    **kwargs: Unpack[ledgerq.OpenOptions],
) -> _Opener:
    """Open (creating if missing) the queue in ``path`` for asyncio, in a worker thread.

    Use ``q = await ledgerq.aio.open(path, **options)`` or
    ``async with ledgerq.aio.open(path, **options) as q:`` (closes on exit).
    Options, ``clock``, ``shared`` (shared mode: other processes may have the queue open
    too, and a waiting dequeue is woken by their enqueues) and errors are those of
    :func:`ledgerq.open`, raised when awaited.
    """
    return _Opener(
        functools.partial(ledgerq.open, path, options, clock=clock, shared=shared, **kwargs)
    )
