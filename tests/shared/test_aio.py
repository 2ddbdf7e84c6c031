"""``ledgerq.aio.open(path, shared=True)``: an asyncio consumer beside other processes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import ledgerq.aio
from tests._child import Children

from ._procs import start


def test_an_async_dequeue_is_woken_by_another_process(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"

    async def consume() -> tuple[int, float]:
        async with ledgerq.aio.open(path, shared=True) as q:
            producer = start(children, "hold", path)
            waiting = asyncio.ensure_future(q.dequeue(timeout=10))
            # One turn of the loop runs the dequeue up to its wait: everything before it
            # (the first look, the listener) is inline.
            await asyncio.sleep(0)
            assert not waiting.done()
            sent = time.monotonic()
            producer.send("enq 7")
            msg = await waiting
            woke = time.monotonic() - sent
            assert msg is not None
            await q.ack(msg.id)
            producer.send("close")
            producer.wait_for("BYE")
            return msg.id, woke

    message_id, woke = asyncio.run(consume())
    assert message_id == 1
    assert woke < 1.0, f"woken {woke:.3f} s after the other process's enqueue"
