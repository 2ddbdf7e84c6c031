"""Named readers: fan-out, replay with seek/seek_time, visibility timeout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import ledgerq


def drain(reader: ledgerq.Reader | ledgerq.Queue, limit: int = 10_000) -> list[bytes]:
    out = []
    for _ in range(limit):
        msg = reader.dequeue()
        if msg is None:
            break
        reader.ack(msg.id)
        out.append(msg.payload)
    return out


def test_fan_out_two_readers_different_speeds_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "q"
    payloads = [f"m{i}".encode() for i in range(50)]
    with ledgerq.open(path, segment_size=300) as q:
        q.enqueue_batch(payloads)
        fast, slow = q.reader("fast"), q.reader("slow")
        assert drain(fast) == payloads
        assert drain(slow, limit=10) == payloads[:10]
        leased = slow.dequeue()
        assert leased is not None and leased.payload == payloads[10]
        assert q.stats().readers["slow"].in_flight == 1
    with ledgerq.open(path, segment_size=300) as q:
        slow = q.reader("slow")
        assert drain(q.reader("fast")) == []
        again = slow.dequeue()
        assert again is not None and again.id == leased.id and again.attempts == 2
        slow.ack(again.id)
        assert drain(slow) == payloads[11:]
        assert drain(q) == payloads, "the default reader is independent too"
        q.compact()
        assert q.stats().segments == 1


def test_reader_ack_of_other_readers_lease_is_unknown(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue(b"x")
        a, b = q.reader("a"), q.reader("b")
        msg = a.dequeue()
        assert msg is not None
        with pytest.raises(ledgerq.UnknownMessageError):
            b.ack(msg.id)
        a.ack(msg.id)


def test_start_latest_and_same_object(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue(b"old")
        late = q.reader("late", start="latest")
        assert late.dequeue() is None
        q.enqueue(b"new")
        msg = late.dequeue()
        assert msg is not None and msg.payload == b"new"
        assert q.reader("late") is late
        assert q.reader("default") is q.reader("default")
        assert len(q.reader("early")) == 2


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "-x", "x" * 101, "a b", "é"])
def test_reader_names_are_validated(tmp_path: Path, name: str) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        with pytest.raises(ValueError, match="reader name"):
            q.reader(name)
        with pytest.raises(ValueError, match="start"):
            q.reader("ok", start="middle")


def test_seek_replays_acked_messages(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=200, index_interval=64) as q:
        ids = q.enqueue_batch([f"m{i}".encode() for i in range(40)])
        r = q.reader("audit")
        assert len(drain(r)) == 40
        r.seek(ids[25])
        assert drain(r) == [f"m{i}".encode() for i in range(25, 40)]
        r.seek(0)
        assert len(drain(r)) == 40
    with ledgerq.open(path, segment_size=200, index_interval=64) as q:
        r = q.reader("audit")
        r.seek(ids[39])
    with ledgerq.open(path, segment_size=200, index_interval=64) as q:
        assert drain(q.reader("audit")) == [b"m39"], "a seek is durable"


def test_seek_drops_leases_and_restarts_attempts(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        first = q.enqueue(b"a")
        q.enqueue(b"b")
        msg = q.dequeue()
        assert msg is not None
        q.nack(msg.id)
        q.reader("default").seek(first)
        with pytest.raises(ledgerq.UnknownMessageError):
            q.ack(msg.id)
        again = q.dequeue()
        assert again is not None and again.id == first and again.attempts == 1


def test_seek_time_uses_timestamps(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", segment_size=500, index_interval=100) as q:
        q.enqueue_batch([f"early{i}".encode() for i in range(30)])
        cut = time.time_ns()
        while time.time_ns() == cut:  # make sure the next batch is stamped later
            pass
        q.enqueue_batch([f"late{i}".encode() for i in range(30)])
        r = q.reader("replay")
        r.seek_time(cut + 1)
        assert drain(r) == [f"late{i}".encode() for i in range(30)]
        r.seek_time(0)
        assert len(drain(r)) == 60
        r.seek_time(time.time_ns() + 10**12)
        assert drain(r) == []
        q.enqueue(b"after")
        assert drain(r) == [b"after"]


def test_visibility_timeout_redelivers_without_reopen(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", visibility_timeout=0.05, max_retries=0) as q:
        q.enqueue(b"slow job")
        first = q.dequeue()
        assert first is not None
        again = q.dequeue(timeout=30)  # the wait ends when the lease expires
        assert again is not None and again.id == first.id and again.attempts == 2
        assert q.stats().in_flight == 1
        q.ack(again.id)
        assert q.dequeue() is None
        assert q.stats().acked == 1


def test_remove_reader(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=200) as q:
        q.enqueue_batch([b"x" * 50] * 20)
        lagging = q.reader("lagging")
        drain(q)
        q.compact()
        assert q.stats().segments > 1, "the lagging reader holds the segments"
        assert q.remove_reader("lagging")
        assert not q.remove_reader("lagging")
        assert q.stats().segments == 1
        with pytest.raises(ledgerq.QueueClosedError):
            lagging.dequeue()
        with pytest.raises(ValueError):
            q.remove_reader("default")
