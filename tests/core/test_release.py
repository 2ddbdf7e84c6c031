"""``release``: a leased message given back unused - not a failed delivery.

Its next delivery has the same ``attempts``, it moves no closer to the dead-letter
queue, and that holds across a reopen and a crash (the RELEASE journal record undoes
its LEASE's delivery count), through a journal checkpoint between the two, on named
readers, with priorities, in ``ledgerq.aio`` and in a sharded queue.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ledgerq
import ledgerq.aio
from ledgerq.core import reader_handle as reader_module
from ledgerq.format.reader_state import StateRecordType, encode_ids_record
from ledgerq.segment.readonly_state import ReaderState, StateRecords

from .._child import child_environment


def test_a_released_message_comes_back_with_the_same_attempts(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=1) as q:
        first_id = q.enqueue(b"job")
        q.enqueue(b"later")
        for _ in range(5):  # max_retries=1: a single nack would dead-letter it
            msg = q.dequeue()
            assert msg is not None and msg.id == first_id and msg.attempts == 1
            q.release(msg.id)
        msg = q.dequeue()
        assert msg is not None and msg.id == first_id and msg.attempts == 1
        q.ack(msg.id)
        stats = q.stats()
        assert (stats.nacked, stats.dead_lettered, stats.acked) == (0, 0, 1)
        q._check()


def test_release_after_a_nack_keeps_the_failure_that_happened(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=3) as q:
        q.enqueue(b"job")
        msg = q.dequeue()
        assert msg is not None
        q.nack(msg.id, "boom")
        again = q.dequeue()
        assert again is not None and again.attempts == 2
        q.release(again.id)
        third = q.dequeue()
        assert third is not None and third.attempts == 2
        q._check()
    with ledgerq.open(tmp_path / "q") as q:  # the lease open at close is a failure
        msg = q.dequeue()
        assert msg is not None and msg.attempts == 3
        assert q.stats().dead_lettered == 0


def test_release_of_an_id_not_leased_raises(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        message_id = q.enqueue(b"job")
        with pytest.raises(ledgerq.UnknownMessageError, match=f"message {message_id}"):
            q.release(message_id)
        msg = q.dequeue()
        assert msg is not None
        q.ack(msg.id)
        with pytest.raises(ledgerq.UnknownMessageError):
            q.release(msg.id)
        with pytest.raises(TypeError):
            q.release("1")  # type: ignore[arg-type]


def test_a_release_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, max_retries=1) as q:
        q.enqueue(b"job")
        msg = q.dequeue()
        assert msg is not None
        q.release(msg.id)
    with ledgerq.open(path) as q:
        msg = q.dequeue()
        assert msg is not None and msg.attempts == 1
        assert q.stats().dead_lettered == 0


_CRASH_AFTER_RELEASE = """
import os, sys
import ledgerq
q = ledgerq.open(sys.argv[1], max_retries=1, sync="never")
first = q.dequeue()
second = q.dequeue()
q.release(first.id)
if sys.argv[2] == "checkpoint":
    q.compact()  # rewrites the journal as a checkpoint holding both deliveries
    q.release(second.id)
os._exit(0)  # a crash: no close, no final checkpoint
"""


@pytest.mark.parametrize("between", ["plain", "checkpoint"])
def test_a_crash_after_a_release_counts_no_failed_delivery(tmp_path: Path, between: str) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, max_retries=1) as q:
        q.enqueue_batch([b"released", b"held"])
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CRASH_AFTER_RELEASE), str(path), between],
        env=child_environment(),
        check=True,
        timeout=60,
    )
    with ledgerq.open(path) as q:
        got = q.dequeue_batch(10)
        if between == "checkpoint":  # both released: neither lease failed
            assert [(m.payload, m.attempts) for m in got] == [(b"released", 1), (b"held", 1)]
            assert q.stats().dead_lettered == 0
        else:  # the lease still held at the crash failed, and max_retries=1 moved it
            assert [(m.payload, m.attempts) for m in got] == [(b"released", 1)]
            assert q.stats().dead_lettered == 1


def test_named_readers_release_on_their_own(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=1) as q:
        q.enqueue(b"job")
        audit = q.reader("audit")
        mine = audit.dequeue()
        theirs = q.dequeue()
        assert mine is not None and theirs is not None
        audit.release(mine.id)
        with pytest.raises(ledgerq.UnknownMessageError, match="audit"):
            audit.release(mine.id)
        again = audit.dequeue()
        assert again is not None and again.attempts == 1
        assert q.stats().in_flight == 1  # the default reader's lease is untouched
        q._check()


def test_a_released_message_competes_by_priority(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", priorities=True) as q:
        low = q.enqueue(b"low", priority=ledgerq.Priority.LOW)
        high = q.enqueue(b"high", priority=ledgerq.Priority.HIGH)
        msg = q.dequeue()
        assert msg is not None and msg.id == high
        q.release(high)
        order = [m.id for m in q.dequeue_batch(2)]
        assert order == [high, low]


class _Clock:
    """``time`` for the reader handle's module, with a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return time.time_ns()


