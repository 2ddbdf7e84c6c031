"""A real ``celery worker`` (prefork) over a ledgerq broker directory, for the tests.

The worker runs in its own session (so a SIGKILL of its group takes the pool processes
too), writes its log to a file, and is known to be ready when the log says so.  Tests
wait on files and logs with deadlines (:func:`wait_until`), never with fixed sleeps.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests._child import REPO, child_environment, start_logged

__all__ = ["Broker", "Worker", "wait_until"]


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``condition()`` every 20 ms until it is true; fail naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class Broker:
    """A broker directory and the directory the tasks leave their files in; with a
    ``key_file``, the tests' app (workers, ``celery`` commands) encrypts the broker."""

    def __init__(
        self, root: Path, *, key_file: Path | None = None, result_backend: str | None = None
    ) -> None:
        self.dir = root / "broker"
        self.out = root / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.url = f"ledgerq://{self.dir}"
        self.key_file = key_file
        self.result_backend = result_backend

    def env(self) -> dict[str, str]:
        extra = {"LEDGERQ_TEST_BROKER": str(self.dir), "LEDGERQ_TEST_OUT": str(self.out)}
        if self.result_backend is not None:
            extra["LEDGERQ_TEST_RESULT_BACKEND"] = self.result_backend
        if self.key_file is not None:
            extra["LEDGERQ_TEST_KEY_FILE"] = str(self.key_file)
        return child_environment(extra)

    def events(self, tag: str, event: str) -> list[Path]:
        return sorted(self.out.glob(f"{tag}.{event}.*"))

    def times(self, tag: str, event: str) -> list[float]:
        """When each ``event`` of ``tag`` happened (seconds since the epoch)."""
        return [int(p.name.rsplit(".", 1)[1]) / 1e9 for p in self.events(tag, event)]

    def celery(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the ``celery`` command line on the tests' app."""
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.celery.tasksapp", *args],
            cwd=REPO,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


class Worker:
    """``celery worker -P prefork -c N`` over ``broker``; stop() or kill() it."""

    def __init__(self, broker: Broker, log: Path, *, name: str, concurrency: int = 2) -> None:
        self.log = log
        self.name = name
        self.proc = start_logged(
            [
                "-m",
                "celery",
                "-A",
                "tests.celery.tasksapp",
                "worker",
                "-P",
                "prefork",
                "-c",
                str(concurrency),
                "-n",
                f"{name}@%h",
                # Cluster chatter the tests do not need: faster startup.
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel=INFO",
            ],
            log=log,
            cwd=REPO,
            env=broker.env(),
        )

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise AssertionError(f"the worker exited ({code}):\n{self.log_text()}")
            return " ready." in self.log_text()

        wait_until(ready, timeout, f"worker {self.name} to be ready")

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes (a crash)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), or a kill if it takes over 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
