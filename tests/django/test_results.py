"""The results database alone, with the times given (no clock to wait for): pruning after
``result_ttl``, attempts lost to dead processes, dead letters, redeliveries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ledgerq.django._payload import TaskMessage
from ledgerq.django._process import is_gone, worker_id
from ledgerq.django._results import ResultStore, StoredResult

DAY_NS = 86_400 * 10**9
NOW = 1_800_000_000 * 10**9


def message(
    result_id: str, *, enqueued_ns: int = NOW, run_after_ns: int | None = None
) -> TaskMessage:
    return TaskMessage(
        result_id=result_id,
        task_path="tasksapp.tasks.add",
        args=[1, 2],
        kwargs={},
        backend="default",
        queue="default",
        priority=0,
        enqueued_ns=enqueued_ns,
        run_after_ns=run_after_ns,
    )


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    return ResultStore(str(tmp_path / "results.sqlite3"), ttl_s=7 * 86_400, durable=False)


def test_results_are_pruned_result_ttl_after_they_finished_or_were_last_due(
    store: ResultStore,
) -> None:
    for name, days_ago in (("old", 8), ("recent", 6)):
        store.add(StoredResult.of_message(message(name, enqueued_ns=NOW - days_ago * DAY_NS)))
        running = store.begin_attempt(message(name), 1, "w", NOW - days_ago * DAY_NS)
        assert running is not None
        store.finish(running, now_ns=NOW - days_ago * DAY_NS, return_json="3")
    # Never run: kept for result_ttl after the latest of its enqueue and its run_after.
    store.add(
        StoredResult.of_message(
            message("waiting", enqueued_ns=NOW - 30 * DAY_NS, run_after_ns=NOW + 30 * DAY_NS)
        )
    )
    store.add(StoredResult.of_message(message("forgotten", enqueued_ns=NOW - 8 * DAY_NS)))
    assert store.prune(NOW) == 2
    assert store.get("old") is None and store.get("forgotten") is None
    assert store.get("recent") is not None and store.get("waiting") is not None


def test_an_attempt_whose_process_died_is_recorded_at_the_next_one(store: ResultStore) -> None:
    store.add(StoredResult.of_message(message("r")))
    store.begin_attempt(message("r"), 7, "w1", NOW)
    again = store.begin_attempt(message("r"), 7, "w2", NOW + 1)  # delivered again
    assert again is not None and again.worker_ids == ["w1", "w2"]
    (lost,) = again.errors
    assert lost[0] == "ledgerq.django.WorkerLostError" and "attempt 1" in lost[1]
    done = store.finish(again, now_ns=NOW + 2, return_json="3")
    assert done is not None and done.status == "SUCCESSFUL" and done.started_ns == NOW


def test_a_redelivery_of_the_message_that_finished_the_task_does_not_run_it_again(
    store: ResultStore,
) -> None:
    store.add(StoredResult.of_message(message("r")))
    running = store.begin_attempt(message("r"), 7, "w1", NOW)
    assert running is not None
    store.finish(running, now_ns=NOW + 1, error=("builtins.ValueError", "..."))
    assert store.begin_attempt(message("r"), 7, "w2", NOW + 2) is None  # ack lost
    rerun = store.begin_attempt(message("r"), 8, "w3", NOW + 3)  # requeued: a new message
    assert rerun is not None and rerun.status == "RUNNING" and rerun.finished_ns is None
    assert rerun.worker_ids == ["w1", "w3"]


def test_a_missing_result_is_made_again_from_the_message(store: ResultStore) -> None:
    started = store.begin_attempt(message("gone"), 3, "w", NOW)
    assert started is not None and started.args == [1, 2] and started.status == "RUNNING"


def test_a_dead_letter_fails_the_result_of_its_own_message_only(store: ResultStore) -> None:
    store.add(StoredResult.of_message(message("r")))
    store.begin_attempt(message("r"), 7, "w1", NOW)
    assert not store.dead_lettered("r", 6, "crashed", NOW + 1)  # another message's
    assert store.dead_lettered("r", 7, "worker process crashed (exit code 3)", NOW + 1)
    failed = store.get("r")
    assert failed is not None and failed.status == "FAILED" and failed.finished_ns == NOW + 1
    assert "exit code 3" in failed.errors[0][1]
    assert not store.dead_lettered("r", 7, "again", NOW + 2)  # already failed: unchanged
    assert len(store.get("r").errors) == 1  # type: ignore[union-attr]
    assert not store.dead_lettered("unknown", 1, "x", NOW)


def test_a_worker_id_names_a_live_process_until_it_ends() -> None:
    assert not is_gone(worker_id())
    child = subprocess.run(
        [sys.executable, "-c", "from ledgerq.django._process import worker_id; print(worker_id())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert is_gone(child.stdout.strip())  # it exited (its pid may even be reused)
    host, ns, pid, start = worker_id().rsplit(":", 3)
    assert is_gone(f"{host}:{ns}:{pid}:{int(start) + 1}")  # same pid, another process
    assert not is_gone(f"elsewhere:{ns}:{pid}:{start}")  # another host: cannot tell
    assert not is_gone(f"{host}:{int(ns) + 1}:{pid}:{start}")  # another container's pids
    assert not is_gone("not an id")


def test_an_attempt_ends_on_the_row_as_it_is_if_it_changed_meanwhile(store: ResultStore) -> None:
    store.add(StoredResult.of_message(message("r")))
    first = store.begin_attempt(message("r"), 7, "w1", NOW)
    assert first is not None and first.worker_ids == ["w1"]
    # Another delivery of it began meanwhile (the first process was thought dead).
    second = store.begin_attempt(message("r"), 7, "w2", NOW + 1)
    assert second is not None
    done = store.finish(first, now_ns=NOW + 2, return_json="3")
    assert done is not None and done.worker_ids == ["w1", "w2"]  # not written over
    stored = store.get("r")
    assert stored is not None and stored.status == "SUCCESSFUL" and len(stored.errors) == 1
    assert store.finish(first, now_ns=NOW + 3) is not None  # its row is there: no error
    store.remove("r")
    assert store.finish(first, now_ns=NOW + 4) is None
