"""``python manage.py ledgerq_worker [--queue-name NAME ...] [--processes N] ...``"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerq.django import _compat
from ledgerq.django._worker import PoolSettings, serve
from ledgerq.django.backend import LedgerQBackend


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


class Command(BaseCommand):
    help = (
        "Run the tasks of a ledgerq Tasks backend: a pool of worker processes per queue "
        "(docs/django.md). SIGINT/SIGTERM: running tasks finish; a second: stop at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue-name",
            action="append",
            dest="queue_names",
            metavar="NAME",
            help="a queue to run (repeat for more; default: every queue in QUEUES)",
        )
        parser.add_argument(
            "--processes",
            type=_positive_int,
            default=4,
            metavar="N",
            help="task processes per queue (default: 4)",
        )
        parser.add_argument(
            "--backend",
            default="default",
            metavar="ALIAS",
            help="the TASKS entry to run (default: 'default')",
        )
        parser.add_argument(
            "--task-timeout",
            type=_seconds,
            metavar="S",
            help="kill a task running longer: a failed delivery, run again up to max_retries",
        )
        parser.add_argument(
            "--max-tasks-per-child",
            type=_positive_int,
            metavar="N",
            help="replace a task process by a fresh one after N tasks",
        )
        parser.add_argument(
            "--until-empty",
            action="store_true",
            help="return once no task is waiting or running (delayed ones included)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._log_to_stderr(options["verbosity"])
        alias = options["backend"]
        try:
            backend = _compat.task_backends[alias]
        except (ImproperlyConfigured, KeyError) as exc:
            raise CommandError(f"no usable TASKS[{alias!r}]: {exc}") from None
        if not isinstance(backend, LedgerQBackend):
            raise CommandError(
                f"TASKS[{alias!r}] is a {type(backend).__module__}.{type(backend).__name__}, "
                "not ledgerq.django.LedgerQBackend: ledgerq_worker runs only ledgerq's tasks"
            )
        known = sorted(backend.queues)
        names: list[str] = list(dict.fromkeys(options["queue_names"] or known))
        if not names:
            raise CommandError(
                f"TASKS[{alias!r}]['QUEUES'] is empty (any queue name is allowed): name the "
                "queues to run with --queue-name"
            )
        unknown = [name for name in names if known and name not in known]
        if unknown:
            raise CommandError(
                f"queue(s) {', '.join(map(repr, unknown))} not in TASKS[{alias!r}]['QUEUES'] "
                f"({', '.join(known)})"
            )
        try:
            backend.check_storage()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        status = serve(
            backend,
            names,
            PoolSettings(
                processes=options["processes"],
                task_timeout=options["task_timeout"],
                max_tasks_per_child=options["max_tasks_per_child"],
                until_empty=options["until_empty"],
            ),
        )
        if status:
            raise CommandError("a pool failed (its error is above)")

    def _log_to_stderr(self, verbosity: int) -> None:
        """Show the worker's log (and the framework's) unless logging is configured."""
        level = {0: logging.ERROR, 1: logging.INFO}.get(verbosity, logging.DEBUG)
        for name in ("ledgerq", _compat.FRAMEWORK):
            log = logging.getLogger(name)
            if not log.handlers:
                handler = logging.StreamHandler(sys.stderr)
                handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
                log.addHandler(handler)
                log.setLevel(level)