def test_a_released_lease_leaves_no_deadline_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The next lease of a released message has the attempt number of the released
    # one; the released lease's deadline must not end that lease early.
    clock = _Clock()
    monkeypatch.setattr(reader_module, "time", clock)
    with ledgerq.open(tmp_path / "q", visibility_timeout=10.0) as q:
        q.enqueue(b"job")
        first = q.dequeue()
        assert first is not None
        clock.now += 5
        q.release(first.id)
        second = q.dequeue()  # its lease runs to now + 10
        assert second is not None and second.attempts == 1
        clock.now += 6  # past the released lease's deadline, not this lease's
        assert q.dequeue() is None
        q.ack(second.id)
        assert q.stats().acked == 1


def test_replay_undoes_the_lease_a_release_follows() -> None:
    lease = encode_ids_record(StateRecordType.LEASE, [7, 8])
    release = encode_ids_record(StateRecordType.RELEASE, [7])
    state = ReaderState()
    state.apply(StateRecords(lease + lease + release, 0, "journal"))
    assert state.deliveries == {7: 1, 8: 2}
    assert state.leased == {8}
    state.apply(StateRecords(release, 0, "journal"))
    assert state.deliveries == {8: 2}
    assert state.counters == {}  # a release counts as nothing


def test_aio_release(tmp_path: Path) -> None:
    async def scenario() -> int:
        async with ledgerq.aio.open(tmp_path / "q", max_retries=1) as q:
            await q.enqueue(b"job")
            msg = await q.dequeue()
            assert msg is not None
            await q.release(msg.id)
            reader = await q.reader("r")
            theirs = await reader.dequeue()
            assert theirs is not None
            await reader.release(theirs.id)
            again = await q.dequeue()
            assert again is not None
            return again.attempts

    assert asyncio.run(scenario()) == 1


def test_sharded_release_routes_by_id(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "root", 4, max_retries=1) as q:
        for key in "abcdefgh":
            q.enqueue(key.encode(), key=key)
        taken = q.dequeue_batch(8)
        assert len(taken) == 8
        for msg in taken:
            q.release(msg.id)
        with pytest.raises(ledgerq.UnknownMessageError, match="shard"):
            q.release(taken[0].id)
        again = q.dequeue_batch(8)
        assert sorted(m.id for m in again) == sorted(m.id for m in taken)
        assert {m.attempts for m in again} == {1}
        assert q.stats().dead_lettered == 0


def test_a_journal_is_version_3_from_its_first_record_and_holds_a_release(
    tmp_path: Path,
) -> None:
    """Format 2: every journal is version 3 (CRC-32C, RELEASE allowed) - an older ledgerq
    refuses it by its version.  (A version 2 journal of format 1 holding a RELEASE is read:
    tests/format/test_v1_fixture.py.)"""
    path = tmp_path / "q"
    journal = path / "readers" / "default.state"
    with ledgerq.open(path) as q:
        q.enqueue(b"m")
        assert journal.read_bytes()[4:8] == b"\x03\x00\x00\x00"
        message = q.dequeue()
        assert message is not None
        q.release(message.id)
        assert journal.read_bytes()[4:8] == b"\x03\x00\x00\x00"
    assert journal.read_bytes()[4:8] == b"\x03\x00\x00\x00"
    with ledgerq.open(path) as q:
        again = q.dequeue()
        assert again is not None and again.attempts == 1
