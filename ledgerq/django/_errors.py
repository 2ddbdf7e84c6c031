"""The error a result records for an attempt that ended without one of its own."""

from __future__ import annotations

__all__ = ["WorkerLostError", "class_path"]


class WorkerLostError(Exception):
    """An attempt of a task ended without a result: its worker process died (killed,
    crashed, out of memory, past ``--task-timeout``) or the worker was stopped at once.

    Never raised: ``TaskResult.errors`` holds one, by its class path
    ``ledgerq.django.WorkerLostError``, for each such attempt - so a finished result has
    one error per failed attempt.  The task was delivered again (at-least-once) until
    ``max_retries`` failed deliveries, then moved to its queue's dead-letter queue.
    """


# Spelled where users import it from, so that TaskError.exception_class resolves it.
WorkerLostError.__module__ = "ledgerq.django"


def class_path(kind: type[BaseException]) -> str:
    """``module.QualName`` of an exception class, as Django's ``TaskError`` spells it."""
    return f"{kind.__module__}.{kind.__qualname__}"
