"""Django's Tasks framework on ledgerq: a backend, its worker and durable results.

::

    INSTALLED_APPS = [..., "ledgerq.django"]      # (+ "django_tasks" with the backport)
    TASKS = {"default": {"BACKEND": "ledgerq.django.LedgerQBackend",
                         "QUEUES": ["default", "emails"],
                         "OPTIONS": {"path": "/abs/dir"}}}

then ``python manage.py ledgerq_worker``.  Works with ``django.tasks`` (Django >= 6.0)
and with the ``django-tasks`` backport (``django_tasks``); installed with
``pip install 'ledgerq[django]'``.  docs/django.md describes it all.
"""

from __future__ import annotations

from typing import Any

from ledgerq.django._errors import WorkerLostError

__all__ = ["LedgerQBackend", "WorkerLostError"]


def __getattr__(name: str) -> Any:
    # The backend imports the Tasks framework, which needs Django's settings: loaded on
    # first use (settings name it by path), not when Django imports the app.
    if name == "LedgerQBackend":
        from ledgerq.django.backend import LedgerQBackend

        return LedgerQBackend
    raise AttributeError(f"module 'ledgerq.django' has no attribute {name!r}")
