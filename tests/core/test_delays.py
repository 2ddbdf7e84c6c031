"""Delayed messages: ``enqueue(..., delay=)`` and ``Item(delay=)``.

A delayed message is pending (``len``, ``stats().pending``) and counted in
``stats().delayed`` until its time; ``dequeue`` and ``peek`` never return it early,
on any reader, across a reopen; a blocked ``dequeue`` wakes when it falls due.  The
not-before time is in the entry (flag HAS_DELIVER_AT, format 2 entries only), and
meta.json says version 2 (format 2, from the first open) so that an older ledgerq
refuses the queue rather than skip the entry as damage.  Time is a clock the test
moves, except where the wake-up of a blocked call is the point.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest

import ledgerq
import ledgerq.aio
from ledgerq import Item, Priority
from ledgerq.segment import meta as meta_module
from tests.clocks import SteppedClock
from tests.core._refused import check_refused_and_nothing_written


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


def meta_version(path: Path) -> int:
    version = json.loads((path / "meta.json").read_text())["version"]
    assert type(version) is int
    return version


def test_a_delayed_message_waits_for_its_time(tmp_path: Path, clock: SteppedClock) -> None:
    with ledgerq.open(tmp_path / "q", clock=clock) as q:
        later = q.enqueue(b"later", delay=10)
        now = q.enqueue(b"now")
        assert len(q) == 2
        stats = q.stats()
        assert (stats.pending, stats.delayed) == (2, 1)
        assert [m.id for m in q.peek(5)] == [now]
        msg = q.dequeue()
        assert msg is not None and msg.id == now
        q.ack(now)
        assert q.dequeue() is None
        assert q.peek(5) == []
        clock.elapse(9.9)
        assert q.dequeue() is None
        assert q.stats().delayed == 1
        clock.elapse(0.1)
        assert [m.id for m in q.peek(5)] == [later]
        assert q.stats().delayed == 0
        msg = q.dequeue()
        assert msg is not None and (msg.id, msg.payload, msg.attempts) == (later, b"later", 1)
        q.ack(later)
        assert (len(q), q.stats().pending, q.stats().delayed) == (0, 0, 0)
        q._check()


def test_stats_count_delayed_messages_the_reader_has_not_reached(
    tmp_path: Path, clock: SteppedClock
) -> None:
    # A dequeue stops at the first message it can deliver: delayed ones behind it
    # are unread, and still counted.
    with ledgerq.open(tmp_path / "q", clock=clock) as q:
        first = q.enqueue(b"ready")
        q.enqueue_batch([Item(b"a", delay=5), Item(b"b", delay=7), b"c"])
        msg = q.dequeue()
        assert msg is not None and msg.id == first
        stats = q.stats()
        assert (stats.pending, stats.in_flight, stats.delayed) == (3, 1, 2)
        q.enqueue(b"d", delay=1)
        assert q.stats().delayed == 3
        clock.elapse(5)
        assert q.stats().delayed == 1
        assert [m.payload for m in q.peek(5)] == [b"a", b"c", b"d"]


def test_due_messages_come_in_id_order_and_by_priority(tmp_path: Path, clock: SteppedClock) -> None:
    with ledgerq.open(tmp_path / "q", clock=clock) as q:
        late = q.enqueue(b"late", delay=3)
        early = q.enqueue(b"early", delay=1)
        assert q.dequeue() is None
        clock.elapse(5)
        assert [m.id for m in q.dequeue_batch(5)] == [late, early]
    with ledgerq.open(tmp_path / "p", clock=clock, priorities=True) as q:
        low = q.enqueue(b"low", priority=Priority.LOW)
        high = q.enqueue(b"high", priority=Priority.HIGH, delay=2)
        msg = q.dequeue()
        assert msg is not None and msg.id == low
        q.release(low)
        clock.elapse(2)
        assert [m.id for m in q.dequeue_batch(5)] == [high, low]


def test_a_delay_survives_a_reopen(tmp_path: Path, clock: SteppedClock) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock) as q:
        delayed = q.enqueue(b"x", delay=60)
        assert q.dequeue() is None  # read and parked, then closed
    clock.elapse(30)
    with ledgerq.open(path, clock=clock) as q:
        assert q.dequeue() is None
        assert q.peek() == []
        assert (q.stats().pending, q.stats().delayed) == (1, 1)
    clock.elapse(30)
    with ledgerq.open(path, clock=clock) as q:
        msg = q.dequeue()
        assert msg is not None and msg.id == delayed


def test_named_readers_wait_for_the_delay_too(tmp_path: Path, clock: SteppedClock) -> None:
    with ledgerq.open(tmp_path / "q", clock=clock) as q:
        audit = q.reader("audit")
        delayed = q.enqueue(b"x", delay=2)
        assert audit.dequeue() is None and audit.peek() == []
        assert audit.stats().delayed == 1
        clock.elapse(2)
        msg = audit.dequeue()
        assert msg is not None and msg.id == delayed
        assert q.stats().delayed == 0
        other = q.dequeue()
        assert other is not None and other.id == delayed


def test_a_blocked_dequeue_wakes_when_a_delayed_message_falls_due(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        delayed = q.enqueue(b"x", delay=0.3)
        started = time.monotonic()
        msg = q.dequeue(timeout=30)
        waited = time.monotonic() - started
        assert msg is not None and msg.id == delayed
        assert 0.25 <= waited < 10


def test_a_blocked_aio_dequeue_wakes_when_a_delayed_message_falls_due(tmp_path: Path) -> None:
    async def main() -> tuple[int | None, float]:
        async with ledgerq.aio.open(tmp_path / "q") as q:
            await q.enqueue(b"x", delay=0.3)
            started = time.monotonic()
            msg = await q.dequeue(timeout=30)
            return (msg.id if msg else None), time.monotonic() - started

    found, waited = asyncio.run(main())
    assert found == 1
    assert 0.25 <= waited < 10


def test_shared_mode_waits_for_the_delay(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as producer, ledgerq.open(path, shared=True) as consumer:
        delayed = producer.enqueue(b"x", delay=0.3)
        assert consumer.dequeue() is None and consumer.peek() == []
        assert (consumer.stats().pending, consumer.stats().delayed) == (1, 1)
        started = time.monotonic()
        msg = consumer.dequeue(timeout=30)
        assert msg is not None and msg.id == delayed
        assert time.monotonic() - started >= 0.2


@pytest.mark.parametrize(
    ("delay", "error"),
    [
        (-1, ValueError),
        (-0.001, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (1e12, ValueError),
        ("5", TypeError),
        (True, TypeError),
    ],
)
def test_a_bad_delay_writes_nothing(tmp_path: Path, delay: object, error: type) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        check_refused_and_nothing_written(q, "delay", delay, error)
        assert q.stats().next_id == 1


def test_meta_says_version_2_before_the_first_delayed_entry(tmp_path: Path) -> None:
    # Format 2 (which brought delays and groups) writes meta.json version 2 at the
    # first open: no delayed entry is ever written under version 1.
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        assert meta_version(path) == 2
        q.enqueue(b"later", delay=5)
        q.enqueue(b"grouped", group="g")
    assert meta_version(path) == 2  # a close keeps it


def test_a_ledgerq_that_reads_version_1_refuses_a_queue_with_delays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An older ledgerq (FORMAT_VERSION 1) would skip a delayed entry as corrupt; meta.json
    # version 2 makes it refuse the queue instead.
    delayed = tmp_path / "delayed"
    with ledgerq.open(delayed) as q:
        q.enqueue(b"x", delay=5)
    monkeypatch.setattr(meta_module, "FORMAT_VERSION", 1)
    monkeypatch.setattr(meta_module, "NEWEST_VERSION", 1)  # the newest it reads (issue 18)
    with pytest.raises(ledgerq.IncompatibleFormatError, match="upgrade ledgerq"):
        ledgerq.open(delayed)
