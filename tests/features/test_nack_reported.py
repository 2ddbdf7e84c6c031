"""A nack's failure is reported once, by its nacker, even when the message is next taken
by another handle or after a reopen.

Every nack writes a NOT_BEFORE record with its NACK (its retry delay, or none), and a
checkpoint keeps it; a reader that reads it back knows the failure was a nack, not a
lease lost to a crash.  So the next taker neither applies the retry policy a second
time (``nack(delay=0)`` means "again at once") nor records a lost lease in the retry
log - but it does finish a move to the DLQ whose nacker was killed before making it.
(The next taker once counted a nack it had not seen made as a lost lease.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerq
from ledgerq.core.reader import _NACK_UNFINISHED
from tests._child import Children
from tests.clocks import SteppedClock
from tests.shared.conftest import locking  # noqa: F401  (the fixture)

POLICY = {"retry_delay": 60.0, "retry_backoff": 1.0, "max_retries": 5}


def take(q: ledgerq.Queue) -> ledgerq.Message:
    msg = q.dequeue()
    assert msg is not None, "nothing to take"
    return msg


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
def test_a_nack_without_delay_stays_without_one_after_a_reopen(
    tmp_path: Path, shared: bool
) -> None:
    clock = SteppedClock()
    path = tmp_path / "q"
    with ledgerq.open(path, shared=shared, clock=clock, **POLICY) as q:
        q.enqueue(b"job")
        q.nack(take(q).id, "busy", delay=0)
    with ledgerq.open(path, shared=shared, clock=clock, **POLICY) as q:
        assert q.stats().delayed == 0
        again = take(q)  # at once: not a lost lease waiting the policy's 60 s
        assert again.attempts == 2
        q.nack(again.id, "busy")  # the policy's delay
    with ledgerq.open(path, shared=shared, clock=clock, **POLICY) as q:
        assert q.dequeue() is None
        clock.elapse(60)
        assert take(q).attempts == 3


@pytest.mark.usefixtures("locking")
def test_another_handle_takes_a_nack_without_delay_at_once(tmp_path: Path) -> None:
    clock = SteppedClock()
    path = tmp_path / "q"
    with (
        ledgerq.open(path, shared=True, clock=clock, **POLICY) as first,
        ledgerq.open(path, shared=True, clock=clock, **POLICY) as second,
    ):
        first.enqueue(b"job")
        first.nack(take(first).id, "busy", delay=0)
        again = take(second)
        assert again.attempts == 2
        second.nack(again.id, "busy")
        assert first.dequeue() is None and second.dequeue() is None
        clock.elapse(60)
        assert take(first).attempts == 3


def test_a_checkpoint_keeps_that_a_nack_was_reported(tmp_path: Path) -> None:
    # compact() rewrites the journal as a checkpoint: the NACK record is
    # gone, its NOT_BEFORE kept - also for nacks without a delay.
    clock = SteppedClock()
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock, **POLICY) as q:
        q.enqueue_batch([b"a", b"b", b"c"])
        first = take(q)
        q.nack(first.id, delay=0)
        q.compact()
    with ledgerq.open(path, clock=clock, **POLICY) as q:
        assert [take(q).payload for _ in range(3)] == [b"a", b"b", b"c"]


KILLED_BEFORE_THE_MOVE = """
import os, signal, sys
import ledgerq
from ledgerq.features.dlq.feature import DeadLetterFeature
path, shared = sys.argv[1], sys.argv[2] == "shared"
q = ledgerq.open(path, shared=shared, max_retries=1)
msg = q.dequeue()
def killed(self, delivery):  # the NACK record is written: die before the move
    os.kill(os.getpid(), signal.SIGKILL)
DeadLetterFeature.failed = killed
os.write(1, b"nacking\\n")
q.nack(msg.id, "poison")
os.write(1, b"returned\\n")
"""


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
def test_the_next_taker_finishes_a_move_its_nacker_was_killed_before(
    tmp_path: Path, children: Children, shared: bool
) -> None:
    path = tmp_path / "q"
    mode = "shared" if shared else "exclusive"
    with ledgerq.open(path, shared=shared) as q:
        q.enqueue(b"poison pill")
    # Shared: a handle open beside the child all along; exclusive: the next open.
    beside = ledgerq.open(path, shared=True, max_retries=1) if shared else None
    child = children.start(["-c", KILLED_BEFORE_THE_MOVE, str(path), mode])
    assert child.line() == "nacking"
    assert child.wait() == -9
    assert child.read_line() is None  # killed inside the nack
    with beside or ledgerq.open(path, max_retries=1) as q:
        # One failed delivery at max_retries=1: moved, not delivered a second time.
        assert q.dequeue() is None
        dead = q.dlq.peek(10)
        assert [m.payload for m in dead] == [b"poison pill"]
        assert dead[0].headers["dlq.retry_count"] == "1"
        assert dead[0].headers["dlq.failure_reason"] == _NACK_UNFINISHED
        assert q.stats().dead_lettered == 1
