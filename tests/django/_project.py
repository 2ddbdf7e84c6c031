"""The tests' Django project in real processes: ``manage.py ledgerq_worker``, clients.

A :class:`Site` is one backend directory (and a directory the tasks leave their marks
in); it points this process's settings at it while in a ``with`` block, starts workers
and client processes over it, and reads results.  Tests wait on what they can observe
(a result's status, a task's mark, a log line) with deadlines (:func:`wait_until`),
never with fixed sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from tests._child import child_environment, start_logged

__all__ = ["PROJECT", "Site", "Worker", "wait_until"]

PROJECT = Path(__file__).resolve().parent / "project"
WAIT = 30.0


def wait_until(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll ``condition()`` every 10 ms until it returns something true, and return it;
    fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
    return value


class Worker:
    """``python manage.py ledgerq_worker ARGS`` over a site, its output in ``log``."""

    def __init__(self, site: Site, log: Path, args: list[str]) -> None:
        self.log = log
        self.proc = start_logged(
            ["manage.py", "ledgerq_worker", *args], log=log, cwd=PROJECT, env=site.env()
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the worker exited ({self.proc.returncode}):\n{self.text()}")
            return "ledgerq_worker: ready" in self.text()

        wait_until(ready, "the worker to be ready")

    def wait_exit(self, timeout: float = WAIT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker did not exit:\n{self.text()}") from None

    def kill(self) -> None:
        """SIGKILL the worker's main process: its pools and task processes die with it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(WAIT)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.send_signal(signal.SIGTERM)  # a second: at once
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.kill()


class Site:
    """A backend directory with its settings, workers and client processes."""

    def __init__(self, root: Path, options: dict[str, Any] | None = None) -> None:
        self.root = root
        self.dir = root / "tasks"
        self.out = root / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.options = {"path": str(self.dir), **(options or {})}
        self._workers: list[Worker] = []
        self._settings: Any = None

    # -- this process

    def tasks_setting(self) -> dict[str, Any]:
        return {
            "default": {
                "BACKEND": "ledgerq.django.LedgerQBackend",
                "QUEUES": ["default", "emails"],
                "OPTIONS": self.options,
            }
        }

    def __enter__(self) -> Site:
        from django.test import override_settings

        self._settings = override_settings(TASKS=self.tasks_setting())
        self._settings.enable()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for worker in self._workers:
            worker.close()
        self._settings.disable()
        from ledgerq.django import backend

        backend._close_handles()

    def result(self, result_id: str) -> Any:
        """The result, read in this process (the framework's ``get_result``)."""
        from ledgerq.django._compat import task_backends

        return task_backends["default"].get_result(result_id)

    def wait_status(self, result_id: str, status: str, timeout: float = WAIT) -> Any:
        def reached() -> Any:
            result = self.result(result_id)
            return result if str(result.status) == status else None

        return wait_until(reached, f"result {result_id} to be {status}", timeout)

    def enqueue_here(self, jobs: list[dict[str, Any]]) -> list[str]:
        """Enqueue ``jobs`` (as :meth:`enqueue` takes them) from this process."""
        import datetime

        from django.utils import timezone
        from django.utils.module_loading import import_string

        ids = []
        for job in jobs:
            task = import_string(job["task"])
            changes: dict[str, Any] = {}
            if "priority" in job:
                changes["priority"] = job["priority"]
            if "queue" in job:
                changes["queue_name"] = job["queue"]
            if "run_after_s" in job:
                delta = datetime.timedelta(seconds=job["run_after_s"])
                changes["run_after"] = timezone.now() + delta
            if changes:
                task = task.using(**changes)
            ids.append(task.enqueue(*job.get("args", []), **job.get("kwargs", {})).id)
        return ids

    def marks(self, tag: str, event: str) -> list[float]:
        """When each ``event`` of ``tag`` happened (seconds since the epoch), in order."""
        return sorted(
            int(p.name.rsplit(".", 1)[1]) / 1e9 for p in self.out.glob(f"{tag}.{event}.*")
        )

    # -- other processes

    def env(self, pythonpath: list[Path] | None = None) -> dict[str, str]:
        options = {k: v for k, v in self.options.items() if k != "path"}
        env = child_environment(
            {
                "DJANGO_SETTINGS_MODULE": "testsite.settings",
                "LEDGERQ_DJANGO_DIR": str(self.options["path"]),
                "LEDGERQ_DJANGO_OUT": str(self.out),
                "LEDGERQ_DJANGO_OPTIONS": json.dumps(options),
            }
        )
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), env["PYTHONPATH"]])
        return env

    def run(
        self, *args: str, stdin: str = "", pythonpath: list[Path] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``python ARGS`` in the project directory (``manage.py ...``, ``client.py ...``)."""
        return subprocess.run(
            [sys.executable, *args],
            cwd=PROJECT,
            env=self.env(pythonpath),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def enqueue(
        self, jobs: list[dict[str, Any]], pythonpath: list[Path] | None = None
    ) -> list[str]:
        """Enqueue ``jobs`` from a client process (client.py); return the result ids."""
        done = self.run("client.py", "enqueue", stdin=json.dumps(jobs), pythonpath=pythonpath)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    def read_results(self, ids: list[str]) -> list[dict[str, Any]]:
        """The results, read by a client process."""
        done = self.run("client.py", "result", *ids)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    def worker(self, name: str, *args: str) -> Worker:
        """Start ``manage.py ledgerq_worker ARGS``; it is stopped at the end of the test."""
        worker = Worker(self, self.root / f"{name}.log", list(args))
        self._workers.append(worker)
        return worker
