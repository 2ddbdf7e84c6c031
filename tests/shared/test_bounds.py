"""Bounded queues in shared mode: the bound holds across handles and processes.

Two handles of one process stand for two processes where only the wake-up is tested
(another handle's ack reaches a waiting enqueue only through the files, as another
process's does); real worker processes race for the last room and are killed with
SIGKILL at random points of their enqueues.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children

from ._procs import Reports, start, wait_until


def test_another_handles_ack_wakes_a_waiting_enqueue(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with (
        ledgerq.open(path, shared=True, max_pending=2) as producer,
        ledgerq.open(path, shared=True) as consumer,
    ):
        producer.enqueue_batch([b"a", b"b"])
        with pytest.raises(ledgerq.QueueFullError, match="max_pending=2"):
            consumer.enqueue(b"c")  # the bound is the queue's, stored: every handle has it
        result: list[object] = []

        def enqueue() -> None:
            try:
                result.append(producer.enqueue(b"c", timeout=30))
            except BaseException as exc:
                result.append(exc)

        thread = threading.Thread(target=enqueue)
        thread.start()
        wait_until(lambda: producer._waits.room_waiting, 30, "the enqueue waits for room")
        msg = consumer.dequeue()
        assert msg is not None
        consumer.ack(msg.id)
        thread.join(30)
        assert result == [3]
        assert consumer.stats().pending == 2


def test_processes_racing_for_room_never_exceed_the_bound(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    bound = 12
    with ledgerq.open(path, shared=True, max_pending=bound) as q:
        producers = [
            Reports(start(children, "produce", path, f"base={1000 * i}", "count=40"))
            for i in range(3)
        ]

        def enqueued() -> int:
            return sum(len(p.kinds("E")) for p in producers)

        def refused_since(counts: list[int]) -> bool:
            return all(len(p.kinds("X")) > n for p, n in zip(producers, counts, strict=True))

        for room in (0, 5, 3):
            if room:
                q.ack_batch([m.id for m in q.dequeue_batch(room)])
            acked = q.stats().acked
            wait_until(lambda a=acked: enqueued() >= bound + a, 60, "the room taken")
            # Once the room is taken, every later try is refused: wait for one of each.
            counts = [len(p.kinds("X")) for p in producers]
            wait_until(lambda c=counts: refused_since(c), 60, "every producer refused")
            assert enqueued() == bound + acked
            stats = q.stats()
            assert (stats.enqueued, stats.pending + stats.in_flight) == (bound + acked, bound)
        assert {x[0] for p in producers for x in p.kinds("X")} == {"QueueFullError"}
        for p in producers:
            p.stop()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_producer_killed_mid_enqueue_leaves_the_bound_kept(
    tmp_path: Path, children: Children, seed: int
) -> None:
    path = tmp_path / "q"
    bound, bound_bytes = 8, 300  # payloads of ~50 bytes: the bytes bind first
    rng = random.Random(seed)

    def check(q: ledgerq.Queue) -> None:
        stats = q.stats()
        assert stats.pending + stats.in_flight <= bound
        assert sum(len(m.payload) for m in q.peek(bound + 1)) <= bound_bytes

    with ledgerq.open(path, shared=True, max_pending=bound, max_pending_bytes=bound_bytes) as q:
        for round_ in range(4):
            producer = Reports(
                start(children, "produce", path, f"base={100 * round_}", "batch=2", "size=50")
            )
            target = rng.randrange(1, 4)
            wait_until(
                lambda p=producer, n=target: len(p.kinds("E")) >= n or bool(p.kinds("X")),
                60,
                "some enqueues, or the queue full",
            )
            producer.stop()  # SIGKILL, wherever it is: mid-write, waiting, retrying
            check(q)
            for msg in q.dequeue_batch(rng.randrange(1, 4)):
                q.ack(msg.id)
    with ledgerq.open(path) as q:  # recovered exclusively: what the crashes left
        check(q)
        while True:
            try:
                q.enqueue(b"x" * 50)
            except ledgerq.QueueFullError:
                break
        check(q)


def test_the_bound_holds_for_a_producer_handle_after_retention_deleted_segments(
    tmp_path: Path,
) -> None:
    # A handle that only produces never reads the log: what the consumer's handle acked
    # in segments that retention has since deleted must not count as room.  (Issue 25:
    # the producer counted 4 pending where there were 50, and let 441 in.)
    path = tmp_path / "q"
    options = {"shared": True, "max_pending": 50, "segment_size": 8192}
    with ledgerq.open(path, **options) as producer, ledgerq.open(path, **options) as consumer:
        for _ in range(400):
            try:
                producer.enqueue(b"x" * 100)
            except ledgerq.QueueFullError:
                msg = consumer.dequeue()
                assert msg is not None
                consumer.ack(msg.id)
                producer.enqueue(b"x" * 100)
        assert producer.stats().segments < 7  # segments were deleted on the way
        for _ in range(100):
            with pytest.raises(ledgerq.QueueFullError):
                producer.enqueue(b"x" * 100)
        assert producer.stats().pending == consumer.stats().pending == 50


@pytest.mark.usefixtures("locking")
@pytest.mark.parametrize(("producers", "consumers"), [(1, 1), (3, 2)])
def test_processes_over_tiny_segments_keep_the_bound(
    tmp_path: Path, children: Children, producers: int, consumers: int
) -> None:
    path = tmp_path / "q"
    bound, options = 50, ("max_pending=50", "segment_size=8192", "size=100")
    ledgerq.open(path, shared=True, max_pending=bound, segment_size=8192).close()
    consuming = [
        Reports(start(children, "consume", path, f"count={300 // consumers}", *options))
        for _ in range(consumers)
    ]
    making = [
        Reports(start(children, "produce", path, f"base={100_000 * i}", *options))
        for i in range(producers)
    ]
    for c in consuming:
        assert c.done.wait(120), "a consumer did not finish its share"
    # The consumers are gone: the producers fill the queue, then every try is refused.
    counts = [len(p.kinds("X")) for p in making]
    wait_until(
        lambda: all(len(p.kinds("X")) >= n + 20 for p, n in zip(making, counts, strict=True)),
        60,
        "every producer refused again and again",
    )
    for p in making:
        p.stop()
    with ledgerq.open(path, shared=True) as q:
        stats = q.stats()
        assert stats.segments > 1 or stats.acked >= 300
        assert stats.pending + stats.in_flight == bound
        assert stats.enqueued == bound + stats.acked
