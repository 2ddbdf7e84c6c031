"""Helpers of the multi-process tests: start workers, gather their reports as they come."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests._child import Child, Children

WORKER = ["-m", "tests.shared._worker"]


def start(children: Children, mode: str, path: Path, *options: str) -> Child:
    """Start a worker (``tests/shared/_worker.py``) and wait until its queue is open."""
    child = children.start([*WORKER, mode, str(path), *options])
    child.wait_for("READY")
    return child


def start_holder(children: Children, path: Path, count: int) -> Child:
    """Start a worker that leases ``count`` messages of the queue at ``path`` and holds
    them; return once it has them all."""
    holder = start(children, "lease", path, f"n={count}")
    holder.wait_for("HELD")
    return holder


@dataclass
class Reports:
    """Every line one worker wrote, gathered by a thread, with the time each was read."""

    child: Child
    lines: list[tuple[float, str]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread(target=self._gather, daemon=True).start()

    def _gather(self) -> None:
        while (line := self.child.read_line()) is not None:
            self.lines.append((time.monotonic(), line))
        self.done.set()

    def kinds(self, kind: str) -> list[list[str]]:
        """The fields of every report of ``kind`` (``"E"``, ``"L"``...), in order."""
        return [line.split()[1:] for _, line in list(self.lines) if line.split()[0] == kind]

    def count(self) -> int:
        return len(self.lines)

    def last_at(self) -> float:
        lines = list(self.lines)
        return lines[-1][0] if lines else 0.0

    def stop(self) -> None:
        """Kill the worker; wait until every line it wrote is gathered."""
        self.child.kill()
        self.child.wait()
        assert self.done.wait(10), "the worker's output did not end"


def wait_until(condition: object, timeout: float, what: str) -> None:
    """Poll ``condition()`` (every 10 ms) until it holds; fail saying ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
