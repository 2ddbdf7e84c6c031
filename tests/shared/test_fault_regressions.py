"""Bugs of shared mode found by the shared-mode fault sweep, one test each.

**A reader's published head** (retention's hint in its lock file) on a failing disk.
Found by the shared-mode fault sweep (tests/faults/test_shared_faults.py): the 8-byte
write of a reader's head into its lock file let the raw ``OSError`` out - from
``ledgerq.open`` on a full disk (a new lock file needs a block), and from an ack whose
ACK had been written.  The head is a lower bound for retention: left unwritten it is
still one - when it only had to grow, or when none was published yet (retention then
reads the journal) - so the call goes on; only a head that had to move back (a new
session, a seek) and stays above the reader's true head could let retention delete
what the reader has not read: that call fails with ``StorageError``.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children
from tests.faults._inject import Fault, FaultInjector

from ._procs import start

HEAD_FILE = "shared/default.reader"
NAMED_HEAD_FILE = "shared/r.reader"


def test_a_full_disk_does_not_stop_a_shared_open_at_the_published_head(tmp_path: Path) -> None:
    path = tmp_path / "q"
    injector = FaultInjector(path, Fault("write", 1, errno.ENOSPC, match=HEAD_FILE))
    with injector.installed():
        q = ledgerq.open(path, shared=True)  # raised the raw OSError
    try:
        assert injector.fired == 1
        message_id = q.enqueue(b"x")
        msg = q.dequeue()
        assert msg is not None and msg.id == message_id
        q.ack(msg.id)
    finally:
        q.close()


def test_an_ack_that_happened_returns_though_its_head_was_not_published(tmp_path: Path) -> None:
    path = tmp_path / "q"
    injector = FaultInjector(path)
    with injector.installed():
        # One message per segment: the ack of the first, once the reader has read past
        # it, lets retention delete its segment - and publishes the head first.
        q = ledgerq.open(path, shared=True, sync="always", segment_size=64)
        try:
            for payload in (b"a" * 40, b"b" * 40, b"c" * 40):
                q.enqueue(payload)
            first, second = q.dequeue(), q.dequeue()
            assert first is not None and second is not None
            injector.arm(Fault("write", 1, errno.EIO, match=HEAD_FILE))
            q.ack(first.id)  # raised the raw OSError after the ACK was written
            assert injector.fired == 1
            injector.clear()
            q.ack(second.id)
        finally:
            q.close()
    with ledgerq.open(path, segment_size=64) as again:
        assert [m.payload for m in again.peek(10)] == [b"c" * 40], "the acks happened"


def test_a_head_that_must_move_back_and_cannot_fails_the_call(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        ids = q.enqueue_batch([b"a", b"b", b"c"])
        reader = q.reader("r")
        for _ in ids:
            msg = reader.dequeue()
            assert msg is not None
            reader.ack(msg.id)
    injector = FaultInjector(path)
    with injector.installed(), ledgerq.open(path, shared=True) as q:
        reader = q.reader("r")
        stale = (path / NAMED_HEAD_FILE).read_bytes()
        assert int.from_bytes(stale, "little") == ids[-1] + 1, "past every message"
        injector.arm(Fault("write", 1, errno.EIO, match=NAMED_HEAD_FILE))
        with pytest.raises(ledgerq.StorageError) as caught:
            reader.seek(ids[0])  # back to the first: the published head must go down
        assert caught.value.errno == errno.EIO and NAMED_HEAD_FILE in str(caught.value)
        assert (path / NAMED_HEAD_FILE).read_bytes() == stale


def test_a_shared_open_that_meets_a_full_disk_in_recovery_uses_the_reserve(
    tmp_path: Path,
) -> None:
    """**The first handle's recovery on a full disk.**  Recovery that meets ENOSPC gives
    back the disk reserve and runs again with a new segment manager; the first shared
    handle went on with the old one, closed and empty, and failed with ``IndexError``
    (found by the sweep: ENOSPC creating the first segment of a new DLQ)."""
    path = tmp_path / "q"
    first_log = "segments/00000000000000000001.log"
    injector = FaultInjector(path, Fault("open", 1, errno.ENOSPC, match=first_log))
    with injector.installed():
        q = ledgerq.open(path, shared=True)  # raised IndexError
    try:
        assert injector.fired == 1
        assert (path / first_log).exists()
        message_id = q.enqueue(b"x")
        with ledgerq.open(path, shared=True) as other:
            msg = other.dequeue()
            assert msg is not None and msg.id == message_id
            other.ack(msg.id)
    finally:
        q.close()


@pytest.mark.parametrize("call", ["peek", "enqueue"])
def test_an_io_error_reading_a_segment_another_process_made_is_a_storage_error(
    tmp_path: Path, children: Children, call: str
) -> None:
    """**A handle's view of the segments.**  When another process rotated, the next
    section of this handle reads the new segments (their index, their log); an EIO
    opening one escaped as a raw ``OSError`` (found by the sweep: from ``peek`` and
    ``dequeue``, and from an append catching up with them).  It is a ``StorageError``
    naming the file, and the view is read again at the next call."""
    path = tmp_path / "q"
    injector = FaultInjector(path)
    with injector.installed(), ledgerq.open(path, shared=True, segment_size=64) as q:
        writer = start(children, "hold", path, "segment_size=64")
        for token in range(4):  # one entry per segment
            writer.send(f"enq {token}")
            writer.wait_for("E ")
        injector.arm(Fault("open", 1, errno.EIO, match="00000000000000000003.log"))
        with pytest.raises(ledgerq.StorageError) as caught:
            q.peek(10) if call == "peek" else q.enqueue(b"x")  # raised the raw OSError
        assert caught.value.errno == errno.EIO
        assert "00000000000000000003.log" in str(caught.value)
        injector.clear()
        assert [m.id for m in q.peek(10)] == [1, 2, 3, 4]
        writer.send("close")
        writer.wait_for("BYE")


@pytest.mark.parametrize("site", ["fsync", "rename"])
def test_a_new_queue_whose_first_meta_save_failed_opens_shared(tmp_path: Path, site: str) -> None:
    """**The first save of ``meta.json``.**  An exclusive open of a new queue goes on when
    its first ``meta.json`` write fails (the next save writes it); the first shared
    handle read the file back before saving, found none, and failed with
    ``NotAQueueError`` - in the sweep, leaving a DLQ nobody could open."""
    path = tmp_path / "q"
    match = "meta.json.tmp" if site == "fsync" else "/meta.json"
    injector = FaultInjector(path, Fault(site, 1, errno.EIO, match=match))
    with injector.installed():
        q = ledgerq.open(path, shared=True)  # raised NotAQueueError
    try:
        assert injector.fired == 1
        message_id = q.enqueue(b"x")
    finally:
        q.close()
    with ledgerq.open(path, shared=True) as again:
        assert [m.id for m in again.peek(10)] == [message_id]


def test_an_io_error_moving_the_cursor_in_a_compaction_is_a_storage_error(
    tmp_path: Path,
) -> None:
    """**A compaction moving the cursor.**  Before it checkpoints, a handle whose cursor
    lags the head (another handle acked ahead of it) moves its cursor there, reading
    the segments; an EIO opening one escaped ``compact()`` as a raw ``OSError`` (found
    by the sweep, ``sync="never"``)."""
    path = tmp_path / "q"
    injector = FaultInjector(path)
    with injector.installed():
        a = ledgerq.open(path, shared=True, segment_size=64)
        b = ledgerq.open(path, shared=True, segment_size=64)
        try:
            for n in range(6):  # one entry per segment
                a.enqueue(b"message %d" % n + b"." * 40)
            for _ in range(3):
                msg = b.dequeue()
                assert msg is not None
                b.ack(msg.id)
            # The first open of a log refreshes a's view; the second moves its cursor.
            injector.arm(Fault("open", 2, errno.EIO, match=".log"))
            with pytest.raises(ledgerq.StorageError) as caught:
                a.compact()  # raised the raw OSError
            assert caught.value.errno == errno.EIO and ".log" in str(caught.value)
            injector.clear()
            a.compact()
            assert [m.payload[:9] for m in a.peek(10)] == [b"message %d" % n for n in (3, 4, 5)]
        finally:
            a.close()
            b.close()
