"""A minimal project using ledgerq as its Tasks backend (docs/django.md)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only"
DEBUG = True
USE_TZ = True
DATABASES: dict[str, object] = {}

INSTALLED_APPS = ["ledgerq.django", "shop"]
if importlib.util.find_spec("django.tasks") is None:  # Django < 6: the django-tasks backport
    INSTALLED_APPS.insert(0, "django_tasks")

TASKS = {
    "default": {
        "BACKEND": "ledgerq.django.LedgerQBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            # An absolute path: every process (web, workers, cron) must name the same one.
            "path": os.environ.get("TASKS_DIR", str(BASE_DIR / "var" / "tasks")),
            "result_ttl": 24 * 3600,  # keep results a day
            "max_retries": 3,  # a task whose process dies 3 times goes to the DLQ
        },
    }
}
