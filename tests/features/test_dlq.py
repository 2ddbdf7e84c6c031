"""Dead-letter queue and retry tracking."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children
from tests.clocks import SteppedClock


def fail(q: ledgerq.Queue, reason: str) -> ledgerq.Message:
    msg = q.dequeue()
    assert msg is not None
    q.nack(msg.id, reason)
    return msg


def _enqueue_and_fail_once(path: Path, max_retries: int, payload: bytes, reason: str) -> None:
    """Enqueue ``payload`` into the queue at ``path``, lease and nack it, and close."""
    with ledgerq.open(path, max_retries=max_retries) as q:
        q.enqueue(payload)
        fail(q, reason)


def test_nack_max_retries_times_moves_to_dlq_with_headers(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=3) as q:
        original = q.enqueue(b"poison", headers={"job": "7"}, priority=ledgerq.Priority.HIGH)
        fail(q, "first")
        fail(q, "second")
        assert len(q.dlq) == 0
        fail(q, "third: bad input")
        assert q.dequeue() is None
        assert len(q.dlq) == 1
        dead = q.dlq.dequeue()
        assert dead is not None
        assert dead.payload == b"poison"
        assert dead.priority is ledgerq.Priority.HIGH
        assert dead.headers["job"] == "7"
        assert dead.headers["dlq.original_id"] == str(original)
        assert dead.headers["dlq.retry_count"] == "3"
        assert dead.headers["dlq.failure_reason"] == "third: bad input"
        assert int(dead.headers["dlq.last_failure"]) > 0
        stats = q.stats()
        assert stats.dead_lettered == 1 and stats.nacked == 3 and stats.pending == 0


def test_max_retries_zero_never_dead_letters(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=0) as q:
        q.enqueue(b"x")
        for attempt in range(1, 8):
            msg = fail(q, "again")
            assert msg.attempts == attempt
        assert len(q.dlq) == 0


def test_retry_count_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "q"
    _enqueue_and_fail_once(path, 2, b"x", "one")
    with ledgerq.open(path, max_retries=2) as q:
        msg = q.dequeue()
        assert msg is not None and msg.attempts == 2
        q.nack(msg.id, "two")
        assert q.dequeue() is None
        dead = q.dlq.peek(1)
        assert dead and dead[0].headers["dlq.retry_count"] == "2"


def test_lost_leases_count_as_failures(tmp_path: Path) -> None:
    """A message whose worker dies every time still ends up in the DLQ."""
    path = tmp_path / "q"
    with ledgerq.open(path, max_retries=2) as q:
        q.enqueue(b"kills the worker")
        assert q.dequeue() is not None  # leased, never acked
    with ledgerq.open(path, max_retries=2) as q:
        msg = q.dequeue()
        assert msg is not None and msg.attempts == 2
    with ledgerq.open(path, max_retries=2) as q:
        assert q.dequeue() is None
        dead = q.dlq.peek(1)
        assert dead and "lease lost" in dead[0].headers["dlq.failure_reason"]


def test_worker_killed_by_sigkill_ends_in_dlq(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, max_retries=2) as q:
        q.enqueue(b"deadly")
    worker = textwrap.dedent(
        f"""
        import os, sys, ledgerq
        q = ledgerq.open({str(path)!r}, max_retries=2)
        msg = q.dequeue()
        print(msg.id if msg else "none", flush=True)
        sys.stdin.read()
        """
    )
    for _ in range(2):
        child = children.start(["-c", worker])
        assert child.line() != "none"
        child.kill_and_drain()
    with ledgerq.open(path, max_retries=2) as q:
        assert q.dequeue() is None
        assert len(q.dlq) == 1


def test_requeue_dlq_moves_back_once(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=1) as q:
        original = q.enqueue(b"retry later", headers={"k": "v"})
        fail(q, "down")
        dead = q.dlq.peek(1)[0]
        assert q.requeue_dlq([dead.id]) == 1
        assert q.requeue_dlq([dead.id]) == 0, "requeued twice must not make two copies"
        assert len(q.dlq) == 0
        msg = q.dequeue()
        assert msg is not None
        assert msg.id > original and msg.payload == b"retry later"
        assert msg.headers == {"k": "v"}
        assert msg.attempts == 1
        q.ack(msg.id)
        assert q.dequeue() is None


def test_requeue_all_and_unknown_ids(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=1) as q:
        q.enqueue_batch([b"a", b"b", b"c"])
        for _ in range(3):
            fail(q, "x")
        assert len(q.dlq) == 3
        assert q.requeue_dlq([999]) == 0
        assert q.requeue_dlq() == 3
        assert sorted(m.payload for m in q.dequeue_batch(10)) == [b"a", b"b", b"c"]


def test_dlq_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "q"
    _enqueue_and_fail_once(path, 1, b"a", "x")
    with ledgerq.open(path, max_retries=1) as q:
        assert len(q.dlq) == 1
        assert q.stats().dead_lettered == 1
        assert q.requeue_dlq() == 1
    with ledgerq.open(path, max_retries=1) as q:
        assert len(q.dlq) == 0 and len(q) == 1


def test_visibility_timeout_expiry_is_a_failed_delivery(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=2, visibility_timeout=0.05) as q:
        q.enqueue(b"slow")
        first = q.dequeue()
        assert first is not None
        second = q.dequeue(timeout=10)  # waits for the lease to expire, no polling
        assert second is not None and second.id == first.id and second.attempts == 2
        assert q.dequeue(timeout=0.2) is None  # the second expiry moved it to the DLQ
        assert len(q.dlq) == 1
        assert "visibility timeout" in q.dlq.peek(1)[0].headers["dlq.failure_reason"]


def test_retry_log_records_each_failure_in_its_format(tmp_path: Path) -> None:
    """``features/retries.log``: header ``LQRT`` v1, then ``[reader, id, time_ns, reason]``."""
    from ledgerq.format.feature_state import decode_feature_file

    path = tmp_path / "q"
    with ledgerq.open(path, max_retries=5) as q:
        first = q.enqueue(b"x")
        fail(q, "one")
        fail(q, "two")
        other = q.reader("r")
        leased = other.dequeue()
        assert leased is not None
        other.nack(leased.id, "three")
        data = (path / "features" / "retries.log").read_bytes()
    assert data[:8] == b"LQRT\x02\x00\x00\x00"
    decoded = decode_feature_file(data, b"LQRT")  # values and where the last record ends
    values, end = decoded[0], decoded[1]
    assert end == len(data)
    assert [(v[0], v[1], v[3]) for v in values] == [
        ("default", first, "one"),
        ("default", first, "two"),
        ("r", first, "three"),
    ]
    assert all(type(v[2]) is int and v[2] > 0 for v in values)


def test_requeue_with_a_delay_holds_the_messages_back(tmp_path: Path) -> None:
    """``requeue_dlq(delay=)``: back in the queue, delayed, and never delivered early."""
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", max_retries=1, clock=clock) as q:
        q.enqueue_batch([b"a", b"b"])
        fail(q, "down")
        fail(q, "down")
        with pytest.raises(ValueError):
            q.requeue_dlq(delay=-1)  # checked before anything moves
        assert q.dlq is not None and len(q.dlq) == 2
        assert q.requeue_dlq(delay=60) == 2
        assert q.stats().delayed == 2
        assert q.dequeue() is None
        clock.elapse(61)
        got = [q.dequeue(), q.dequeue()]
        assert sorted(m.payload for m in got if m is not None) == [b"a", b"b"]
