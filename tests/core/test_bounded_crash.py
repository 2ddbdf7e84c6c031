"""A bounded queue killed with SIGKILL at random moments never exceeds its bound after
recovery.

The child owns the queue (an exclusive open), fills it to its bounds with batches of
random sizes (refusals included), consumes and acks some, and reports each step only
after it returned; the test kills it after a random number of reports - mid-write,
mid-ack, mid-rotation - reopens the queue and counts what recovery left.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children

MAX_PENDING, MAX_PENDING_BYTES = 40, 6000

CHILD = """
import os, random, sys
import ledgerq

path, seed, max_pending, max_pending_bytes = sys.argv[1], *map(int, sys.argv[2:])
rng = random.Random(seed)
q = ledgerq.open(path, max_pending=max_pending, max_pending_bytes=max_pending_bytes,
                 segment_size=4096, sync="never")
while True:
    batch = [b"x" * rng.randrange(0, 400) for _ in range(rng.randrange(1, 6))]
    try:
        q.enqueue_batch(batch)
        os.write(1, b"E\\n")
    except ledgerq.QueueFullError:
        os.write(1, b"F\\n")
    for msg in q.dequeue_batch(rng.randrange(1, 4)):
        if rng.random() < 0.7:
            q.ack(msg.id)
    os.write(1, b"C\\n")
"""


def _backlog(q: ledgerq.Queue) -> tuple[int, int]:
    stats = q.stats()
    pending = q.peek(MAX_PENDING * 2)  # nothing is leased after a reopen
    return stats.pending + stats.in_flight, sum(len(m.payload) for m in pending)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_the_bound_holds_after_kill_9(tmp_path: Path, children: Children, seed: int) -> None:
    path = tmp_path / "q"
    rng = random.Random(seed)
    for round_ in range(5):
        bounds = [str(MAX_PENDING), str(MAX_PENDING_BYTES)]
        child = children.start(["-c", CHILD, str(path), str(seed * 100 + round_), *bounds])
        for _ in range(rng.randrange(1, 120)):
            child.line()
        child.kill()
        child.wait()
        with ledgerq.open(path) as q:
            count, size = _backlog(q)
            assert count <= MAX_PENDING
            assert size <= MAX_PENDING_BYTES
            assert q.options.max_pending == MAX_PENDING  # stored: the bound survives too
            q._check()
