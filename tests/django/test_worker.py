"""``manage.py ledgerq_worker`` in real processes, tasks sent from other processes, results
read from others again: what runs, in which order, how often, and what the result says."""

from __future__ import annotations

import datetime
import signal
import textwrap
from pathlib import Path

import pytest

import ledgerq
from ledgerq.django import WorkerLostError
from tests.django._project import Site, wait_until


def test_tasks_sent_from_other_processes_run_once_and_every_process_reads_their_results(
    site: Site,
) -> None:
    worker = site.worker("worker", "--processes", "2")
    jobs = [{"task": "tasksapp.tasks.record", "args": [f"t{i}"]} for i in range(10)]
    first = site.enqueue(jobs[:5])
    *second, context = site.enqueue(
        [
            *jobs[5:],
            {"task": "tasksapp.tasks.send_email", "args": ["a@b"]},
            {"task": "tasksapp.tasks.attempt_number", "args": ["ctx"]},
            {"task": "tasksapp.tasks.async_add", "args": [2, 3]},
            {"task": "tasksapp.tasks.add", "kwargs": {"a": 1, "b": 2}},
        ]
    )
    ids, context = first + second[:6], [*second[6:], context]
    for result_id in ids + context:
        site.wait_status(result_id, "SUCCESSFUL")
    for i in range(10):
        assert len(site.marks(f"t{i}", "done")) == 1, f"t{i} ran {site.marks(f't{i}', 'done')}"
    read = site.read_results(ids + context)  # from yet another process
    assert [r["return_value"] for r in read] == [f"t{i}" for i in range(10)] + [
        {"sent": "a@b"},
        1,
        5,
        3,
    ]
    for r in read:
        assert r["status"] == "SUCCESSFUL"
        assert r["attempts"] == 1 and len(r["worker_ids"]) == 1
        assert r["errors"] == []
        assert r["enqueued_at"] <= r["started_at"] <= r["finished_at"]
        assert r["last_attempted_at"] == r["started_at"]
    assert read[10]["task"] == "tasksapp.tasks.send_email"
    assert read[0]["args"] == ["t0"] and read[-1]["kwargs"] == {"a": 1, "b": 2}
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait_exit() == 0, worker.text()


def test_a_result_goes_from_ready_to_running_to_successful(site: Site) -> None:
    (result_id,) = site.enqueue_here([{"task": "tasksapp.tasks.wait_for_file", "args": ["held"]}])
    assert str(site.result(result_id).status) == "READY"  # no worker yet
    site.worker("worker", "--processes", "1")
    running = site.wait_status(result_id, "RUNNING")
    assert running.started_at is not None and running.finished_at is None
    assert running.attempts == 1
    (site.out / "held.release").touch()
    done = site.wait_status(result_id, "SUCCESSFUL")
    assert done.return_value == "held"
    assert done.started_at == running.started_at
    # TaskResult.refresh() reads the same store.
    running.refresh()
    assert str(running.status) == "SUCCESSFUL" and running.return_value == "held"


