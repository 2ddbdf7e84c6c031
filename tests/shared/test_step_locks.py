"""The step locks of shared mode: a dead holder is taken over, a live one never.

Real processes take a lock - the append lock, or a reader's after leasing a message -
and then die holding it (SIGKILL, maybe half-way through a journal record), or stop
(SIGSTOP) and are continued after the others went on.  Every test runs with the lock
words (compare-and-swap in the state page) and with the flock files the words fall back
to (``LEDGERQ_LOCKING=flock``, the choice of a session's first handle).
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import threading
import time
from pathlib import Path

import pytest

import ledgerq
from ledgerq.format.shared_state import APPEND_LOCK, LOCK_OWNER
from tests._child import Child, Children

from ._procs import wait_until

HOLDER = ["-m", "tests.shared._holder"]


def _holder(children: Children, path: Path, what: str, then: str) -> tuple[Child, int, int]:
    """Start a holder; return it, its pid, and the id it leased (0 for the append lock)."""
    child = children.start([*HOLDER, str(path), what, then])
    leased = int(child.wait_for("L").split()[1]) if what == "reader" else 0
    held = child.wait_for("HELD")
    return child, int(held.split()[1]), leased


def _owner(q: ledgerq.Queue) -> int:
    memory = q._page.memory  # type: ignore[attr-defined]
    return int(struct.unpack_from("<Q", memory, APPEND_LOCK + LOCK_OWNER)[0])


@pytest.mark.usefixtures("locking")
def test_a_holder_killed_holding_the_append_lock_is_taken_over(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, lock_timeout=30) as q:
        q.enqueue(b"before")
        child, _, _ = _holder(children, path, "append", "die")
        child.wait()
        assert q.enqueue(b"after") == 2  # the lock taken over, the append done
        assert [m.payload for m in q.dequeue_batch(10)] == [b"before", b"after"]
        assert _owner(q) == 0
        q._check()  # type: ignore[attr-defined]


@pytest.mark.usefixtures("locking")
@pytest.mark.parametrize("then", ["die", "tear"])
def test_a_holder_killed_in_a_readers_step_loses_its_lease_once(
    tmp_path: Path, children: Children, then: str
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, lock_timeout=30) as q:
        first = q.enqueue(b"job")
        child, _, leased = _holder(children, path, "reader", then)
        assert leased == first
        child.wait()
        # The dead holder's lease comes back once (the housekeeper reclaims it: a failed
        # delivery), after this handle took the reader's lock over and, for "tear", cut
        # the half record the holder left.
        msg = q.dequeue(timeout=30)
        assert msg is not None and (msg.id, msg.attempts) == (first, 2)
        assert q.dequeue() is None
        q.ack(msg.id)
        stats = q.stats()
        assert (stats.pending, stats.in_flight, stats.acked) == (0, 0, 1)
        assert stats.corrupt_skipped == 0
    with ledgerq.open(path) as q:  # the journal reads clean: no half record in the middle
        assert (q.stats().acked, q.dequeue()) == (1, None)


@pytest.mark.usefixtures("locking")
def test_a_stopped_holder_is_never_taken_over(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, lock_timeout=1.0) as q:
        first = q.enqueue(b"job")
        child, pid, leased = _holder(children, path, "reader", "stop")
        assert leased == first
        wait_until(lambda: _stopped(pid), 30, "the holder to stop")
        # A dequeue with a timeout returns by it: the reader's lock stays with the
        # stopped process, whose step would resume and write.
        started = time.monotonic()
        assert q.dequeue(timeout=0.5) is None
        assert time.monotonic() - started < 30, "the wait ignored its own timeout"
        with pytest.raises(ledgerq.QueueBusyError, match=f"process {pid}") as busy:
            q.dequeue()
        assert busy.value.holder_pid == pid and "reader 'default'" in busy.value.held
        assert q.enqueue(b"appends go on") == first + 1  # (another lock)
        with pytest.raises(ledgerq.QueueLockedError):
            ledgerq.open(path)  # an exclusive open beside it, at once
        os.kill(pid, signal.SIGCONT)
        assert child.wait_for("DONE") == "DONE"
        child.wait()
        got = q.dequeue_batch(10, timeout=5)
        assert [m.payload for m in got] == [b"appends go on", b"after-stop"]
        stats = q.stats()
        assert (stats.acked, stats.in_flight, stats.corrupt_skipped) == (1, 2, 0)


@pytest.mark.usefixtures("locking")
def test_a_stopped_appender_bounds_every_other_call(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, lock_timeout=1.0) as q:
        q.enqueue(b"before")
        child, pid, _ = _holder(children, path, "append", "stop")
        wait_until(lambda: _stopped(pid), 30, "the holder to stop")
        with pytest.raises(ledgerq.QueueBusyError, match="the append lock"):
            q.enqueue(b"blocked")
        with pytest.raises(ledgerq.QueueLockedError, match=r"lock_timeout|stopped"):
            ledgerq.open(path, shared=True, lock_timeout=0.5)  # a new handle joins: it needs it
        assert q.dequeue() is not None  # the reader's lock is free: consuming goes on
        os.kill(pid, signal.SIGCONT)
        child.wait_for("DONE")
        child.wait()
        assert q.enqueue(b"after") == 3
        assert [m.payload for m in q.dequeue_batch(10)] == [b"after-stop", b"after"]


@pytest.mark.usefixtures("locking")
def test_a_lock_word_left_with_garbage_is_recovered(tmp_path: Path) -> None:
    # A torn page (a power cut is rebuilt by the next session; a stray write is not):
    # the owner names no live handle, so the next holder takes it over.
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, lock_timeout=30) as q:
        q.enqueue(b"before")
        memory = q._page.memory  # type: ignore[attr-defined]
        struct.pack_into("<Q", memory, APPEND_LOCK + LOCK_OWNER, 0xDEAD_BEEF_0000_0042)
        assert q.enqueue(b"after") == 2
        assert _owner(q) == 0
        assert [m.payload for m in q.dequeue_batch(10)] == [b"before", b"after"]


def test_two_handles_of_one_process_exclude_each_other(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with (
        ledgerq.open(path, shared=True, lock_timeout=0.3) as a,
        ledgerq.open(path, shared=True, lock_timeout=0.3) as b,
    ):
        a._manager.lock_appends()  # type: ignore[attr-defined] # a in the middle of a step
        try:
            with pytest.raises(ledgerq.QueueBusyError, match=f"process {os.getpid()}"):
                b.enqueue(b"x")
        finally:
            a._manager.unlock_appends()  # type: ignore[attr-defined]
        assert b.enqueue(b"x") == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_a_lock_is_held_cannot_hold_it(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, lock_timeout=30) as q:
        taken, release = threading.Event(), threading.Event()

        def hold() -> None:  # another thread of the parent, in the middle of an append
            with q._lock:  # type: ignore[attr-defined]
                q._manager.lock_appends()  # type: ignore[attr-defined]
                taken.set()
                release.wait(30)
                q._manager.unlock_appends()  # type: ignore[attr-defined]

        holder = threading.Thread(target=hold)
        holder.start()
        assert taken.wait(30)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its copy of the handle holds nothing and can do nothing
            try:
                os.close(read_end)
                try:
                    q.enqueue(b"inherited")
                    said = "no error"
                except ledgerq.ForkedQueueError:
                    said = "forked"
                os.write(write_end, (said + "\n").encode())
                # Its own handle waits for the parent's append (the open, or the
                # enqueue: both take the append lock), then works.
                with ledgerq.open(path, shared=True, lock_timeout=30) as own:
                    own.enqueue(b"from the child")
                os.write(write_end, b"enqueued\n")
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            assert pipe.readline() == b"forked\n"
            release.set()
            holder.join(30)
            assert pipe.readline() == b"enqueued\n"
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert [m.payload for m in q.dequeue_batch(10)] == [b"from the child"]


def _stopped(pid: int) -> bool:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
        return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"T"
    return False
