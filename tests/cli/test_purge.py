"""``ledgerq purge QUEUE``: everything not leased goes, beside a live shared holder."""

from __future__ import annotations

from pathlib import Path

import ledgerq

from ._run import fails, ok


def _fill(path: Path) -> ledgerq.Queue:
    """A shared handle holding one lease, with ready, delayed and retry-waiting messages."""
    q = ledgerq.open(path, shared=True, retry_delay=60)
    q.enqueue_batch([b"leased", b"retried", b"ready"])
    q.enqueue(b"later", delay=60)
    q.enqueue(b"g1", group="g")
    q.enqueue(b"g2", group="g")
    leased = q.dequeue()
    retried = q.dequeue()
    assert leased is not None and retried is not None
    q.nack(retried.id)  # waits 60 s for its retry
    return q


def test_purge_removes_everything_not_leased_beside_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with _fill(path) as holder:
        leased_id = 1
        assert ok("purge", path, "--yes", "--json").json() == {"queue": str(path), "purged": 5}
        holder.ack(leased_id)  # the holder's lease survived the purge
        assert holder.dequeue() is None
        assert holder.stats().pending == 0


def test_purge_of_chosen_ids_and_its_confirmation(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue_batch([b"a", b"b", b"c"])
    refused = fails("purge", path, code=1).err
    assert "without confirmation" in refused and "--yes" in refused
    assert "purged 1 message from" in ok("purge", path, "--id", "2", "-y").out
    with ledgerq.open(path) as q:
        assert [m.payload for m in q.dequeue_batch(10)] == [b"a", b"c"]
    missing = tmp_path / "nowhere"
    fails("purge", missing, "--yes", code=1)
    assert not missing.exists()
    assert "--id" in fails("purge", path, "--id", "0", "--yes", code=2).err