def test_failures_are_recorded_with_the_exception_class_path_and_traceback_and_not_retried(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A task module this process can import and the worker cannot (a deploy skew).
    ghost = tmp_path / "ghost"
    ghost.mkdir()
    (ghost / "ghost_tasks.py").write_text(
        textwrap.dedent(
            """
            try:
                from django.tasks import task
            except ImportError:
                from django_tasks import task

            @task()
            def vanish() -> None: ...
            """
        )
    )
    monkeypatch.syspath_prepend(ghost)
    (missing,) = site.enqueue_here([{"task": "ghost_tasks.vanish"}])
    failing, bad_return, after = site.enqueue_here(
        [
            {"task": "tasksapp.tasks.fail", "args": ["boom"]},
            {"task": "tasksapp.tasks.returns_a_set"},
            {"task": "tasksapp.tasks.record", "args": ["after"]},
        ]
    )
    worker = site.worker("worker", "--processes", "1")
    site.wait_status(after, "SUCCESSFUL")  # the worker goes on after each failure

    failed = site.wait_status(failing, "FAILED")
    (error,) = failed.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback and "tasks.py" in error.traceback
    assert failed.finished_at is not None and failed.attempts == 1
    assert len(site.marks("boom", "started")) == 1  # Django's semantics: not run again

    (error,) = site.wait_status(bad_return, "FAILED").errors
    assert error.exception_class_path == "builtins.TypeError"  # a set is not JSON

    unloadable = site.wait_status(missing, "FAILED")
    (error,) = unloadable.errors
    assert error.exception_class_path == "builtins.ModuleNotFoundError"
    assert "ghost_tasks" in error.traceback
    assert unloadable.task.module_path == "ghost_tasks.vanish"  # readable here, too
    assert worker.text().count("ghost_tasks.vanish") == 1, worker.text()  # one line, no loop
    with ledgerq.open(site.dir / "queues" / "default", shared=True) as queue:
        assert queue.stats().dead_lettered == 0 and len(queue) == 0


def test_priorities_order_a_backlog_and_run_after_is_never_early(site: Site) -> None:
    levels = [-50, 0, 30, 100, -1, 0, 30, 1, -50, 0]
    jobs = [
        {"task": "tasksapp.tasks.in_order", "args": [f"{p}/{i}"], "priority": p}
        for i, p in enumerate(levels)
    ]
    jobs.append({"task": "tasksapp.tasks.record", "args": ["later"], "run_after_s": 1.5})
    jobs.append({"task": "tasksapp.tasks.record", "args": ["past"], "run_after_s": -60})
    *ids, later, past = site.enqueue_here(jobs)
    worker = site.worker("worker", "--processes", "1", "--queue-name", "default", "--until-empty")
    assert worker.wait_exit() == 0, worker.text()  # it waited for the delayed task too
    ran = (site.out / "order.log").read_text().split()
    # Positive priorities first, then 0, then negative ones; inside each, in enqueue order.
    expected = [
        f"{p}/{i}" for sign in (1, 0, -1) for i, p in enumerate(levels) if (p > 0) - (p < 0) == sign
    ]
    assert ran == expected
    delayed = site.result(later)
    assert delayed.started_at >= delayed.task.run_after
    assert datetime.datetime.fromtimestamp(site.marks("later", "done")[0], datetime.UTC) >= (
        delayed.task.run_after
    )
    assert str(site.result(past).status) == "SUCCESSFUL"
    assert [str(site.result(i).task.priority) for i in ids] == [str(p) for p in levels]


def test_a_worker_killed_mid_task_runs_the_task_again_in_a_new_worker(site: Site) -> None:
    (result_id,) = site.enqueue_here(
        [{"task": "tasksapp.tasks.hang_on_first_attempt", "args": ["k"]}]
    )
    first = site.worker("first", "--processes", "1")
    running = site.wait_status(result_id, "RUNNING")
    wait_until(lambda: site.marks("k", "started1"), "the first attempt to start")
    first.kill()  # SIGKILL: the pool and the task process die with it
    # Read from another process: the attempt's process is gone, the task is not running.
    lost = wait_until(
        lambda: (r := site.read_results([result_id])[0])["status"] == "READY" and r,
        "the result to say the attempt was lost",
    )
    assert lost["attempts"] == 1 and lost["errors"][0][0] == "ledgerq.django.WorkerLostError"
    second = site.worker("second", "--processes", "1")
    done = site.wait_status(result_id, "SUCCESSFUL")
    assert done.return_value == 2 and done.attempts == 2
    assert done.worker_ids[0] == running.worker_ids[0] != done.worker_ids[1]
    (error,) = done.errors
    assert error.exception_class is WorkerLostError
    assert "attempt 1" in error.traceback
    assert done.started_at == running.started_at < done.last_attempted_at
    assert len(site.marks("k", "done")) == 1
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait_exit() == 0, second.text()


def test_tasks_whose_deliveries_all_fail_end_failed_after_max_retries_and_stay_in_the_dlq(
    tmp_path: Path,
) -> None:
    with Site(tmp_path, {"max_retries": 2}) as site:
        crashing, retrying, hanging = site.enqueue_here(
            [
                {"task": "tasksapp.tasks.crash", "args": ["c"]},
                {"task": "tasksapp.tasks.retry_later", "args": ["r"]},
                {"task": "tasksapp.tasks.wait_for_file", "args": ["never-released"]},
            ]
        )
        with ledgerq.open(site.dir / "queues" / "default", shared=True) as queue:
            queue.enqueue(b"not a task")  # something else put into the queue
        worker = site.worker("worker", "--processes", "2", "--task-timeout", "1")
        crashed = site.wait_status(crashing, "FAILED")
        assert crashed.attempts == 2 and len(site.marks("c", "started")) == 2
        assert [e.exception_class_path for e in crashed.errors] == [
            "ledgerq.django.WorkerLostError"
        ] * 2
        assert "exit code 3" in crashed.errors[1].traceback
        assert "dead-letter queue" in crashed.errors[1].traceback
        retried = site.wait_status(retrying, "FAILED")
        assert [e.exception_class_path for e in retried.errors] == ["ledgerq.workers.Retry"] * 2
        assert "not yet" in retried.errors[0].traceback
        timed_out = site.wait_status(hanging, "FAILED")
        assert timed_out.attempts == 2 and site.marks("never-released", "done") == []
        assert "task timed out after 1 s" in timed_out.errors[1].traceback
        with ledgerq.open(site.dir / "queues" / "default", shared=True) as queue:
            dead = wait_until(lambda: len(queue.dlq) == 4 and queue.dlq.peek(4), "4 dead letters")
            assert b"not a task" in [m.payload for m in dead]  # nothing dropped
        wait_until(lambda: "is not a task" in worker.text(), "the keeper's word on it")
        assert worker.text().count("is not a task") == 1, worker.text()
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait_exit() == 0, worker.text()


def test_sigterm_lets_the_running_task_finish_then_the_worker_exits(site: Site) -> None:
    held, waiting = site.enqueue_here(
        [
            {"task": "tasksapp.tasks.wait_for_file", "args": ["drain"]},
            {"task": "tasksapp.tasks.record", "args": ["not-started"]},
        ]
    )
    worker = site.worker("worker", "--processes", "1")
    site.wait_status(held, "RUNNING")
    worker.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "stopping" in worker.text(), "the worker to say it stops")
    (site.out / "drain.release").touch()
    assert worker.wait_exit() == 0, worker.text()
    assert str(site.result(held).status) == "SUCCESSFUL"
    assert str(site.result(waiting).status) == "READY"  # still queued, for the next worker
    assert site.marks("not-started", "done") == []
