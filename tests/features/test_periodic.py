"""Periodic jobs on one queue: ticks on a clock the test moves, replacement and removal,
catch-up after downtime, what the messages carry, and bad input refused before
anything is written."""

from __future__ import annotations

import math
import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import ledgerq
import ledgerq.tools
from ledgerq.features.periodic import NAME_HEADER, TICK_HEADER
from tests.clocks import SECOND, SteppedClock

START = SteppedClock().wall_ns  # the stepped clock's first wall time (ns)


def drain(q: ledgerq.Queue) -> list[tuple[str, int]]:
    """Lease and ack everything ready: the (job, tick) of each message, in order."""
    got = []
    while (msg := q.dequeue()) is not None:
        got.append((msg.headers[NAME_HEADER], int(msg.headers[TICK_HEADER])))
        q.ack(msg.id)
    return got


def test_every_fires_once_per_tick(tmp_path: Path) -> None:
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", clock=clock) as q:
        q.add_periodic(
            "tick", b"work", every=10, headers={"k": "v"}, priority=ledgerq.Priority.HIGH
        )
        assert drain(q) == []  # the first tick is one period after the add
        assert q.periodic()[0].last_run is None
        clock.elapse(9.5)
        assert drain(q) == []
        clock.elapse(0.5)
        msg = q.dequeue()
        assert msg is not None
        assert msg.payload == b"work"
        assert msg.priority == ledgerq.Priority.HIGH
        assert msg.headers == {"k": "v", NAME_HEADER: "tick", TICK_HEADER: str(START + 10 * SECOND)}
        assert msg.timestamp == START + 10 * SECOND
        q.ack(msg.id)
        assert drain(q) == []  # the same tick again: nothing
        clock.elapse(10)
        assert drain(q) == [("tick", START + 20 * SECOND)]
        # Three ticks pass unseen: one message, for the latest.
        clock.elapse(35)
        assert drain(q) == [("tick", START + 50 * SECOND)]
        (job,) = q.periodic()
        assert (job.name, job.every, job.cron, job.schedule) == ("tick", 10.0, None, "every 10s")
        assert job.last_run_ns == START + 50 * SECOND
        assert job.next_run_ns == START + 60 * SECOND
        # The same instants as aware UTC datetimes, for printing and comparing.
        assert job.next_run == datetime.fromtimestamp((START + 60 * SECOND) / 1e9, tz=UTC)
        assert job.last_run is not None and job.next_run - job.last_run == timedelta(seconds=10)
        assert job.next_run.tzinfo is UTC
        assert job.payload == b"work" and job.headers == {"k": "v"}


def test_cron_ticks_on_whole_minutes_in_utc(tmp_path: Path) -> None:
    clock = SteppedClock()  # START is 2025-06-15 15:06:40 UTC
    minute = 60 * SECOND
    with ledgerq.open(tmp_path / "q", clock=clock) as q:
        q.add_periodic("five", b"x", cron="*/5 * * * *")
        (job,) = q.periodic()
        first = (START // minute + 4) * minute  # 15:10
        assert job.next_run_ns == first and job.schedule == "cron */5 * * * *"
        clock.elapse((first - START) / SECOND - 0.5)
        assert drain(q) == []
        clock.elapse(0.5)
        assert drain(q) == [("five", first)]
        clock.elapse(3600)  # twelve ticks: one message, the latest
        assert drain(q) == [("five", first + 60 * minute)]


def test_downtime_gives_one_catch_up_message_at_open(tmp_path: Path) -> None:
    clock = SteppedClock()
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock) as q:
        q.add_periodic("j", b"p", every=1)
        clock.elapse(1)
        assert drain(q) == [("j", START + SECOND)]
    clock.elapse(100)  # closed for 100 ticks
    with ledgerq.open(path, clock=clock) as q:
        assert len(q) == 1  # fired by the open itself
        assert drain(q) == [("j", START + 101 * SECOND)]
        assert drain(q) == []
    with ledgerq.open(path, clock=clock) as q:
        assert drain(q) == []  # no tick since: nothing


def test_add_replaces_and_remove_stops(tmp_path: Path) -> None:
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", clock=clock) as q:
        q.add_periodic("j", b"old", every=10)
        clock.elapse(5)
        q.add_periodic("j", b"new", every=3)  # replaced: ticks from now, every 3 s
        clock.elapse(3)
        msg = q.dequeue()
        assert msg is not None and msg.payload == b"new"
        assert int(msg.headers[TICK_HEADER]) == START + 8 * SECOND
        q.ack(msg.id)
        assert [j.name for j in q.periodic()] == ["j"]
        assert q.remove_periodic("j") is True
        assert q.remove_periodic("j") is False
        assert q.remove_periodic("never") is False
        clock.elapse(100)
        assert drain(q) == [] and q.periodic() == []


