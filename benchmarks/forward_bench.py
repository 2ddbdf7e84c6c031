"""Hand-offs: the cost of ``forward(id, target, [item])`` beside ``enqueue`` + ``ack``.

    python benchmarks/forward_bench.py [--messages 20000] [--rounds 5] [--shared]

A targeted measurement (not the suite of ``benchmarks/run.py``) of issue 28's promise
``forward of one item >= 0.8x an enqueue + ack``.  Both sides start from a source queue
holding ``--messages`` leased 100-byte messages (the dequeues are not timed) and a new
target queue, then time, per message:

* **enqueue + ack**: ``target.enqueue(PAYLOAD)`` then ``source.ack(id)`` - the hand-off
  without its guarantee (a kill -9 between the two adds the item twice);
* **forward**: ``source.forward(id, target, [PAYLOAD])`` - the same work, exactly once
  (a hand-off record stored in the target's mapped table, then the item, then the ack);
* **floor**: enqueue + ack + one ``os.write`` of a record-sized buffer (54 bytes) to
  another file - what a design that writes each hand-off record with a system call
  pays at least (the record must reach the OS before the item: a third ``write()``;
  the design before ``features/forwards.table``, which stores the record into a
  mapping of the file instead).
* **in-entry floor**: enqueue + ack plus what a design keeping the hand-off key *inside*
  the item's entry (no third ``write()``; a new entry format, since the flags byte is
  full) pays at least: the key's digest, one lookup and one insert in a dict, and an
  entry 17 bytes longer.

Rounds alternate; the best round of each is reported, and the ratio of the rates.
Times are the process's CPU time (``time.process_time``: user + system), not wall
time: on a shared, loaded machine the wall clock mostly measures the wait for a core.
Default options otherwise (``sync="interval"``).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time

import ledgerq
from ledgerq.core.feature import handoff_key

PAYLOAD = b"x" * 100


def _round(root: str, n: int, *, shared: bool, kind: str) -> float:
    """Messages per CPU second of one round."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    with (
        ledgerq.open(os.path.join(root, "source"), shared=shared) as source,
        ledgerq.open(os.path.join(root, "target"), shared=shared) as target,
    ):
        source.enqueue_batch([PAYLOAD] * n)
        ids = [m.id for m in source.dequeue_batch(n)]
        assert len(ids) == n
        gc.collect()
        if kind == "forward":
            hand_on = source.forward
            items = [PAYLOAD]
            started = time.process_time()
            for message_id in ids:
                hand_on(message_id, target, items)
        elif kind == "floor":
            enqueue, ack, write = target.enqueue, source.ack, os.write
            fd = os.open(os.path.join(root, "floor"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            record = bytes(54)
            try:
                started = time.process_time()
                for message_id in ids:
                    write(fd, record)
                    enqueue(PAYLOAD)
                    ack(message_id)
            finally:
                os.close(fd)
        elif kind == "in-entry floor":
            enqueue, ack = target.enqueue, source.ack
            prefix = os.path.join(root, "source").encode() + b"\0\0"
            longer = PAYLOAD + bytes(17)
            landed: dict[bytes, int] = {}
            started = time.process_time()
            for message_id in ids:
                key = handoff_key(prefix, message_id)
                if landed.get(key) is None:
                    landed[key] = enqueue(longer)
                ack(message_id)
        else:
            enqueue, ack = target.enqueue, source.ack
            started = time.process_time()
            for message_id in ids:
                enqueue(PAYLOAD)
                ack(message_id)
        elapsed = time.process_time() - started
        assert len(target) == n
        assert source.stats().in_flight == 0
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shared", action="store_true", help="both queues in shared mode")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="ledgerq-forward-")
    try:
        best = {"enqueue + ack": 0.0, "forward": 0.0, "floor": 0.0, "in-entry floor": 0.0}
        for _ in range(args.rounds):
            for name in best:
                rate = _round(root, args.messages, shared=args.shared, kind=name)
                best[name] = max(best[name], rate)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mode = "shared" if args.shared else "exclusive"
    print(f"{args.messages} messages, best of {args.rounds} rounds, {mode} mode, CPU time")
    for name, rate in best.items():
        print(f"  {name:<14} {rate:>10,.0f} msg/s  ({1e6 / rate:.2f} us each)")
    base = best["enqueue + ack"]
    print(f"  forward / (enqueue + ack) = {best['forward'] / base:.2f}x")
    print(f"  floor / (enqueue + ack)   = {best['floor'] / base:.2f}x")
    print(f"  in-entry floor / (enqueue + ack) = {best['in-entry floor'] / base:.2f}x")


if __name__ == "__main__":
    main()
