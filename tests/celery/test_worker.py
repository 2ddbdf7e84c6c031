"""A real prefork ``celery worker`` on a ledgerq broker, fed from other processes.

One worker serves every test of this module (a worker takes a second or two to start);
each test uses its own task tags, so they do not see each other's runs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

import ledgerq
from tests._child import REPO, Children
from tests.celery._worker import Broker, Worker, wait_until

WAIT = 30.0  # seconds: a deadline for one wait, far above what a loaded machine needs


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("celery-worker")
    broker = Broker(root)
    worker = Worker(broker, root / "worker.log", name="shared")
    try:
        worker.wait_ready()
        broker.worker = worker  # type: ignore[attr-defined]
        yield broker
    finally:
        worker.stop()


@pytest.fixture
def client(broker: Broker) -> Iterator[Celery]:
    """A Celery app in this (the test's) process that sends tasks by name."""
    app = Celery("client", broker=broker.url)
    try:
        yield app
    finally:
        app.close()


def queue_stats(broker: Broker, name: str = "celery") -> ledgerq.Stats:
    with ledgerq.open(broker.dir / "queues" / name, shared=True) as queue:
        return queue.stats()


def test_tasks_sent_by_another_process_run_once_each(broker: Broker) -> None:
    send = (
        "import sys\nfrom celery import Celery\n"
        "app = Celery(broker=sys.argv[1])\n"
        "for i in range(5):\n    app.send_task('tasksapp.record', args=[f'other-{i}'])\n"
    )
    subprocess.run([sys.executable, "-c", send, broker.url], cwd=REPO, check=True, timeout=60)
    wait_until(lambda: all(broker.events(f"other-{i}", "done") for i in range(5)), WAIT, "5 tasks")
    assert [len(broker.events(f"other-{i}", "done")) for i in range(5)] == [1] * 5
    assert queue_stats(broker).in_flight == 0  # every task acked


def test_countdown_is_held_by_the_broker_and_never_runs_early(
    broker: Broker, client: Celery
) -> None:
    sent = time.time()
    client.send_task("tasksapp.record", args=["countdown"], countdown=1.5)
    # The broker holds it, not the worker: a delayed message in the queue.
    assert queue_stats(broker).delayed == 1
    wait_until(lambda: broker.events("countdown", "done"), WAIT, "the countdown task")
    [ran] = broker.times("countdown", "done")
    assert ran >= sent + 1.5


def test_retry_with_countdown_waits_then_runs(broker: Broker, client: Celery) -> None:
    client.send_task("tasksapp.retry_once", args=["retry", 1.0])
    wait_until(lambda: broker.events("retry", "done"), WAIT, "the retried task")
    [tried] = broker.times("retry", "tried")
    [done] = broker.times("retry", "done")
    assert done >= tried + 1.0


def test_a_pool_process_killed_mid_task_runs_the_task_again(broker: Broker, client: Celery) -> None:
    client.send_task("tasksapp.hold_first_run", args=["poolkill"])
    wait_until(lambda: broker.events("poolkill", "started"), WAIT, "the task to start")
    [started] = broker.events("poolkill", "started")
    pool_pid = int(started.name.split(".")[2])
    assert pool_pid != broker.worker.proc.pid  # type: ignore[attr-defined]
    os.kill(pool_pid, signal.SIGKILL)
    wait_until(lambda: broker.events("poolkill", "done"), WAIT, "the task's second run")
    assert len(broker.events("poolkill", "started")) == 2
    assert len(broker.events("poolkill", "done")) == 1
    # acks_late: the worker acks after the task's body (which wrote "done") returned.
    wait_until(lambda: queue_stats(broker).in_flight == 0, WAIT, "the second run's ack")
    assert queue_stats(broker).dead_lettered == 0


def test_inspect_ping_reaches_the_worker_through_the_broker(broker: Broker) -> None:
    # With a destination, inspect returns at the first reply instead of waiting out
    # the timeout for unknown others.
    node = f"shared@{socket.gethostname()}"
    result = broker.celery("inspect", "ping", "--destination", node, "--timeout", "10")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{node}: OK" in result.stdout
    assert "pong" in result.stdout
    # The client's reply queue lived as long as the command: removed, not left behind.
    assert not list((broker.dir / "queues").glob("*.reply.celery.pidbox"))


def test_a_message_kombu_cannot_decode_is_dead_lettered_once(
    broker: Broker, client: Celery
) -> None:
    with ledgerq.open(broker.dir / "queues" / "celery", shared=True) as queue:
        queue.enqueue(b"\xffnot a kombu message")
    client.send_task("tasksapp.record", args=["after-garbage"])
    wait_until(lambda: broker.events("after-garbage", "done"), WAIT, "the next task")
    with ledgerq.open(broker.dir / "queues" / "celery", shared=True) as queue:
        [dead] = queue.dlq.peek(5)
        assert dead.payload == b"\xffnot a kombu message"
        assert dead.headers["dlq.failure_reason"].startswith("not a kombu message")
    log = broker.worker.log_text()  # type: ignore[attr-defined]
    assert log.count("to its dead-letter queue") == 1
    # Neither kombu nor Celery met it (the pool kill test's WorkerLostError is
    # the only traceback this worker logs).
    assert "UndecodableMessageError" not in log
    assert "Can't decode message body" not in log  # Celery's own complaint


# A client of rpc:// results: sends tasks, waits for their results, and exits without
# closing anything (as scripts do) - or, with "hold", waits on stdin to be killed.
_RPC_CLIENT = """
import sys
from celery import Celery
app = Celery(broker=sys.argv[1], backend="rpc://")
for i in range(3):
    assert app.send_task("tasksapp.record", args=[f"rpc-{sys.argv[2]}-{i}"]).get(timeout=30) \\
        == f"rpc-{sys.argv[2]}-{i}"
print("got", app.thread_oid, flush=True)
if sys.argv[3] == "hold":
    sys.stdin.readline()
"""


def test_an_rpc_client_s_reply_queue_goes_with_it(tmp_path: Path, children: Children) -> None:
    """Issue 25: every rpc:// client left its reply queue (``queues/<uuid>``) behind.
    It is declared auto-delete: removed when its client exits, and - for a client
    killed first - by the next process that connects."""
    broker = Broker(tmp_path, result_backend="rpc://")
    worker = Worker(broker, tmp_path / "worker.log", name="results")
    try:
        worker.wait_ready()
        queues = broker.dir / "queues"
        clean = children.start(["-c", _RPC_CLIENT, broker.url, "clean", "exit"], env=broker.env())
        clean_queue = queues / clean.wait_for("got ").split()[1]
        clean.expect_exit(0)
        # Removed at its exit - unless the worker's handle that sent the last reply was
        # still open at that instant (a busy machine): its record stays, and the next
        # process that connects removes it.
        killed = children.start(["-c", _RPC_CLIENT, broker.url, "killed", "hold"], env=broker.env())
        reply_queue = killed.wait_for("got ").split()[1]
        assert not clean_queue.exists()
        assert (queues / reply_queue).is_dir()  # in use while its client runs
        killed.kill_and_drain()
        # The next process that connects (a producer here) removes the dead client's.
        subprocess.run(
            [sys.executable, "-c", _RPC_CLIENT, broker.url, "next", "exit"],
            cwd=REPO,
            env=broker.env(),
            check=True,
            timeout=120,
        )
        assert not (queues / reply_queue).exists()
        pidbox = f"results@{socket.gethostname()}.celery.pidbox"  # the live worker's
        assert sorted(p.name for p in queues.iterdir()) == ["celery", pidbox]
        assert [p.name for p in (broker.dir / "temporary").iterdir()] == [f"{pidbox}.json"]
    finally:
        worker.stop()
