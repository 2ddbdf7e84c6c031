"""Shared mode under faults: a process dying mid-append, corrupt records, a full disk.

What one process leaves behind must never stop the others: a torn append is cut by
the next appender (it held the lock and died: nothing will complete it), a corrupt
record is skipped and counted once for the whole queue, and a full disk fails the
call that met it - in its own process - and nothing else.
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

import ledgerq
from ledgerq import StorageError
from ledgerq.format.entry import encode_plain_entry
from ledgerq.format.shared_state import SLOT_WRITING
from tests._child import Children
from tests.realfs import SmallDisk

from ._procs import Reports, start, wait_until
from ._worker import payload, token_of


def drain(q: ledgerq.Queue) -> list[ledgerq.Message]:
    got = []
    while (msg := q.dequeue()) is not None:
        q.ack(msg.id)
        got.append(msg)
    return got


def active_log(path: Path) -> Path:
    return sorted((path / "segments").glob("*.log"))[-1]


_DIE_MID_APPEND = """
import os, sys, time, ledgerq
from ledgerq.format.entry import encode_plain_entry
from ledgerq.format.shared_state import SLOT_WRITING
q = ledgerq.open(sys.argv[1], shared=True)
manager = q._manager
manager.begin_append()  # the append lock, the writing word set
seg = manager.segments[-1]
record = encode_plain_entry(manager.next_id, time.time_ns(), b"never finished" * 100)
os.write(os.open(seg.log_path, os.O_WRONLY | os.O_APPEND), record[: len(record) // 2])
print("TORN", flush=True)
time.sleep(60)  # killed here, the lock held, half an entry written
"""


def test_a_process_killed_mid_append_leaves_nothing_that_blocks_the_others(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        first = q.enqueue(b"before")
        dying = children.start(["-c", _DIE_MID_APPEND, str(path)])
        assert dying.line() == "TORN"
        size_with_torn_bytes = active_log(path).stat().st_size
        dying.kill_and_drain()
        # The next appender finds the writing word set: it cuts the torn entry, goes on.
        second = q.enqueue(b"after")
        assert second == first + 1, "the torn entry's id is not skipped: it never existed"
        assert active_log(path).stat().st_size < size_with_torn_bytes + len(b"after") + 64
        assert [m.payload for m in drain(q)] == [b"before", b"after"]
        assert q._page.get(SLOT_WRITING) == 0  # type: ignore[attr-defined]
    assert [m.id for m in ledgerq.follow(path, timeout=0.05)] == [first, second]


def test_appenders_killed_at_random_moments(tmp_path: Path, children: Children) -> None:
    """Big batches (a write() takes milliseconds): kills land inside appends."""
    path = tmp_path / "q"
    rng = random.Random(7)
    options = ("sync='never'", "segment_size=4194304", "batch=8", "size=300000")
    with ledgerq.open(path, shared=True, segment_size=4 << 20) as q:
        done: list[Reports] = []
        for round_number in range(6):
            writer = Reports(
                start(children, "produce", path, *options, f"base={round_number * 10_000}")
            )
            wait_until(lambda w=writer: w.count() >= rng.randint(2, 12), 30, "some appends")
            writer.stop()
            done.append(writer)
            q.enqueue(b"survivor %d" % round_number)  # the others go on at once
        returned = {int(i): int(t) for r in done for i, t in r.kinds("E")}
        got = drain(q)
    ids = [m.id for m in got]
    assert ids == sorted(set(ids)), "ids unique and increasing"
    assert set(returned) <= set(ids), "a returned enqueue was lost"
    for msg in got:
        if msg.id in returned:
            assert token_of(msg.payload) == returned[msg.id]
    assert sum(1 for m in got if m.payload.startswith(b"survivor")) == 6


def test_a_corrupt_record_is_skipped_and_counted_once_by_all(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    a = ledgerq.open(path, shared=True)
    b = ledgerq.open(path, shared=True)
    try:
        ids = [*a.enqueue_batch([payload(t) for t in range(3)]), a.enqueue(payload(3))]
        log = active_log(path)
        data = bytearray(log.read_bytes())
        second = len(encode_plain_entry(1, 0, payload(0)))  # entries of equal size
        data[second + 30] ^= 0xFF  # flip a payload byte of the second entry: bad CRC
        log.write_bytes(bytes(data))
        got = drain(b)
        assert [m.id for m in got] == [ids[0], ids[2], ids[3]]
        assert b.stats().corrupt_skipped == 1
        assert a.peek(5) == []
        assert a.stats().corrupt_skipped == 1, "counted once for the queue, seen from all"
        other = start(children, "hold", path)
        other.send("stats")
        fields = other.wait_for("S ").split()
        assert int(fields[-1]) == 1, "and from another process"
        other.send("close")
        other.wait_for("BYE")
    finally:
        a.close()
        b.close()
    with ledgerq.open(path) as q:
        assert q.stats().corrupt_skipped == 1


def test_a_full_disk_fails_only_the_call_that_met_it(
    small_disk: SmallDisk, children: Children
) -> None:
    path = small_disk.path / "q"
    with ledgerq.open(path, shared=True, sync="never") as q:
        q.enqueue(payload(0))
        other = start(children, "hold", path, "sync='never'")
        small_disk.fill(leave_bytes=64 * 1024)
        with pytest.raises(StorageError, match="disk is full"):
            q.enqueue(os.urandom(512 * 1024))  # does not fit: nothing of it stays
        # The other process is not stopped by it: it appends and consumes.
        other.send("enq 1")
        assert other.wait_for("E ").split()[1] == "2", "the failed call used no id"
        other.send("deq")
        assert other.wait_for("L ").split()[1] == "1"
        small_disk.free()
        assert q.enqueue(b"after") == 3, "and the failed process goes on once there is room"
        other.send("close")
        other.wait_for("BYE")
        # (its close gave its lease back: message 1 comes again)
        assert [m.payload for m in q.dequeue_batch(10)] == [payload(0), payload(1), b"after"]
    assert [m.id for m in ledgerq.follow(path, timeout=0.05)] == [1, 2, 3]


_DIE_MID_ROTATION = """
import os, sys, ledgerq
from ledgerq.segment.naming import log_path
q = ledgerq.open(sys.argv[1], shared=True, segment_size=100000)
q.enqueue(b"x" * 300)
manager = q._manager
manager.begin_append()  # the append lock, the writing word set
# A rotation that created its next log and died before writing its index:
os.close(os.open(log_path(manager.directory, manager.next_id), os.O_CREAT | os.O_WRONLY, 0o644))
os._exit(0)
"""


def test_a_rotation_killed_between_the_next_log_and_its_index(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, segment_size=100) as q:
        dying = children.start(["-c", _DIE_MID_ROTATION, str(path)])
        dying.expect_exit(0)
        assert q.enqueue(b"after") == 2  # finishes the rotation: seals 1, adopts 2
        assert sorted(p.name for p in (path / "segments").glob("*.idx")) == [
            "00000000000000000001.idx",
            "00000000000000000002.idx",
        ]
        assert [m.payload for m in drain(q)] == [b"x" * 300, b"after"]


_EIO_CHILD = """
import errno, os, sys
import ledgerq
from tests.faults._shim import Interposer

class FailingWrites(Interposer):
    target = ""  # "segments" or "readers": the writes that fail with EIO, while set

    def around(self, name, path, call, args):
        if name == "write" and self.target and os.sep + self.target + os.sep in path:
            raise OSError(errno.EIO, "Input/output error")
        return call()

path = sys.argv[1]
shim = FailingWrites(path)
shim.install()
q = ledgerq.open(path, shared=True)
print("READY", flush=True)
for line in sys.stdin:
    command, *args = line.split()
    try:
        if command == "fail":
            shim.target = args[0] if args else ""
            print("OK", flush=True)
        elif command == "enq":
            print("E", q.enqueue(args[0].encode()), flush=True)
        elif command == "deq":
            m = q.dequeue()
            print("L", m.id if m else 0, flush=True)
        elif command == "ack":
            q.ack(int(args[0]))
            print("A", args[0], flush=True)
        elif command == "close":
            q.close()
            print("BYE", flush=True)
            break
    except ledgerq.LedgerQError as exc:
        print("X", type(exc).__name__, getattr(exc, "errno", None), flush=True)
"""


def test_an_io_error_in_one_process_fails_there_and_leaves_the_others_working(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        q.enqueue_batch([b"1", b"2"])
        child = children.start(["-c", _EIO_CHILD, str(path)])
        child.wait_for("READY")
        child.send("deq")
        assert child.wait_for("L ") == "L 1"
        # EIO on its segment writes: its enqueue raises, uses no id, leaves nothing.
        child.send("fail segments")
        child.wait_for("OK")
        child.send("enq 3")
        assert child.wait_for("X ") == f"X StorageError {errno.EIO}"
        assert q.enqueue(b"3") == 3, "the failed append used no id and holds nothing up"
        # EIO on its journal writes: its ack raises (the message stays leased to it).
        child.send("fail readers")
        child.wait_for("OK")
        child.send("ack 1")
        assert child.wait_for("X ") == f"X StorageError {errno.EIO}"
        got = q.dequeue()
        assert got is not None and got.id == 2, "message 1 is still the child's"
        q.ack(got.id)
        # Once the device is back, the failed process goes on where it was.
        child.send("fail")
        child.wait_for("OK")
        child.send("ack 1")
        assert child.wait_for("A ") == "A 1"
        child.send("enq 4")
        assert child.wait_for("E ") == "E 4"
        child.send("close")
        child.wait_for("BYE")
        assert [m.payload for m in q.dequeue_batch(10)] == [b"3", b"4"]
        assert q.stats().acked == 2