def test_jobs_survive_reopen_and_a_queue_without_jobs_has_no_file(tmp_path: Path) -> None:
    clock = SteppedClock()
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock) as q:
        q.enqueue(b"plain")
        assert q.periodic() == []
    assert not (path / "features" / "periodic.log").exists()
    with ledgerq.open(path, clock=clock) as q:
        q.add_periodic("a", b"1", every=2)
        q.add_periodic("b", b"2", cron="@hourly")
    assert (path / "features" / "periodic.log").exists()
    with ledgerq.open(path, clock=clock) as q:
        assert [(j.name, j.schedule) for j in q.periodic()] == [
            ("a", "every 2s"),
            ("b", "cron @hourly"),
        ]


def test_many_ticks_rewrite_the_file_and_keep_the_last_tick(tmp_path: Path) -> None:
    clock = SteppedClock()
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock) as q:
        q.add_periodic("j", b"p", every=1)
        for n in range(1, 201):
            clock.elapse(1)
            assert drain(q) == [("j", START + n * SECOND)]
        size = os.path.getsize(path / "features" / "periodic.log")
    assert size < 100 * 40  # rewritten: not 200 records
    with ledgerq.open(path, clock=clock) as q:
        assert drain(q) == []
        assert q.periodic()[0].last_run_ns == START + 200 * SECOND


def test_encrypted_queue_seals_the_job(tmp_path: Path) -> None:
    key = bytes(range(32))
    clock = SteppedClock()
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock, encryption_key=key) as q:
        q.add_periodic("secret-job", b"secret-payload", every=1, headers={"h": "secret-header"})
    data = (path / "features" / "periodic.log").read_bytes()
    assert b"secret-payload" not in data and b"secret-header" not in data
    clock.elapse(1)
    with ledgerq.open(path, clock=clock, encryption_key=key) as q:
        msg = q.dequeue()
        assert msg is not None and msg.payload == b"secret-payload"
        assert msg.headers["h"] == "secret-header"


def test_a_blocked_dequeue_wakes_for_the_tick(tmp_path: Path) -> None:
    # The wait of dequeue(timeout=...) ends at the next tick (real clock here: 0.2 s).
    with ledgerq.open(tmp_path / "q") as q:
        q.add_periodic("soon", b"p", every=0.2)
        got: list[ledgerq.Message | None] = []
        consumer = threading.Thread(target=lambda: got.append(q.dequeue(timeout=60)))
        consumer.start()
        consumer.join(60)
        assert got and got[0] is not None and got[0].payload == b"p"


def test_an_asyncio_dequeue_wakes_for_the_tick(tmp_path: Path) -> None:
    import asyncio

    import ledgerq.aio

    async def consume() -> ledgerq.Message | None:
        async with ledgerq.aio.open(tmp_path / "q") as q:
            q.sync_queue.add_periodic("soon", b"p", every=0.2)
            return await q.dequeue(timeout=60)

    msg = asyncio.run(consume())
    assert msg is not None and msg.payload == b"p"


