"""``LedgerQBackend``: Django's Tasks framework on ledgerq queues, with no server.

``enqueue`` checks the task as the framework requires, stores its result (``READY``) in
the backend's results database, then enqueues the task into the ledgerq queue of its
Tasks queue (``<path>/queues/<name>``, opened in shared mode, so any number of
processes enqueue and work at once): its path, arguments and kwargs as JSON, its
priority as a ledgerq level (the sign of the priority: docs/django.md), ``run_after``
as a ``delay``.  ``get_result`` reads the result from any process.  The worker side is
``python manage.py ledgerq_worker`` (:mod:`ledgerq.django._worker`).

Handles and database connections are per process (a forked child - a Django
prefork server's worker, a pool's task process - opens its own) and shared by every
backend instance of the process: Django makes one per thread.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

import ledgerq
from ledgerq.django import _compat
from ledgerq.django._config import BackendConfig, check_queue_name, parse_config
from ledgerq.django._payload import TaskMessage, level_of
from ledgerq.django._process import is_gone
from ledgerq.django._results import ResultStore, StoredResult

__all__ = ["LedgerQBackend", "from_ns", "to_ns"]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MICROSECOND = datetime.timedelta(microseconds=1)

_lock = threading.Lock()
_pid = os.getpid()
_handles: dict[tuple[str, tuple[tuple[str, Any], ...]], ledgerq.Queue] = {}
_stores: dict[tuple[str, float, bool], ResultStore] = {}
_prepared: set[str] = set()


def _this_process() -> None:
    """Forget what a parent process opened (called under ``_lock``): a forked child
    must open its own handles; the parent's are left as they are, never closed here."""
    global _pid
    if _pid != os.getpid():
        _pid = os.getpid()
        _handles.clear()
        _stores.clear()
        _prepared.clear()


@atexit.register
def _close_handles() -> None:
    with _lock:
        if _pid != os.getpid():
            return
        for handle in _handles.values():
            handle.close()
        _handles.clear()


def to_ns(moment: datetime.datetime) -> int:
    """Nanoseconds since the epoch of an aware datetime, or a naive one in local time."""
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return (moment - _EPOCH) // _MICROSECOND * 1000


