"""``python -m djangobench.produce N``: enqueue N no-op tasks; print the seconds it took."""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djangobench.settings")

import django

django.setup()

from djangobench.tasks import noop  # noqa: E402

count = int(sys.argv[1])
started = time.perf_counter()
for _ in range(count):
    noop.enqueue()
print(time.perf_counter() - started)
