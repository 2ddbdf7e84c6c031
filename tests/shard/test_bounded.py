"""A sharded queue with bounded shards: ``max_pending`` holds per shard."""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerq


def test_each_shard_is_bounded_and_enqueue_takes_a_timeout(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "s", 2, max_pending=1) as q:
        first = q.enqueue(b"a", key="k")
        with pytest.raises(ledgerq.QueueFullError, match="max_pending=1"):
            q.enqueue(b"b", key="k", timeout=0.01)
        other = next(k for k in map(str, range(100)) if q.shard_for(k) != q.shard_for("k"))
        q.enqueue(b"c", key=other)  # the other shard has room of its own
        msg = q.dequeue()
        assert msg is not None
        q.ack(msg.id)
        freed = "k" if msg.id == first else other
        q.enqueue(b"d", key=freed)
        assert q.stats().pending == 2


def test_a_batch_refused_by_a_later_shard_names_what_was_written(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "s", 2, max_pending=1) as q:
        keys = [str(k) for k in range(100)]
        on_0 = next(k for k in keys if q.shard_for(k) == 0)
        on_1 = next(k for k in keys if q.shard_for(k) == 1)
        q.enqueue(b"full", key=on_1)
        with pytest.raises(ledgerq.QueueFullError, match=r"other shards were enqueued: ids \["):
            q.enqueue_batch([b"x", b"y"], keys=[on_0, on_1])
        with pytest.raises(ledgerq.QueueFullError) as refused:
            q.enqueue_batch([b"z"], keys=[on_1])
        assert "other shards" not in str(refused.value)
        assert q.stats().enqueued == 2
