"""The whole worker killed with SIGKILL (main and pool processes) and started again:
with ``task_acks_late=True`` the tasks it was running run again, the acked ones don't.
And ``celery purge`` on a broker with waiting tasks."""

from __future__ import annotations

from pathlib import Path

from celery import Celery

import ledgerq
from tests.celery._worker import Broker, Worker, wait_until

WAIT = 30.0


def _wait_for_events(broker: Broker, tags: tuple[str, ...], event: str, what: str) -> None:
    """Wait until each of ``tags`` has had ``event`` (a mark its task left)."""
    wait_until(lambda: all(broker.events(tag, event) for tag in tags), WAIT, what)


def test_a_worker_killed_with_sigkill_leaves_nothing_lost_and_acked_tasks_done_once(
    tmp_path: Path,
) -> None:
    broker = Broker(tmp_path)
    client = Celery("client", broker=broker.url)
    first = Worker(broker, tmp_path / "first.log", name="first")
    try:
        first.wait_ready()
        for tag in ("quick-1", "quick-2"):
            client.send_task("tasksapp.record", args=[tag])
        _wait_for_events(broker, ("quick-1", "quick-2"), "done", "the quick tasks")
        # Two tasks that hold both pool processes until the kill (acks_late: not acked).
        for tag in ("held-1", "held-2"):
            client.send_task("tasksapp.hold_first_run", args=[tag])
        _wait_for_events(broker, ("held-1", "held-2"), "started", "the held tasks to start")
    finally:
        first.kill()
    second = Worker(broker, tmp_path / "second.log", name="second")
    try:
        second.wait_ready()
        _wait_for_events(broker, ("held-1", "held-2"), "done", "the held tasks to run again")
        for tag in ("held-1", "held-2"):
            assert len(broker.events(tag, "started")) == 2, tag
            assert len(broker.events(tag, "done")) == 1, tag
        for tag in ("quick-1", "quick-2"):
            assert len(broker.events(tag, "done")) == 1, tag  # acked: never again
    finally:
        second.stop()
        client.close()


def test_celery_purge_removes_the_waiting_tasks(tmp_path: Path) -> None:
    broker = Broker(tmp_path)
    client = Celery("client", broker=broker.url)
    try:
        for i in range(3):
            client.send_task("tasksapp.record", args=[f"purged-{i}"])
    finally:
        client.close()
    result = broker.celery("purge", "--force")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Purged 3 messages" in result.stdout
    with ledgerq.open(broker.dir / "queues" / "celery", shared=True) as queue:
        assert len(queue) == 0
        assert queue.stats().enqueued == 3
