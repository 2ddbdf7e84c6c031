"""Every feature in shared mode, through two handles of one queue (as two processes would).

Each handle catches up with the other's log entries, journal records and feature
records before it decides anything, so what one handle did is what the other sees:
dedup ids, retries and the DLQ, TTL, priorities, named readers, seek, visibility
timeouts (whoever looks first takes an expired lease over), retention, stats.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from ledgerq import Item, Priority
from tests.clocks import SteppedClock


@contextmanager
def two_handles(path: Path, **options: Any) -> Iterator[tuple[ledgerq.Queue, ledgerq.Queue]]:
    """Two shared handles of the queue at ``path``, opened with ``options``; closed
    after (the first, then the second)."""
    a, b = (ledgerq.open(path, shared=True, **options) for _ in range(2))
    try:
        yield a, b
    finally:
        a.close()
        b.close()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ledgerq.Queue, ledgerq.Queue]]:
    with two_handles(tmp_path / "q") as handles:
        yield handles


def test_ids_interleave_and_stay_increasing(pair: tuple[ledgerq.Queue, ledgerq.Queue]) -> None:
    a, b = pair
    ids = [a.enqueue(b"a"), b.enqueue(b"b"), *a.enqueue_batch([b"c", b"d"]), b.enqueue(b"e")]
    assert ids == [1, 2, 3, 4, 5]
    assert [m.id for m in b.peek(10)] == ids
    assert a.stats().enqueued == b.stats().enqueued == 5


def test_dedup_ids_are_the_queues(tmp_path: Path) -> None:
    with two_handles(tmp_path / "q", dedup_window=60.0) as (a, b):
        first = a.enqueue(b"x", dedup_id="order-1")
        assert b.enqueue(b"x again", dedup_id="order-1") == first
        assert b.enqueue_batch([Item(b"y", dedup_id="order-2")]) == [2]
        assert a.enqueue(b"y again", dedup_id="order-2") == 2
        assert a.stats().duplicates == b.stats().duplicates == 2
        assert len(a) == len(b) == 2
    # A new session (every handle closed) still knows them.
    with ledgerq.open(tmp_path / "q", shared=True) as c:
        assert c.enqueue(b"x", dedup_id="order-1") == first


def test_retries_and_the_dlq_across_handles(tmp_path: Path) -> None:
    with two_handles(tmp_path / "q", max_retries=2) as (a, b):
        message_id = a.enqueue(b"poison", headers={"k": "v"})
        first = a.dequeue()
        assert first is not None and first.attempts == 1
        a.nack(first.id, "first failure")
        second = b.dequeue()
        assert second is not None and (second.id, second.attempts) == (message_id, 2)
        b.nack(second.id, "second failure")  # the second failure: b moves it to the DLQ
        assert a.dequeue() is None and b.dequeue() is None
        assert a.stats().dead_lettered == b.stats().dead_lettered == 1
        (dead,) = a.dlq.peek(5)
        assert dead.headers["dlq.failure_reason"] == "second failure"
        assert dead.headers["dlq.retry_count"] == "2"
        assert len(b.dlq) == 1
        assert b.requeue_dlq() == 1
        again = a.dequeue()
        assert again is not None and again.payload == b"poison" and again.attempts == 1
        assert len(a.dlq) == len(b.dlq) == 0


def test_ttl_expires_for_every_handle(tmp_path: Path) -> None:
    clock = SteppedClock()
    with two_handles(tmp_path / "q", clock=clock) as (a, b):
        a.enqueue(b"short", ttl=1.0)
        a.enqueue(b"long", ttl=100.0)
        clock.elapse(2)
        got = b.dequeue()
        assert got is not None and got.payload == b"long"
        assert a.stats().expired == b.stats().expired == 1


def test_priorities_order_every_handle_alike(tmp_path: Path) -> None:
    with two_handles(tmp_path / "q", priorities=True, starvation_after=None) as (a, b):
        a.enqueue(b"low", priority=Priority.LOW)
        b.enqueue(b"high", priority=Priority.HIGH)
        a.enqueue(b"medium")
        b.enqueue(b"high 2", priority=Priority.HIGH)
        got = [a.dequeue(), b.dequeue(), a.dequeue(), b.dequeue()]
        assert [m.payload for m in got if m] == [b"high", b"high 2", b"medium", b"low"]
        # A lease of the other handle given back competes by priority again.
        for msg in got[:2]:
            assert msg is not None
        b.nack(got[1].id)  # type: ignore[union-attr]
        again = a.dequeue()
        assert again is not None and again.payload == b"high 2"


def test_starvation_promotes_for_every_handle(tmp_path: Path) -> None:
    clock = SteppedClock()
    with two_handles(tmp_path / "q", priorities=True, starvation_after=10.0, clock=clock) as (a, b):
        a.enqueue(b"old low", priority=Priority.LOW)
        clock.elapse(25)  # promoted twice: as high as HIGH, and older
        b.enqueue(b"new high", priority=Priority.HIGH)
        got = b.dequeue()
        assert got is not None and got.payload == b"old low"


def test_named_readers_are_shared(pair: tuple[ledgerq.Queue, ledgerq.Queue]) -> None:
    a, b = pair
    a.enqueue_batch([b"1", b"2", b"3"])
    audit_a = a.reader("audit")
    audit_b = b.reader("audit")  # created by a: b opens the same reader
    first = audit_a.dequeue()
    second = audit_b.dequeue()
    assert first is not None and second is not None and (first.id, second.id) == (1, 2)
    audit_b.ack(second.id)
    with pytest.raises(ledgerq.UnknownMessageError):
        audit_b.ack(first.id)
    audit_a.ack(first.id)
    assert audit_b.stats().acked == audit_a.stats().acked == 2
    assert [m.id for m in a.dequeue_batch(5)] == [1, 2, 3], "the default reader is apart"


def test_seek_moves_the_reader_for_every_handle(pair: tuple[ledgerq.Queue, ledgerq.Queue]) -> None:
    a, b = pair
    a.enqueue_batch([b"1", b"2", b"3", b"4"])
    for msg in a.dequeue_batch(4):
        a.ack(msg.id)
    b.reader("default").seek(2)  # replay from id 2
    assert [m.id for m in a.dequeue_batch(10)] == [2, 3, 4]


def test_seek_drops_the_other_handles_leases(pair: tuple[ledgerq.Queue, ledgerq.Queue]) -> None:
    a, b = pair
    a.enqueue_batch([b"1", b"2"])
    leased = a.dequeue()
    assert leased is not None
    b.reader("default").seek(1)
    with pytest.raises(ledgerq.UnknownMessageError, match="seek"):
        a.ack(leased.id)
    assert [m.id for m in b.dequeue_batch(5)] == [1, 2]


def test_an_expired_lease_is_taken_over_and_its_holder_told(tmp_path: Path) -> None:
    clock = SteppedClock()
    with two_handles(tmp_path / "q", visibility_timeout=5.0, clock=clock) as (a, b):
        a.enqueue(b"slow work")
        leased = a.dequeue()
        assert leased is not None and leased.attempts == 1
        assert b.dequeue() is None
        clock.elapse(6)
        taken = b.dequeue()
        assert taken is not None and (taken.id, taken.attempts) == (leased.id, 2)
        with pytest.raises(ledgerq.UnknownMessageError, match="visibility timeout"):
            a.ack(leased.id)
        b.ack(taken.id)
        assert a.stats().in_flight == b.stats().in_flight == 0


def test_ack_batch_and_release_across_handles(pair: tuple[ledgerq.Queue, ledgerq.Queue]) -> None:
    a, b = pair
    a.enqueue_batch([b"1", b"2", b"3"])
    got = a.dequeue_batch(3)
    with pytest.raises(ledgerq.UnknownMessageError):
        b.ack_batch([m.id for m in got])
    assert a.stats().in_flight == 3, "a refused batch acks nothing"
    a.release(got[2].id)
    again = b.dequeue()
    assert again is not None and (again.id, again.attempts) == (3, 1)
    a.ack_batch([got[0].id, got[1].id])
    b.ack(again.id)
    assert a.stats().acked == b.stats().acked == 3


def test_retention_waits_for_every_reader_of_every_handle(tmp_path: Path) -> None:
    with two_handles(tmp_path / "q", segment_size=128, index_interval=1) as (a, b):
        b.reader("slow")
        for n in range(20):
            a.enqueue(b"message %02d " % n + b"." * 60)
        while (msg := b.dequeue()) is not None:
            b.ack(msg.id)
        a.compact()
        held = a.stats().segments
        assert held > 5, "the slow reader holds every segment"
        assert b.stats().segments == held
        slow = a.reader("slow")
        while (msg := slow.dequeue()) is not None:
            slow.ack(msg.id)
        b.compact()
        assert a.stats().segments == b.stats().segments == 1
        assert len(list((tmp_path / "q" / "segments").glob("*.log"))) == 1


def test_stats_are_the_queues_from_every_handle(pair: tuple[ledgerq.Queue, ledgerq.Queue]) -> None:
    a, b = pair
    a.enqueue_batch([b"%d" % n for n in range(10)])
    for msg in b.dequeue_batch(4):
        b.ack(msg.id)
    leased = a.dequeue_batch(2)
    a.nack(leased[0].id, "no")
    left, right = a.stats(), b.stats()
    for field in ("pending", "in_flight", "enqueued", "acked", "nacked", "segments", "next_id"):
        assert getattr(left, field) == getattr(right, field), field
    assert (right.pending, right.in_flight, right.acked, right.nacked) == (5, 1, 4, 1)


def test_a_queue_of_the_previous_release_opens_shared(tmp_path: Path) -> None:
    """A format-1 queue (committed fixture: version 1 journals, feature files and
    meta.json, written before format 2) opens shared: the first handle upgrades every
    file while it is alone, the second joins and reads what is on disk."""
    path = tmp_path / "q"
    shutil.copytree(Path(__file__).parent.parent / "format" / "fixtures" / "v1_clean", path)
    journal = path / "readers" / "default.state"
    assert journal.read_bytes()[4:8] == (1).to_bytes(4, "little")
    with two_handles(path, max_retries=1, dedup_window=60.0) as (a, b):
        assert journal.read_bytes()[4:8] == (3).to_bytes(4, "little")
        assert json.loads((path / "meta.json").read_text())["version"] == 2
        for name in ("dedup.log", "retries.log"):
            assert (path / "features" / name).read_bytes()[4:8] == (2).to_bytes(4, "little")
        before = a.stats().pending
        got = b.dequeue()
        assert got is not None
        b.ack(got.id)
        new_id = a.enqueue(b"new", dedup_id="n")
        assert b.enqueue(b"again", dedup_id="n") == new_id  # a's dedup record, read by b
        assert a.stats().pending == b.stats().pending == before
    with ledgerq.open(path) as q:  # and an exclusive open reads it after
        assert q.stats().pending == before


def test_compression_and_headers_between_handles(tmp_path: Path) -> None:
    a = ledgerq.open(tmp_path / "q", shared=True, compression="zstd", compression_min_size=0)
    b = ledgerq.open(tmp_path / "q", shared=True)
    try:
        body = b"compressible " * 200
        a.enqueue(body, headers={"h": "1"})
        got = b.dequeue()
        assert got is not None and got.payload == body and got.headers == {"h": "1"}
    finally:
        a.close()
        b.close()


def test_two_handles_requeueing_at_once_move_each_message_once(tmp_path: Path) -> None:
    import threading

    with two_handles(tmp_path / "q", max_retries=1) as (a, b):
        for n in range(40):
            a.enqueue(b"%d" % n)
        while (msg := a.dequeue()) is not None:
            a.nack(msg.id, "into the DLQ")
        assert len(b.dlq) == 40
        moved: list[int] = []
        threads = [
            threading.Thread(target=lambda h=h: moved.append(h.requeue_dlq())) for h in (a, b)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(moved) == 40
        assert len(a) == len(b) == 40, "each dead letter came back once"
        assert len(a.dlq) == 0
