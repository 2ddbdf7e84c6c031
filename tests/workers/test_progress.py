"""``ledgerq.workers.progress``: a handler's report, kept while its message is in flight."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import pytest

import ledgerq
from ledgerq.segment.readonly import read_progress
from ledgerq.workers import WorkerReport, progress, run
from tests.shared._procs import wait_until
from tests.workers import _handlers


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "exclusive"])
def test_a_report_is_readable_while_the_task_runs_and_gone_after(
    tmp_path: Path, done_log: Path, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    path = tmp_path / "q"
    go_dir = tmp_path / "go"
    go_dir.mkdir()
    monkeypatch.setenv(_handlers.GO_DIR, str(go_dir))
    os.mkfifo(go_dir / "go-job")
    with ledgerq.open(path) as q:
        (message_id,) = q.enqueue_batch([b"job"])
    reports: list[WorkerReport] = []
    pool = threading.Thread(
        target=lambda: reports.append(
            run(path, _handlers.report_then_wait, processes=1, until_empty=True, shared=shared)
        )
    )
    pool.start()
    try:
        wait_until(lambda: read_progress(str(path)), 60, "the handler's report")
        (record,) = read_progress(str(path))
        assert (record.reader, record.id, record.attempts) == ("default", message_id, 1)
        assert (record.fraction, record.note) == (0.5, "half of job")
        assert read_progress(str(path), "other") == []
    finally:
        with open(go_dir / "go-job", "wb"):
            pass  # the end of the FIFO: the handler goes on
        pool.join(60)
    assert reports and reports[0].processed == 1
    assert read_progress(str(path)) == []  # acked: the record went with the lease


@pytest.mark.parametrize(
    ("fraction", "note", "error", "what"),
    [
        (1.5, "", ValueError, "fraction"),
        (-0.1, "", ValueError, "fraction"),
        (math.nan, "", ValueError, "fraction"),
        ("half", "", TypeError, "fraction"),
        (True, "", TypeError, "fraction"),
        (0.5, b"note", TypeError, "note"),
        (0.5, "x" * 1001, ValueError, "note"),
    ],
)
def test_a_bad_report_fails_at_once(
    fraction: object, note: object, error: type[Exception], what: str
) -> None:
    with pytest.raises(error, match=f"progress {what}"):
        progress(fraction, note)  # type: ignore[arg-type]


def test_outside_a_pool_task_it_does_nothing() -> None:
    """A handler called directly (a unit test of it) may report: nothing happens."""
    progress(0.25, "a step")
    progress(1)


def test_a_crashed_task_leaves_no_record(tmp_path: Path, done_log: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue_batch([b"a", b"b"])
    report = run(path, _handlers.report_then_crash_once, processes=2, until_empty=True)
    assert (report.processed, report.crashed) == (2, 2)
    assert read_progress(str(path)) == []