def from_ns(ns: int | None) -> datetime.datetime | None:
    """The datetime of ``ns`` as Django's ``timezone.now()`` gives it: aware (UTC) with
    ``USE_TZ``, else naive local time."""
    if ns is None:
        return None
    moment = _EPOCH + datetime.timedelta(microseconds=ns // 1000)
    return moment if settings.USE_TZ else moment.astimezone().replace(tzinfo=None)


def _stand_in(path: str) -> Callable[..., Any]:
    """A function named ``path`` for the result of a task this process cannot import."""
    module, _, name = path.rpartition(".")

    def unavailable(*_args: Any, **_kwargs: Any) -> Any:
        raise ImportError(f"task {path} cannot be imported in this process")

    unavailable.__module__, unavailable.__qualname__, unavailable.__name__ = module, name, name
    return unavailable


def build_task(stored: StoredResult, alias: str, found: Any = None) -> Any:
    """The ``Task`` a stored result is of (``found``: that task, already imported): the
    importable one, with the priority, queue and ``run_after`` it was enqueued with - or
    a stand-in of the same path when the task cannot be imported here (a result still
    reads).  Not validated again: it describes what was enqueued, whatever the settings
    say now."""
    if found is None:
        try:
            found = import_string(stored.task_path)
        except Exception:  # ImportError, or whatever its module raises on import
            found = None
    values: dict[str, Any] = {}
    if isinstance(found, _compat.Task):
        values = {f.name: getattr(found, f.name) for f in fields(found)}
        cls: Any = type(found)
    else:
        values = {"func": _stand_in(stored.task_path), "takes_context": False}
        cls = _compat.Task
    values.update(
        priority=stored.priority,
        queue_name=stored.queue,
        backend=alias,
        run_after=from_ns(stored.run_after_ns),
    )
    task = object.__new__(cls)
    for name, value in values.items():
        object.__setattr__(task, name, value)
    return task


def build_result(stored: StoredResult, task: Any) -> Any:
    """A framework ``TaskResult`` of a stored result."""
    result = _compat.TaskResult(
        task=task,
        id=stored.id,
        status=_compat.TaskResultStatus[stored.status],
        enqueued_at=from_ns(stored.enqueued_ns),
        started_at=from_ns(stored.started_ns),
        finished_at=from_ns(stored.finished_ns),
        last_attempted_at=from_ns(stored.last_attempt_ns),
        args=stored.args,
        kwargs=stored.kwargs,
        backend=task.backend,
        errors=[
            _compat.TaskError(exception_class_path=path, traceback=text)
            for path, text in stored.errors
        ],
        worker_ids=list(stored.worker_ids),
    )
    if stored.return_json is not None:
        object.__setattr__(result, "_return_value", json.loads(stored.return_json))
    return result


class LedgerQBackend(_compat.BaseTaskBackend):
    """A Tasks backend storing tasks in ledgerq queues and results in SQLite, under
    ``OPTIONS["path"]``; ``python manage.py ledgerq_worker`` runs them.

    Raises ``ImproperlyConfigured`` when created with a relative or missing path, an
    unknown option or an invalid value (docs/django.md lists them).
    """

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.config: BackendConfig = parse_config(alias, self.options, self.queues)

    # -- storage

    def _prepare(self) -> None:
        """Create the backend's directory once per process (under ``_lock``)."""
        root = self.config.root
        if root in _prepared:
            return
        try:
            os.makedirs(os.path.join(root, "queues"), exist_ok=True)
        except OSError as exc:
            raise ImproperlyConfigured(
                f"{self.config.setting('path')} is {root!r}, which cannot be created: "
                f"{exc.strerror or exc}; name a directory this process may create and write"
            ) from None
        _prepared.add(root)

    @property
    def store(self) -> ResultStore:
        """The results database (opened per process and thread, created on first use)."""
        config = self.config
        durable = config.queue_options.get("sync") == "always"
        key = (config.results_path, config.result_ttl, durable)
        with _lock:
            _this_process()
            store = _stores.get(key)
            if store is None:
                self._prepare()
                store = ResultStore(key[0], ttl_s=config.result_ttl, durable=durable)
                _stores[key] = store
        return store

    def queue(self, name: str) -> ledgerq.Queue:
        """This process's handle (shared mode) on the ledgerq queue of Tasks queue ``name``."""
        options = self.config.queue_options
        path = self.config.queue_path(name)
        key = (path, tuple(sorted(options.items())))
        with _lock:
            _this_process()
            handle = _handles.get(key)
            if handle is None:
                self._prepare()
                handle = ledgerq.open(path, shared=True, remember_options=False, **options)
                _handles[key] = handle
        return handle

    def _results(self, call: Callable[[ResultStore], Any]) -> Any:
        try:
            return call(self.store)
        except sqlite3.OperationalError as exc:
            if "unable to open" in str(exc):
                raise ImproperlyConfigured(
                    f"the results database {self.config.results_path} cannot be opened: {exc} "
                    f"(check {self.config.setting('path')} and its permissions)"
                ) from None
            raise

    # -- the framework's verbs

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Store the task's result (``READY``) and enqueue the task.

        Raises the framework's invalid-task error for a task it refuses (an unknown queue,
        a priority out of range, ...), ``TypeError``/``ValueError`` for arguments that are
        not JSON - in both cases before anything is written.  Returns when the task is
        in its queue: written to the OS, so a kill -9 of any process loses nothing
        (on disk as the queues' ``sync`` option says).
        """
        self.validate_task(task)
        try:  # with QUEUES empty, the framework takes any name: it must be a directory's
            check_queue_name(task.queue_name, f"task {task.module_path}")
        except ImproperlyConfigured as exc:
            raise _compat.InvalidTaskError(str(exc)) from None
        now_ns = time.time_ns()
        try:
            result = _compat.TaskResult(
                task=task,
                id=uuid.uuid4().hex,
                status=_compat.TaskResultStatus.READY,
                enqueued_at=from_ns(now_ns),
                started_at=None,
                finished_at=None,
                last_attempted_at=None,
                args=args,
                kwargs=kwargs,
                backend=self.alias,
                errors=[],
                worker_ids=[],
            )
            run_after_ns = None if task.run_after is None else to_ns(task.run_after)
            message = TaskMessage(
                result_id=result.id,
                task_path=task.module_path,
                args=result.args,
                kwargs=result.kwargs,
                backend=self.alias,
                queue=task.queue_name,
                priority=task.priority,
                enqueued_ns=now_ns,
                run_after_ns=run_after_ns,
            )
            payload = message.encode()
        except (TypeError, ValueError) as exc:
            raise type(exc)(
                f"the arguments of task {task.module_path} are not JSON: {exc} (Django's "
                "Tasks store arguments as JSON: pass ids, strings, numbers, lists and dicts)"
            ) from None
        delay = None
        if run_after_ns is not None:
            # Rounded up to the microsecond: the queue's own clock is read after ours,
            # so the task is due no earlier than run_after.
            delay = max(0, run_after_ns - now_ns + 999) // 1000 / 1e6
        queue = self.queue(task.queue_name)
        self._results(lambda store: store.add(StoredResult.of_message(message)))
        try:
            queue.enqueue(
                payload, headers=message.headers(), priority=level_of(task.priority), delay=delay
            )
        except BaseException:
            with contextlib.suppress(sqlite3.Error):  # the enqueue's error is the news
                self.store.remove(result.id)  # not enqueued: no result either
            raise
        _compat.task_enqueued.send(type(self), task_result=result)
        return result

    async def aenqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """:meth:`enqueue` in a worker thread (handles and connections are thread-safe)."""
        return await sync_to_async(self.enqueue, thread_sensitive=False)(task, args, kwargs)

    def get_result(self, result_id: str) -> Any:
        """The result ``result_id`` as the results database has it now, from any process.

        A result marked ``RUNNING`` whose worker process has ended reads ``READY``, its
        attempt with a :class:`~ledgerq.django.WorkerLostError`: it is delivered again,
        or goes to the dead-letter queue (then ``FAILED``).  Raises the framework's
        ``TaskResultDoesNotExist`` for an id it has no result for (never enqueued here,
        or pruned after ``result_ttl``).
        """
        stored = self._results(lambda store: store.get(result_id)) if result_id else None
        if stored is None:
            raise _compat.TaskResultDoesNotExist(
                f"no result {result_id!r} in {self.config.results_path} (never enqueued "
                "through this backend, or pruned after result_ttl)"
            )
        if stored.status == "RUNNING" and stored.worker_ids and is_gone(stored.worker_ids[-1]):
            stored.status = "READY"
            stored.note_lost_attempts("its worker process ended before the task did")
        return build_result(stored, build_task(stored, self.alias))

    async def aget_result(self, result_id: str) -> Any:
        """:meth:`get_result` in a worker thread."""
        return await sync_to_async(self.get_result, thread_sensitive=False)(result_id)

    def prune_results(self) -> int:
        """Delete the results past ``result_ttl`` now; return how many (the workers do it
        on their own, hourly at most)."""
        return int(self._results(lambda store: store.prune(time.time_ns())))

    def check_storage(self) -> None:
        """Create the directory and the results database if missing; raise
        ``ImproperlyConfigured`` saying why when they cannot be."""
        self._results(lambda store: store.get(""))

    def check(self, **kwargs: Any) -> Iterable[Any]:
        """The system check (``manage.py check``, and before ``ledgerq_worker`` runs): the
        directory can be created and the results database opened."""
        messages = list(super().check(**kwargs))
        try:
            self.check_storage()
        except (ImproperlyConfigured, sqlite3.Error) as exc:
            messages.append(checks.Error(str(exc), obj=f"TASKS[{self.alias!r}]", id="ledgerq.E001"))
        return messages
