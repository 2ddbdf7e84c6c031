"""The rate limit's file (``shared/ratelimit``) as a unit, with a clock the test moves.

Several limiters on one file stand for several pools: whatever their interleaving,
no window of one period holds more than N grants, and a start is refused only when
N grants are already in the last period (the model: a list of grant times).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq.segment.ratelimit import Grant, RateLimiter, read_rate_state

SECOND = 1_000_000_000


class FakeClock:
    """Monotonic ns that move only when the test says so (shared by the limiters)."""

    def __init__(self) -> None:
        self.now = 5 * SECOND

    def __call__(self) -> int:
        return self.now


steps = st.lists(
    st.tuples(
        st.integers(0, 2),  # which limiter
        st.sampled_from(["start", "start", "start", "cancel", "wait"]),
        st.integers(0, 600_000_000),  # ns to let pass first
    ),
    max_size=80,
)


@settings(max_examples=60, deadline=None)
@given(count=st.integers(1, 5), period_ms=st.integers(1, 1000), steps=steps)
def test_no_window_of_one_period_holds_more_than_n_starts(
    tmp_path_factory: pytest.TempPathFactory,
    count: int,
    period_ms: int,
    steps: list[tuple[int, str, int]],
) -> None:
    queue_dir = str(tmp_path_factory.mktemp("q"))
    period = period_ms * 1_000_000
    clock = FakeClock()
    limiters = [RateLimiter(queue_dir, count, period, clock) for _ in range(3)]
    granted: list[Grant] = []  # the model: the starts that count, in order
    last: list[Grant | None] = [None, None, None]  # each limiter's newest grant

    def start(which: int) -> bool:
        answer = limiters[which].acquire()
        recent = [g.at_ns for g in granted if clock.now - g.at_ns < period]
        if len(recent) < count:
            assert isinstance(answer, Grant), (recent, clock.now)
            granted.append(answer)
            last[which] = answer
            return True
        # Refused, with the exact wait: until the oldest of the last N leaves.
        assert answer == recent[-count] + period - clock.now
        return False

    for which, action, elapse in steps:
        clock.now += elapse
        if action == "cancel":
            grant = last[which]
            if grant is not None:
                is_newest = bool(granted) and granted[-1] is grant
                assert limiters[which].cancel(grant) == is_newest
                if is_newest:
                    granted.pop()
                last[which] = None
        elif not start(which) and action == "wait":
            answer = limiters[which].acquire()
            assert isinstance(answer, int)
            clock.now += answer
            assert start(which)
    times = [g.at_ns for g in granted]
    for i in range(len(times) - count):
        assert times[i + count] - times[i] >= period
    assert limiters[0].state().starts == len(granted)
    for limiter in limiters:
        limiter.close()


def test_a_burst_of_n_then_one_as_each_ages_out(tmp_path: Path) -> None:
    clock = FakeClock()
    limiter = RateLimiter(str(tmp_path), 3, SECOND, clock)
    assert all(isinstance(limiter.acquire(), Grant) for _ in range(3))
    assert limiter.acquire() == SECOND
    clock.now += SECOND
    assert isinstance(limiter.acquire(), Grant)
    state = read_rate_state(str(tmp_path), clock.now)
    assert state is not None and (state.count, state.period_ns, state.starts) == (3, SECOND, 4)
    assert state.rate == pytest.approx(4.0)  # the last period: 3 + 1, the window's edge
    clock.now += 10 * SECOND
    assert read_rate_state(str(tmp_path), clock.now).rate == 0.0  # type: ignore[union-attr]


def test_state_survives_reopen_and_a_new_limit_keeps_the_newest_starts(tmp_path: Path) -> None:
    clock = FakeClock()
    first = RateLimiter(str(tmp_path), 3, SECOND, clock)
    for _ in range(3):
        assert isinstance(first.acquire(), Grant)
        clock.now += 1_000
    first.close()
    again = RateLimiter(str(tmp_path), 3, SECOND, clock)  # a pool started again
    assert isinstance(again.acquire(), int)
    smaller = RateLimiter(str(tmp_path), 2, SECOND, clock)  # the newest two kept
    assert isinstance(smaller.acquire(), int)
    clock.now += SECOND - 2_000
    assert isinstance(smaller.acquire(), Grant)  # the older of the two aged out
    assert isinstance(smaller.acquire(), int)
    # The first limiter now follows the file's new limit until it lays out its own.
    assert isinstance(again.acquire(), int)
    again.close()
    smaller.close()


def test_a_damaged_or_other_boot_file_starts_empty(tmp_path: Path) -> None:
    clock = FakeClock()
    limiter = RateLimiter(str(tmp_path), 1, 3600 * SECOND, clock)
    assert isinstance(limiter.acquire(), Grant)
    limiter.close()
    path = tmp_path / "shared" / "ratelimit"
    raw = bytearray(path.read_bytes())
    raw[24:32] = b"\xff" * 8  # another boot's file
    path.write_bytes(bytes(raw))
    limiter = RateLimiter(str(tmp_path), 1, 3600 * SECOND, clock)
    assert isinstance(limiter.acquire(), Grant)
    limiter.close()
    path.write_bytes(b"garbage")
    assert read_rate_state(str(tmp_path), clock.now) is None
    limiter = RateLimiter(str(tmp_path), 1, 3600 * SECOND, clock)
    assert isinstance(limiter.acquire(), Grant)
    limiter.close()


def test_a_time_from_the_future_does_not_hold_starts_back(tmp_path: Path) -> None:
    """A ring written under a clock that was ahead (another boot's monotonic clock,
    without a boot id to tell) never blocks: that slot counts as free."""
    clock = FakeClock()
    limiter = RateLimiter(str(tmp_path), 1, 3600 * SECOND, clock)
    assert isinstance(limiter.acquire(), Grant)
    clock.now -= SECOND
    assert isinstance(limiter.acquire(), Grant)
    limiter.close()


def test_a_limiter_in_a_forked_child_is_closed(tmp_path: Path) -> None:
    limiter = RateLimiter(str(tmp_path), 1, SECOND, FakeClock())
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if limiter._fd is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    limiter.close()
