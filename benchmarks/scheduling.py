"""Delivery in time at scale: a million delayed messages, 100,000 message groups.

    python benchmarks/scheduling.py [--messages 1000000] [--groups 100000] [--rounds 2]

A targeted measurement (not the full suite of ``benchmarks/run.py``) of issue 17's
speed and memory promises, each workload beside its undelayed / ungrouped twin in the
same run, alternately, the best round of each (noise on a shared machine only slows a
round down):

* **enqueue**: ``--messages`` single enqueues into a new queue, plain vs each with
  ``delay=3600`` (the delay index grows to all of them);
* **due messages beside parked delayed ones**: a queue of ``--messages`` delayed
  messages, then as many due ones; after the first dequeue has read and parked every
  delayed entry (timed apart: the cost of a delayed message is reading it once),
  dequeue+ack of the due ones vs a queue holding only the due ones - the index must
  not slow the rest of the traffic;
* **due and delayed interleaved**: the same messages alternating, so every due dequeue
  also reads and parks one delayed entry: what a delayed message costs a consumer
  (reported, no target: the work per dequeue doubles);
* **falling due**: ``--messages`` delayed messages whose time comes (the queue's clock
  is moved past it: no waiting), dequeue+ack them all from the delay index vs the same
  count never delayed;
* **memory**: bytes the delay index holds per delayed message (``tracemalloc`` over the
  read that parks ``--messages`` delayed entries; a separate, untimed pass);
* **groups**: ``--groups`` groups of 10 messages, enqueued round-robin, dequeue+ack one
  at a time vs the same messages without a group.

Every queue runs at the default options and a 100-byte payload.  Rates are operations
per second (a dequeue+ack is one operation).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from time import perf_counter

import ledgerq

PAYLOAD = b"x" * 100
HOUR = 3600.0
BATCH = 1000  # messages per enqueue_batch when a queue is built (untimed)


class ShiftedClock:
    """The system's clocks, moved ``ahead_s`` seconds into the future when told."""

    def __init__(self) -> None:
        self.ahead_ns = 0

    def time_ns(self) -> int:
        return time.time_ns() + self.ahead_ns

    def monotonic_ns(self) -> int:
        return time.monotonic_ns() + self.ahead_ns


def _fresh(base: str) -> str:
    path = os.path.join(base, "q")
    shutil.rmtree(path, ignore_errors=True)
    return path


def enqueue_rate(base: str, n: int, delay: float | None) -> float:
    """Single enqueues per second into a new queue."""
    path = _fresh(base)
    with ledgerq.open(path) as q:
        enqueue = q.enqueue
        start = perf_counter()
        if delay is None:
            for _ in range(n):
                enqueue(PAYLOAD)
        else:
            for _ in range(n):
                enqueue(PAYLOAD, delay=delay)
        return n / (perf_counter() - start)


def _build(path: str, items: Callable[[int], ledgerq.Item], n: int) -> None:
    with ledgerq.open(path) as q:
        for start in range(0, n, BATCH):
            q.enqueue_batch([items(i) for i in range(start, min(n, start + BATCH))])


def drain_rate(
    path: str, expected: int, clock: ShiftedClock | None = None, *, park_first: bool = False
) -> float:
    """Dequeue+ack per second until nothing is due; checks ``expected`` came out.

    ``park_first``: the first dequeue (which reads and parks every delayed entry before
    the first due one) is done and acked before the clock starts.
    """
    with ledgerq.open(path, clock=clock) as q:
        if clock is not None:
            clock.ahead_ns = int(2 * HOUR * 1e9)  # every delay has passed
        dequeue, ack = q.dequeue, q.ack
        done = 0
        if park_first:
            started = perf_counter()
            first = dequeue()
            assert first is not None
            ack(first.id)
            done = 1
            PARKING.append(perf_counter() - started)
        start = perf_counter()
        while (m := dequeue()) is not None:
            ack(m.id)
            done += 1
        elapsed = perf_counter() - start
    if done != expected:
        raise SystemExit(f"drained {done} messages, expected {expected}")
    return (done - 1 if park_first else done) / elapsed


PARKING: list[float] = []  # seconds of the first dequeue that parked every delayed entry


def due_beside_delayed(base: str, n: int, delayed: bool) -> float:
    path = _fresh(base)
    if delayed:  # n delayed messages, then n due ones
        _build(path, lambda i: ledgerq.Item(PAYLOAD, delay=HOUR if i < n else None), 2 * n)
    else:
        _build(path, lambda i: ledgerq.Item(PAYLOAD), n)
    return drain_rate(path, n, park_first=True)


