"""The benchmark's task: count the run (one byte appended to ``BENCH_COUNT_FILE``)."""

from __future__ import annotations

import os

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

_fd: int | None = None


@task()
def noop() -> None:
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["BENCH_COUNT_FILE"], os.O_WRONLY | os.O_APPEND)
    os.write(_fd, b".")
