"""ledgerq.aio: the asyncio face of a queue.

No sleeps as synchronisation: a test that needs a coroutine to be *waiting*
yields to the loop (``asyncio.sleep(0)``) until the probe below sees its
listener registered on the queue; every test body runs under a generous
``asyncio.timeout`` so a lost wake-up fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

import ledgerq
import ledgerq.aio
from ledgerq.aio import AsyncQueue
from tests.aioguard import run_guarded

T = TypeVar("T")
GUARD_S = 30.0  # a hang guard, not a timing assertion


def run(coro: Coroutine[Any, Any, T]) -> T:
    return run_guarded(coro, GUARD_S)


class WaitProbe:
    """Counts the listeners an AsyncQueue registers on its sync queue (= waiting coroutines)."""

    def __init__(self, q: AsyncQueue) -> None:
        self.queue = q
        self.added = 0
        self.removed = 0
        sync = q.sync_queue
        original = sync.add_listener

        def add_listener(callback: Callable[[], None]) -> Callable[[], None]:
            self.added += 1
            remove = original(callback)

            def counted_remove() -> None:
                self.removed += 1
                remove()

            return counted_remove

        sync.add_listener = add_listener  # type: ignore[method-assign]

    @property
    def waiting(self) -> int:
        return self.added - self.removed

    async def until_waiting(self, n: int = 1) -> None:
        deadline = time.monotonic() + GUARD_S  # a hang guard: waiters may come from threads
        while self.waiting < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {n} waiting coroutines, saw {self.waiting}")
            await asyncio.sleep(0)

    async def waiting_dequeue(self) -> asyncio.Task[ledgerq.Message | None]:
        """A ``dequeue(timeout=None)`` of the probed queue, started as a task and
        returned once it waits (the only waiting coroutine)."""
        task = asyncio.create_task(self.queue.dequeue(timeout=None))
        await self.until_waiting()
        return task


class TakeCounter:
    """Counts non-blocking dequeue attempts on a sync reader (to prove there is no polling)."""

    def __init__(self, reader: ledgerq.Reader) -> None:
        self.calls = 0
        original = reader.dequeue_batch

        def dequeue_batch(n: int, timeout: float | None = 0) -> list[ledgerq.Message]:
            self.calls += 1
            return original(n, timeout)

        reader.dequeue_batch = dequeue_batch  # type: ignore[method-assign]


async def yield_until(predicate: Callable[[], bool]) -> None:
    """Let the loop run until ``predicate()`` holds (a hang guard bounds the wait)."""
    deadline = time.monotonic() + GUARD_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition never became true")
        await asyncio.sleep(0)


@pytest.fixture
def qpath(tmp_path: Path) -> Path:
    return tmp_path / "q"


# --------------------------------------------------------------------------- basics


def test_round_trip_enqueue_dequeue_ack_nack(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath, max_retries=5) as q:
            assert isinstance(q.sync_queue, ledgerq.Queue)
            first = await q.enqueue(b"one", headers={"k": "v"})
            ids = await q.enqueue_batch([b"two", ledgerq.Item(b"three", ttl=60)])
            assert ids == [first + 1, first + 2]
            assert len(q) == 3
            assert [m.payload for m in await q.peek(2)] == [b"one", b"two"]

            msg = await q.dequeue()
            assert msg is not None
            assert (msg.id, msg.payload, msg.attempts) == (first, b"one", 1)
            assert msg.headers == {"k": "v"}
            await q.ack(msg.id)

            msg = await q.dequeue()
            assert msg is not None and msg.payload == b"two"
            await q.nack(msg.id, reason="try later")
            again = await q.dequeue()
            assert again is not None and again.id == msg.id and again.attempts == 2
            await q.ack(again.id)

            batch = await q.dequeue_batch(10)
            assert [m.payload for m in batch] == [b"three"]
            await q.ack_batch(m.id for m in batch)
            assert await q.dequeue() is None
            assert await q.dequeue_batch(3) == []

            stats = await q.stats()
            assert (stats.enqueued, stats.acked, stats.nacked, stats.pending) == (3, 3, 1, 0)
            with pytest.raises(ledgerq.UnknownMessageError):
                await q.ack(999)
        assert q.closed
        with pytest.raises(ledgerq.QueueClosedError):
            await q.dequeue()
        with pytest.raises(ledgerq.QueueClosedError):
            await q.enqueue(b"late")

    run(main())


def test_await_open_then_close_and_reopen(qpath: Path) -> None:
    async def main() -> None:
        q = await ledgerq.aio.open(qpath, sync="always")
        assert repr(q).endswith("open>")
        assert await q.enqueue(b"durable") == 1
        with pytest.raises(ledgerq.QueueLockedError):
            await ledgerq.aio.open(qpath)
        await q.close()
        await q.close()  # idempotent
        async with await ledgerq.aio.open(qpath) as again:
            msg = await again.dequeue()
            assert msg is not None and msg.payload == b"durable"
            await again.ack(msg.id)

    run(main())


def test_open_errors_surface_when_awaited(qpath: Path) -> None:
    async def main() -> None:
        opener = ledgerq.aio.open(qpath, segmnet_size=10)  # nothing happens yet
        with pytest.raises(TypeError, match="unknown option"):
            await opener
        with pytest.raises(ledgerq.ConfigError):
            async with ledgerq.aio.open(qpath, sync="sometimes"):
                pass

    run(main())
    assert not qpath.exists()  # options are checked before anything is created


def test_argument_errors(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            with pytest.raises(ValueError, match="timeout"):
                await q.dequeue(timeout=-1)
            with pytest.raises(TypeError, match="timeout"):
                await q.dequeue(timeout="5")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="n must be"):
                await q.dequeue_batch(0)
            with pytest.raises(TypeError, match="payload"):
                await q.enqueue("text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"ledgerq\.Queue"):
            AsyncQueue(object())  # type: ignore[arg-type]

    run(main())


def test_wrap_an_open_queue(qpath: Path) -> None:
    async def main() -> None:
        sync = ledgerq.open(qpath)
        try:
            q = AsyncQueue(sync)
            await q.enqueue(b"x")
            msg = sync.dequeue()
            assert msg is not None and msg.payload == b"x"
            sync.ack(msg.id)
        finally:
            sync.close()

    run(main())


# --------------------------------------------------------------------------- waiting


def test_dequeue_woken_by_enqueue_from_another_task(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            probe = WaitProbe(q)
            consumer = await probe.waiting_dequeue()
            assert not consumer.done()
            await q.enqueue(b"wake up")
            msg = await consumer
            assert msg is not None and msg.payload == b"wake up"
            assert probe.waiting == 0  # the listener was removed
            await q.ack(msg.id)

    run(main())


def test_dequeue_woken_by_enqueue_from_another_thread(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            probe = WaitProbe(q)
            consumer = asyncio.create_task(q.dequeue_batch(5, timeout=GUARD_S))
            await probe.until_waiting()
            producer = threading.Thread(target=q.sync_queue.enqueue_batch, args=([b"a", b"b"],))
            producer.start()
            batch = await consumer
            producer.join()
            assert [m.payload for m in batch][:1] == [b"a"]
            for m in batch:
                await q.ack(m.id)

    run(main())


def test_dequeue_woken_by_nack_of_another_consumer(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            probe = WaitProbe(q)
            await q.enqueue(b"hot potato")
            held = await q.dequeue()
            assert held is not None
            other = asyncio.create_task(q.dequeue(timeout=None))
            await probe.until_waiting()
            await q.nack(held.id, "pass it on")
            msg = await other
            assert msg is not None and msg.id == held.id and msg.attempts == 2

    run(main())


def test_dequeue_timeout_expires_with_none(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            probe = WaitProbe(q)
            assert await q.dequeue(timeout=0.05) is None
            assert await q.dequeue_batch(3, timeout=0.05) == []
            assert probe.waiting == 0
            # A message enqueued afterwards is still there for the next call.
            await q.enqueue(b"later")
            msg = await q.dequeue(timeout=0.05)
            assert msg is not None and msg.attempts == 1

    run(main())


def test_visibility_timeout_redelivers_to_a_waiting_dequeue(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath, visibility_timeout=0.2) as q:
            await q.enqueue(b"slow job")
            first = await q.dequeue()
            assert first is not None and first.attempts == 1
            # Nothing enqueues or nacks: only the lease expiry can wake this wait.
            again = await q.dequeue(timeout=None)
            assert again is not None
            assert (again.id, again.attempts) == (first.id, 2)
            await q.ack(again.id)
            with pytest.raises(ledgerq.UnknownMessageError):
                await q.ack(first.id + 1)

    run(main())


def test_many_waiters_each_get_a_different_message(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            probe = WaitProbe(q)
            waiters = [asyncio.create_task(q.dequeue(timeout=None)) for _ in range(4)]
            await probe.until_waiting(4)
            await q.enqueue_batch([b"1", b"2", b"3", b"4"])
            got = await asyncio.gather(*waiters)
            assert sorted(m.payload for m in got if m is not None) == [b"1", b"2", b"3", b"4"]

    run(main())


def test_a_waiter_woken_for_nothing_waits_again(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            probe = WaitProbe(q)
            waiters = {asyncio.create_task(q.dequeue(timeout=None)) for _ in range(2)}
            await probe.until_waiting(2)
            await q.enqueue(b"first")  # wakes both; one of them gets it
            done, rest = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1 and len(rest) == 1
            for _ in range(20):  # let the loser see an empty queue and wait again
                await asyncio.sleep(0)
            assert probe.waiting == 1
            await q.enqueue(b"second")
            loser = rest.pop()
            msg = await loser
            assert msg is not None and msg.payload == b"second"

    run(main())


def test_loop_stays_responsive_and_nothing_polls_while_waiting(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            probe = WaitProbe(q)
            takes = TakeCounter(q.sync_queue.reader("default"))
            ticks = 0
            order: list[str] = []

            async def ticker() -> None:
                nonlocal ticks
                while ticks < 1000:
                    ticks += 1
                    await asyncio.sleep(0)
                order.append("ticker done")

            async def consumer() -> ledgerq.Message | None:
                msg = await q.dequeue(timeout=None)
                order.append("consumer done")
                return msg

            waiting = asyncio.create_task(consumer())
            await probe.until_waiting()
            calls_when_waiting = takes.calls
            await ticker()
            # 1000 turns of the loop while the dequeue waited, and it did not look again.
            assert not waiting.done()
            assert takes.calls == calls_when_waiting
            await q.enqueue(b"finally")
            msg = await waiting
            assert msg is not None and msg.payload == b"finally"
            assert order == ["ticker done", "consumer done"]

            # A timed wait too: the ticker advances while dequeue(timeout=...) waits.
            ticks = 0
            seen_at_return: list[int] = []

            async def timed() -> None:
                assert await q.dequeue(timeout=0.1) is None
                seen_at_return.append(ticks)

            spinner = asyncio.create_task(ticker())
            await timed()
            await spinner
            assert seen_at_return[0] > 0

    run(main())


# --------------------------------------------------------------------------- cancellation, close


def test_cancelled_waiting_dequeue_loses_nothing(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            probe = WaitProbe(q)
            waiter = await probe.waiting_dequeue()
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert probe.waiting == 0
            await q.enqueue(b"after cancel")
            stats = await q.stats()
            assert (stats.pending, stats.in_flight) == (1, 0)
            msg = await q.dequeue()
            assert msg is not None and msg.payload == b"after cancel" and msg.attempts == 1

    run(main())


def test_cancel_racing_a_wake_up_leases_nothing(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            waiter = await WaitProbe(q).waiting_dequeue()
            # The enqueue schedules the wake-up; the cancel lands before the waiter runs.
            q.sync_queue.enqueue(b"contested")
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            stats = await q.stats()
            assert (stats.pending, stats.in_flight) == (1, 0)
            msg = await q.dequeue()
            assert msg is not None and msg.payload == b"contested" and msg.attempts == 1

    run(main())


def test_cancel_via_wait_for_timeout_leases_nothing(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(q.dequeue(timeout=None), 0.05)
            await q.enqueue(b"x")
            assert (await q.stats()).in_flight == 0
            msg = await q.dequeue()
            assert msg is not None and msg.attempts == 1

    run(main())


def test_close_while_waiting_raises_queue_closed(qpath: Path) -> None:
    async def main() -> None:
        q = await ledgerq.aio.open(qpath)
        probe = WaitProbe(q)
        waiter = asyncio.create_task(q.dequeue(timeout=None))
        batch_waiter = asyncio.create_task(q.dequeue_batch(3, timeout=GUARD_S))
        await probe.until_waiting(2)
        await q.close()
        with pytest.raises(ledgerq.QueueClosedError):
            await waiter
        with pytest.raises(ledgerq.QueueClosedError):
            await batch_waiter
        assert probe.waiting == 0

    run(main())


def test_sync_close_from_another_thread_wakes_waiter(qpath: Path) -> None:
    async def main() -> None:
        q = await ledgerq.aio.open(qpath)
        waiter = await WaitProbe(q).waiting_dequeue()
        closer = threading.Thread(target=q.sync_queue.close)
        closer.start()
        with pytest.raises(ledgerq.QueueClosedError):
            await waiter
        closer.join()

    run(main())


def test_cancelled_open_does_not_leave_the_queue_locked(
    qpath: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = threading.Event()
    proceed = threading.Event()
    real_open = ledgerq.open

    def slow_open(*args: Any, **kwargs: Any) -> ledgerq.Queue:
        queue = real_open(*args, **kwargs)
        opened.set()
        proceed.wait(GUARD_S)  # bounded: a failing test must not hang asyncio.run's join
        return queue

    monkeypatch.setattr(ledgerq, "open", slow_open)

    async def main() -> None:
        task = asyncio.ensure_future(ledgerq.aio.open(qpath))
        await asyncio.sleep(0)  # the task hands the job to a thread
        try:
            # Block the loop until the thread holds an open queue (it needs no loop).
            assert opened.wait(GUARD_S)
            task.cancel()
        finally:
            proceed.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())  # asyncio.run joins the executor's threads before returning
    monkeypatch.setattr(ledgerq, "open", real_open)
    ledgerq.open(qpath).close()  # not locked: the orphan was closed


def test_open_cancelled_after_the_thread_opened_closes_the_queue(
    qpath: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    finished = threading.Event()
    real_run = ledgerq.aio._OpenJob.run

    def run_and_signal(self: Any) -> ledgerq.Queue | None:
        try:
            return real_run(self)
        finally:
            finished.set()

    monkeypatch.setattr(ledgerq.aio._OpenJob, "run", run_and_signal)

    async def main() -> None:
        task = asyncio.ensure_future(ledgerq.aio.open(qpath))
        await asyncio.sleep(0)  # the task hands the job to a thread
        # Block the loop until the thread has opened the queue and handed it over, so
        # the cancel lands after the open but before the task could receive it.
        assert finished.wait(GUARD_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    ledgerq.open(qpath).close()  # not locked: the cancelled opener closed it


# --------------------------------------------------------------------------- iteration, readers


def test_async_for_leases_and_caller_acks(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            await q.enqueue_batch([b"%d" % i for i in range(5)])
            got = []
            async for msg in q:
                got.append(msg.payload)
                await q.ack(msg.id)
                if len(got) == 5:
                    break
            assert got == [b"0", b"1", b"2", b"3", b"4"]
            stats = await q.stats()
            assert (stats.acked, stats.in_flight, stats.pending) == (5, 0, 0)

    run(main())


def test_async_for_ends_when_the_queue_closes(qpath: Path) -> None:
    async def main() -> None:
        q = await ledgerq.aio.open(qpath)
        probe = WaitProbe(q)
        got: list[bytes] = []

        async def consume() -> None:
            async for msg in q:
                got.append(msg.payload)
                await q.ack(msg.id)

        consumer = asyncio.create_task(consume())
        await q.enqueue(b"only")
        await yield_until(lambda: bool(got) and probe.waiting == 1)
        await q.close()
        await consumer  # ends normally
        assert got == [b"only"]

    run(main())


def test_readers_fan_out(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath) as q:
            audit = await q.reader("audit")
            assert audit.name == "audit"
            probe = WaitProbe(q)
            waiting = asyncio.create_task(audit.dequeue(timeout=None))
            await probe.until_waiting()
            await q.enqueue(b"both see me")
            seen = await waiting
            mine = await q.dequeue()
            assert seen is not None and mine is not None and seen.id == mine.id
            await audit.ack(seen.id)
            assert (await audit.stats()).acked == 1
            assert (await q.stats()).in_flight == 1
            await audit.seek(seen.id)
            replay = await audit.dequeue()
            assert replay is not None and replay.id == seen.id
            assert len(audit) == 0
            assert await q.remove_reader("audit")

    run(main())


def test_sync_always_operations_run_off_the_loop(qpath: Path) -> None:
    async def main() -> None:
        async with ledgerq.aio.open(qpath, sync="always") as q:
            ids = await asyncio.gather(*(q.enqueue(b"%d" % i) for i in range(20)))
            assert sorted(ids) == list(range(1, 21))
            acks: list[Awaitable[None]] = []
            for msg in await q.dequeue_batch(20):
                acks.append(q.ack(msg.id))
            await asyncio.gather(*acks)
            assert (await q.stats()).acked == 20

    run(main())
