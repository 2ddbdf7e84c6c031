"""A shared-mode session from its first handle to its last: opens, deaths, closes.

The first handle of a session (no other has the queue open) recovers the queue as an
exclusive open does; the last one to close leaves it closed cleanly; in between,
handles come and go - by close, by kill -9, by fork - and the others go on.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

import ledgerq
from ledgerq.segment.naming import handle_live_path, list_live_handles
from tests._child import Children

from ._procs import start, start_holder
from ._worker import payload


def test_the_last_handle_closes_the_queue_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "q"
    a = ledgerq.open(path, shared=True)
    b = ledgerq.open(path, shared=True)
    a.enqueue_batch([b"1", b"2", b"3"])
    held = b.dequeue()
    assert held is not None
    a.close()
    assert list_live_handles(str(path)) == [b.handle_id]  # type: ignore[attr-defined]
    b.close()  # the last: leases back as failed deliveries, meta.json clean
    assert list_live_handles(str(path)) == []
    meta = (path / "meta.json").read_text()
    assert '"clean": true' in meta
    with ledgerq.open(path) as q:
        assert q.enqueue(b"4") == 4, "a clean close: no id skipped"
        assert [(m.id, m.attempts) for m in q.dequeue_batch(5)] == [(1, 2), (2, 1), (3, 1), (4, 1)]


def test_after_every_process_was_killed_the_next_open_recovers(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    producer = start(children, "produce", path, "count=50", "sync='always'")
    producer.wait_for("BYE")
    holder = start_holder(children, path, 3)
    other = start(children, "hold", path)
    for child in (holder, other):
        child.kill_and_drain()
    with ledgerq.open(path, shared=True) as q:  # the first handle of a new session
        assert list_live_handles(str(path)) == [q.handle_id]  # type: ignore[attr-defined]
        got = q.dequeue_batch(100)
        assert [(m.id, m.attempts) for m in got[:3]] == [(1, 2), (2, 2), (3, 2)]
        assert len(got) == 50
        # Ids never reused: after a crash they skip to the reservation.
        assert q.enqueue(b"next") > 50


def test_a_dead_holder_without_its_liveness_file_is_reclaimed_too(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        q.enqueue_batch([payload(1), payload(2)])
        holder = start_holder(children, path, 2)
        live = [h for h in list_live_handles(str(path)) if h != q.handle_id]  # type: ignore[attr-defined]
        assert len(live) == 1
        holder.kill_and_drain()
        os.unlink(handle_live_path(str(path), live[0]))  # gone with its file, say
        killed = time.monotonic()
        back = q.dequeue_batch(2, timeout=3)
        assert len(back) == 2 and time.monotonic() - killed < 1.0


_FORK = """
import os, sys, ledgerq
q = ledgerq.open(sys.argv[1], shared=True)
q.enqueue(b"one")
held = q.dequeue()
pid = os.fork()
if pid == 0:
    try:
        q.ack(held.id)
    except ledgerq.ForkedQueueError:
        print("CHILD FORKED", flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("PARENT", held.id, flush=True)
sys.stdin.readline()
q.ack(held.id)
print("ACKED", flush=True)
q.close()
"""


def test_a_forked_child_neither_uses_nor_frees_the_parents_handle(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    parent = children.start(["-c", _FORK, str(path)])
    assert parent.line() == "CHILD FORKED"
    assert parent.line() == "PARENT 1"
    with ledgerq.open(path, shared=True) as q:
        # The child exited; the parent's lease must stay its own (its liveness lock held).
        assert q.dequeue(timeout=0.8) is None
        parent.send("go")
        assert parent.line() == "ACKED"
        parent.expect_exit(0)
        assert q.stats().acked == 1


def test_a_reader_removed_by_another_handle(tmp_path: Path) -> None:
    path = tmp_path / "q"
    a = ledgerq.open(path, shared=True)
    b = ledgerq.open(path, shared=True)
    try:
        a.enqueue(b"x")
        audit = b.reader("audit")
        assert a.remove_reader("audit") is True
        with pytest.raises(ledgerq.QueueClosedError, match="removed"):
            audit.dequeue()
    finally:
        a.close()
        b.close()


def test_retention_max_bytes_drops_for_every_handle(tmp_path: Path) -> None:
    path = tmp_path / "q"
    options = {"segment_size": 200, "index_interval": 1, "retention_max_bytes": 600}
    a = ledgerq.open(path, shared=True, **options)
    b = ledgerq.open(path, shared=True, **options)
    try:
        for n in range(20):
            (a if n % 2 else b).enqueue(b"%02d" % n + b"." * 80)
        assert a.stats().disk_bytes <= 600 + 200
        assert a.stats().dropped == b.stats().dropped > 0
        left = b.dequeue_batch(100)
        assert [m.id for m in left] == sorted(m.id for m in left)
        assert left[-1].id == 20
        assert a.stats().dropped + len(left) == 20
    finally:
        a.close()
        b.close()


def test_a_damaged_state_page_is_rebuilt_by_the_next_session(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        q.enqueue_batch([b"1", b"2"])
    (path / "shared" / "state").write_bytes(b"garbage")
    with ledgerq.open(path, shared=True) as q, ledgerq.open(path, shared=True) as r:
        assert r.enqueue(b"3") == 3
        assert [m.id for m in q.dequeue_batch(5)] == [1, 2, 3]


def test_a_damaged_state_page_under_live_handles_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True):
        state = path / "shared" / "state"
        data = bytearray(state.read_bytes())
        data[0:4] = b"XXXX"
        state.write_bytes(bytes(data))
        with pytest.raises(ledgerq.CorruptionError, match="close every handle"):
            ledgerq.open(path, shared=True)


@pytest.mark.skipif(sys.platform != "linux", reason="SIGSTOP semantics")
def test_a_stopped_holder_is_alive(tmp_path: Path, children: Children) -> None:
    """A holder that is merely slow (stopped) keeps its leases: liveness is the process."""
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        q.enqueue(payload(1))
        holder = start_holder(children, path, 1)
        holder.signal(signal.SIGSTOP)
        try:
            assert q.dequeue(timeout=1.0) is None
        finally:
            holder.signal(signal.SIGCONT)


_DIE_BEFORE_THE_DLQ_MOVE = """
import os, sys, ledgerq
from ledgerq.features.dlq.feature import DeadLetterFeature
q = ledgerq.open(sys.argv[1], shared=True, max_retries=1)
msg = q.dequeue()
def die(self, delivery):
    os._exit(9)  # the NACK record is written; the move to the DLQ never happens
DeadLetterFeature.failed = die
q.nack(msg.id, "fails every time")
"""


def test_a_nack_whose_dlq_move_died_is_moved_by_the_next_taker(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, max_retries=1) as q:
        message_id = q.enqueue(b"poison")
        dying = children.start(["-c", _DIE_BEFORE_THE_DLQ_MOVE, str(path)])
        dying.expect_exit(9)
        assert q.dequeue() is None, "its failures reached max_retries: not delivered again"
        (dead,) = q.dlq.peek(5)
        assert dead.headers["dlq.original_id"] == str(message_id)
        assert q.stats().dead_lettered == 1


def _still_named(lock: object) -> bool:
    try:
        return os.stat(lock.path).st_ino == os.fstat(lock.fd).st_ino  # type: ignore[attr-defined]
    except FileNotFoundError:
        return False


def test_a_liveness_file_is_never_seen_unlocked(tmp_path: Path) -> None:
    """Another process's housekeeper may probe ``shared/`` while a handle opens: a
    ``.live`` file it could lock would pass for a dead handle's."""
    import threading

    from ledgerq.segment.lock import LockFile

    path = tmp_path / "q"
    ledgerq.open(path, shared=True).close()
    stop = threading.Event()
    unlocked: list[str] = []

    def probe() -> None:
        while not stop.is_set():
            for handle in list_live_handles(str(path)):
                try:
                    lock = LockFile(handle_live_path(str(path), handle), create=False)
                except ledgerq.StorageError:
                    continue  # closed meanwhile
                try:
                    # Lockable and still named: a live handle's file (none dies here) -
                    # a closing handle removes its file before it lets its lock go.
                    if lock.try_acquire() and _still_named(lock):
                        unlocked.append(lock.path)
                finally:
                    lock.close()

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        with ledgerq.open(path, shared=True):
            for _ in range(150):
                ledgerq.open(path, shared=True).close()
    finally:
        stop.set()
        prober.join()
    assert not unlocked, f"probed unlocked: {unlocked[:3]}"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_a_closed_handle_leaves_no_file_open(tmp_path: Path) -> None:
    """A long-lived process opening and closing handles must not run out of fds."""
    path = tmp_path / "q"

    def session() -> None:
        with ledgerq.open(path, shared=True) as a, ledgerq.open(path, shared=True) as b:
            a.enqueue(b"x")
            got = b.dequeue()
            assert got is not None
            b.ack(got.id)

    def open_files() -> set[tuple[str, str]]:
        # Sockets are left out: other threads of the test process (a Spark gateway's,
        # say) open and close theirs at any time; a handle opens none.
        found = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(FileNotFoundError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if not target.startswith("socket:"):
                    found.add((fd, target))
        return found

    session()  # the process's housekeeper and its watches exist from now on
    before = open_files()
    for _ in range(5):
        session()
    # The housekeeper thread may be mid-probe of a closed handle's liveness file (a
    # `with open(...)` of its own): a leak stays, a probe ends.  Poll until clean.
    deadline = time.monotonic() + 20  # a hang guard, never a timing assertion
    while (extra := open_files() - before) and time.monotonic() < deadline:
        time.sleep(0.01)  # a poll of the fd table, not a synchronisation
    assert extra == set()


def test_an_id_reservation_is_saved_when_it_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An id may be written only once a durable reservation covers it: after a power cut
    # the next session starts past meta.json's reservation, never reusing an id that a
    # lost tail held.  A new block reached the state page but not meta.json.
    from ledgerq.core import appending

    monkeypatch.setattr(appending, "ID_BLOCK", 10)  # (the one id reservation, both modes)
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as a, ledgerq.open(path, shared=True) as b:
        for round_ in range(3):
            ids = (a, b)[round_ % 2].enqueue_batch([b"x"] * 12)
            meta = json.loads((path / "meta.json").read_text())
            assert meta["reserved_until"] > ids[-1], (ids, meta["reserved_until"])


def test_a_wake_that_reaches_a_handle_just_closed_is_dropped(tmp_path: Path) -> None:
    """The housekeeper lists a queue's live handles, then wakes each: a handle with a
    listener (the Celery transport, ``ledgerq.aio``) may close in between.  The wake must
    not touch its closed files - an exception there ended the housekeeper's thread, and
    with it every wake-up and dead-handle reclaim of the process (a CI run caught it)."""
    path = tmp_path / "q"
    q = ledgerq.open(path, shared=True)
    q.add_listener(lambda: None)
    q.close()
    q._wake_from_outside()  # type: ignore[attr-defined]  # the housekeeper's late call
    with ledgerq.open(path, shared=True) as again:
        assert again.enqueue(b"x") == 1
