"""The console shows what worker pools leave: the rate limit, the start rate, progress."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import ledgerq
from ledgerq.segment.readonly import read_progress
from ledgerq.workers import WorkerReport, run
from tests._child import Children
from tests.shared._procs import wait_until
from tests.workers import _handlers

from ._console import open_console


def test_the_queue_page_and_api_show_the_limit_and_in_flight_progress(
    tmp_path: Path, children: Children, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    path = root / "jobs"
    go_dir = tmp_path / "go"
    go_dir.mkdir()
    monkeypatch.setenv(_handlers.GO_DIR, str(go_dir))
    monkeypatch.setenv(_handlers.DONE_LOG, str(tmp_path / "done.log"))
    os.mkfifo(go_dir / "go-job")
    with ledgerq.open(path) as q:
        (message_id,) = q.enqueue_batch([b"job"])
    client = open_console(children, root)
    assert client.get("/api/queue?q=jobs").json()["rate_limit"] is None
    assert "Start limit" not in client.get("/queue?q=jobs").text
    reports: list[WorkerReport] = []

    def pool() -> None:
        reports.append(
            run(path, _handlers.report_then_wait, processes=1, until_empty=True, rate_limit="5/m")
        )

    worker = threading.Thread(target=pool)
    worker.start()
    try:
        wait_until(lambda: read_progress(str(path)), 60, "the handler's report")
        value = client.get("/api/queue?q=jobs").json()
        assert value["rate_limit"]["limit"] == "5/m" and value["rate_limit"]["starts"] == 1
        assert 0 < value["rate_limit"]["current_rate"] <= 1
        (report,) = value["in_flight_progress"]
        assert (report["id"], report["attempts"]) == (message_id, 1)
        assert (report["fraction"], report["note"]) == (0.5, "half of job")
        page = client.get("/queue?q=jobs").text
        assert "Start limit" in page and "5/m" in page and "Starts, last minute" in page
        assert "50.0%" in page and "half of job" in page
    finally:
        with open(go_dir / "go-job", "wb"):
            pass  # the handler goes on
        worker.join(60)
    assert reports and reports[0].processed == 1
    assert client.get("/api/queue?q=jobs").json()["in_flight_progress"] == []
