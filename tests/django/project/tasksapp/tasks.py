"""The tests' tasks.  Each leaves a file in ``LEDGERQ_DJANGO_OUT`` named
``<tag>.<event>.<ns>`` (events: started, done) so tests see what ran, when and how often."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import ledgerq.workers

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


def _out() -> Path:
    return Path(os.environ["LEDGERQ_DJANGO_OUT"])


def note(tag: str, event: str) -> None:
    (_out() / f"{tag}.{event}.{time.time_ns()}").touch()


@task()
def record(tag: str) -> str:
    note(tag, "done")
    return tag


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails")
def send_email(to: str) -> dict[str, str]:
    note(to, "done")
    return {"sent": to}


@task()
def in_order(tag: str) -> None:
    """Append ``tag`` to order.log: the order tasks ran in."""
    with open(_out() / "order.log", "a") as log:
        log.write(tag + "\n")


@task()
def fail(text: str) -> None:
    note(text, "started")
    raise ValueError(text)


@task()
def returns_a_set() -> object:
    return {1, 2}


@task(takes_context=True)
def attempt_number(context: object, tag: str) -> int:
    note(tag, "done")
    return context.attempt  # type: ignore[attr-defined, no-any-return]


@task()
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task()
def wait_for_file(tag: str) -> str:
    """Run until ``<out>/<tag>.release`` exists (at most 60 s)."""
    note(tag, "started")
    release = _out() / f"{tag}.release"
    deadline = time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    note(tag, "done")
    return tag


@task(takes_context=True)
def hang_on_first_attempt(context: object, tag: str) -> int:
    """The first attempt never ends (it is killed); the next one returns its number."""
    attempt: int = context.attempt  # type: ignore[attr-defined]
    note(tag, f"started{attempt}")
    if attempt == 1:
        time.sleep(3600)
    note(tag, "done")
    return attempt


@task()
def crash(tag: str) -> None:
    """Kill the task's own process, every time."""
    note(tag, "started")
    os._exit(3)


@task()
def retry_later(tag: str) -> None:
    note(tag, "started")
    raise ledgerq.workers.Retry(0.05, "not yet")
