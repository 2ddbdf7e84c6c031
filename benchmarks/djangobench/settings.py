"""Settings of the benchmark's project: ``BENCH_BACKEND`` is ``ledgerq`` (the ledgerq
backend) or ``db`` (django-tasks-db's database backend on SQLite), ``BENCH_DIR`` where
either keeps its data."""

from __future__ import annotations

import importlib.util
import os

SECRET_KEY = "benchmark-only"
DEBUG = False
USE_TZ = True
_DIR = os.environ.get("BENCH_DIR", "/nonexistent")
_BACKEND = os.environ.get("BENCH_BACKEND", "ledgerq")
INSTALLED_APPS = ["djangobench"]
if importlib.util.find_spec("django.tasks") is None:
    INSTALLED_APPS.insert(0, "django_tasks")
DATABASES: dict[str, object] = {}
if _BACKEND == "ledgerq":
    INSTALLED_APPS.append("ledgerq.django")
    TASKS = {
        "default": {
            "BACKEND": "ledgerq.django.LedgerQBackend",
            "OPTIONS": {"path": os.path.join(_DIR, "tasks")},
        }
    }
else:
    INSTALLED_APPS.append("django_tasks_db")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(_DIR, "db.sqlite3"),
            # WAL and a busy timeout, as a deployment that runs 4 workers on SQLite would.
            "OPTIONS": {"timeout": 30, "init_command": "PRAGMA journal_mode=WAL;"},
        }
    }
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
