"""The Django tests need Django's Tasks framework (``ledgerq[django]``): Django >= 6.0,
or the ``django-tasks`` backport; without it they are skipped, saying so.

The tests' project (``tests/django/project``: settings, an app with tasks, ``manage.py``)
is also set up in this process, so tests enqueue and read results here as a web process
would, beside real ``ledgerq_worker`` processes.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

if importlib.util.find_spec("django") is None or (
    importlib.util.find_spec("django.tasks") is None
    and importlib.util.find_spec("django_tasks") is None
):
    pytest.skip(
        "Django's Tasks framework is not installed (pip install 'ledgerq[django]')",
        allow_module_level=True,
    )

from tests.django._project import PROJECT, Site

sys.path.insert(0, str(PROJECT))

import django
from django.conf import settings

# Loaded from the environment variable, which is then taken away again: children of
# other tests (a Celery worker: its Django fix-up reads it) must not see it.
os.environ["DJANGO_SETTINGS_MODULE"] = "testsite.settings"
try:
    settings.INSTALLED_APPS  # noqa: B018 - loads the settings
finally:
    del os.environ["DJANGO_SETTINGS_MODULE"]
django.setup()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    """A backend directory of its own, this process's settings pointed at it."""
    with Site(tmp_path) as made:
        yield made
