"""kill -9 and scheduled delivery: a delayed or backed-off message is never delivered
early after the queue is reopened, and a group's order holds.

The child process enqueues delayed, grouped and plain messages, nacks one with the
retry policy's delay and one with its own, leases a group's first message, says
``ready`` and waits to be killed (SIGKILL: no close, nothing flushed by ledgerq).  The
test then reopens the queue at the real time (nothing is due yet) and with a clock an
hour and more ahead (everything is).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children

CHILD = """
import sys, time
import ledgerq
q = ledgerq.open(sys.argv[1], sync=sys.argv[2], retry_delay=600, max_retries=0)
q.enqueue(b"plain")
q.enqueue(b"delayed", delay=3600)
q.enqueue(b"g1", group="g")
q.enqueue(b"g2", group="g")
for payload in (b"backoff", b"nack-delay"):
    q.enqueue(payload)
got = {m.payload: m.id for m in q.dequeue_batch(10)}
assert set(got) == {b"plain", b"g1", b"backoff", b"nack-delay"}, got
q.ack(got[b"plain"])
q.nack(got[b"backoff"], "down")                  # the policy: 600 s
q.nack(got[b"nack-delay"], "later", delay=1800)  # its own: 1800 s
print("ready", flush=True)                       # g1 stays leased: a lost lease
time.sleep(3600)
"""


class AheadClock:
    """The system clock, ``ahead_s`` seconds in the future."""

    def __init__(self, ahead_s: float) -> None:
        self.ahead_ns = int(ahead_s * 1e9)

    def time_ns(self) -> int:
        return time.time_ns() + self.ahead_ns

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()


def drain(q: ledgerq.Queue) -> list[tuple[bytes, int]]:
    """Dequeue and ack everything deliverable now, as (payload, attempts) in order."""
    out = []
    while batch := q.dequeue_batch(10):
        for msg in batch:
            out.append((msg.payload, msg.attempts))
            q.ack(msg.id)
    return out


@pytest.mark.parametrize("sync", ["never", "always"])
def test_nothing_scheduled_comes_early_after_kill9(
    tmp_path: Path, children: Children, sync: str
) -> None:
    path = tmp_path / "q"
    child = children.start(["-c", CHILD, str(path), sync])
    assert child.line() == "ready"
    assert child.kill_and_drain() == []

    with ledgerq.open(path) as q:
        stats = q.stats()
        assert (stats.pending, stats.delayed) == (5, 3)  # g1 (lost lease), g2, 3 waiting
        # Nothing is due: g1's lost lease is a failed delivery that waits the policy's
        # 600 s like the others, and g2 waits for g1.
        assert drain(q) == []
        assert (q.stats().pending, q.stats().delayed) == (5, 4)
    with ledgerq.open(path, clock=AheadClock(601)) as q:
        got = drain(q)
        # 600 s of backoff passed for both failures; the group goes in order.
        assert sorted(got) == [(b"backoff", 2), (b"g1", 2), (b"g2", 1)]
        assert got.index((b"g1", 2)) < got.index((b"g2", 1))
    with ledgerq.open(path, clock=AheadClock(1801)) as q:
        assert drain(q) == [(b"nack-delay", 2)]
    with ledgerq.open(path, clock=AheadClock(3601)) as q:
        assert drain(q) == [(b"delayed", 1)]
        assert q.stats().pending == 0
