"""Celery with ledgerq as its broker: no RabbitMQ, no Redis - a directory.

``Celery(broker="ledgerq:///abs/dir")`` is all it takes once ``ledgerq[celery]`` is
installed.  This file is both the Celery app (the worker imports it) and a script that
starts a real ``celery worker`` (two prefork processes), sends it tasks from this
process and reads their results through Celery's file result backend:

* a plain task and its result;
* ``countdown=2``: the broker holds the task (a delayed ledgerq message) for 2 seconds;
* a flaky task that calls ``self.retry(countdown=1)`` until it succeeds;
* ``task_acks_late=True``: a task is acked when it is done, so a worker killed mid-task
  gets it again (docs/celery.md).

Run: python examples/celery_app.py [DIR]   (the broker goes into DIR/broker)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from celery import Celery

HERE = Path(__file__).resolve().parent
BASE = Path(os.environ.get("CELERY_APP_DIR") or tempfile.gettempdir()).resolve()

app = Celery(
    "celery_app",
    broker=f"ledgerq://{BASE / 'broker'}",  # three slashes: ledgerq:///abs/dir
    backend=f"file://{BASE / 'results'}",  # results as files: no server either
)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={
        # Any ledgerq.open option, for every queue of the broker (docs/celery.md).
        "queue_options": {"sync": "interval", "max_retries": 5},
        "polling_interval": 0.5,
    },
)


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task(bind=True, max_retries=5)
def flaky(self: Any, fail_times: int) -> int:
    """Fail ``fail_times`` times, retrying a second later each time; return the tries."""
    if self.request.retries < fail_times:
        raise self.retry(countdown=1)
    return int(self.request.retries) + 1


def start_worker() -> subprocess.Popen[bytes]:
    env = dict(os.environ, CELERY_APP_DIR=str(BASE))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-c", "2",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=WARNING"],
        cwd=HERE,  # the worker imports this file as the module celery_app
        env=env,
    )  # fmt: skip
    # Wait until the worker answers a ping through the broker (a broadcast and a reply).
    deadline = time.monotonic() + 60
    while not app.control.ping(timeout=0.5):
        if worker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the worker did not start")
    return worker


def main() -> None:
    print(f"broker: {app.conf.broker_url}")
    (BASE / "results").mkdir(parents=True, exist_ok=True)  # the file backend's directory
    worker = start_worker()
    try:
        print("add(2, 3) =", add.delay(2, 3).get(timeout=30))

        sent = time.monotonic()
        later = add.apply_async((20, 22), countdown=2)
        print(f"add(20, 22) with countdown=2 = {later.get(timeout=30)}", end=" ")
        print(f"after {time.monotonic() - sent:.1f} s")

        tries = flaky.delay(2).get(timeout=30)
        print(f"flaky(2) succeeded at try {tries} (two retries, each a second later)")
    finally:
        worker.send_signal(signal.SIGTERM)  # warm shutdown: running tasks finish
        worker.wait(60)

    import ledgerq  # the broker's queues are ledgerq queues: look at one

    with ledgerq.open(BASE / "broker" / "queues" / "celery", shared=True) as queue:
        stats = queue.stats()
        print(f"queue 'celery': {stats.enqueued} enqueued, {stats.acked} acked, {len(queue)} left")


if __name__ == "__main__":
    if len(sys.argv) > 1:  # the directory to use: the module reads it when imported
        os.environ["CELERY_APP_DIR"] = str(Path(sys.argv[1]).resolve())
        os.execv(sys.executable, [sys.executable, __file__])
    main()
