"""The worker-process pool: acks, nacks, crashes, timeouts, graceful stop."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import ledgerq
from ledgerq.workers import WorkerReport, run
from tests._child import Children, child_environment
from tests.workers import _handlers


def done_ids(log: Path) -> Counter[int]:
    if not log.exists():
        return Counter()
    return Counter(int(line.split()[0]) for line in log.read_text().splitlines())


def _queue_of(tmp_path: Path, payloads: list[bytes]) -> tuple[Path, list[int]]:
    """A queue at ``tmp_path / "q"`` holding ``payloads``; its path and their ids."""
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        return path, q.enqueue_batch(payloads)


def test_every_job_is_acked_or_dead_lettered(tmp_path: Path, done_log: Path) -> None:
    path, ids = _queue_of(tmp_path, [str(n).encode() for n in range(200)])
    report = run(path, _handlers.mixed, processes=3, until_empty=True, max_retries=2)
    assert isinstance(report, WorkerReport)
    failing = {ids[n] for n in range(200) if n % 10 == 0}
    succeeded = done_ids(done_log)
    assert set(succeeded) == set(ids) - failing
    assert all(count == 1 for count in succeeded.values()), "a job done twice after success"
    assert report.processed == 180
    assert report.dead_lettered == 20
    assert report.crashed == 1
    assert report.failed == 20 * 2 + 1
    with ledgerq.open(path, max_retries=2) as q:
        assert len(q) == 0 and q.stats().in_flight == 0
        dead = [int(m.headers["dlq.original_id"]) for m in q.dlq.peek(100)]
        assert sorted(dead) == sorted(failing)
        reasons = {m.headers["dlq.failure_reason"] for m in q.dlq.peek(100)}
        assert all(r.startswith("ValueError: job") for r in reasons)


def test_task_timeout_kills_and_retries(tmp_path: Path, done_log: Path) -> None:
    path, _ = _queue_of(tmp_path, [str(n).encode() for n in range(6)])
    report = run(path, _handlers.slow_once, processes=2, task_timeout=0.5, until_empty=True)
    assert report.timed_out == 1
    assert report.processed == 6
    assert sorted(done_ids(done_log).values()) == [1] * 6


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="processes"):
        run(tmp_path / "q", _handlers.mixed, processes=0)
    with pytest.raises(TypeError, match="handler"):
        run(tmp_path / "q", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="task_timeout"):
        run(tmp_path / "q", _handlers.mixed, task_timeout=-1)
    with pytest.raises(TypeError, match="shared must be a bool"):
        run(tmp_path / "q", _handlers.mixed, shared="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reader"):
        run(tmp_path / "q", _handlers.mixed, reader="../x")


def test_sigterm_mid_run_loses_nothing(tmp_path: Path, children: Children) -> None:
    log = tmp_path / "done.log"
    path = tmp_path / "q"
    total = 400
    with ledgerq.open(path) as q:
        q.enqueue_batch([str(n).encode() for n in range(total)])
    code = (
        "import sys, ledgerq.workers as w; from tests.workers import _handlers as h;"
        f"r = w.run({str(path)!r}, h.announce, processes=2);"
        "print('report', r.processed, flush=True)"
    )
    owner = children.start(["-c", code], env=child_environment({_handlers.DONE_LOG: str(log)}))
    seen = 0
    while seen < 50:
        if owner.line().startswith("done"):
            seen += 1
    owner.signal(signal.SIGTERM)
    after = []
    while (line := owner.read_line()) is not None:
        after.append(line)
    assert owner.finish() == 0, owner.failure("did not stop cleanly on SIGTERM")
    assert any(line.startswith("report") for line in after), after
    done = done_ids(log)
    assert all(count == 1 for count in done.values())
    with ledgerq.open(path) as q:
        stats = q.stats()
        assert stats.acked == len(done)
        # Everything not done is still pending - nothing lost, nothing leased forever.
        assert stats.pending + stats.acked == total
        assert len(q.dlq) == 0


def test_children_die_with_a_killed_owner_and_release_the_queue(
    tmp_path: Path, children: Children
) -> None:
    path, _ = _queue_of(tmp_path, [b"1", b"2"])
    code = (
        "import ledgerq.workers as w; from tests.workers import _handlers as h;"
        f"w.run({str(path)!r}, h.block, processes=2)"
    )
    owner = children.start(["-c", code], env=child_environment())
    workers = [int(owner.line().split()[-1]) for _ in range(2)]
    owner.kill()  # kill -9: no cleanup runs in the owner
    owner.finish()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "worker children outlived their killed owner"
        time.sleep(0.01)
    with ledgerq.open(path) as q:  # nobody holds the lock any more
        assert q.stats().pending == 2  # the two leases came back


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_forked_child_does_not_keep_the_queue_locked(tmp_path: Path) -> None:
    path = tmp_path / "q"
    q = ledgerq.open(path)
    read_end, write_end = os.pipe()
    started_r, started_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never touches the queue; it waits for the pipe to close
        os.close(write_end)
        os.write(started_w, b"s")  # (after fork()'s hooks, which drop its copy of the lock)
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    os.close(started_w)
    try:
        # Only a child that ran can have dropped its copy: on a busy machine the parent's
        # next steps may come first.
        assert os.read(started_r, 1) == b"s"
        os.close(started_r)
        q.close()
        with ledgerq.open(path):  # the child is alive and must not hold the lock
            pass
    finally:
        os.close(write_end)
        os.waitpid(pid, 0)


def test_a_handler_raising_retry_is_nacked_with_its_delay(tmp_path: Path, done_log: Path) -> None:
    path, ids = _queue_of(tmp_path, [b"a", b"b"])
    report = run(path, _handlers.retry_later, processes=2, until_empty=True, max_retries=5)
    assert (report.processed, report.failed) == (2, 2)
    seen: dict[tuple[int, int], int] = {}
    for line in done_log.read_text().splitlines():
        message_id, attempt, at_ns = map(int, line.split())
        seen[(message_id, attempt)] = at_ns
    for message_id in ids:
        waited = (seen[(message_id, 2)] - seen[(message_id, 1)]) / 1e9
        assert waited >= 0.45, f"retried after {waited:.3f} s, not the 0.5 s asked for"
    with ledgerq.open(path) as q:
        assert q.stats().nacked == 2 and q.stats().dead_lettered == 0


@pytest.mark.parametrize(
    ("reader", "shared"), [("default", True), ("audit", True), ("audit", False)]
)
def test_a_long_task_keeps_its_lease_while_its_child_lives(
    tmp_path: Path, done_log: Path, reader: str, shared: bool
) -> None:
    # visibility_timeout 0.6 s, tasks of 1.5 s: without the pool's touch the idle child
    # took the expired message and it ran twice - on a named reader, in either mode, too.
    path, (only,) = _queue_of(tmp_path, [b"long"])
    report = run(
        path,
        _handlers.outlast_lease,
        processes=2,
        until_empty=True,
        reader=reader,
        shared=shared,
        visibility_timeout=0.6,
    )
    assert done_ids(done_log) == Counter({only: 1})
    assert (report.processed, report.failed) == (1, 0)
    with ledgerq.open(path) as q:
        assert q.reader(reader).stats().acked == 1
        assert q.reader(reader).stats().nacked == 0
        if reader != "default":  # the pool consumed that reader only
            assert len(q) == 1


def test_a_timed_out_task_waits_the_retry_policy_and_dead_letters(
    tmp_path: Path, done_log: Path
) -> None:
    path, (only,) = _queue_of(tmp_path, [b"stuck"])
    report = run(
        path,
        _handlers.hang_noting_attempts,
        processes=2,
        task_timeout=0.3,
        until_empty=True,
        max_retries=2,
        retry_delay=0.5,
    )
    assert (report.timed_out, report.failed, report.dead_lettered) == (2, 2, 1)
    started = {}
    for line in done_log.read_text().splitlines():
        message_id, attempt, at_ns = map(int, line.split())
        assert message_id == only
        started[attempt] = at_ns
    assert sorted(started) == [1, 2]
    # Killed 0.3 s after it was handed out (the handler notes its start a little later,
    # later still on a busy machine), then the retry policy's 0.5 s before the next
    # delivery (the idle child would have taken it at once): at least 0.5 s apart.
    waited = (started[2] - started[1]) / 1e9
    assert waited >= 0.5, f"delivered again after {waited:.3f} s"
    with ledgerq.open(path, max_retries=2) as q:
        (dead,) = q.dlq.peek(5)
        assert int(dead.headers["dlq.original_id"]) == only
        assert dead.headers["dlq.failure_reason"].startswith("task timed out after 0.3 s")
