"""Producers and consumers in separate processes on one queue: shared mode.

Every process opens the queue with ``ledgerq.open(path, shared=True)`` - no server, no
owner process.  Two producers enqueue jobs while three consumers lease and ack them;
a consumer blocked in ``dequeue`` is woken by any process's enqueue - every waiting
consumer, in every process, so the jobs spread over the consumers while each works on
one.  Each job is done once: a lease belongs to the process that took it.

Run: python examples/multiprocess.py [QUEUE_DIR]
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import ledgerq

PRODUCERS, CONSUMERS, JOBS_EACH = 2, 3, 50
STOP = b"stop"  # one per consumer, enqueued after every job
WORK_S = 0.002  # what a job costs here; the other consumers take the next jobs meanwhile


def work(payload: bytes) -> None:
    """Stand-in for the job's real work (an image resized, a request made)."""
    time.sleep(WORK_S)


def produce(path: Path, producer: int) -> None:
    with ledgerq.open(path, shared=True) as q:
        for n in range(JOBS_EACH):
            q.enqueue(f"job {producer}.{n}".encode())


def consume(path: Path, results: multiprocessing.Queue[tuple[int, int]], consumer: int) -> None:
    done = 0
    with ledgerq.open(path, shared=True) as q:
        while True:
            job = q.dequeue(timeout=1.0)  # woken by any process's enqueue
            if job is None:
                continue  # nothing for a second: wait again
            if job.payload == STOP:
                q.ack(job.id)
                break
            work(job.payload)
            q.ack(job.id)  # done: acked after the work, so a crash mid-job redelivers it
            done += 1
    results.put((consumer, done))


def main(path: Path) -> None:
    spawn = multiprocessing.get_context("spawn")  # fresh processes: each opens the queue itself
    results: multiprocessing.Queue[tuple[int, int]] = spawn.Queue()
    # The parent is one more process on the queue: it creates it, and says when to stop.
    with ledgerq.open(path, shared=True) as q:
        consumers = [
            spawn.Process(target=consume, args=(path, results, c)) for c in range(CONSUMERS)
        ]
        producers = [spawn.Process(target=produce, args=(path, p)) for p in range(PRODUCERS)]
        for process in consumers + producers:
            process.start()
        for process in producers:
            process.join()
        print(f"{PRODUCERS} producer processes enqueued {PRODUCERS * JOBS_EACH} jobs")
        q.enqueue_batch([STOP] * CONSUMERS)
        done = dict(results.get() for _ in consumers)
        for process in consumers:
            process.join()
        for consumer, count in sorted(done.items()):
            print(f"consumer process {consumer} did {count} jobs {'#' * (count // 2)}")
        stats = q.stats()  # the queue's figures, the same from every process
        print(f"in all: {sum(done.values())} jobs done once each, {stats.pending} pending")
        assert sum(done.values()) == PRODUCERS * JOBS_EACH and stats.pending == 0


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "jobs")
