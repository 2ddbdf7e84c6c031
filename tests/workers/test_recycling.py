"""Children replaced after ``max_tasks_per_child`` tasks or past ``max_memory_per_child``."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

import ledgerq
from ledgerq.workers import run
from tests.workers import _handlers


def pids_by_id(log: Path) -> dict[int, int]:
    """Which process ran each message (each ran once: checked)."""
    pairs = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    ran = Counter(message_id for message_id, _ in pairs)
    assert all(n == 1 for n in ran.values()), f"a task ran twice: {ran}"
    return dict(pairs)


def test_a_child_runs_at_most_max_tasks_per_child_tasks(tmp_path: Path, done_log: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        ids = q.enqueue_batch([b"%d" % n for n in range(10)])
    report = run(path, _handlers.record_pid, processes=2, until_empty=True, max_tasks_per_child=3)
    ran_in = pids_by_id(done_log)
    assert sorted(ran_in) == ids
    tasks_per_pid = Counter(ran_in.values())
    assert max(tasks_per_pid.values()) <= 3, tasks_per_pid
    assert len(tasks_per_pid) >= 4  # 10 tasks, 3 per process at most
    # Every process that reached 3 was replaced; the task that made it 3 was not failed.
    assert report.recycled == sum(n == 3 for n in tasks_per_pid.values())
    assert (report.processed, report.failed, report.crashed) == (10, 0, 0)
    assert os.getpid() not in tasks_per_pid


def _resident_bytes_of_a_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """The resident size of a pool child that has run one small task.

    Measured, not assumed from this process's size: a forked child does not map the
    file-backed pages its parent has touched (in a long test run, hundreds of MB of
    libraries), so it starts well below its parent."""
    log = tmp_path / "resident.log"
    monkeypatch.setenv(_handlers.DONE_LOG, str(log))
    path = tmp_path / "measure"
    with ledgerq.open(path) as q:
        q.enqueue(b"measure")
    run(path, _handlers.record_resident, processes=1, until_empty=True)
    ((_, resident),) = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    return resident


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_a_child_past_max_memory_is_replaced_after_its_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A child's own size, and 40 MB: the big task keeps 80 MB more.
    limit = _resident_bytes_of_a_child(tmp_path, monkeypatch) + (40 << 20)
    log = tmp_path / "done.log"
    monkeypatch.setenv(_handlers.DONE_LOG, str(log))
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        ids = q.enqueue_batch([b"small", b"small", b"big", b"small", b"small"])
    report = run(
        path, _handlers.grow_on_big, processes=1, until_empty=True, max_memory_per_child=limit
    )
    ran_in = pids_by_id(log)
    pids = [ran_in[i] for i in ids]
    assert pids[0] == pids[1] == pids[2], "a child below the limit was replaced"
    assert pids[3] != pids[2], "the child that grew past the limit ran another task"
    assert pids[3] == pids[4]
    # The task that pushed it over finished: acked, not failed.
    assert (report.processed, report.failed, report.recycled) == (5, 0, 1)
    with ledgerq.open(path) as q:
        assert q.stats().acked == 5 and q.stats().nacked == 0


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("max_tasks_per_child", 0, ValueError),
        ("max_tasks_per_child", "3", TypeError),
        ("max_tasks_per_child", True, TypeError),
        ("max_memory_per_child", -1, ValueError),
        ("max_memory_per_child", 1.5e9, TypeError),
    ],
)
def test_bad_limits_are_refused_before_anything_runs(
    tmp_path: Path, name: str, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=name):
        run(tmp_path / "q", _handlers.record_pid, **{name: value})  # type: ignore[arg-type]
    assert not (tmp_path / "q").exists()
