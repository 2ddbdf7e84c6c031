"""Forwards from several processes at once, on shared queues: each source message's
items land in the target once, ids strictly increasing, and a message one process
leased and forwarded is not forwarded again by another that gets it back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children
from tests.features._forward import forward_losing_the_ack, lease_new
from tests.shared.conftest import locking  # noqa: F401  (the fixture)

WORKER = """
import os, sys
import ledgerq
source, target = sys.argv[1], sys.argv[2]
a = ledgerq.open(source, shared=True)
b = ledgerq.open(target, shared=True)
os.write(1, b"ready\\n")
sys.stdin.readline()
count = 0
while (msg := a.dequeue()) is not None:
    a.forward(msg.id, b, [msg.payload + b".x", msg.payload + b".y"])
    count += 1
os.write(1, b"forwarded %d\\n" % count)
a.close()
b.close()
"""


@pytest.mark.usefixtures("locking")
def test_processes_forwarding_at_once_land_each_batch_once(
    tmp_path: Path, children: Children
) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    jobs = [b"%d" % n for n in range(400)]
    with ledgerq.open(source, shared=True) as a:
        a.enqueue_batch(jobs)
    workers = [children.start(["-c", WORKER, str(source), str(target)]) for _ in range(3)]
    for worker in workers:
        assert worker.line() == "ready"
    for worker in workers:
        worker.send("go\n")
    counts = [int(worker.line().split()[1]) for worker in workers]
    for worker in workers:
        worker.expect_exit(0)
    assert sum(counts) == len(jobs)
    with ledgerq.open(target, shared=True) as b, ledgerq.open(source, shared=True) as a:
        got = b.peek(10_000)
        assert [m.id for m in got] == sorted(m.id for m in got)
        seen = Counter(m.payload for m in got)
        assert set(seen) == {j + s for j in jobs for s in (b".x", b".y")}
        assert max(seen.values()) == 1
        # Each batch is contiguous: a message's two items have consecutive ids.
        ids = {m.payload: m.id for m in got}
        assert all(ids[j + b".y"] == ids[j + b".x"] + 1 for j in jobs)
        assert len(a) == 0


@pytest.mark.usefixtures("locking")
def test_another_handle_that_gets_the_message_back_only_acks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease lost after the items landed (the handle closed before its ack): the
    handle that gets the message back finds the items there, in another process's
    view of the target - the file's news read under the append lock."""

    with (
        ledgerq.open(tmp_path / "a", shared=True) as a1,
        ledgerq.open(tmp_path / "a", shared=True) as a2,
        ledgerq.open(tmp_path / "b", shared=True) as b1,
        ledgerq.open(tmp_path / "b", shared=True) as b2,
    ):
        msg = lease_new(a1)
        forward_losing_the_ack(monkeypatch, a1, msg.id, b1, [b"one"])
        a1.close()  # its leases go back to the queue
        again = a2.dequeue(timeout=30)
        assert again is not None
        assert again.id == msg.id
        assert a2.forward(again.id, b2, [b"two"]) == [1]
        assert [m.payload for m in b2.peek(10)] == [b"one"]
        assert a2.stats().in_flight == 0