class _FireLockWithAPause:
    """A handle's fire lock whose first holder pauses, holding it, before it fires -
    until the dequeue under test (``consumer``) has returned or waits for the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.consumer: threading.Thread | None = None
        self.held = threading.Event()
        self.go = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if threading.current_thread() is self.consumer:
            if blocking:
                self.go.set()  # the consumer waits for the fire: let it happen
            return self._lock.acquire(blocking, timeout)
        got = self._lock.acquire(blocking, timeout)
        if got and not self.held.is_set():
            self.held.set()
            assert self.go.wait(30)
        return got

    def release(self) -> None:
        self._lock.release()


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
def test_a_dequeue_while_another_thread_fires_the_tick_returns_it(
    tmp_path: Path, shared: bool
) -> None:
    # A dequeue that finds the tick being fired by another thread of the handle (the
    # housekeeper's, another consumer's) waits for that fire, then takes the message;
    # it returned nothing when it looked before the fire had appended (a CI failure).
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", clock=clock, shared=shared) as q:
        q.add_periodic("j", b"p", every=10)
        fire_lock = _FireLockWithAPause()
        q._timer._fire_lock = fire_lock  # type: ignore[attr-defined]
        clock.elapse(10)
        firer = threading.Thread(target=q.poll_timer)
        firer.start()
        assert fire_lock.held.wait(30)  # a thread holds the fire, paused before the append
        got: list[ledgerq.Message | None] = []

        def consume() -> None:
            try:
                got.append(q.dequeue())
            finally:
                fire_lock.go.set()

        fire_lock.consumer = threading.Thread(target=consume)
        fire_lock.consumer.start()
        fire_lock.consumer.join(30)
        firer.join(30)
        assert got and got[0] is not None
        assert got[0].headers[TICK_HEADER] == str(START + 10 * SECOND)
        assert drain(q) == []  # fired once


def test_a_full_bounded_queue_delays_the_tick(tmp_path: Path) -> None:
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", clock=clock, max_pending=1) as q:
        q.enqueue(b"filler")
        q.add_periodic("j", b"p", every=1)
        clock.elapse(1)
        assert len(q) == 1  # no room: nothing fired (and no error)
        msg = q.dequeue()
        assert msg is not None and msg.payload == b"filler"
        q.ack(msg.id)
        assert drain(q) == [("j", START + SECOND)]  # room again: fired


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({}, TypeError, "neither"),
        ({"every": 1, "cron": "* * * * *"}, TypeError, "both"),
        ({"every": 0}, ValueError, "above 0"),
        ({"every": -5}, ValueError, "above 0"),
        ({"every": math.nan}, ValueError, "above 0"),
        ({"every": math.inf}, ValueError, "at most"),
        ({"every": "10"}, TypeError, "number of seconds"),
        ({"every": True}, TypeError, "number of seconds"),
        ({"every": 0.0000001}, ValueError, "at least"),
        ({"cron": "* * * *"}, ValueError, "5 fields"),
        ({"cron": "61 * * * *"}, ValueError, "minute field"),
        ({"cron": "0 0 31 2 *"}, ValueError, "never matches"),
        ({"cron": "0 0 * * 8"}, ValueError, "day of week"),
        ({"cron": 5}, TypeError, "cron must be a str"),
        ({"every": 1, "headers": {"k": 1}}, TypeError, "header"),
        ({"every": 1, "priority": 7}, ValueError, "priority"),
    ],
)
def test_bad_schedules_are_refused_before_anything_is_written(
    tmp_path: Path, kwargs: dict[str, object], error: type[Exception], says: str
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        with pytest.raises(error, match=says):
            q.add_periodic("j", b"p", **kwargs)  # type: ignore[arg-type]
        assert q.periodic() == []
    assert not (path / "features" / "periodic.log").exists()


@pytest.mark.parametrize(
    ("name", "payload", "error", "says"),
    [
        ("", b"p", ValueError, "1 to 255 bytes"),
        ("x" * 256, b"p", ValueError, "1 to 255 bytes"),
        (None, b"p", TypeError, "name must be a str"),
        (b"j", b"p", TypeError, "name must be a str"),
        ("j", "text", TypeError, "encode"),
        ("j", None, TypeError, "payload"),
        ("j", b"x" * 2048, ledgerq.MessageTooLargeError, "max_message_size"),
    ],
)
def test_bad_names_and_payloads_are_refused(
    tmp_path: Path, name: object, payload: object, error: type[Exception], says: str
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, max_message_size=1024) as q:
        with pytest.raises(error, match=says):
            q.add_periodic(name, payload, every=1)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            q.remove_periodic(5)  # type: ignore[arg-type]
    assert not (path / "features" / "periodic.log").exists()


def test_calls_on_a_closed_queue_raise(tmp_path: Path) -> None:
    q = ledgerq.open(tmp_path / "q")
    q.close()
    with pytest.raises(ledgerq.QueueClosedError):
        q.add_periodic("j", b"p", every=1)
    with pytest.raises(ledgerq.QueueClosedError):
        q.periodic()


def test_tools_read_the_jobs_without_the_lock_beside_a_holder(tmp_path: Path) -> None:
    clock = SteppedClock()
    path = tmp_path / "q"
    assert ledgerq.tools.periodic_jobs(path) == []
    with ledgerq.open(path, clock=clock) as q:  # exclusive: the lock is held
        q.add_periodic("j", b"p", every=10, headers={"h": "v"})
        clock.elapse(10)
        assert drain(q) == [("j", START + 10 * SECOND)]
        (job,) = ledgerq.tools.periodic_jobs(path)
        assert job == q.periodic()[0]
    key = bytes(32)
    with ledgerq.open(tmp_path / "sealed", encryption_key=key) as q:
        q.add_periodic("s", b"secret", cron="@daily", headers={"h": "v"})
    (sealed,) = ledgerq.tools.periodic_jobs(tmp_path / "sealed")
    assert (sealed.name, sealed.schedule, sealed.payload, sealed.headers) == (
        "s",
        "cron @daily",
        b"",
        {},
    )
