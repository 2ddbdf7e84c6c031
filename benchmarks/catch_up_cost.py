"""What a shared consumer pays for each message another consumer took (issue 26, item 3).

    python benchmarks/catch_up_cost.py [--messages 20000] [--runs 5]

Why the drain rate of one queue falls as consumer processes are added
(benchmarks/consumer_scaling.py): before each step a shared reader brings its state up
to date with the other handles - it folds the records they appended to the reader's
journal (a LEASE_BY and an ACK per message they took) and its cursor passes over the
entries of the messages they took.  So with C consumers every message costs its own
dequeue + ack plus C - 1 such catch-ups, all under the reader's lock word.

Method.  Two shared handles of one queue in this process, ``a`` and ``b``, on a queue
preloaded with 2 x ``--messages`` messages of 100 B.  ``b`` leases one message (its
view is then current); ``a`` dequeues + acks ``--messages`` messages one at a time
(timed: the cost of the step itself); then ``b``'s next ``dequeue()`` catches up with
all of that at once (timed: the catch-up, divided by the messages ``a`` took).  An
exclusive handle's dequeue + ack of the same messages is timed beside them.  The best
of ``--runs`` rounds (a fresh queue each).  Not a test: run by hand; docs/benchmarks.md
("Consumers of one queue") quotes one run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import ledgerq  # noqa: E402

PAYLOAD = b"x" * 100


def _preload(path: str, messages: int) -> None:
    with ledgerq.open(path, sync="never") as q:
        for _ in range(0, messages, 1000):
            q.enqueue_batch([PAYLOAD] * 1000)


def _drain(q: ledgerq.Queue, messages: int) -> float:
    """Seconds ``q`` takes to dequeue + ack ``messages`` messages one at a time."""
    start = time.perf_counter()
    for _ in range(messages):
        msg = q.dequeue()
        assert msg is not None
        q.ack(msg.id)
    return time.perf_counter() - start


def one_round(messages: int) -> tuple[float, float, float]:
    """Microseconds per message: exclusive dequeue + ack, shared dequeue + ack, and
    the catch-up another shared handle's next step pays for it."""
    with tempfile.TemporaryDirectory(prefix="lq-catch-up-") as scratch:
        path = os.path.join(scratch, "exclusive")
        _preload(path, messages)
        with ledgerq.open(path) as q:
            exclusive = _drain(q, messages)
        path = os.path.join(scratch, "shared")
        _preload(path, 2 * messages + 1)
        with ledgerq.open(path, shared=True) as a, ledgerq.open(path, shared=True) as b:
            assert b.dequeue() is not None  # b's view is current from here
            shared = _drain(a, messages)
            start = time.perf_counter()
            assert b.dequeue() is not None  # folds a's records, passes a's messages
            catch_up = time.perf_counter() - start
    return tuple(seconds / messages * 1e6 for seconds in (exclusive, shared, catch_up))  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rounds = [one_round(args.messages) for _ in range(args.runs)]
    exclusive, shared, catch_up = (min(column) for column in zip(*rounds, strict=True))
    print(f"load average at start: {os.getloadavg()[0]:.2f}; best of {args.runs} rounds")
    print(f"exclusive dequeue + ack          {exclusive:6.2f} us per message")
    print(f"shared dequeue + ack             {shared:6.2f} us per message")
    print(f"another handle's catch-up        {catch_up:6.2f} us per message it took")
    # The steps of one reader run one at a time (its lock word): with C consumers a
    # message costs its own step and C - 1 catch-ups, done in bulk here - a bound.
    for consumers in (1, 2, 4, 8):
        per_message = shared + (consumers - 1) * catch_up
        print(
            f"  {consumers} consumers, one step at a time: {per_message:6.2f} us per message"
            f" -> at most {1e6 / per_message:9,.0f} messages/s"
        )


if __name__ == "__main__":
    main()
