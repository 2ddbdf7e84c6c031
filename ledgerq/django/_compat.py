"""The Tasks framework, wherever it lives: ``django.tasks`` (Django >= 6.0) or the
``django-tasks`` backport (``django_tasks``, Django 4.2-5.2), which has the same API.

Everything the backend uses from the framework is imported here and nowhere else, so
the two differ in one module: the names of the invalid-task error (``InvalidTask`` in
Django 6, ``InvalidTaskError`` in the backport) and where ``normalize_json`` lives.
The names are typed ``Any``: Django ships no type information, and the backport's
would hold for one of the two only.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__all__ = [
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def _framework() -> str:
    try:
        if importlib.util.find_spec("django.tasks") is not None:
            return "django.tasks"
    except ImportError:  # no Django at all: said below
        pass
    if importlib.util.find_spec("django_tasks") is not None:
        return "django_tasks"
    raise ImportError(
        "ledgerq.django needs Django's Tasks framework: Django >= 6.0 (Python >= 3.12), or "
        "the django-tasks backport with Django 4.2-5.2: pip install 'ledgerq[django]'"
    )


#: The package the framework was imported from: ``"django.tasks"`` or ``"django_tasks"``.
FRAMEWORK = _framework()

_base: Any = importlib.import_module(f"{FRAMEWORK}.base")
_backends: Any = importlib.import_module(f"{FRAMEWORK}.backends.base")
_exceptions: Any = importlib.import_module(f"{FRAMEWORK}.exceptions")
_signals: Any = importlib.import_module(f"{FRAMEWORK}.signals")
_package: Any = importlib.import_module(FRAMEWORK)

BaseTaskBackend: Any = _backends.BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
InvalidTaskError: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
task_backends: Any = _package.task_backends
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished

if FRAMEWORK == "django.tasks":
    normalize_json: Any = importlib.import_module("django.utils.json").normalize_json
else:
    normalize_json = importlib.import_module("django_tasks.utils").normalize_json
