"""One delivery of a task, in a worker's task process: the handler given to
:func:`ledgerq.workers.run`.

The order of what it does is what a crash at any point relies on:

1. decode the message (not a task of this backend: raise - it is retried, then lands
   in the dead-letter queue, where an operator sees it; nothing is dropped);
2. mark the result ``RUNNING``, adding this process to ``worker_ids`` (a delivery of a
   message that already finished the task - its ack lost to a crash - stops here);
3. import the task (it cannot be: the result is ``FAILED`` with the ``ImportError``, and
   the message acked - no loop of redeliveries, the arguments are in the result);
4. run it; record ``SUCCESSFUL`` with the return value (JSON, as Django requires: one
   that is not is a failure) or ``FAILED`` with the exception's class path and
   traceback; the message is acked when this returns.  Django's semantics: a task that
   raises is not run again.  ``raise ledgerq.workers.Retry(delay)`` in a task asks for
   another attempt (``READY`` again, the error recorded; it counts toward
   ``max_retries``).

A kill anywhere leaves the result ``RUNNING`` with this process in ``worker_ids``: the
next delivery (step 2) records the lost attempt as a ``WorkerLostError``, and the
keeper (:mod:`ledgerq.django._keeper`) marks the result ``FAILED`` if it was the
last one ``max_retries`` allows.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from typing import Any

from django.db import close_old_connections
from django.utils.module_loading import import_string

import ledgerq
from ledgerq.django import _compat
from ledgerq.django._errors import class_path
from ledgerq.django._payload import decode
from ledgerq.django._process import worker_id
from ledgerq.django.backend import LedgerQBackend, build_result, build_task
from ledgerq.workers import Retry

__all__ = ["TaskHandler"]

logger = logging.getLogger("ledgerq.django")

# A task due later than this by the worker's clock (the queue's clock said it is due:
# the wall clock was stepped since one of them opened the queue) goes back to the
# queue; a shorter wait is waited here, so run_after is never early.
_LONGEST_WAIT_S = 5.0


def _error_of(exc: BaseException) -> tuple[str, str]:
    return class_path(type(exc)), "".join(traceback.format_exception(exc))


def _load(path: str) -> Any:
    task = import_string(path)
    if not isinstance(task, _compat.Task):
        raise TypeError(f"{path} is a {type(task).__name__}, not a task (decorate it with @task)")
    return task


class TaskHandler:
    """Runs the tasks of one backend, one delivery at a time (a ``workers.run`` handler)."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def backend(self) -> LedgerQBackend:
        backend = _compat.task_backends[self.alias]
        assert isinstance(backend, LedgerQBackend)
        return backend

    def __call__(self, message: ledgerq.Message) -> None:
        task_message = decode(message.payload)  # PayloadError: retried, then dead-lettered
        if task_message.run_after_ns is not None:
            early_s = (task_message.run_after_ns - time.time_ns()) / 1e9
            if early_s > _LONGEST_WAIT_S:
                raise Retry(early_s, "due later by this process's clock (was it stepped?)")
            if early_s > 0:
                time.sleep(early_s)
        backend = self.backend()
        store = backend.store
        stored = store.begin_attempt(task_message, message.id, worker_id(), time.time_ns())
        if stored is None:
            logger.info(
                "ledgerq_worker: task %s (result %s) already finished: message %d acked again",
                task_message.task_path,
                task_message.result_id,
                message.id,
            )
            return
        try:
            found = _load(task_message.task_path)
        except Exception as exc:  # ImportError, AttributeError, TypeError: all the same
            store.finish(stored, now_ns=time.time_ns(), error=_error_of(exc))
            logger.error(
                "ledgerq_worker: task %s (result %s) cannot be loaded here: %s: %s - "
                "its result is FAILED",
                task_message.task_path,
                stored.id,
                type(exc).__name__,
                exc,
            )
            return
        task = build_task(stored, self.alias, found)
        result = build_result(stored, task)
        sender = type(backend)
        _compat.task_started.send(sender=sender, task_result=result)
        close_old_connections()  # as a request would: no stale database connection
        try:
            if task.takes_context:
                value = task.call(
                    _compat.TaskContext(task_result=result), *stored.args, **stored.kwargs
                )
            else:
                value = task.call(*stored.args, **stored.kwargs)
            return_json = json.dumps(_compat.normalize_json(value), allow_nan=False)
        except Retry as exc:
            close_old_connections()
            store.finish(stored, now_ns=time.time_ns(), error=_error_of(exc), ready_again=True)
            raise
        except BaseException as exc:  # a task that calls sys.exit() failed too
            close_old_connections()
            final = store.finish(stored, now_ns=time.time_ns(), error=_error_of(exc))
            if final is not None:  # sent here, so the framework's log has the traceback
                _compat.task_finished.send(sender=sender, task_result=build_result(final, task))
            return
        close_old_connections()
        final = store.finish(stored, now_ns=time.time_ns(), return_json=return_json)
        if final is not None:
            _compat.task_finished.send(sender=sender, task_result=build_result(final, task))