def due_among_delayed(base: str, n: int, delayed: bool) -> float:
    path = _fresh(base)
    if delayed:  # delayed and due alternate: every due message follows a delayed one
        _build(path, lambda i: ledgerq.Item(PAYLOAD, delay=HOUR if i % 2 else None), 2 * n)
    else:
        _build(path, lambda i: ledgerq.Item(PAYLOAD), n)
    return drain_rate(path, n)


def falling_due(base: str, n: int, delayed: bool) -> float:
    path = _fresh(base)
    _build(path, lambda i: ledgerq.Item(PAYLOAD, delay=HOUR if delayed else None), n)
    return drain_rate(path, n, ShiftedClock() if delayed else None)


def grouped(base: str, groups: int, with_groups: bool) -> float:
    path = _fresh(base)
    n = groups * 10
    if with_groups:
        names = [f"g{g}" for g in range(groups)]
        _build(path, lambda i: ledgerq.Item(PAYLOAD, group=names[i % groups]), n)
    else:
        _build(path, lambda i: ledgerq.Item(PAYLOAD), n)
    return drain_rate(path, n)


def delay_index_bytes(base: str, n: int) -> float:
    """Bytes per delayed message held after the cursor parked ``n`` delayed entries."""
    path = _fresh(base)
    _build(path, lambda i: ledgerq.Item(PAYLOAD, delay=HOUR), n)
    with ledgerq.open(path) as q:
        gc.collect()
        tracemalloc.start()
        assert q.dequeue() is None  # reads every entry, parks each one
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        delayed = q.stats().delayed
    if delayed != n:
        raise SystemExit(f"{delayed} delayed after the read, expected {n}")
    return held / n


Row = tuple[str, float, float, float, float | None]


def pair(name: str, rounds: int, run: Callable[[bool], float], bound: float | None) -> Row:
    """Run both twins ``rounds`` times, alternately; the best rate of each."""
    plain: list[float] = []
    featured: list[float] = []
    for _ in range(rounds):
        plain.append(run(False))
        featured.append(run(True))
    best_plain, best_featured = max(plain), max(featured)
    return name, best_plain, best_featured, best_featured / best_plain, bound


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    n, rounds = args.messages, args.rounds
    load = os.getloadavg()[0]
    base = tempfile.mkdtemp(prefix="lq-scheduling-", dir=args.dir)
    try:
        rows = [
            pair(
                f"enqueue, {n:,} x delay=1h vs none",
                rounds,
                lambda d: enqueue_rate(base, n, HOUR if d else None),
                0.8,
            ),
            pair(
                f"dequeue+ack of {n:,} due messages beside {n:,} parked delayed ones vs alone",
                rounds,
                lambda d: due_beside_delayed(base, n, d),
                0.8,
            ),
            pair(
                f"dequeue+ack of {n:,} delayed messages fallen due vs never delayed",
                rounds,
                lambda d: falling_due(base, n, d),
                0.8,
            ),
            pair(
                f"dequeue+ack, {args.groups:,} groups x 10 vs no group",
                rounds,
                lambda g: grouped(base, args.groups, g),
                0.75,
            ),
            pair(
                f"dequeue+ack of {n:,} due messages interleaved with {n:,} delayed vs alone",
                rounds,
                lambda d: due_among_delayed(base, n, d),
                None,
            ),
        ]
        memory = delay_index_bytes(base, n)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    parked = min(PARKING[1::2])  # the delayed twin's rounds
    print(f"load average when the run started: {load:.2f} (1 min); best of {rounds} rounds")
    print()
    print("| workload | without | with | ratio | wanted | |")
    print("|---|---|---|---|---|---|")
    for name, plain, featured, ratio, bound in rows:
        if bound is None:
            wanted, verdict = "", "(cost)"
        else:
            wanted, verdict = f">= {bound:.2f}x", "met" if ratio >= bound else "**NOT met**"
        print(
            f"| {name} | {plain:,.0f}/s | {featured:,.0f}/s | {ratio:.2f}x | {wanted} | {verdict} |"
        )
    verdict = "met" if memory <= 40 else "**NOT met**"
    index = f"delay index, {n:,} delayed messages"
    print(f"| {index} | | {memory:.1f} B/message | | <= 40 B | {verdict} |")
    print(
        f"| parking {n:,} delayed messages (the first dequeue reads them all) | | "
        f"{parked:.2f} s ({parked / n * 1e6:.2f} us each) | | | |"
    )


if __name__ == "__main__":
    main()
