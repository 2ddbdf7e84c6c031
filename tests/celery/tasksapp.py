"""The Celery app the tests' workers run: ``celery -A tests.celery.tasksapp worker``.

Its broker is ``ledgerq://`` + ``$LEDGERQ_TEST_BROKER`` (encrypted with the key in the
file ``$LEDGERQ_TEST_KEY_FILE`` when that is set); every task run leaves a file
in ``$LEDGERQ_TEST_OUT`` named ``<tag>.<event>.<pid>.<time_ns>`` (created whole, by
rename), which the tests read: what ran, how often, when and in which process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery

BROKER_DIR = os.environ.get("LEDGERQ_TEST_BROKER", "/nonexistent")
KEY_FILE = os.environ.get("LEDGERQ_TEST_KEY_FILE")
# $LEDGERQ_TEST_RESULT_BACKEND: a result backend for the tests of results (none else).
app = Celery(
    "tasksapp",
    broker=f"ledgerq://{BROKER_DIR}",
    backend=os.environ.get("LEDGERQ_TEST_RESULT_BACKEND") or None,
)
app.conf.update(
    task_acks_late=True,  # at-least-once: acked when the task is done
    task_reject_on_worker_lost=True,  # a pool process killed mid-task: the task comes back
    worker_prefetch_multiplier=1,
    worker_lost_wait=1.0,  # how long Celery waits for a killed pool process's result
    broker_connection_retry_on_startup=False,
    broker_transport_options={
        "polling_interval": 0.5,
        **({"encryption_key_file": KEY_FILE} if KEY_FILE else {}),
    },
)


def _out() -> Path:
    return Path(os.environ["LEDGERQ_TEST_OUT"])


def note(tag: str, event: str) -> None:
    """Leave the file ``<tag>.<event>.<pid>.<time_ns>``."""
    name = f"{tag}.{event}.{os.getpid()}.{time.time_ns()}"
    temporary = _out() / f".{name}"
    temporary.write_text("")
    temporary.rename(_out() / name)


def events(tag: str, event: str) -> list[Path]:
    return sorted(_out().glob(f"{tag}.{event}.*"))


@app.task(name="tasksapp.record")
def record(tag: str) -> str:
    note(tag, "done")
    return tag


@app.task(name="tasksapp.hold_first_run")
def hold_first_run(tag: str) -> str:
    """Started once: wait (up to a minute) for a kill; started again: finish."""
    first = not events(tag, "started")
    note(tag, "started")
    if first:
        time.sleep(60)
    note(tag, "done")
    return tag


@app.task(name="tasksapp.retry_once", bind=True, max_retries=3)
def retry_once(self: Any, tag: str, countdown: float) -> str:
    if not events(tag, "tried"):
        note(tag, "tried")
        raise self.retry(countdown=countdown)
    note(tag, "done")
    return tag
