"""Shared mode on a full disk: one disk reserve for every handle (docs/reliability.md).

The queue's ``reserve`` file keeps the last 32 KiB of a full disk for acks, which free
space.  In shared mode any handle may spend it (its ack met the full disk), and from
then on *every* handle's enqueues refuse until it is back - else another handle's
enqueues would take the room meant for the drain.  The state page's ``reserve_spent``
word tells them.  Every disk here is a real tmpfs filled to its last byte.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import ledgerq
from ledgerq.format.feature_state import decode_feature_file
from ledgerq.format.shared_state import SLOT_RESERVE_SPENT, SLOT_WRITING
from tests._child import Children
from tests.realfs import SmallDisk, can_mount, drain_until_enqueue_works, fill_with_messages

from ._procs import start
from ._worker import payload


def _spent(q: ledgerq.Queue) -> int:
    return q._page.get(SLOT_RESERVE_SPENT)  # type: ignore[attr-defined, no-any-return]


def _ack_until_reserve_spent(q: ledgerq.Queue, reserve: Path) -> list[int]:
    """Dequeue and ack with ``q`` until its acks spent the disk reserve; return the ids."""
    drained: list[int] = []
    while reserve.exists():
        message = q.dequeue()
        assert message is not None and len(drained) < 100
        q.ack(message.id)
        drained.append(message.id)
    return drained


def test_a_reserve_spent_by_one_handle_stops_every_handles_enqueues(
    small_disk: SmallDisk,
) -> None:
    path = small_disk.path / "q"
    reserve = path / "reserve"
    a = ledgerq.open(path, shared=True, segment_size=256 * 1024)
    b = ledgerq.open(path, shared=True, segment_size=256 * 1024)
    try:
        ids = fill_with_messages(a, small_disk)
        assert reserve.exists() and not _spent(b)
        # a's acks meet the full disk (once its journal needs a new page): a spends the
        # reserve, for the whole queue.
        drained = _ack_until_reserve_spent(a, reserve)
        assert _spent(b)
        # b never met the full disk, and the reserve's room is free now: still, the room
        # is for acks - b refuses, writing nothing.
        with pytest.raises(ledgerq.StorageError, match="No space left"):
            b.enqueue(b"refused")
        # Both drain (b's acks through the spent reserve too) until retention deleted
        # segments: then b's enqueue writes the reserve again and goes through.
        new_id = drain_until_enqueue_works([a, b], b, drained)
        assert new_id > ids[-1]
        assert reserve.stat().st_size == 32 * 1024 and not _spent(a)
        assert a.enqueue(b"a again") == new_id + 1, "and a learned it is back"
    finally:
        a.close()
        b.close()
    with ledgerq.open(path) as q:
        rest = [m.id for m in q.peek(len(ids) + 3)]
    assert drained + rest == [*ids, new_id, new_id + 1]


def test_a_read_on_a_full_disk_keeps_the_reserve(small_disk: SmallDisk) -> None:
    # The close of a handle that changed nothing writes nothing (exclusive mode's rule):
    # neither a joining handle's close nor the last one's spends the reserve.
    path = small_disk.path / "q"
    with ledgerq.open(path, shared=True, segment_size=256 * 1024) as q:
        ids = q.enqueue_batch([b"x" * 1000] * 2000)
    small_disk.fill()
    assert small_disk.is_full()
    assert (path / "reserve").stat().st_size == 32 * 1024
    a = ledgerq.open(path, shared=True)
    with ledgerq.open(path, shared=True) as b:
        assert b.stats().pending == len(ids)
        assert [m.id for m in b.peek(2)] == ids[:2]
    assert a.stats().pending == len(ids)
    a.close()
    assert (path / "reserve").stat().st_size == 32 * 1024
    assert small_disk.is_full()


def test_a_retry_reason_cut_back_on_a_full_disk_keeps_the_others_records(
    small_disk: SmallDisk,
) -> None:
    # retries.log is appended by every handle; a record a full disk cut short is cut
    # back to where this handle thinks the file ends - which must take in the records
    # other handles appended since, or the cut takes them away too.
    path = small_disk.path / "q"
    a = ledgerq.open(path, shared=True, max_retries=5)
    b = ledgerq.open(path, shared=True, max_retries=5)
    try:
        a.enqueue_batch([b"1", b"2"])
        mine, theirs = a.dequeue(), b.dequeue()
        assert mine is not None and theirs is not None
        b.nack(theirs.id, "b's reason")
        small_disk.fill()
        a.nack(mine.id, "a" * 5000)  # (the nack stands: only its reason is not written)
        small_disk.free()
    finally:
        a.close()
        b.close()
    data = (path / "features" / "retries.log").read_bytes()
    found = decode_feature_file(data, b"LQRT")
    assert ["default", theirs.id] in [value[:2] for value in found.values]
    assert found.end == len(data) and not found.damaged


def test_another_process_learns_that_the_reserve_is_spent_and_back(
    small_disk: SmallDisk, children: Children
) -> None:
    path = small_disk.path / "q"
    reserve = path / "reserve"
    with ledgerq.open(path, shared=True, segment_size=256 * 1024) as a:
        other = start(children, "hold", path, "segment_size=262144")
        ids = fill_with_messages(a, small_disk)
        _ack_until_reserve_spent(a, reserve)
        other.send("enq 1")
        refused = other.line()  # (its one answer: "E <id>" had it enqueued)
        assert refused.startswith("X StorageError") and "No space left for messages" in refused
        # a drains until retention made room and its enqueue wrote the reserve
        new_id = drain_until_enqueue_works([a], a, [], payload(0))
        assert reserve.exists() and new_id > ids[-1]
        other.send("enq 2")
        assert other.line() == f"E {new_id + 1} 2", "the other process enqueues again"
        other.send("close")
        other.wait_for("BYE")


def test_a_handle_drains_through_a_reserve_another_one_spent(small_disk: SmallDisk) -> None:
    # b never met the full disk itself: it learns from the page that the reserve is
    # spent and compacts its journal every few KiB, as the handle that spent it does -
    # else its acks fill the freed room and fail long before retention frees a segment.
    path = small_disk.path / "q"
    reserve = path / "reserve"
    a = ledgerq.open(path, shared=True, segment_size=1 << 20)
    b = ledgerq.open(path, shared=True, segment_size=1 << 20)
    try:
        ids = fill_with_messages(a, small_disk)
        drained = _ack_until_reserve_spent(a, reserve)
        # b alone drains, until retention made room for its enqueue
        new_id = drain_until_enqueue_works([b], b, drained)
        assert drained == ids[: len(drained)] and new_id > ids[-1]
    finally:
        a.close()
        b.close()


def test_a_rotation_the_full_disk_failed_is_finished_once_there_is_room(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 25: the disk filled as the active segment filled; the rotation failed after
    # the append (logged, the enqueue returned) and closed the handle's writer; the next
    # enqueue of that handle, once the disk had room, raised a bare AssertionError from
    # the seal (``assert fd is not None``) and left the ``writing`` word set.  Each disk
    # here leaves a little more room before it is full, so that the rotation meets it at
    # one of its steps (the sealed index, the next file).
    reason = can_mount()
    if reason is not None:
        pytest.skip(reason)
    disk = SmallDisk(tmp_path / "disk", 2 * 1024 * 1024)
    failed_rotations = 0
    try:
        for leave_kib in range(252, 276, 2):
            path = disk.path / f"q{leave_kib}"
            caplog.clear()
            with (
                ledgerq.open(path, shared=True, segment_size=256 * 1024) as a,
                ledgerq.open(path, shared=True, segment_size=256 * 1024) as b,
            ):
                disk.fill(leave_bytes=leave_kib * 1024)
                refused = 0
                while refused < 3:
                    try:
                        a.enqueue(b"x" * 1000)
                    except ledgerq.StorageError:
                        refused += 1
                    assert not a._page.get(SLOT_WRITING), "a call left the writing word set"  # type: ignore[attr-defined]
                failed_rotations += "could not finish a segment rotation" in caplog.text
                disk.free()
                first, second = a.enqueue(b"room again"), b.enqueue(b"room again")
                assert second == first + 1
                assert not a._page.get(SLOT_WRITING)  # type: ignore[attr-defined]
            shutil.rmtree(path)
    finally:
        disk.unmount()
    assert failed_rotations, "no rotation met the full disk: the test tests nothing"
