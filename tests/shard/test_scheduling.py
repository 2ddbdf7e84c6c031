"""The sharded queue schedules delivery like one queue: delays, groups, nack and release
delays, touch (global ids throughout)."""

from __future__ import annotations

from pathlib import Path

import ledgerq
from ledgerq import Item
from tests.clocks import SteppedClock


def test_a_group_lives_in_one_shard_and_keeps_its_order(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "s", 4) as q:
        ids = [q.enqueue(b"%d" % i, group="account-42") for i in range(3)]
        ids += q.enqueue_batch([Item(b"3", group="account-42")])
        assert len({q.shard_of(i) for i in ids}) == 1
        order = []
        for _ in ids:
            got = q.dequeue_batch(10)
            assert len(got) == 1  # one of the group at a time
            order.append(got[0].id)
            q.ack(got[0].id)
        assert order == ids


def test_delays_and_lease_calls_take_global_ids(tmp_path: Path) -> None:
    clock = SteppedClock()
    with ledgerq.open_sharded(tmp_path / "s", 2, clock=clock, visibility_timeout=10) as q:
        later = q.enqueue(b"later", delay=5)
        assert q.dequeue() is None and q.stats().delayed == 1
        clock.elapse(5)
        msg = q.dequeue()
        assert msg is not None and msg.id == later
        clock.elapse(9)
        q.touch(msg.id, 10)
        clock.elapse(5)
        assert q.dequeue() is None  # touched: still leased
        q.release(msg.id, delay=3)
        assert q.dequeue() is None
        clock.elapse(3)
        again = q.dequeue()
        assert again is not None and again.attempts == 1
        q.nack(again.id, delay=2)
        clock.elapse(2)
        third = q.dequeue()
        assert third is not None and third.attempts == 2
