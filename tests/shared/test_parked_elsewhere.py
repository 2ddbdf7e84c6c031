"""A message one handle parked for its time, taken by another handle when due.

Handle ``b`` reads a delayed message early and parks it; at its time handle ``a`` leases
it.  What ``a``'s lease then does (times out, is nacked, is nacked with a retry delay)
must leave ``b`` with the message once: one delivery, one count.  Before the fix ``b``
gave it back both from the lease's end and from its own stale park - the priority order
held it twice (delivered twice, the second lease on top of the first), and ``b`` counted
a message nacked with a delay as two delayed ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerq
from tests.clocks import SteppedClock


def _parked_by_b_then_leased_by_a(
    tmp_path: Path, priorities: bool
) -> tuple[SteppedClock, ledgerq.Queue, ledgerq.Queue, ledgerq.Message]:
    clock = SteppedClock()
    options = {"shared": True, "priorities": priorities, "visibility_timeout": 5.0}
    a = ledgerq.open(tmp_path / "q", clock=clock, **options)
    b = ledgerq.open(tmp_path / "q", clock=clock, **options)
    a.enqueue(b"later", delay=10)
    assert b.dequeue() is None  # b has read it and parked it until its time
    clock.elapse(11)
    leased = a.dequeue()
    assert leased is not None
    return clock, a, b, leased


@pytest.mark.parametrize("priorities", [False, True], ids=["fifo", "priorities"])
@pytest.mark.parametrize("lease_end", ["timed out", "nacked", "nacked with a delay"])
def test_a_message_parked_here_and_leased_there_comes_back_once(
    tmp_path: Path, priorities: bool, lease_end: str
) -> None:
    clock, a, b, leased = _parked_by_b_then_leased_by_a(tmp_path, priorities)
    try:
        if lease_end == "timed out":
            clock.elapse(6)
        elif lease_end == "nacked":
            a.nack(leased.id)
        else:
            a.nack(leased.id, delay=3)
            assert b.dequeue() is None
            assert b.stats().delayed == a.stats().delayed == 1
            clock.elapse(4)
        # (A timed-out lease counts in flight until a dequeue takes it back.)
        expected = (0, 1) if lease_end == "timed out" else (1, 0)
        for handle in (a, b):
            stats = handle.stats()
            assert (stats.pending, stats.in_flight) == expected
        again = b.dequeue()
        assert again is not None and again.id == leased.id
        assert b.dequeue() is None, "delivered twice"
        b.ack(again.id)
        assert b.dequeue() is None
        assert b.stats().pending == a.stats().pending == 0
    finally:
        a.close()
        b.close()


def test_a_message_parked_here_and_acked_there_is_not_delivered_here(tmp_path: Path) -> None:
    _clock, a, b, leased = _parked_by_b_then_leased_by_a(tmp_path, priorities=True)
    try:
        a.ack(leased.id)
        assert b.dequeue() is None
        assert b.stats().pending == 0 and b.stats().acked == 1
    finally:
        a.close()
        b.close()


def test_a_lease_lost_to_a_close_and_found_by_the_other_handle_is_delayed_for_both(
    tmp_path: Path,
) -> None:
    # a has read the message; b's lease of it is reclaimed at its close (a gives the
    # message back at its next look); b's next take finds the failure and writes its
    # retry time alone.  a counted the message pending, not delayed, while b and the
    # message waited.  (Found by the two-handle scheduling model.)
    clock = SteppedClock()
    options = {"shared": True, "retry_delay": 2.0, "visibility_timeout": 30.0}
    a = ledgerq.open(tmp_path / "q", clock=clock, **options)
    b = ledgerq.open(tmp_path / "q", clock=clock, **options)
    try:
        a.enqueue(b"work")
        read = a.dequeue()  # a has read it: it gives it back by id from now on
        assert read is not None
        a.release(read.id)
        assert b.dequeue() is not None
        b.close()
        assert a.stats().pending == 1  # a has the reclaimed message back
        b = ledgerq.open(tmp_path / "q", clock=clock, **options)
        assert b.dequeue() is None  # the lost lease waits its retry delay
        for handle in (a, b):
            assert (handle.stats().pending, handle.stats().delayed) == (1, 1)
        assert a.dequeue() is None
        clock.elapse(3)
        again = a.dequeue()
        assert again is not None and again.attempts == 2
    finally:
        a.close()
        b.close()
