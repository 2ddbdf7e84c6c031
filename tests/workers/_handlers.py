"""Handlers for the worker-pool tests (importable by child processes)."""

from __future__ import annotations

import os
import sys
import time

import ledgerq
import ledgerq.workers

DONE_LOG = "LEDGERQ_TEST_DONE_LOG"


def _note(line: bytes) -> None:
    # O_APPEND writes of one short line are atomic: children can share the file.
    fd = os.open(os.environ[DONE_LOG], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _record(message: ledgerq.Message) -> None:
    _note(b"%d %s\n" % (message.id, message.payload))


def _note_attempt(message: ledgerq.Message) -> None:
    _note(b"%d %d %d\n" % (message.id, message.attempts, time.time_ns()))


def mixed(message: ledgerq.Message) -> None:
    """Fail for multiples of 10, crash once for job 13, succeed otherwise."""
    n = int(message.payload)
    if n == 13 and message.attempts == 1:
        os._exit(7)  # a crash, not an exception
    if n % 10 == 0:
        raise ValueError(f"job {n} is invalid")
    _record(message)


def slow_once(message: ledgerq.Message) -> None:
    """Hang on the first attempt of job 3 (past any task timeout), succeed otherwise."""
    if int(message.payload) == 3 and message.attempts == 1:
        time.sleep(3600)
    _record(message)


def announce(message: ledgerq.Message) -> None:
    """Succeed and tell the test on stdout (its synchronisation point)."""
    _record(message)
    sys.stdout.write(f"done {message.id}\n")
    sys.stdout.flush()


def block(message: ledgerq.Message) -> None:
    """Say which process took the task (the test's synchronisation point), then hang."""
    sys.stdout.write(f"running {message.id} in {os.getpid()}\n")
    sys.stdout.flush()
    time.sleep(3600)  # the workload: a task that outlives its owner


def retry_later(message: ledgerq.Message) -> None:
    """Ask for a retry in 0.5 s on the first attempt (noting when), succeed on the next."""
    _note_attempt(message)
    if message.attempts == 1:
        raise ledgerq.workers.Retry(0.5)


def outlast_lease(message: ledgerq.Message) -> None:
    """Run past the queue's visibility timeout (1.5 s against 0.6 s), then record."""
    time.sleep(1.5)  # the work itself: longer than the lease
    _record(message)


GO_DIR = "LEDGERQ_TEST_GO_DIR"
_KEPT: list[bytes] = []  # what grow_on_big holds on to, for the rest of its process


def record_resident(message: ledgerq.Message) -> None:
    """Note the resident size of the child that runs the task: ``<id> <bytes>``."""
    with open("/proc/self/statm", "rb") as statm:
        resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    _note(b"%d %d\n" % (message.id, resident))


def record_pid(message: ledgerq.Message) -> None:
    """Note which process ran the task: ``<id> <pid>``."""
    _note(b"%d %d\n" % (message.id, os.getpid()))


def grow_on_big(message: ledgerq.Message) -> None:
    """Keep 80 MB resident for the payload ``big`` (written, so the pages are real)."""
    if message.payload == b"big":
        _KEPT.append(b"\1" * (80 << 20))
    record_pid(message)


def wait_for_go(message: ledgerq.Message) -> None:
    """Open the FIFO ``go-<payload>`` in ``$LEDGERQ_TEST_GO_DIR``, say the task runs, read
    the FIFO to its end (the test's close), then record; payloads starting with ``fail``
    then raise."""
    name = message.payload.decode()
    with open(os.path.join(os.environ[GO_DIR], f"go-{name}"), "rb") as go:
        # Said only once open: a test that closes its end on this word must not close it
        # before this open, which would then wait for a writer forever.
        sys.stdout.write(f"running {name} in {os.getpid()}\n")
        sys.stdout.flush()
        go.read()  # the end of the file: the test's word
    _record(message)
    if name.startswith("fail"):
        raise ValueError(f"{name} failed")


def hang_noting_attempts(message: ledgerq.Message) -> None:
    """Note ``<id> <attempt> <time_ns>``, then hang (past any task timeout)."""
    _note_attempt(message)
    time.sleep(3600)  # the workload: a task that never ends on its own


CLOCK_FILE = "LEDGERQ_TEST_CLOCK_FILE"


class FileClock:
    """A clock every process reads from one file the test rewrites (``set``): time
    that passes only when the test says, the same for pools in several processes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def set(self, mono_ns: int) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as file:
            file.write(str(mono_ns))
        os.replace(tmp, self.path)  # readers see the old time or the new one

    def monotonic_ns(self) -> int:
        with open(self.path) as file:
            return int(file.read())

    def time_ns(self) -> int:
        return 1_750_000_000_000_000_000 + self.monotonic_ns()


def clocked(message: ledgerq.Message) -> None:
    """Note ``<id> <the test clock's time>``: when, for the limiter, the task started."""
    now = FileClock(os.environ[CLOCK_FILE]).monotonic_ns()
    _note(b"%d %d\n" % (message.id, now))


def report_then_wait(message: ledgerq.Message) -> None:
    """Report progress 0.5 ("half of <payload>"), wait for the FIFO ``go-<payload>`` like
    :func:`wait_for_go`, then record."""
    name = message.payload.decode()
    ledgerq.workers.progress(0.5, note=f"half of {name}")
    with open(os.path.join(os.environ[GO_DIR], f"go-{name}"), "rb") as go:
        go.read()
    _record(message)


def report_then_crash_once(message: ledgerq.Message) -> None:
    """Report progress, then kill the process on the first attempt; record on the next."""
    ledgerq.workers.progress(0.1, note=f"attempt {message.attempts}")
    if message.attempts == 1:
        os._exit(9)
    _record(message)


def traced(message: ledgerq.Message) -> None:
    """Note ``<id> <trace id> <parent span id> <span name>`` of the span it runs in
    (``-`` for none): the producer's trace continued, or not."""
    from opentelemetry import trace

    span = trace.get_current_span()
    context = span.get_span_context()
    parent = getattr(span, "parent", None)
    _note(
        b"%d %032x %s %s\n"
        % (
            message.id,
            context.trace_id,
            b"%016x" % parent.span_id if parent is not None else b"-",
            getattr(span, "name", "-").replace(" ", "_").encode(),
        )
    )
