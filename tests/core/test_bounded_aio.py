"""Bounded queues through ``ledgerq.aio``: ``await q.enqueue(..., timeout=)``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import ledgerq
import ledgerq.aio

GUARD_S = 30.0  # a hang guard, not a timing assertion


async def _room_waiters(q: ledgerq.aio.AsyncQueue) -> None:
    """Return once an enqueue of ``q`` waits for room (a state, polled on the loop)."""
    while not q.sync_queue._waits.room_waiting:
        await asyncio.sleep(0.001)


def test_an_awaited_enqueue_waits_for_an_ack(tmp_path: Path) -> None:
    async def main(path: Path) -> None:
        async with ledgerq.aio.open(path, max_pending=1) as q:
            await q.enqueue(b"a")
            with pytest.raises(ledgerq.QueueFullError):
                await q.enqueue(b"b")
            waiting = asyncio.create_task(q.enqueue(b"b", timeout=None))
            await _room_waiters(q)
            msg = await q.dequeue()
            assert msg is not None
            assert not waiting.done()
            await q.ack(msg.id)
            assert await waiting == msg.id + 1

    asyncio.run(asyncio.wait_for(main(tmp_path / "q"), GUARD_S))


def test_a_cancelled_enqueue_never_writes_its_message(tmp_path: Path) -> None:
    async def main(path: Path) -> None:
        async with ledgerq.aio.open(path, max_pending=1) as q:
            await q.enqueue_batch([b"a"])
            waiting = asyncio.create_task(q.enqueue_batch([b"late"], timeout=None))
            await _room_waiters(q)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert not q.sync_queue._waits.room_waiting
            msg = await q.dequeue()
            assert msg is not None
            await q.ack(msg.id)
            assert await q.dequeue() is None  # the cancelled batch is not in the queue
            assert (await q.stats()).enqueued == 1

    asyncio.run(asyncio.wait_for(main(tmp_path / "q"), GUARD_S))


def test_an_awaited_enqueue_times_out(tmp_path: Path) -> None:
    async def main(path: Path) -> None:
        async with ledgerq.aio.open(path, max_pending=1) as q:
            await q.enqueue(b"a")
            with pytest.raises(ledgerq.QueueFullError):
                await q.enqueue(b"b", timeout=0.05)
            assert (await q.stats()).enqueued == 1

    asyncio.run(asyncio.wait_for(main(tmp_path / "q"), GUARD_S))
