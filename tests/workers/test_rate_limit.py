"""``workers.run(rate_limit=)``: one limit for every pool on the queue, on a test clock.

Two pools in two processes share one clock file that moves only when the test moves
it, so a start's time is the clock's at its grant, and the promise - no window of one
period holds more than N starts - is checked on the times the handlers saw, with no
timing of the test itself.  The pools wake when the test enqueues (shared mode).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

import ledgerq
from ledgerq.segment.readonly import read_rate_state
from ledgerq.workers import parse_rate_limit, run
from tests.shared._procs import wait_until
from tests.workers import _handlers

HOUR_NS = 3_600_000_000_000
T0 = 50 * HOUR_NS


def _pool(path: str, clock_path: str, exclusive: bool = False) -> None:
    run(
        path,
        _handlers.clocked,
        processes=2,
        rate_limit="2/h",
        shared=not exclusive,
        clock=_handlers.FileClock(clock_path),  # type: ignore[call-arg]
    )


def _starts(log: Path) -> list[int]:
    if not log.exists():
        return []
    return sorted(int(line.split()[1]) for line in log.read_text().splitlines())


@pytest.fixture
def clock(tmp_path: Path, done_log: Path, monkeypatch: pytest.MonkeyPatch) -> _handlers.FileClock:
    file_clock = _handlers.FileClock(str(tmp_path / "clock"))
    file_clock.set(T0)
    monkeypatch.setenv(_handlers.CLOCK_FILE, file_clock.path)
    return file_clock


def test_two_pools_share_one_limit(
    tmp_path: Path, done_log: Path, clock: _handlers.FileClock
) -> None:
    path = str(tmp_path / "q")
    ctx = multiprocessing.get_context("fork")
    with ledgerq.open(path, shared=True, clock=clock) as q:
        q.enqueue_batch([b"a", b"b", b"c"])
        pools = [ctx.Process(target=_pool, args=(path, clock.path)) for _ in range(2)]
        for pool in pools:
            pool.start()
        try:
            # A burst of two at T0, from either pool; the third waits for an hour.
            wait_until(lambda: len(_starts(done_log)) == 2, 60, "the first two starts")
            for step in range(1, 4):
                clock.set(T0 + step * HOUR_NS)
                q.enqueue(b"more")  # wakes the pools: they look at the limiter again
                expected = min(2 + 2 * step, 3 + step)  # the limit, or every message
                wait_until(lambda n=expected: len(_starts(done_log)) == n, 60, f"{expected} starts")
        finally:
            for pool in pools:
                os.kill(pool.pid, signal.SIGTERM)
            for pool in pools:
                pool.join(60)
        assert all(pool.exitcode == 0 for pool in pools)
        assert len(q) == 0
    starts = _starts(done_log)
    assert len(starts) == 6
    assert all(starts[i + 2] - starts[i] >= HOUR_NS for i in range(len(starts) - 2))
    state = read_rate_state(path, clock.monotonic_ns())
    assert state is not None and (state.count, state.period_ns) == (2, HOUR_NS)
    assert state.starts >= len(starts)  # every start was granted (some grants unused)


def test_a_pool_killed_minus_nine_leaves_nothing_held(
    tmp_path: Path, done_log: Path, clock: _handlers.FileClock
) -> None:
    path = str(tmp_path / "q")
    ctx = multiprocessing.get_context("fork")
    with ledgerq.open(path, clock=clock) as q:
        q.enqueue_batch([b"a", b"b", b"c"])
    first = ctx.Process(target=_pool, args=(path, clock.path, True))
    first.start()
    wait_until(lambda: len(_starts(done_log)) == 2, 60, "the first two starts")
    os.kill(first.pid, signal.SIGKILL)
    first.join(60)
    # The starts it made count after its death, and only for their hour.
    with ledgerq.open(path, clock=clock) as q:
        pending = len(q)  # 1, or more if it died between a task's end and its ack
    again = ctx.Process(target=_pool, args=(path, clock.path, True))
    clock.set(T0 + HOUR_NS)
    again.start()
    later = min(pending, 2)
    try:
        wait_until(lambda: len(_starts(done_log)) == 2 + later, 60, "the starts an hour later")
    finally:
        os.kill(again.pid, signal.SIGTERM)
        again.join(60)
    assert _starts(done_log) == [T0, T0] + [T0 + HOUR_NS] * later


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("20", ValueError),
        ("20/d", ValueError),
        ("0/s", ValueError),
        ("-1/s", ValueError),
        ("1.5/s", ValueError),
        ("s/20", ValueError),
        ("1000001/s", ValueError),
        ("٣/s", ValueError),  # an Arabic-Indic digit: isdigit(), not a number here
        (20, TypeError),
        (b"20/s", TypeError),
    ],
)
def test_a_malformed_rate_limit_fails_before_anything_is_written(
    tmp_path: Path, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="rate_limit"):
        run(tmp_path / "q", _handlers.clocked, rate_limit=value)  # type: ignore[arg-type]
    assert not (tmp_path / "q").exists()


def test_the_three_units() -> None:
    assert parse_rate_limit("20/s") == (20, 1_000_000_000)
    assert parse_rate_limit("3/m") == (3, 60_000_000_000)
    assert parse_rate_limit(" 1/h ") == (1, HOUR_NS)
