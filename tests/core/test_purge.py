"""``q.purge(ids=None)``: everything not leased goes, nothing leased does.

Pending is more than ready: delayed messages, messages waiting for their retry delay,
and messages held behind the head of their group are pending too, and a purge removes
them.  A leased message stays - this handle's or, in shared mode, another process's -
so its holder's ``ack`` still works (issue 25: purge removed only the ready ones, one a
call for a group, and the holders' acks raised ``UnknownMessageError``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerq
from ledgerq import Item
from tests._child import Children
from tests.shared._procs import Reports, start, wait_until


def _fill(q: ledgerq.Queue) -> int:
    """Ready, delayed, retry-waiting and group-held messages; one leased.  Returns the
    leased id."""
    q.enqueue(b"ready")
    q.enqueue(b"later", delay=60)
    retry = q.enqueue(b"retry")
    q.enqueue_batch([Item(f"g{i}".encode(), group="g") for i in range(4)])
    leased = q.enqueue(b"leased")
    msgs = q.dequeue_batch(10)
    by_payload = {m.payload: m for m in msgs}
    q.nack(by_payload[b"retry"].id, delay=30)
    for m in msgs:
        if m.payload not in (b"retry", b"leased"):
            q.release(m.id)  # back, not failed: pending again
    assert retry and leased == by_payload[b"leased"].id
    return leased


@pytest.mark.parametrize("shared", [False, True])
def test_purge_removes_everything_not_leased(tmp_path: Path, shared: bool) -> None:
    with ledgerq.open(tmp_path / "q", shared=shared) as q:
        leased = _fill(q)
        assert q.stats().pending == 7
        assert q.purge() == 7
        stats = q.stats()
        assert (stats.pending, stats.in_flight, stats.delayed) == (0, 1, 0)
        assert q.purge() == 0
        q.ack(leased)  # the holder's ack still works
        assert q.dequeue() is None
        q._check()
    with ledgerq.open(tmp_path / "q") as q:  # durable: nothing comes back
        assert (q.stats().pending, q.dequeue()) == (0, None)


@pytest.mark.parametrize("shared", [False, True])
def test_purge_by_id_skips_the_leased_and_frees_a_group(tmp_path: Path, shared: bool) -> None:
    with ledgerq.open(tmp_path / "q", shared=shared) as q:
        ids = q.enqueue_batch([Item(b"a1", group="a"), Item(b"a2", group="a"), b"x"])
        [a1, x] = q.dequeue_batch(10)
        assert [a1.payload, x.payload] == [b"a1", b"x"]
        assert q.purge([a1.id, ids[1], 999]) == 1  # a1 is leased; 999 is no message
        q.ack(a1.id)
        assert q.dequeue() is None  # a2 was purged, x is leased
        q.ack(x.id)
        assert q.stats().pending == 0


def test_a_purge_keeps_another_processs_leases(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        q.enqueue_batch([b"token:1;", b"token:2;", b"token:3;"])
        q.enqueue(b"token:4;", delay=60)
        holder = Reports(start(children, "hold", path))
        holder.child.send("deq")
        wait_until(lambda: holder.kinds("L"), 30, "the other process's lease")
        [[held_id, _, _]] = holder.kinds("L")
        assert q.purge() == 3
        holder.child.send(f"ack {held_id}")
        wait_until(lambda: holder.kinds("A") or holder.kinds("X"), 30, "the other process's ack")
        assert holder.kinds("A") == [[held_id]], holder.kinds("X")
        stats = q.stats()
        assert (stats.pending, stats.in_flight, stats.acked) == (0, 0, 4)


def test_another_handles_purge_of_what_waits_here_for_its_time_is_seen(tmp_path: Path) -> None:
    """A delayed message and a retry waiting in one handle, purged through another:
    gone from the first handle's count too (it kept them parked until their time)."""
    path = tmp_path / "q"
    with (
        ledgerq.open(path, shared=True, retry_delay=60) as here,
        ledgerq.open(path, shared=True) as other,
    ):
        here.enqueue(b"later", delay=60)
        here.enqueue(b"retried")
        retried = here.dequeue()
        assert retried is not None
        here.nack(retried.id)  # waits 60 s for its retry
        assert here.stats().pending == 2
        assert other.purge() == 2
        assert here.stats().pending == 0
        assert here.dequeue() is None
