"""Message groups: ``enqueue(..., group=)``, ``Item(group=)``, ``Message.group``.

The messages of one group are delivered one at a time, in id order: the next is not
leased until the one before it is acked, dead-lettered or expired (a nack or a lost
lease brings the same one back first).  Groups, and messages without one, flow in
parallel.  It holds with priorities, delays, named readers, across a reopen and in
shared mode.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest

import ledgerq
from ledgerq import Item, Priority
from tests.clocks import SteppedClock
from tests.core._refused import check_refused_and_nothing_written
from tests.shared._procs import wait_until


def payloads(messages: list[ledgerq.Message]) -> list[bytes]:
    return [m.payload for m in messages]


def test_one_message_of_a_group_at_a_time_in_id_order(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue_batch(
            [
                Item(b"a1", group="a"),
                Item(b"a2", group="a"),
                Item(b"b1", group="b"),
                b"free",
                Item(b"a3", group="a"),
                Item(b"b2", group="b"),
            ]
        )
        assert payloads(q.peek(10)) == [b"a1", b"b1", b"free"]
        first = q.dequeue_batch(10)
        assert [(m.payload, m.group) for m in first] == [
            (b"a1", "a"),
            (b"b1", "b"),
            (b"free", None),
        ]
        assert q.dequeue() is None
        assert (len(q), q.stats().pending, q.stats().in_flight) == (3, 3, 3)
        q.ack(first[1].id)  # b1 done: b2 may go, a still waits
        assert payloads(q.dequeue_batch(10)) == [b"b2"]
        q.ack(first[0].id)
        assert payloads(q.dequeue_batch(10)) == [b"a2"]
        q._check()


def _lease_the_head_of_group_a(q: ledgerq.Queue) -> int:
    """Enqueue ``a1`` and ``a2`` in group ``a`` and lease ``a1``, its head; return its id."""
    a1 = q.enqueue(b"a1", group="a")
    q.enqueue(b"a2", group="a")
    msg = q.dequeue()
    assert msg is not None and msg.id == a1
    return a1


def test_a_nacked_head_comes_back_before_the_rest_of_its_group(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=0) as q:
        a1 = _lease_the_head_of_group_a(q)
        q.nack(a1)
        again = q.dequeue_batch(10)
        assert [(m.id, m.attempts) for m in again] == [(a1, 2)]
        q.release(a1)
        assert [m.id for m in q.dequeue_batch(10)] == [a1]


def test_a_dead_lettered_head_frees_its_group(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=1) as q:
        a1 = _lease_the_head_of_group_a(q)
        q.nack(a1, "poison")
        assert payloads(q.dequeue_batch(10)) == [b"a2"]
        assert q.stats().dead_lettered == 1


def test_an_expired_head_frees_its_group(tmp_path: Path) -> None:
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", clock=clock) as q:
        q.enqueue(b"a1", group="a", ttl=5)
        q.enqueue(b"a2", group="a")
        clock.elapse(6)
        assert payloads(q.dequeue_batch(10)) == [b"a2"]
        assert q.stats().expired == 1


def test_a_group_keeps_id_order_over_priorities_and_delays(tmp_path: Path) -> None:
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", clock=clock, priorities=True) as q:
        q.enqueue(b"low first", group="g", priority=Priority.LOW)
        q.enqueue(b"high second", group="g", priority=Priority.HIGH)
        q.enqueue(b"other", priority=Priority.MEDIUM)
        got = q.dequeue_batch(10)
        assert payloads(got) == [b"other", b"low first"]
        q.ack(got[1].id)
        assert payloads(q.dequeue_batch(10)) == [b"high second"]
    with ledgerq.open(tmp_path / "d", clock=clock) as q:
        q.enqueue(b"later", group="g", delay=10)
        q.enqueue(b"now", group="g")
        q.enqueue(b"free")
        assert payloads(q.dequeue_batch(10)) == [b"free"]  # the group waits for its head
        clock.elapse(10)
        head = q.dequeue_batch(10)
        assert payloads(head) == [b"later"]
        q.ack(head[0].id)
        assert payloads(q.dequeue_batch(10)) == [b"now"]


def test_named_readers_have_their_own_group_turns(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        audit = q.reader("audit")
        q.enqueue_batch([Item(b"a1", group="a"), Item(b"a2", group="a")])
        assert payloads(q.dequeue_batch(10)) == [b"a1"]
        got = audit.dequeue_batch(10)
        assert payloads(got) == [b"a1"]
        audit.ack(got[0].id)
        assert payloads(audit.dequeue_batch(10)) == [b"a2"]
        assert q.dequeue() is None


def test_group_order_holds_across_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue_batch([Item(b"a1", group="a"), Item(b"a2", group="a"), b"x"])
        assert payloads(q.dequeue_batch(10)) == [b"a1", b"x"]  # never acked
    with ledgerq.open(path) as q:
        got = q.dequeue_batch(10)
        assert [(m.payload, m.attempts) for m in got] == [(b"a1", 2), (b"x", 2)]
        q.ack(got[0].id)
    with ledgerq.open(path) as q:
        assert payloads(q.dequeue_batch(10)) == [b"a2", b"x"]


def test_shared_handles_lease_one_message_of_a_group_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as first, ledgerq.open(path, shared=True) as second:
        first.enqueue_batch([Item(b"a1", group="a"), Item(b"a2", group="a"), b"x"])
        got = first.dequeue_batch(10)
        assert payloads(got) == [b"a1", b"x"]
        assert second.dequeue_batch(10) == []
        first.ack(got[0].id)
        assert payloads(second.dequeue_batch(10)) == [b"a2"]


@pytest.mark.parametrize(
    ("group", "error"),
    [
        (5, TypeError),
        (b"a", TypeError),
        ("", ValueError),
        ("x" * 256, ValueError),
        ("\ud800", ValueError),
    ],
)
def test_a_bad_group_writes_nothing(tmp_path: Path, group: object, error: type) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        check_refused_and_nothing_written(q, "group", group, error)
    # 255 bytes of UTF-8 is the documented limit, in bytes, not characters.
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue(b"x", group="\u00e9" * 127)
        with pytest.raises(ValueError, match="255"):
            q.enqueue(b"x", group="\u00e9" * 128)


def test_a_requeued_dead_letter_comes_back_in_its_group(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=1) as q:
        first = q.enqueue(b"a1", group="a")
        msg = q.dequeue()
        assert msg is not None and msg.id == first
        q.nack(first, "poison")
        dead = q.dlq.peek()
        assert dead[0].headers["dlq.group"] == "a" and dead[0].group is None
        assert q.requeue_dlq() == 1
        back = q.dequeue()
        assert back is not None and (back.payload, back.group) == (b"a1", "a")
        assert "dlq.group" not in back.headers


def _blocked_dequeue(queue: ledgerq.Queue) -> tuple[threading.Thread, list[object]]:
    """A thread blocked in ``queue.dequeue(timeout=None)``; what it got lands in the list."""
    got: list[object] = []

    def wait() -> None:
        try:
            got.append(queue.dequeue(timeout=None))
        except ledgerq.QueueClosedError as exc:
            got.append(exc)

    before = queue._waits.waiting  # type: ignore[attr-defined]
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    wait_until(lambda: queue._waits.waiting > before, 30, "the dequeue to block")  # type: ignore[attr-defined]
    return thread, got


@pytest.mark.parametrize("mode", ["exclusive", "shared", "another handle"])
def test_the_ack_that_frees_a_group_wakes_a_blocked_dequeue(tmp_path: Path, mode: str) -> None:
    # Issue 25: A1, A2 (group a), B1 (group b), U; A1, B1 and U leased, B1 and U acked;
    # a dequeue blocks; ack(A1) made A2 deliverable but woke nobody: the waiter got A2
    # only when its own timeout ran out.
    path = tmp_path / "q"
    shared = mode != "exclusive"
    with contextlib.ExitStack() as stack:
        q = stack.enter_context(ledgerq.open(path, shared=shared))
        acker = (
            stack.enter_context(ledgerq.open(path, shared=True)) if mode == "another handle" else q
        )
        acker.enqueue_batch(
            [Item(b"a1", group="a"), Item(b"a2", group="a"), Item(b"b1", group="b"), b"u"]
        )
        a1, b1, u = acker.dequeue_batch(10)
        assert [a1.payload, b1.payload, u.payload] == [b"a1", b"b1", b"u"]
        acker.ack_batch([b1.id, u.id])
        thread, got = _blocked_dequeue(q)
        acker.ack(a1.id)
        thread.join(30)
        assert not thread.is_alive(), "the ack that freed group a woke no waiter"
        [msg] = got
        assert isinstance(msg, ledgerq.Message) and msg.payload == b"a2"
