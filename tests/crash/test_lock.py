"""The directory lock: one open queue per directory, across processes and inside one.

The lock is an OS lock (flock), so the kernel drops it when the holder dies, kill -9
included; a second open fails at once with QueueLockedError naming the path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerq

from ._harness import Spawn
from ._payload import matches


def test_open_held_by_another_process_raises_then_works_after_kill9(
    tmp_path: Path, spawn: Spawn
) -> None:
    path = tmp_path / "q"
    holder = spawn("hold", path, token_base=0)
    assert holder.line() == "O"
    assert holder.line() == "R"

    with pytest.raises(ledgerq.QueueLockedError) as info:
        ledgerq.open(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ledgerq.LedgerQError)

    # The failed open harmed nothing: the holder goes on working.
    reported: dict[int, int] = {}
    for _ in range(3):
        holder.send("enq")
        kind, n = holder.line().split()  # B <n>, then n lines E <id> <token>
        assert kind == "B"
        for _ in range(int(n)):
            kind, message_id, token = holder.line().split()
            assert kind == "E"
            reported[int(message_id)] = int(token)

    holder.kill_and_drain()  # killed and reaped
    with ledgerq.open(path) as q:  # the OS released the dead holder's lock
        got = q.dequeue_batch(100)
    assert [m.id for m in got] == sorted(reported)
    for msg in got:
        assert matches(msg, reported[msg.id])


def test_other_process_cannot_open_while_held(tmp_path: Path, spawn: Spawn) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue(b"held by the parent")
        child = spawn("tryopen", path)
        line = child.line()
        assert child.wait() == 0
        assert line.startswith("LOCKED "), line
        assert str(path) in line
        assert q.dequeue() is not None  # still ours and working
    child = spawn("tryopen", path)
    assert child.line() == "OPENED"
    assert child.wait() == 0


def test_second_open_in_same_process_raises(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        first = q.enqueue(b"one")
        with pytest.raises(ledgerq.QueueLockedError) as info:
            ledgerq.open(path)
        assert str(path) in str(info.value)
        with pytest.raises(ledgerq.QueueLockedError):
            ledgerq.open(str(path) + "/")  # the same directory spelled differently
        second = q.enqueue(b"two")  # the first handle is unharmed
    with ledgerq.open(path) as q:  # and after close the directory opens again
        assert [m.id for m in q.dequeue_batch(10)] == [first, second]
