"""Settings of the tests' project: the backend's directory and options come from the
environment (``LEDGERQ_DJANGO_DIR``, ``LEDGERQ_DJANGO_OPTIONS`` as JSON), so each test
runs its own workers and clients over its own directory."""

from __future__ import annotations

import importlib.util
import json
import os

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DATABASES: dict[str, object] = {}
INSTALLED_APPS = ["ledgerq.django", "tasksapp"]
if importlib.util.find_spec("django.tasks") is None:  # Django < 6: the backport
    INSTALLED_APPS.insert(0, "django_tasks")

TASKS = {
    "default": {
        "BACKEND": "ledgerq.django.LedgerQBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "path": os.environ.get("LEDGERQ_DJANGO_DIR", "/nonexistent/ledgerq-django-tests"),
            **json.loads(os.environ.get("LEDGERQ_DJANGO_OPTIONS", "{}")),
        },
    }
}
LOGGING_CONFIG = None
