"""TTL: expired messages are skipped, settled and counted."""

from __future__ import annotations

from pathlib import Path

import ledgerq


def test_expired_messages_are_skipped_and_counted(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue(b"gone", ttl=1e-9)
        q.enqueue(b"kept", ttl=3600)
        q.enqueue(b"forever")
        got = [m.payload for m in q.dequeue_batch(10)]
        assert got == [b"kept", b"forever"]
        assert q.stats().expired == 1


def test_expired_messages_never_come_back(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue(b"gone", ttl=1e-9)
        assert q.dequeue() is None
    with ledgerq.open(path) as q:
        assert q.dequeue() is None
        assert len(q) == 0
        assert q.stats().expired == 1
