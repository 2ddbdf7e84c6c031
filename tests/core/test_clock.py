"""The queue's clock (issue 15 item 8): a stepped system clock moves nothing it should not.

A queue reads one clock: at open, the later of the wall clock and the newest timestamp
in its log; while open, that plus the monotonic time elapsed (``ledgerq/core/clock.py``).
These tests inject a clock (``ledgerq.open(path, clock=...)``) whose wall clock they
step back and forth and whose monotonic clock they advance - no sleeping - and check
every decision that depends on time: TTLs, dedup windows, starvation, retention by age,
visibility timeouts, timestamps, while open and across a reopen.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgerq
import ledgerq.aio
from ledgerq import Priority

SECOND = 1_000_000_000
DAY = 86_400 * SECOND
HOUR = 3_600 * SECOND
START = 1_750_000_000 * SECOND  # June 2025


class SteppedClock:
    """A wall clock the test steps, and a monotonic clock only the test advances."""

    def __init__(self, wall_ns: int = START) -> None:
        self.wall_ns = wall_ns
        self.mono_ns = 10 * DAY  # an arbitrary origin, as the real one has

    def time_ns(self) -> int:
        return self.wall_ns

    def monotonic_ns(self) -> int:
        return self.mono_ns

    def step_wall(self, delta_ns: int) -> None:
        """The system clock is set (NTP, by hand): only the wall clock moves."""
        self.wall_ns += delta_ns

    def elapse(self, delta_ns: int) -> None:
        """Real time passes: both clocks move."""
        self.wall_ns += delta_ns
        self.mono_ns += delta_ns


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def qpath(tmp_path: Path) -> Path:
    return tmp_path / "q"


@pytest.fixture
def queue(qpath: Path, clock: SteppedClock) -> Iterator[ledgerq.Queue]:
    with ledgerq.open(qpath, sync="never", clock=clock) as q:
        yield q


# ---------------------------------------------------------------- TTL


def test_a_clock_stepped_back_while_open_does_not_extend_a_ttl(
    queue: ledgerq.Queue, clock: SteppedClock
) -> None:
    queue.enqueue(b"3 s", ttl=3)
    clock.step_wall(-DAY)
    clock.elapse(4 * SECOND)
    assert queue.dequeue() is None, "expired 3 s after it was written, not a day later"
    assert queue.stats().expired == 1


def test_a_clock_stepped_forward_while_open_does_not_expire_a_ttl(
    queue: ledgerq.Queue, clock: SteppedClock
) -> None:
    queue.enqueue(b"an hour", ttl=3600)
    clock.step_wall(2 * HOUR)
    clock.elapse(SECOND)
    message = queue.dequeue()
    assert message is not None and message.payload == b"an hour"
    assert queue.stats().expired == 0


def _written_then_stepped(
    qpath: Path, clock: SteppedClock, payload: bytes, ttl: float, step_ns: int
) -> None:
    """A message of ``ttl`` seconds written, the queue closed, and then its wall clock
    stepped by ``step_ns`` before the next open."""
    with ledgerq.open(qpath, sync="never", clock=clock) as q:
        q.enqueue(payload, ttl=ttl)
    clock.step_wall(step_ns)


def test_a_clock_stepped_back_across_a_reopen_does_not_extend_a_ttl(
    qpath: Path, clock: SteppedClock
) -> None:
    _written_then_stepped(qpath, clock, b"3 s", 3, -DAY)
    with ledgerq.open(qpath, clock=clock) as q:
        clock.elapse(2 * SECOND)
        assert [m.payload for m in q.peek(5)] == [b"3 s"], "2 s old: still alive"
        clock.elapse(2 * SECOND)
        assert q.dequeue() is None, "4 s old by the queue's time: expired"
        assert q.stats().expired == 1


def test_a_clock_stepped_forward_across_a_reopen_counts_like_downtime(
    qpath: Path, clock: SteppedClock
) -> None:
    _written_then_stepped(qpath, clock, b"an hour", 3600, 2 * HOUR)
    with ledgerq.open(qpath, clock=clock) as q:
        assert q.dequeue() is None
        assert q.stats().expired == 1


# ---------------------------------------------------------------- timestamps


def test_timestamps_never_decrease_whatever_the_wall_clock_does(
    qpath: Path, clock: SteppedClock
) -> None:
    with ledgerq.open(qpath, sync="never", clock=clock) as q:
        q.enqueue(b"1")
        clock.step_wall(-DAY)
        clock.elapse(SECOND)
        q.enqueue(b"2")
    clock.step_wall(-DAY)
    with ledgerq.open(qpath, sync="never", clock=clock) as q:
        q.enqueue(b"3")
        stamps = [m.timestamp for m in q.dequeue_batch(3)]
    assert stamps == [START, START + SECOND, START + SECOND], stamps
    with ledgerq.open(qpath, sync="never", clock=clock) as q:
        reader = q.reader("replay")
        reader.seek_time(START + SECOND)
        assert [m.payload for m in reader.dequeue_batch(3)] == [b"2", b"3"]


def test_the_queue_time_starts_at_the_wall_clock_when_it_is_ahead(
    queue: ledgerq.Queue, clock: SteppedClock
) -> None:
    queue.enqueue(b"x")
    message = queue.dequeue()
    assert message is not None and message.timestamp == START


# ---------------------------------------------------------------- dedup, starvation, age


def test_a_dedup_window_is_measured_on_the_queue_time(qpath: Path, clock: SteppedClock) -> None:
    with ledgerq.open(qpath, sync="never", dedup_window=10, clock=clock) as q:
        first = q.enqueue(b"a", dedup_id="order-1")
        clock.step_wall(DAY)
        clock.elapse(SECOND)
        assert q.enqueue(b"a", dedup_id="order-1") == first, "1 s later: a duplicate"
        clock.step_wall(-2 * DAY)
        clock.elapse(10 * SECOND)
        assert q.enqueue(b"a", dedup_id="order-1") != first, "11 s later: the window is over"


def test_starvation_promotion_is_measured_on_the_queue_time(
    queue: ledgerq.Queue, qpath: Path, clock: SteppedClock
) -> None:
    queue.close()
    with ledgerq.open(qpath, priorities=True, starvation_after=5, clock=clock) as q:
        q.enqueue(b"low", priority=Priority.LOW)
        q.enqueue(b"high", priority=Priority.HIGH)
        clock.step_wall(DAY)
        clock.elapse(SECOND)
        assert [m.payload for m in q.peek(2)] == [b"high", b"low"], "not starved after 1 s"
        clock.elapse(10 * SECOND)
        assert [m.payload for m in q.peek(2)] == [b"low", b"high"], "promoted twice by 11 s"


def test_retention_by_age_is_measured_on_the_queue_time(qpath: Path, clock: SteppedClock) -> None:
    with ledgerq.open(
        qpath, sync="never", segment_size=100, retention_max_age=60, clock=clock
    ) as q:
        q.enqueue_batch([b"x" * 80] * 3)
        for message in q.dequeue_batch(3):
            q.ack(message.id)
        segments = q.stats().segments
        assert segments > 1
        clock.step_wall(DAY)
        q.compact()
        assert q.stats().segments == segments, "a day by the wall clock, 0 s by the queue's"
        clock.elapse(61 * SECOND)
        q.compact()
        assert q.stats().segments == 1


def test_oldest_pending_age_is_measured_on_the_queue_time(
    queue: ledgerq.Queue, clock: SteppedClock
) -> None:
    queue.enqueue(b"x")
    clock.step_wall(-DAY)
    clock.elapse(5 * SECOND)
    assert queue.stats().oldest_pending_age == pytest.approx(5.0)


# ---------------------------------------------------------------- leases


def test_a_visibility_timeout_passes_with_the_injected_monotonic_clock(
    qpath: Path, clock: SteppedClock
) -> None:
    with ledgerq.open(qpath, sync="never", visibility_timeout=30, clock=clock) as q:
        q.enqueue(b"job")
        first = q.dequeue()
        assert first is not None
        clock.step_wall(HOUR)
        assert q.dequeue() is None, "a wall-clock step is no time passing"
        assert q.reader("default").seconds_to_next_expiry() == pytest.approx(30.0)
        clock.elapse(31 * SECOND)
        assert q.reader("default").seconds_to_next_expiry() == 0.0
        again = q.dequeue()
        assert again is not None and (again.id, again.attempts) == (first.id, 2)


def test_the_dlq_reads_the_same_clock(qpath: Path, clock: SteppedClock) -> None:
    with ledgerq.open(qpath, sync="never", max_retries=1, clock=clock) as q:
        q.enqueue(b"poison")
        clock.step_wall(-DAY)
        clock.elapse(7 * SECOND)
        message = q.dequeue()
        assert message is not None
        q.nack(message.id, "boom")
        [dead] = q.dlq.peek(1)
        assert dead.headers["dlq.last_failure"] == str(START + 7 * SECOND)
        assert dead.timestamp == START - DAY + 7 * SECOND, "the DLQ's own time: its log was empty"


# ---------------------------------------------------------------- the faces


def test_asyncio_and_sharded_queues_take_a_clock(tmp_path: Path, clock: SteppedClock) -> None:
    async def scenario() -> int:
        async with ledgerq.aio.open(tmp_path / "a", sync="never", clock=clock) as aq:
            await aq.enqueue(b"x", ttl=3)
            clock.step_wall(-DAY)
            clock.elapse(4 * SECOND)
            assert await aq.dequeue() is None
            return (await aq.stats()).expired

    assert asyncio.run(scenario()) == 1
    with ledgerq.open_sharded(tmp_path / "s", 2, sync="never", clock=clock) as sharded:
        sharded.enqueue(b"x", ttl=3)
        clock.step_wall(-DAY)
        clock.elapse(4 * SECOND)
        assert sharded.dequeue() is None
        assert sharded.stats().expired == 1


def test_the_clock_is_not_a_stored_option(qpath: Path, clock: SteppedClock) -> None:
    with ledgerq.open(qpath, clock=clock) as q:
        q.enqueue(b"x")
    meta = json.loads((qpath / "meta.json").read_text())
    assert "clock" not in meta["options"]
    with ledgerq.open(qpath) as q:  # the system clock again
        q.enqueue(b"y")
        assert [m.timestamp >= START for m in q.dequeue_batch(2)] == [True, True]


@pytest.mark.parametrize(
    "bad", [object(), "time", type("OnlyWall", (), {"time_ns": lambda self: 1})()]
)
def test_a_clock_without_both_methods_is_refused(qpath: Path, bad: object) -> None:
    with pytest.raises(TypeError, match=r"clock must have time_ns\(\) and monotonic_ns\(\)"):
        ledgerq.open(qpath, clock=bad)  # type: ignore[arg-type]


def test_a_clock_returning_floats_is_refused(qpath: Path) -> None:
    class FloatClock:
        def time_ns(self) -> float:
            return 1.5

        def monotonic_ns(self) -> float:
            return 2.5

    with pytest.raises(TypeError, match=r"clock.time_ns\(\) must return an int"):
        ledgerq.open(qpath, clock=FloatClock())  # type: ignore[arg-type]


def test_the_system_clock_is_a_clock() -> None:
    import time

    assert isinstance(time, ledgerq.Clock), "the time module itself fits the protocol"
