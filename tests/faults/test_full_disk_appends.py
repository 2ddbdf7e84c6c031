"""A write cut short by a full disk never stays in the middle of a file (issue 15 item 1).

On a full disk ``write()`` stores what fits and fails on the rest.  If those bytes
stayed, the next append - once space was freed - would land after them, and a reopen
would meet a torn record with good records after it: damage, not a torn tail.  Each
test here fills a real disk (a tmpfs) until an append of one kind of file fails,
frees space, appends more, crashes (a child process ending with ``os._exit``), and
reopens: the queue must open, and nothing acknowledged may be lost or come back.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from ledgerq import tools
from ledgerq.features.dlq.retries import RetryTracker
from ledgerq.format.feature_state import decode_feature_file
from ledgerq.segment.index_file import load_index
from ledgerq.segment.scanner import entry_id_at
from tests.faults._shim import Interposer
from tests.realfs import SmallDisk, crash_child

_EVERYTHING = 1 << 20


def _drain(path: Path, **options: Any) -> list[int]:
    """Reopen the queue at ``path`` and dequeue+ack everything; the ids, in order."""
    got = []
    with ledgerq.open(path, **options) as q:
        while (message := q.dequeue()) is not None:
            got.append(message.id)
            q.ack(message.id)
    return got


def test_reader_journal_full_disk_then_crash(small_disk: SmallDisk) -> None:
    # The reproduction: dequeue+ack on a full disk until the reader state
    # cannot be written, free space, ack more, crash.  Before the fix the reopen raised
    # "reader state record checksum mismatch at offset 4090" (the torn record stayed).
    reports = crash_child(
        small_disk.path,
        """
        q = ledgerq.open(ARGS["queue"], segment_size=256 * 1024)
        ids = q.enqueue_batch([b"m" * 100] * 2000)
        report("enqueued", ids)
        Path(ARGS["queue"], "reserve").unlink()  # as if the disk reserve were spent
        disk.fill()
        acked = []
        failures = 0
        while failures == 0:
            try:
                message = q.dequeue()
                q.ack(message.id)
                acked.append(message.id)
            except ledgerq.StorageError:
                failures += 1
        disk.free()
        for message in q.dequeue_batch(100):
            q.ack(message.id)
            acked.append(message.id)
        report("acked", acked)
        """,
        queue=str(small_disk.path / "q"),
    )
    results = dict(reports)
    enqueued, acked = results["enqueued"], results["acked"]
    assert len(acked) > 100  # the disk filled after some acks, not at once
    rest = _drain(small_disk.path / "q")
    assert not set(rest) & set(acked), "an acked message came back"
    assert sorted(rest + acked) == enqueued, "a message was lost"


class _TornWriteUncut(Interposer):
    """Cut the next write to a file ending in ``suffix`` short (half of it lands, then
    ENOSPC), and fail every ``ftruncate`` of that file with EIO until :meth:`heal`.

    A real disk cannot be made to refuse the cut of a torn write on cue (shrinking a
    file needs no space), so this one fault is injected.
    """

    def __init__(self, root: Path, suffix: str) -> None:
        super().__init__(root)
        self.suffix = suffix
        self.armed = False
        self.healed = False
        self.torn = 0

    def around(self, name: str, path: str, call: Callable[[], Any], args: tuple[Any, ...]) -> Any:
        if not path.endswith(self.suffix) or self.healed:
            return call()
        if name == "ftruncate" and self.torn:
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        if self.armed and name in ("write", "writev"):
            self.armed = False
            self.torn += 1
            data = b"".join(bytes(b) for b in args[1]) if name == "writev" else bytes(args[1])
            self.real["write"](args[0], data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return call()

    def heal(self) -> None:
        self.healed = True


def test_reader_journal_refuses_appends_after_a_cut_that_failed(tmp_path: Path) -> None:
    # The last line of defence: when even the cut of a torn record fails, nothing is
    # appended after it - the journal raises until a cut succeeds.
    path = tmp_path / "q"
    fault = _TornWriteUncut(path, ".state")
    with fault.installed():
        q = ledgerq.open(path)
        ids = q.enqueue_batch([b"m"] * 4)
        leased = [q.dequeue() for _ in ids]
        fault.armed = True
        with pytest.raises(ledgerq.StorageError):
            q.ack(ids[0])
        with pytest.raises(ledgerq.StorageError, match="cut back a failed write"):
            q.ack(ids[1])  # refused: it would land after the torn half
        fault.heal()
        for message in leased:
            assert message is not None
            q.ack(message.id)  # the first two again: neither was acked
        q.close()
    assert _drain(path) == []


def test_segment_refuses_appends_after_a_cut_that_failed(tmp_path: Path) -> None:
    # The same rule for the segment log: before, SegmentManager._undo logged a failed
    # cut and the next enqueue was written after the torn entry; recovery then took
    # the torn bytes for the end of the log and cut every message after them.
    path = tmp_path / "q"
    fault = _TornWriteUncut(path, ".log")
    with fault.installed():
        q = ledgerq.open(path)
        first = q.enqueue(b"before")
        fault.armed = True
        with pytest.raises(ledgerq.StorageError):
            q.enqueue(b"torn" * 100)
        with pytest.raises(ledgerq.StorageError, match="cut back a failed append"):
            q.enqueue(b"refused")
        fault.heal()
        after = [q.enqueue(b"after"), q.enqueue_batch([b"batch"] * 3)]
        q.close()
    got = _drain(path)
    assert got[0] == first
    assert got[1:] == [after[0], *after[1]]


def test_segment_log_full_disk_then_crash(small_disk: SmallDisk) -> None:
    # Segment appends cut a failed write back (they did before this issue too); the
    # messages enqueued after the disk was freed must all be there after the crash.
    reports = crash_child(
        small_disk.path,
        """
        q = ledgerq.open(ARGS["queue"], segment_size=64 * 1024)
        returned = q.enqueue_batch([b"a" * 300] * 50)
        disk.fill()
        refused = 0
        for i in range(200):
            try:
                returned.append(q.enqueue(b"b" * (i * 37 % 900)))
            except ledgerq.StorageError:
                refused += 1
        try:
            returned.extend(q.enqueue_batch([b"c" * 500] * 20))
        except ledgerq.StorageError:
            refused += 1
        disk.free()
        returned.extend(q.enqueue_batch([b"d" * 200] * 30))
        returned.append(q.enqueue(b"e"))
        report(returned, refused)
        """,
        queue=str(small_disk.path / "q"),
    )
    [[returned, refused]] = reports
    assert refused > 0
    assert _drain(small_disk.path / "q") == returned


def test_open_index_full_disk_then_crash(small_disk: SmallDisk) -> None:
    # The open segment's sparse index grows by appends too.  A point cut short by the
    # full disk stayed, and every later point was written after it, shifted: the index
    # read as damaged, and the next open (and every lock-free reader) scanned the
    # segment from its start.  Now the torn point is cut back.
    queue = small_disk.path / "q"
    crash_child(
        small_disk.path,
        """
        q = ledgerq.open(ARGS["queue"], index_interval=1)  # a point for every entry
        seg = Path(ARGS["queue"]) / "segments" / f"{1:020d}"
        log, idx = Path(f"{seg}.log"), Path(f"{seg}.idx")
        # Leave the index a few points short of a page, the log a page of room, so that
        # on a full disk the index fills first, in the middle of a point.
        while not 2 * 24 <= -idx.stat().st_size % 4096 < 8 * 24:
            q.enqueue(b"s")
        before = log.stat().st_size
        q.enqueue(b"")
        overhead = log.stat().st_size - before
        q.enqueue(b"p" * ((64 - log.stat().st_size - overhead) % 4096))
        assert log.stat().st_size % 4096 == 64
        disk.fill()
        for _ in range(30):
            q.enqueue(b"s")  # all fit in the log's last page
        disk.free()
        for _ in range(30):
            q.enqueue(b"t")
        """,
        queue=str(queue),
    )
    idx = queue / "segments" / f"{1:020d}.idx"
    points, sealed = load_index(str(idx))  # before the fix: "index entries out of order"
    assert not sealed
    with open(queue / "segments" / f"{1:020d}.log", "rb") as log:
        for point in points:
            assert entry_id_at(log.fileno(), point.offset, os.fstat(log.fileno()).st_size) == (
                point.id
            )
    assert len(_drain(queue)) == points[-1].id


def test_retry_log_full_disk_then_crash(small_disk: SmallDisk) -> None:
    # features/retries.log: a failure record cut short by the full disk is cut back,
    # and later records land where a reader finds them.  (Before, the torn record
    # stayed - skipped as damage at load - and the nack that wrote it raised although
    # its failure was recorded.)
    queue = small_disk.path / "q"
    reports = crash_child(
        small_disk.path,
        """
        import logging
        warnings = []
        handler = logging.Handler()
        handler.emit = lambda record: warnings.append(record.getMessage())
        logging.getLogger("ledgerq").addHandler(handler)
        q = ledgerq.open(ARGS["queue"], max_retries=1000)
        [message_id] = q.enqueue_batch([b"job"])
        disk.fill()
        while not any("retry" in w for w in warnings):
            message = q.dequeue()
            if message is None:  # the dequeue before refused: nothing leased
                continue
            try:
                q.nack(message.id, "r" * 1000)
            except ledgerq.StorageError:  # the journal refused: the lease stays
                disk.free()
                q.nack(message.id, "r" * 1000)
                disk.fill()
        disk.free()
        for n in range(3):
            q.nack(q.dequeue().id, f"after-{n}")
        report(message_id)
        """,
        queue=str(queue),
    )
    [[message_id]] = reports
    data = (queue / "features" / "retries.log").read_bytes()
    assert decode_feature_file(data, b"LQRT").damaged == 0
    tracker = RetryTracker(str(queue / "features" / "retries.log"))
    try:
        last = tracker.last("default", message_id)
        assert last is not None and last[1] == "after-2"
    finally:
        tracker.close()


def test_dedup_log_full_disk_then_crash(small_disk: SmallDisk) -> None:
    # features/dedup.log: a record cut short is cut back, and the records of the dedup
    # ids enqueued once space is back are written as usual.  (Before, after one failed
    # record no other was written until a sync: a crash forgot every later dedup id.)
    queue = small_disk.path / "q"
    reports = crash_child(
        small_disk.path,
        """
        q = ledgerq.open(ARGS["queue"], dedup_window=3600.0)
        for i in range(20):
            q.enqueue(b"a", dedup_id=f"a{i}")
        disk.fill()
        for i in range(400):  # the segment's and dedup.log's last pages fill in turn
            try:
                q.enqueue(b"", dedup_id=f"b{i}")
            except ledgerq.StorageError:
                pass
        disk.free()
        report({f"c{i}": q.enqueue(b"c", dedup_id=f"c{i}") for i in range(20)})
        """,
        queue=str(queue),
    )
    [[after]] = reports
    data = (queue / "features" / "dedup.log").read_bytes()
    assert decode_feature_file(data, b"LQDD").damaged == 0
    with ledgerq.open(queue) as q:
        for dedup_id, message_id in after.items():
            assert q.enqueue(b"again", dedup_id=dedup_id) == message_id, dedup_id


def test_shipped_copy_full_destination_then_crash(small_disk: SmallDisk, tmp_path: Path) -> None:
    # ship's destination segments grow by appends too, and a hub's disk fills like any
    # other.  A pass that failed on the full destination left the bytes that fitted; the
    # next pass of the same shipper appended after them, so the copy held damage in the
    # middle (skipped by its readers: those messages were missing at the hub).
    source = tmp_path / "src"
    with ledgerq.open(source, segment_size=512 * 1024) as q:
        ids = q.enqueue_batch([bytes([i % 251]) * 1000 for i in range(3000)])
    reports = crash_child(
        small_disk.path,
        """
        from ledgerq.ship import Shipper
        shipper = Shipper(ARGS["source"], ARGS["hub"], "edge")
        shipper.open()
        disk.fill(leave_bytes=1_000_000)
        try:
            shipper.ship_pass()
            failed = False
        except OSError as exc:
            failed = isinstance(exc, ledgerq.StorageError) and ARGS["hub"] in str(exc)
        disk.free()
        shipper.ship_pass()
        report(failed, shipper.last_id)
        """,
        source=str(source),
        hub=str(small_disk.path / "hub"),
    )
    [[failed, last_id]] = reports
    assert last_id == ids[-1]
    copy = small_disk.path / "hub" / "edge.src"
    report = tools.verify(copy)
    assert report.ok, report.problems
    shipped = [(m.id, m.payload) for m in tools.iter_messages(copy)]
    assert shipped == [(i, bytes([(i - 1) % 251]) * 1000) for i in ids]
    assert failed, "the full destination did not refuse the pass with a StorageError"


def test_unique_table_that_cannot_grow_on_a_full_disk(small_disk: SmallDisk) -> None:
    """The unique keys' table is mapped: its room is allocated before a record is stored
    into it, so a full disk is the enqueue's error (nothing written, the key not held),
    never a SIGBUS at the store - and once there is room the same enqueue works."""
    path = small_disk.path / "q"
    first_room = (64 * 1024 - 64) // 40  # the records the new file has room for
    with ledgerq.open(path) as q:
        ids = [q.enqueue(b"job", unique_key=f"k{n}") for n in range(first_room)]
        small_disk.fill()
        with pytest.raises(ledgerq.StorageError) as failed:
            q.enqueue(b"job", unique_key="one more")  # the table must grow
        assert failed.value.errno == errno.ENOSPC
        assert len(q) == first_room
        small_disk.free()
        again = q.enqueue(b"job", unique_key="one more")
        assert again == ids[-1] + 1, "the failed enqueue took no id"
        assert q.enqueue(b"job", unique_key="one more") == again
    with ledgerq.open(path) as q:
        assert [q.enqueue(b"job", unique_key=f"k{n}") for n in range(first_room)] == ids
        assert q.enqueue(b"job", unique_key="one more") == again
        assert len(q) == first_room + 1
