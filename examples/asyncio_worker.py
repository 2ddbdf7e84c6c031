"""asyncio worker: two producers and three consumer tasks sharing one queue.

Consumers lease with ``async for``, "process" each job, and ack it; every
seventh job fails its first attempt and is nacked, so it comes back with
``attempts == 2``.  When every job is done the queue is closed, which ends the
consumers' ``async for`` loops.

Run: python examples/asyncio_worker.py [QUEUE_DIR]   (default: a temporary directory)
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import ledgerq.aio

JOBS = 200
PRODUCERS = 2
CONSUMERS = 3


async def produce(q: ledgerq.aio.AsyncQueue, first: int, count: int) -> None:
    for n in range(first, first + count):
        await q.enqueue(json.dumps({"job": n}).encode())
        if n % 25 == 0:
            await asyncio.sleep(0)  # let the consumers in while we produce


async def consume(
    q: ledgerq.aio.AsyncQueue,
    name: str,
    done: set[int],
    per_worker: Counter[str],
    all_done: asyncio.Event,
) -> int:
    retries = 0
    async for msg in q:  # leases one message at a time, waiting without blocking the loop
        job = json.loads(msg.payload)["job"]
        await asyncio.sleep(0)  # stands in for real async work (an HTTP call, a query)
        if job % 7 == 0 and msg.attempts == 1:
            retries += 1
            await q.nack(msg.id, reason="transient failure")  # comes back, attempts + 1
            continue
        await q.ack(msg.id)
        done.add(job)
        per_worker[name] += 1
        if len(done) == JOBS:
            all_done.set()
    return retries


async def main(path: Path) -> None:
    done: set[int] = set()
    per_worker: Counter[str] = Counter()
    all_done = asyncio.Event()
    async with ledgerq.aio.open(path, sync="interval") as q:
        consumers = [
            asyncio.create_task(consume(q, f"worker-{i}", done, per_worker, all_done))
            for i in range(CONSUMERS)
        ]
        share = JOBS // PRODUCERS
        await asyncio.gather(*(produce(q, p * share, share) for p in range(PRODUCERS)))
        await all_done.wait()
        stats = await q.stats()
        await q.close()  # ends every consumer's `async for`
        retries = sum(await asyncio.gather(*consumers))

    assert done == set(range(JOBS)), f"missing jobs: {sorted(set(range(JOBS)) - done)[:10]}"
    print(f"processed {len(done)} jobs with {CONSUMERS} consumers; {retries} retried after a nack")
    for name, count in sorted(per_worker.items()):
        print(f"  {name}: {count} jobs")
    print(
        f"stats: enqueued={stats.enqueued} acked={stats.acked} nacked={stats.nacked} "
        f"pending={stats.pending} in_flight={stats.in_flight}"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(Path(sys.argv[1])))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(main(Path(tmp) / "jobs"))
