"""Priorities: order, FIFO inside a level, starvation promotion, rebuild on reopen."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import ledgerq
from ledgerq import Item, Priority
from tests.drain import drain_singly

LOW, MEDIUM, HIGH = Priority.LOW, Priority.MEDIUM, Priority.HIGH


def drain(q: ledgerq.Queue) -> list[bytes]:
    return [msg.payload for msg in drain_singly(q)]


def test_high_before_medium_before_low_fifo_inside(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", priorities=True) as q:
        for name, level in [("l1", LOW), ("m1", MEDIUM), ("h1", HIGH), ("l2", LOW), ("h2", HIGH)]:
            q.enqueue(name.encode(), priority=level)
        assert drain(q) == [b"h1", b"h2", b"m1", b"l1", b"l2"]


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
def test_delayed_messages_count_as_delayed_before_a_dequeue_reaches_them(
    tmp_path: Path, shared: bool
) -> None:
    # The priority order reads the whole log into its columns at once: a delayed
    # message waited there unparked, and stats() counted it pending but not delayed.
    with ledgerq.open(tmp_path / "q", priorities=True, shared=shared) as q:
        q.enqueue(b"later", delay=60, priority=HIGH)
        q.enqueue(b"later too", delay=60, priority=LOW)
        q.enqueue(b"now")
        assert (q.stats().pending, q.stats().delayed) == (3, 2)
        assert drain(q) == [b"now"]
        assert (q.stats().pending, q.stats().delayed) == (2, 2)


def test_without_priorities_order_is_arrival(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue(b"low", priority=LOW)
        q.enqueue(b"high", priority=HIGH)
        assert drain(q) == [b"low", b"high"]


def test_priority_order_survives_reopen_and_nack(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, priorities=True, segment_size=256) as q:
        q.enqueue_batch([Item(f"l{i}".encode(), priority=LOW) for i in range(5)])
        q.enqueue_batch([Item(f"h{i}".encode(), priority=HIGH) for i in range(3)])
        first = q.dequeue()
        assert first is not None and first.payload == b"h0"
        q.nack(first.id, "retry me")
    with ledgerq.open(path, priorities=True, segment_size=256) as q:
        assert len(q) == 8
        got = drain(q)
        assert got == [b"h0", b"h1", b"h2", b"l0", b"l1", b"l2", b"l3", b"l4"]


def test_starvation_promotes_one_level_per_interval(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", priorities=True, starvation_after=10.0) as q:
        low = q.enqueue(b"old low", priority=LOW)
        q.enqueue(b"medium", priority=MEDIUM)
        q.enqueue(b"high", priority=HIGH)
        core = q._default._core
        stamp = q.peek(3)[-1].timestamp  # every message was stamped at about this time
        # 10 s later the LOW message counts as MEDIUM and, older, goes before "medium".
        mono = time.monotonic()
        order = [core.take(1, mono, stamp + 10 * 10**9 + 1)[0][0].payload for _ in range(3)]
        assert order == [b"high", b"old low", b"medium"]
        q.ack(low)


def test_starvation_reaches_high_after_two_intervals(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", priorities=True, starvation_after=10.0) as q:
        q.enqueue(b"old low", priority=LOW)
        q.enqueue(b"high", priority=HIGH)
        core = q._default._core
        stamp = q.peek(1)[0].timestamp
        taken = core.take(1, time.monotonic(), stamp + 20 * 10**9 + 1)
        assert taken[0][0].payload == b"old low", "a LOW message waiting 2 intervals is HIGH"


def test_starvation_disabled_keeps_strict_order(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", priorities=True, starvation_after=None) as q:
        q.enqueue(b"old low", priority=LOW)
        q.enqueue(b"high", priority=HIGH)
        core = q._default._core
        taken = core.take(1, time.monotonic(), time.time_ns() + 10**15)
        assert taken[0][0].payload == b"high"


@pytest.mark.parametrize("bad", [3, -1, 10])
def test_invalid_priority_values(tmp_path: Path, bad: int) -> None:
    with ledgerq.open(tmp_path / "q", priorities=True) as q:
        with pytest.raises(ValueError, match="priority"):
            q.enqueue(b"x", priority=bad)
        with pytest.raises(TypeError):
            q.enqueue(b"x", priority="HIGH")  # type: ignore[arg-type]
        assert len(q) == 0


def test_priority_index_memory_per_message(tmp_path: Path) -> None:
    """The index stores 3 int64 columns: well under 40 bytes a pending message."""
    with ledgerq.open(tmp_path / "q", priorities=True, sync="never") as q:
        q.enqueue_batch([Item(b"x", priority=Priority(i % 3)) for i in range(30_000)])
        q.peek(1)  # pulls every pending message into the index
        selector = q._default._core._selector
        levels = selector._levels  # type: ignore[attr-defined]
        used = sum(lv.ids.itemsize * 3 * len(lv.ids) for lv in levels)
        assert used / 30_000 <= 40
