"""A call that raised must not have happened (issue 15 item 3).

Either a call's change happens and the call returns - a failing optional step after
it (journal compaction, retention, finishing a rotation, a DLQ move that can wait)
is logged and tried again later - or it raises and nothing changed, in memory and on
disk.  Each test makes a call fail on a real full disk (a tmpfs) and then looks at
what a user sees: ``stats()``, a dequeue, a retry of the same call, a reopen.  The
few steps a real disk cannot be made to refuse on cue (deleting a file, a rename) are
injected (``tests/faults/_inject.py``).
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import ledgerq
from ledgerq.core import journal
from tests.clocks import SteppedClock
from tests.faults._inject import Fault, FaultInjector
from tests.realfs import SmallDisk


def _compact_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let reader journals want compaction after a few hundred bytes, not 1 MiB."""
    monkeypatch.setattr(journal, "_COMPACT_MIN_BYTES", 256)


def _spend_reserve(disk: SmallDisk) -> None:
    """Fill the disk as if the queue's disk reserve (docs/reliability.md) were spent
    already: the journal itself then meets the full disk."""
    (disk.path / "q" / "reserve").unlink()
    disk.fill()


def test_a_dequeue_that_raised_holds_no_lease(
    small_disk: SmallDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dequeue whose LEASE was written but whose journal compaction failed raised with
    # the lease held: in_flight counted it, and after a crash it was a failed delivery.
    _compact_early(monkeypatch)
    with ledgerq.open(small_disk.path / "q") as q:
        ids = q.enqueue_batch([b"m"] * 60)
        _spend_reserve(small_disk)
        leased: list[ledgerq.Message] = []
        raised = 0
        for _ in range(60):
            try:
                message = q.dequeue()
            except ledgerq.StorageError:
                raised += 1
            else:
                assert message is not None
                leased.append(message)
            assert q.stats().in_flight == len(leased)
        small_disk.free()
        while (message := q.dequeue()) is not None:
            leased.append(message)
        assert sorted(m.id for m in leased) == ids  # each delivered once, none kept back
        assert {m.attempts for m in leased} == {1}


def test_an_ack_that_raised_can_be_retried(
    small_disk: SmallDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An ack whose ACK was written but whose compaction failed raised, and a retry got
    # UnknownMessageError: the ack had happened.
    _compact_early(monkeypatch)
    with ledgerq.open(small_disk.path / "q") as q:
        q.enqueue_batch([b"m"] * 60)
        leased = q.dequeue_batch(60)
        _spend_reserve(small_disk)
        failed = []
        for message in leased:
            try:
                q.ack(message.id)
            except ledgerq.StorageError:
                failed.append(message.id)
        assert q.stats().acked == len(leased) - len(failed)
        assert q.stats().in_flight == len(failed)
        small_disk.free()
        for message_id in failed:
            q.ack(message_id)  # still leased: the ack that raised did not happen
        assert q.stats().acked == len(leased)
        assert q.dequeue() is None


def test_a_nack_whose_move_to_the_dlq_failed_returns(small_disk: SmallDisk) -> None:
    # The NACK record was written, then the DLQ (full) refused the copy: the nack raised,
    # and a retry got UnknownMessageError.  Now the nack returns; the message is held
    # back - never delivered - and moved as soon as the DLQ takes it.
    with ledgerq.open(small_disk.path / "q", max_retries=1) as q:
        q.dlq.stats()  # the DLQ exists: its first entry needs a page of the disk
        message_id = q.enqueue(b"poison")
        leased = q.dequeue()
        assert leased is not None
        small_disk.fill()
        q.nack(message_id, "it failed")
        assert q.stats().nacked == 1
        assert q.stats().in_flight == 0
        with pytest.raises(ledgerq.StorageError):
            q.dequeue()  # the move is tried again first, and fails: nothing is leased
        assert q.stats().in_flight == 0
        small_disk.free()
        assert q.dequeue() is None  # moved now
        [dead] = q.dlq.peek(5)
        assert dead.headers["dlq.original_id"] == str(message_id)
        assert dead.headers["dlq.failure_reason"] == "it failed"


def test_a_failed_move_does_not_hold_up_other_messages(small_disk: SmallDisk) -> None:
    with ledgerq.open(small_disk.path / "q", max_retries=1) as q:
        q.dlq.stats()
        poison, good = q.enqueue(b"poison"), q.enqueue(b"good")
        first = q.dequeue()
        assert first is not None and first.id == poison
        small_disk.fill()
        q.nack(poison, "it failed")
        message = q.dequeue()  # the move fails: the next message is delivered meanwhile
        assert message is not None and message.id == good
        q.ack(good)
        small_disk.free()
        assert q.dequeue() is None
        assert [m.headers["dlq.original_id"] for m in q.dlq.peek(5)] == [str(poison)]


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
def test_leases_timed_out_together_whose_move_to_the_dlq_failed(
    small_disk: SmallDisk, shared: bool
) -> None:
    # Two leases time out at once and their failures call for the DLQ, which the full
    # disk refuses: each is held back (never delivered, no longer in flight) and moved
    # once there is room.  (The shared reader said so to the others - RECLAIM - then
    # let the first failed move escape, the second lease still held here.)
    clock = SteppedClock()
    path = small_disk.path / "q"
    with ledgerq.open(path, shared=shared, max_retries=1, visibility_timeout=10, clock=clock) as q:
        q.dlq.stats()
        first, second = q.enqueue(b"a"), q.enqueue(b"b")
        assert [q.dequeue().id, q.dequeue().id] == [first, second]  # type: ignore[union-attr]
        small_disk.fill()
        clock.elapse(11)
        with pytest.raises(ledgerq.StorageError):
            q.dequeue()  # both timed out: held back, and their moves, tried first, fail
        assert q.stats().in_flight == 0
        small_disk.free()
        assert q.dequeue() is None  # moved now
        moved = sorted(int(m.headers["dlq.original_id"]) for m in q.dlq.peek(5))
        assert moved == [first, second]
        assert q.stats().dead_lettered == 2


def test_an_enqueue_whose_rotation_failed_returned(small_disk: SmallDisk) -> None:
    # The entry fitted in the log's last page, then sealing the full segment needed a
    # new file (its sealed index) the full disk refused: the enqueue raised, yet its
    # message was there and was delivered.
    segment_size = 3 * 4096 + 3600
    path = small_disk.path / "q"
    with ledgerq.open(path, segment_size=segment_size) as q:
        log = path / "segments" / f"{1:020d}.log"
        ids = []
        while log.stat().st_size < segment_size - 400:
            ids.append(q.enqueue(b"x" * 100))
        small_disk.fill()
        ids.append(q.enqueue(b"y" * 500))  # fits in the page, crosses segment_size
        assert q.stats().pending == len(ids)
        small_disk.free()
        ids.append(q.enqueue(b"z"))  # finishes the rotation
        assert q.stats().segments == 2
    with ledgerq.open(path) as q:
        assert [m.id for m in q.peek(1000)] == ids


def test_a_purge_that_raised_keeps_the_message(small_disk: SmallDisk) -> None:
    # purge of a message given back by a nack dropped it from memory before its ACK
    # record failed: not pending, not delivered, until a reopen brought it back.
    with ledgerq.open(small_disk.path / "q") as q:
        ids = q.enqueue_batch([b"m"] * 200)
        leased = q.dequeue_batch(200)
        target = leased[0].id
        q.nack(target)  # held available again
        _spend_reserve(small_disk)
        for message in leased[1:]:
            try:
                q.ack(message.id)
            except ledgerq.StorageError:
                break  # the journal cannot grow: every record fails now
        else:
            raise AssertionError("the journal never filled the disk")
        pending = q.stats().pending
        with pytest.raises(ledgerq.StorageError):
            q.purge([target])
        assert q.stats().pending == pending
        assert target in [m.id for m in q.peek(5)]
        small_disk.free()
        assert q.purge([target]) == 1
        assert target not in [m.id for m in q.peek(len(ids))]


def test_a_requeue_that_raised_leaves_each_message_in_one_queue(tmp_path: Path) -> None:
    # The copies were written into the queue, then settling the originals in the DLQ
    # failed: the requeue raised with every message in both queues.  Now the copies are
    # taken back.  (A disk that refuses the DLQ's journal but not the queue's log cannot
    # be made to order: the fault is injected.)
    path = tmp_path / "q"
    injector = FaultInjector(path)
    with injector.installed(), ledgerq.open(path) as q:
        for n in range(5):
            q.dlq.enqueue(b"dead %d" % n, headers={"dlq.original_id": str(n)})
        injector.arm(Fault("write", 3, errno.EIO, match="dlq/readers/default.state"))
        with pytest.raises(ledgerq.StorageError) as raised:
            q.requeue_dlq()
        assert "moved 2 of 5" in "".join(raised.value.__notes__)
        injector.clear()
        main = [m.payload for m in q.peek(10)]
        dead = [m.payload for m in q.dlq.peek(10)]
        assert sorted(main + dead) == [b"dead %d" % n for n in range(5)]
        assert q.requeue_dlq() == 3
        assert sorted(m.payload for m in q.peek(10)) == [b"dead %d" % n for n in range(5)]


def test_an_ack_returns_when_retention_cannot_delete_a_segment(tmp_path: Path) -> None:
    # Retention after an ack deletes consumed segments: a deletion the disk refuses is
    # housekeeping, tried again later - not an error of the ack, which happened.
    path = tmp_path / "q"
    injector = FaultInjector(path)
    with injector.installed(), ledgerq.open(path, segment_size=300) as q:
        ids = [q.enqueue(b"m" * 100) for _ in range(6)]
        leased = q.dequeue_batch(6)
        injector.arm(Fault("unlink", 1, errno.EIO, match=".log"))
        for message in leased:
            q.ack(message.id)
        assert injector.fired == 1
        injector.clear()
        assert q.stats().acked == len(ids)
        q.compact()  # tried again: deleted now
        assert q.stats().segments == 1


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
def test_compact_on_a_full_disk_frees_space_before_it_checkpoints(
    small_disk: SmallDisk, shared: bool
) -> None:
    # Consumed segments kept by retention_max_age, a full disk, then the age passes:
    # compact() deletes them first, and the checkpoints it writes after fit in the space
    # that freed.  (Shared mode checkpointed first, and raised StorageError.)
    clock = SteppedClock()
    path = small_disk.path / "q"
    with ledgerq.open(
        path, shared=shared, segment_size=16 * 1024, retention_max_age=60, clock=clock
    ) as q:
        for _ in range(100):
            q.enqueue(bytes(1000))
        while (msg := q.dequeue()) is not None:
            q.ack(msg.id)
        segments = q.stats().segments
        assert segments > 2  # consumed, kept for their age
        (path / "reserve").unlink()  # the disk reserve spent already: nothing to fall back on
        small_disk.fill()
        clock.elapse(61)
        q.compact()
        assert q.stats().segments < segments
    with ledgerq.open(path, shared=shared, clock=clock) as q:
        assert q.dequeue() is None
        assert q.stats().acked == 100
