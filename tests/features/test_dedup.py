"""Dedup window."""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerq
from ledgerq import Item
from tests.clocks import SteppedClock


def test_duplicate_inside_window_returns_original_id(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", dedup_window=60) as q:
        first = q.enqueue(b"a", dedup_id="order-1")
        again = q.enqueue(b"a-again", dedup_id="order-1")
        other = q.enqueue(b"b", dedup_id="order-2")
        assert again == first and other > first
        assert len(q) == 2
        assert q.stats().duplicates == 1
        assert q.enqueue(b"c", dedup_id=b"order-1") != first, "bytes and str ids differ"


def test_dedup_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, dedup_window=60) as q:
        first = q.enqueue(b"a", dedup_id="x")
    with ledgerq.open(path, dedup_window=60) as q:
        assert q.enqueue(b"a", dedup_id="x") == first
        assert len(q) == 1
        assert q.stats().duplicates == 1


def test_dedup_inside_one_batch(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", dedup_window=60) as q:
        ids = q.enqueue_batch([Item(b"a", dedup_id="k"), Item(b"b"), Item(b"a2", dedup_id="k")])
        assert ids[0] == ids[2] and ids[1] == ids[0] + 1
        assert len(q) == 2


def test_window_expires(tmp_path: Path) -> None:
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", dedup_window=10, clock=clock) as q:
        first = q.enqueue(b"a", dedup_id="k")
        clock.elapse(9.9)
        assert q.enqueue(b"a", dedup_id="k") == first  # inside the window: a duplicate
        clock.elapse(0.2)
        assert q.enqueue(b"a", dedup_id="k") != first  # the window has passed


def test_max_entries_evicts_oldest(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", dedup_window=60, dedup_max_entries=3) as q:
        ids = [q.enqueue(b"x", dedup_id=f"k{i}") for i in range(4)]
        assert q.enqueue(b"x", dedup_id="k3") == ids[3]
        assert q.enqueue(b"x", dedup_id="k0") != ids[0], "the oldest entry was evicted"


def test_dedup_off_ignores_ids_but_checks_type(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        assert q.enqueue(b"a", dedup_id="k") != q.enqueue(b"a", dedup_id="k")
        with pytest.raises(TypeError, match="dedup_id"):
            q.enqueue(b"a", dedup_id=5)  # type: ignore[arg-type]
