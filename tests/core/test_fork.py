"""A queue used in a forked child raises, and the child harms nothing (issue 15 item 4).

Before: a child of ``os.fork()`` (or a ``multiprocessing`` worker started by fork) that
used the parent's queue handed out the parent's next ids, tore entries and left
``meta.json`` unreadable.  Now every call raises :class:`ledgerq.ForkedQueueError` naming
the fix, and the child's ``close()``, finalizers and exit leave the parent's files and
lock alone.  Real forks, real processes: the scenarios run in their own interpreter
(``tests/core/_forking.py``), the pool test uses ``multiprocessing``'s fork context.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgerq
from tests._child import run_python
from tests.forked import in_a_forked_child

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _scenario(name: str, path: Path) -> list[str]:
    proc = run_python("-m", "tests.core._forking", name, str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout.splitlines()


def test_every_call_in_a_forked_child_raises_and_the_parent_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "q"
    lines = _scenario("use_after_fork", path)
    closes = ("child close:", "child sharded close:", "child exit:", "open while")
    calls = [line for line in lines if line.startswith("child ") and not line.startswith(closes)]
    assert len(calls) == 12, lines
    for line in calls:
        assert ": ForkedQueueError: " in line, line
        assert "inherited it through fork()" in line and "open it in the child process" in line
    assert any(f"queue {str(path)!r} was opened by process" in line for line in calls)
    assert "child close: returned None" in lines
    assert "child sharded close: returned None" in lines
    assert "child exit: 0" in lines
    assert "files untouched by the child: True" in lines, "no sync, checkpoint or meta save"
    assert any(
        line.startswith("open while the parent holds it: QueueLockedError") for line in lines
    ), "the child's exit released nothing of the parent's"
    # The parent's next id is the one it would have had: the child wrote nothing.
    assert "parent enqueue: 3" in lines
    assert lines[-1] == "parent closed"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["clean"] is True and meta["next_id"] == 4
    with ledgerq.open(path) as q:
        assert [m.payload for m in q.dequeue_batch(10)] == [b"parent-2", b"parent-3"]
        assert q.stats().enqueued == 3
        assert q.stats().corrupt_skipped == 0


def test_opening_the_queue_in_the_child_is_the_way(tmp_path: Path) -> None:
    lines = _scenario("open_in_child", tmp_path / "q")
    assert lines == ["child got: from the parent", "parent sees pending: 0"]


# ---------------------------------------------------------------- multiprocessing

_INHERITED: dict[str, ledgerq.Queue] = {}  # what a fork-started worker finds in its memory


def _enqueue_in_worker(payload: bytes) -> int:
    return _INHERITED["queue"].enqueue(payload)


def _sharded_in_worker(payload: bytes) -> int:
    return _INHERITED["sharded"].enqueue(payload)  # type: ignore[attr-defined]


@pytest.fixture
def inherited(tmp_path: Path) -> Iterator[ledgerq.Queue]:
    with ledgerq.open(tmp_path / "q", sync="never") as q:
        _INHERITED["queue"] = q
        try:
            yield q
        finally:
            _INHERITED.clear()


def test_a_fork_started_pool_worker_gets_the_error_not_a_second_writer(
    inherited: ledgerq.Queue,
) -> None:
    inherited.enqueue(b"parent")
    with multiprocessing.get_context("fork").Pool(2) as pool:
        with pytest.raises(ledgerq.ForkedQueueError, match="open it in the child process"):
            pool.apply(_enqueue_in_worker, (b"worker",))
        results = [pool.apply_async(_enqueue_in_worker, (b"w%d" % n,)) for n in range(4)]
        for result in results:
            with pytest.raises(ledgerq.ForkedQueueError):
                result.get(60)
    assert inherited.enqueue(b"parent again") == 2
    assert [m.payload for m in inherited.dequeue_batch(10)] == [b"parent", b"parent again"]


def test_a_sharded_queue_in_a_fork_started_worker_raises(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "s", 2, sync="never") as sharded:
        _INHERITED["sharded"] = sharded  # type: ignore[assignment]
        try:
            with (
                multiprocessing.get_context("fork").Pool(1) as pool,
                pytest.raises(ledgerq.ForkedQueueError, match="sharded queue"),
            ):
                pool.apply(_sharded_in_worker, (b"worker",))
        finally:
            _INHERITED.clear()
        assert sharded.stats().enqueued == 0


def _run_until(started: object, stop: object) -> None:
    started.set()  # type: ignore[attr-defined]
    stop.wait(60)  # type: ignore[attr-defined]


def test_a_child_holding_the_queue_forgotten_keeps_nothing_locked(tmp_path: Path) -> None:
    """The child inherited an open queue and never uses it: the parent can close and reopen."""
    path = tmp_path / "q"
    ctx = multiprocessing.get_context("fork")
    q = ledgerq.open(path)
    started, stop = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_run_until, args=(started, stop))
    child.start()
    try:
        # The child drops its copy of the lock in its at-fork hook, which runs when it is
        # first scheduled: on a busy machine, after the parent's next steps.
        assert started.wait(60)
        q.enqueue(b"x")
        q.close()
        with ledgerq.open(path) as again:  # not locked by the child's copy
            assert len(again) == 1
    finally:
        stop.set()
        child.join(60)


# ---------------------------------------------------------------- followers


def test_a_follower_keeps_following_in_a_forked_child(tmp_path: Path) -> None:
    """Parent and child each wait on their follower; every append wakes both.

    A follower's inotify descriptor is one kernel event queue: shared with the parent,
    each process consumed the other's wake-ups and slept until its timeout.  The child
    now opens a watcher of its own.
    """
    path = tmp_path / "q"
    rounds = 20
    with ledgerq.open(path, sync="never") as owner:
        owner.enqueue(b"0")
        follower = ledgerq.follow(path, timeout=10, watch="inotify")
        assert next(follower).payload == b"0"
        to_parent_r, to_parent_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child follows and reports each message; never returns to pytest
            code = 1
            try:
                for _ in range(rounds):
                    os.write(to_parent_w, next(follower).payload + b"\n")
                code = 0
            except BaseException as exc:
                os.write(to_parent_w, f"child failed: {exc!r}\n".encode())
            finally:
                os._exit(code)
        os.close(to_parent_w)
        child_lines = os.fdopen(to_parent_r, "rb")
        try:
            got: list[bytes] = []
            for n in range(1, rounds + 1):
                waiting = threading.Thread(target=lambda: got.append(next(follower).payload))
                waiting.start()
                started = time.monotonic()
                owner.enqueue(str(n).encode())
                waiting.join(30)
                assert time.monotonic() - started < 5, f"the parent slept through append {n}"
                line = child_lines.readline().strip()
                assert line == str(n).encode(), line
                assert time.monotonic() - started < 5, f"the child slept through append {n}"
            assert got == [str(n).encode() for n in range(1, rounds + 1)]
        finally:
            follower.close()
            child_lines.close()
            _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_close_unlocks_though_a_fresh_childs_copy_of_the_lock_is_still_open(
    tmp_path: Path,
) -> None:
    """Between fork() and its at-fork hook, a child holds a copy of the lock's descriptor.

    The parent's close must free the queue even then: before, the flock stayed with the
    child's copy, and a reopen right after the close raised QueueLockedError (seen as an
    order-dependent failure of the test above).  A second descriptor of the same open file
    description is exactly what the child holds in that moment.
    """
    path = tmp_path / "q"
    q = ledgerq.open(path)
    lock_path = str(path / "LOCK")
    (held,) = [int(fd) for fd in os.listdir("/proc/self/fd") if _target(fd) == lock_path]
    copy = os.dup(held)  # the child's copy, before its hook closes it
    try:
        q.close()
        with ledgerq.open(path):  # not locked by the copy
            pass
    finally:
        os.close(copy)


def _target(fd: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def test_a_shared_handle_in_a_forked_child_says_to_open_the_childs_own(tmp_path: Path) -> None:
    # Issue 25: the error said the parent's lock keeps the child out - untrue in shared
    # mode, where the child may open a handle of its own beside the parent's.
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        q.enqueue(b"from the parent")

        def child() -> str:
            try:
                q.enqueue(b"inherited")
                said = "no error"
            except ledgerq.ForkedQueueError as exc:
                said = str(exc)
            with ledgerq.open(path, shared=True) as own:
                own.enqueue(b"from the child")
            return said

        said, code = in_a_forked_child(child)
        assert code == 0, said
        assert "ledgerq.open(path, shared=True)" in said, said
        assert "keeps the child out" not in said
        assert [m.payload for m in q.dequeue_batch(10)] == [b"from the parent", b"from the child"]
