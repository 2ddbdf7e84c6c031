"""``ledgerq enqueue --timeout`` on a bounded queue, through a real subprocess."""

from __future__ import annotations

from pathlib import Path

import ledgerq

from ._run import fails, ok


def test_enqueue_on_a_full_queue_fails_or_waits_its_timeout(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q, max_pending=2):
        pass  # the bound is stored with the queue
    assert ok("enqueue", q, "--lines", stdin=b"a\nb\n").out == "1\n2\n"
    full = fails("enqueue", q, "c")
    assert "is full (2 messages pending of max_pending=2)" in full.err
    assert "after waiting" not in full.err
    waited = fails("enqueue", q, "c", "--timeout", "0.2")
    assert "after waiting 0.2 s" in waited.err
    assert "nothing was written" in waited.err
    fails("enqueue", q, "c", "--timeout", "-1", code=2)  # a usage error
    with ledgerq.open(q) as queue:
        assert queue.stats().enqueued == 2
        msg = queue.dequeue()
        assert msg is not None
        queue.ack(msg.id)
    assert ok("enqueue", q, "c", "--timeout", "inf").out == "3\n"
