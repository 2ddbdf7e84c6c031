"""A lease that timed out, taken back by another handle than its holder.

Whichever handle looks first settles it, and both settle it alike: the failure is told
to the features then (a move to the DLQ at the limit) and the retry delay starts then.
Before, the other handle only gave the message back; the failure was found when a take
reached it - after the smaller ids it delivered first - and the delay started there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ledgerq
from tests.clocks import SteppedClock


def _b_holds_2_while_1_waits(
    tmp_path: Path, **options: Any
) -> tuple[SteppedClock, ledgerq.Queue, ledgerq.Queue]:
    """Messages 1 and 2; b holds 2 past its visibility timeout, 1 is available."""
    clock = SteppedClock()
    options = {"shared": True, "visibility_timeout": 5.0, **options}
    a = ledgerq.open(tmp_path / "q", clock=clock, **options)
    b = ledgerq.open(tmp_path / "q", clock=clock, **options)
    a.enqueue_batch([b"one", b"two"])
    first, second = b.dequeue(), b.dequeue()
    assert first is not None and second is not None and (first.id, second.id) == (1, 2)
    b.release(first.id)
    clock.elapse(6)
    return clock, a, b


def test_the_retry_delay_starts_when_the_other_handle_takes_the_lease_back(
    tmp_path: Path,
) -> None:
    clock, a, b = _b_holds_2_while_1_waits(tmp_path, retry_delay=2.0)
    try:
        got = a.dequeue()  # takes 2 back from b, and delivers 1
        assert got is not None and got.id == 1
        assert a.stats().delayed == b.stats().delayed == 1  # 2 waits its retry delay
        clock.elapse(1)
        assert a.dequeue() is None
        clock.elapse(1.5)
        again = a.dequeue()
        assert again is not None and (again.id, again.attempts) == (2, 2)
    finally:
        a.close()
        b.close()


def test_the_other_handle_moves_a_timed_out_message_at_the_limit_at_once(
    tmp_path: Path,
) -> None:
    _clock, a, b = _b_holds_2_while_1_waits(tmp_path, max_retries=1)
    try:
        got = a.dequeue()
        assert got is not None and got.id == 1
        [dead] = a.dlq.peek(5)
        assert dead.headers["dlq.original_id"] == "2"
        assert "visibility timeout" in dead.headers["dlq.failure_reason"]
        assert a.stats().dead_lettered == b.stats().dead_lettered == 1
    finally:
        a.close()
        b.close()


def test_a_lease_touched_to_its_own_deadline_is_settled_once(tmp_path: Path) -> None:
    # The touch pushed the same deadline again: the lease expired twice in one look,
    # and was parked twice (counted as two delayed messages). Found by the model.
    clock = SteppedClock()
    options = {"shared": True, "visibility_timeout": 30.0, "retry_delay": 2.0}
    a = ledgerq.open(tmp_path / "q", clock=clock, priorities=True, **options)
    b = ledgerq.open(tmp_path / "q", clock=clock, priorities=True, **options)
    try:
        b.enqueue(b"work")
        assert a.stats().pending == 1  # a has read it
        leased = b.dequeue()
        assert leased is not None
        b.touch(leased.id)
        clock.elapse(31)
        assert a.dequeue() is None  # a takes it back; it waits its retry delay
        for handle in (a, b):
            assert (handle.stats().pending, handle.stats().delayed) == (1, 1)
    finally:
        a.close()
        b.close()
