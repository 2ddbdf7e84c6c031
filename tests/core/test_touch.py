"""``touch`` (extend a lease) and ``release(..., delay=)``.

A touched lease expires ``seconds`` (default the visibility timeout) from the touch,
not from the dequeue, and attempts do not change; in shared mode the other handles
learn the new deadline from the journal (TOUCH) and do not reclaim the lease before
it.  A delayed release is not a failed delivery, and its wait survives a reopen.
Time is a clock the test moves.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

import ledgerq
import ledgerq.aio
from tests.clocks import SteppedClock


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


def take(q: ledgerq.Queue) -> ledgerq.Message:
    msg = q.dequeue()
    assert msg is not None
    return msg


@pytest.mark.parametrize("shared", [False, True])
def test_a_touched_lease_lasts_from_the_touch(
    tmp_path: Path, clock: SteppedClock, shared: bool
) -> None:
    with ledgerq.open(tmp_path / "q", clock=clock, visibility_timeout=10, shared=shared) as q:
        q.enqueue(b"long task")
        msg = take(q)
        clock.elapse(8)
        q.touch(msg.id)  # now until 18 s
        clock.elapse(9)
        assert q.dequeue() is None and q.stats().in_flight == 1
        q.touch(msg.id, 60)  # now until 77 s
        clock.elapse(59)
        assert q.dequeue() is None
        q.ack(msg.id)
        assert q.stats().acked == 1 and q.stats().nacked == 0


def test_an_untouched_lease_still_expires(tmp_path: Path, clock: SteppedClock) -> None:
    with ledgerq.open(tmp_path / "q", clock=clock, visibility_timeout=10) as q:
        first, second = q.enqueue(b"a"), q.enqueue(b"b")
        a, b = take(q), take(q)
        q.touch(a.id, 30)
        clock.elapse(10)
        again = take(q)  # b's lease expired; a's did not
        assert (again.id, again.attempts) == (second, 2)
        clock.elapse(20)
        again = take(q)
        assert (again.id, again.attempts) == (first, 2)
        assert b.id == second


@pytest.mark.parametrize("shared", [False, True])
def test_a_lease_touched_to_the_deadline_it_had_expires_once(
    tmp_path: Path, clock: SteppedClock, shared: bool
) -> None:
    # Found by the shared scheduling model: the touch pushed the same deadline again,
    # and the shared reader expired the lease twice (KeyError in dequeue).
    with ledgerq.open(tmp_path / "q", clock=clock, visibility_timeout=10, shared=shared) as q:
        message_id = q.enqueue(b"a")
        take(q)
        q.touch(message_id)  # no time has passed: the deadline it already had
        clock.elapse(11)
        again = take(q)
        assert (again.id, again.attempts) == (message_id, 2)
        assert q.stats().in_flight == 1


def test_a_touch_after_a_redelivery_does_not_stretch_the_new_lease(
    tmp_path: Path, clock: SteppedClock
) -> None:
    with ledgerq.open(tmp_path / "q", clock=clock, visibility_timeout=10) as q:
        q.enqueue(b"a")
        msg = take(q)
        q.touch(msg.id, 100)
        q.nack(msg.id)
        again = take(q)  # a new lease: the visibility timeout again, not the touch
        clock.elapse(10)
        third = take(q)
        assert (again.attempts, third.attempts) == (2, 3)


def test_touch_of_an_id_not_leased_here_raises(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with (
        ledgerq.open(path, shared=True, visibility_timeout=10) as first,
        ledgerq.open(path, shared=True) as second,
    ):
        first.enqueue(b"a")
        msg = take(first)
        with pytest.raises(ledgerq.UnknownMessageError):
            second.touch(msg.id)
        with pytest.raises(ledgerq.UnknownMessageError):
            first.touch(msg.id + 1)
        first.ack(msg.id)
        with pytest.raises(ledgerq.UnknownMessageError):
            first.touch(msg.id)


def test_other_handles_honour_a_touched_deadline(tmp_path: Path, clock: SteppedClock) -> None:
    path = tmp_path / "q"
    with (
        ledgerq.open(path, shared=True, clock=clock, visibility_timeout=10) as worker,
        ledgerq.open(path, shared=True, clock=clock) as other,
    ):
        worker.enqueue(b"a")
        msg = take(worker)
        clock.elapse(9)
        worker.touch(msg.id, 20)  # until 29 s
        clock.elapse(11)
        assert other.dequeue() is None  # 20 s: past the first deadline, not the touched one
        clock.elapse(10)
        again = other.dequeue()  # 30 s: the touched lease expired
        assert again is not None and again.attempts == 2
        with pytest.raises(ledgerq.UnknownMessageError):
            worker.ack(msg.id)


def test_a_delayed_release_waits_and_is_no_failure(tmp_path: Path, clock: SteppedClock) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock, max_retries=1) as q:
        q.enqueue(b"a")
        q.release(take(q).id, delay=5)
        assert q.dequeue() is None and q.stats().delayed == 1
    clock.elapse(3)
    with ledgerq.open(path, clock=clock) as q:
        assert q.dequeue() is None  # a reopen does not shorten it
        clock.elapse(2)
        msg = take(q)
        assert msg.attempts == 1  # not a failed delivery: max_retries=1 never hit
        assert q.stats().nacked == 0 and q.stats().dead_lettered == 0


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (math.nan, ValueError), ("1", TypeError)]
)
def test_bad_seconds_and_delays_change_nothing(tmp_path: Path, value: object, error: type) -> None:
    with ledgerq.open(tmp_path / "q", visibility_timeout=10) as q:
        q.enqueue(b"a")
        msg = take(q)
        with pytest.raises(error, match="seconds"):
            q.touch(msg.id, value)  # type: ignore[arg-type]
        with pytest.raises(error, match="delay"):
            q.release(msg.id, delay=value)  # type: ignore[arg-type]
        assert q.stats().in_flight == 1
        q.ack(msg.id)


def test_aio_has_touch_release_and_nack_with_delays(tmp_path: Path, clock: SteppedClock) -> None:
    async def main() -> list[int]:
        async with ledgerq.aio.open(tmp_path / "q", clock=clock, visibility_timeout=10) as q:
            await q.enqueue(b"a")
            msg = await q.dequeue()
            assert msg is not None
            clock.elapse(9)
            await q.touch(msg.id, 20)
            clock.elapse(15)
            assert await q.dequeue() is None  # touched: still leased
            await q.release(msg.id, delay=5)
            assert await q.dequeue() is None
            clock.elapse(5)
            again = await q.dequeue()
            assert again is not None
            await q.nack(again.id, delay=7)
            clock.elapse(6.9)
            assert await q.dequeue() is None
            clock.elapse(0.1)
            third = await q.dequeue()
            assert third is not None
            return [msg.attempts, again.attempts, third.attempts]

    assert asyncio.run(main()) == [1, 1, 2]
