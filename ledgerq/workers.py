"""A pool of worker processes over a queue: ack/nack retry loops without the boilerplate.

The owner process (the caller of :func:`run`) opens the queue - in shared mode unless
told otherwise, so producers in other processes (and other pools) use the queue while
it runs - leases one message per idle child and sends it down that child's pipe at
once (it never leases ahead of a free child); the child calls ``handler(message)`` and
answers.  The owner then:

* acks when the handler returned;
* nacks with ``"<ExceptionType>: <text>"`` when it raised - so ``max_retries`` and the
  dead-letter queue apply - with the delay of a :class:`Retry`, else the retry policy's;
* nacks with a reason and starts a fresh child when the child died (``os._exit``, a
  segfault, the OOM killer) or ran longer than ``task_timeout`` (it is killed);
* replaces a child that has run ``max_tasks_per_child`` tasks, or whose resident size
  after a task is above ``max_memory_per_child`` bytes (that task was acked or nacked
  as it ended: it is not a failure).

Nothing here polls: the owner blocks in ``multiprocessing.connection.wait`` on the
children's pipes and process sentinels, plus a self-pipe that the queue pokes (via
``Queue.add_listener``) when messages arrive - from any process, in shared mode - and
the signal handlers poke on SIGINT/SIGTERM.

Stopping.  Children leave SIGINT and SIGTERM to the owner (a Ctrl-C or a ``kill -TERM``
of the whole process group, as systemd sends, reaches the owner's decision, not the
tasks).  On the first signal the owner stops leasing and lets running tasks finish: each
is acked or nacked as usual, but nothing is leased again, so a task that fails meanwhile
is not retried by this pool (its retry policy's delay applies for the next consumer).
A message leased when the signal came but not yet handed to a child is released
(``release``: no failure, the same ``attempts``).  A second signal stops at once: the
running children are killed and their messages released, not nacked - the stop was the
operator's, not the tasks' failure - so they are delivered again (to other pools at
once, else after a restart) with the same ``attempts``; a killed task may run twice.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import Any, Unpack, cast

import ledgerq
from ledgerq._options import MAX_SECONDS
from ledgerq._types import Message
from ledgerq.segment.progress import MAX_NOTE_CHARS, remove_progress, write_progress
from ledgerq.segment.ratelimit import MAX_COUNT, Grant, RateLimiter

try:
    import resource
except ImportError:  # not Unix: /proc or nothing
    resource = None  # type: ignore[assignment]

__all__ = ["Retry", "WorkerReport", "progress", "run"]

logger = logging.getLogger("ledgerq")

Handler = Callable[[Message], Any]

# How long to wait for a worker that died (its pipe closed) to be reaped, for its
# exit code; it is already exiting, so this is a bound, not a delay.
_REAP_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_MAX_WAIT_SLICE_S = 86_400.0  # one wait of the owner, at most
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PERIODS_NS = {"s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_PROGRESS = "progress"  # the kind of a child's progress report (its answers: "ok", "err")


def parse_rate_limit(rate_limit: object) -> tuple[int, int]:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` as (N, the period in ns); TypeError or
    ValueError naming what is wrong otherwise."""
    if not isinstance(rate_limit, str):
        raise TypeError(f'rate_limit must be a str like "20/s", got {type(rate_limit).__name__}')
    count, _, unit = rate_limit.strip().partition("/")
    if (
        unit not in _PERIODS_NS
        or not count.isdigit()
        or not count.isascii()
        or not 1 <= int(count) <= MAX_COUNT
    ):
        raise ValueError(
            f'rate_limit must be "N/s", "N/m" or "N/h" with N a whole number from 1 to '
            f"{MAX_COUNT} (at most N task starts per second, minute or hour), "
            f"got {rate_limit!r}"
        )
    return int(count), _PERIODS_NS[unit]


_TRACEPARENT = "traceparent"  # the W3C header an enqueue inside a span carries
_tracing: Any = None  # (tracer, propagator, consumer kind), False without OpenTelemetry


def _task_span(message: Message) -> Any:
    """A span for the handler of a ``message`` that carries a trace context, its
    parent that context - or None where ``opentelemetry-api`` is not installed.  Only
    traced messages get here: an untraced task costs one header lookup."""
    global _tracing
    if _tracing is None:
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            _tracing = False
        else:
            tracer = trace.get_tracer("ledgerq.workers")
            _tracing = (tracer, TraceContextTextMapPropagator(), trace.SpanKind.CONSUMER)
    if _tracing is False:
        return None
    tracer, propagator, kind = _tracing
    return tracer.start_as_current_span(
        "ledgerq task",
        context=propagator.extract(message.headers),
        kind=kind,
        attributes={
            "messaging.system": "ledgerq",
            "messaging.operation.type": "process",
            "messaging.message.id": str(message.id),
        },
    )


def _call(handler: Handler, message: Message) -> Any:
    """``handler(message)``, inside the producer's trace when the message carries one;
    what it returns (``run(forward_to=)`` forwards it)."""
    span = _task_span(message) if _TRACEPARENT in message.headers else None
    if span is None:
        return handler(message)
    with span:
        return handler(message)


class _Task:
    """The task a child runs now, for :func:`progress` (None outside a pool task)."""

    conn: Connection | None = None
    message_id = 0
    lock = threading.Lock()  # a handler's threads may report at once: one send at a time


def progress(fraction: float, note: str = "") -> None:
    """Report how far the running task is: ``fraction`` done (0 to 1) and a ``note``.

    Call it from a handler run by :func:`run`: the report is kept with the message's
    lease, in ``shared/progress/`` of the queue (never fsynced), until the message is
    acked, nacked or released; the console's in-flight view and ``ledgerq stats
    --json`` show it.  Outside a pool's task (a handler called by a test) it checks its
    arguments and does nothing.  Each report is sent to the pool's owner, which keeps
    the newest of those that arrive together: calling it often costs the handler a
    pipe write each time.  Raises TypeError or ValueError - before anything is sent -
    for a fraction that is not a number from 0 to 1, or a note that is not a str of at
    most 1000 characters.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"progress fraction must be a number, got {type(fraction).__name__}")
    if not 0 <= fraction <= 1:  # NaN is not
        raise ValueError(f"progress fraction must be from 0 to 1, got {fraction!r}")
    if not isinstance(note, str):
        raise TypeError(f"progress note must be a str, got {type(note).__name__}")
    if len(note) > MAX_NOTE_CHARS:
        raise ValueError(
            f"progress note must be at most {MAX_NOTE_CHARS} characters, got {len(note)}"
        )
    conn = _Task.conn
    if conn is None:
        return
    with _Task.lock, contextlib.suppress(OSError):  # the owner is gone: the task is too
        conn.send((_PROGRESS, _Task.message_id, float(fraction), note))


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What a :func:`run` did: messages acked, failed deliveries, dead letters, time.

    ``released`` counts messages given back without a failure when the pool stopped
    (leased but not started, or killed by a second signal); ``recycled`` counts
    children replaced after ``max_tasks_per_child`` tasks or past
    ``max_memory_per_child``.
    """

    processed: int
    failed: int
    dead_lettered: int
    crashed: int = 0
    timed_out: int = 0
    elapsed: float = 0.0
    released: int = 0
    recycled: int = 0

    @property
    def rate(self) -> float:
        """Messages processed per second."""
        return self.processed / self.elapsed if self.elapsed > 0 else 0.0


def _die_with(owner_pid: int) -> None:
    """Make the kernel kill this process when the owner dies (Linux), even by kill -9.

    A child blocked in its pipe would otherwise never notice: its siblings hold copies
    of the owner's pipe ends, so the pipe never reaches EOF.  Elsewhere, the owner's
    death is noticed only at the pipe.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # not Linux (or no libc symbol): nothing to set
        return
    if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return
    if os.getppid() != owner_pid:  # the owner died before the signal was armed
        os._exit(1)


def _resident_bytes() -> int | None:
    """Return this process's resident size in bytes, or None where it cannot be read.

    Linux (and any system with ``/proc/self/statm``): the current size.  Elsewhere on
    Unix: the peak (``getrusage``'s ``ru_maxrss``, a high-water mark that never goes
    down - a child past the limit once stays past it, which is all the pool asks).
    """
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES  # size, *resident*, shared...
    except (OSError, ValueError, IndexError):
        pass
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, else KiB


class Retry(Exception):  # the handler's word: "retry this later"
    """Raise in a handler to nack the message with a delay: it comes back no earlier
    than ``delay`` seconds from now (None: the queue's retry policy), as
    ``Queue.nack(id, reason, delay=delay)``; a failed delivery like any exception."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        super().__init__(reason or (f"retry in {delay} s" if delay is not None else "retry"))
        self.delay = delay


def _leave_to_owner(_signum: int, _frame: FrameType | None) -> None:
    """Do nothing: the owner decides when a child stops (see :func:`_child_main`)."""


def _child_main(
    handler: Handler,
    conn: Connection,
    owner_pid: int,
    measure_memory: bool,
    forwarding: bool = False,
) -> None:
    """Run tasks from ``conn`` until told to stop (None) or the pipe closes.

    Each answer is ``(kind, message id, reason, Retry delay, resident bytes or None)``;
    when ``forwarding`` (``run(forward_to=)``), an ``"ok"`` answer carries what the
    handler returned in place of the delay: the items the owner forwards.
    """
    _die_with(owner_pid)
    # SIGINT (Ctrl-C reaches the whole foreground group) and SIGTERM (systemd's stop
    # signals every process of the service, as does kill -TERM -PGID) are the owner's to
    # act on: it lets running tasks finish, then stops us, or kills us on a second
    # signal.  A do-nothing handler rather than SIG_IGN: exec() resets handlers, not
    # SIG_IGN, so the handler's own subprocesses keep the default actions.
    signal.signal(signal.SIGINT, _leave_to_owner)
    signal.signal(signal.SIGTERM, _leave_to_owner)
    with contextlib.suppress(ValueError):  # forked with the owner's: its pipe is not ours
        signal.set_wakeup_fd(-1)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        _Task.conn, _Task.message_id = conn, message.id
        try:
            result = _call(handler, message)
        except BaseException as exc:  # report every failure; the owner nacks it
            reason = f"{type(exc).__name__}: {exc}"
            delay = exc.delay if isinstance(exc, Retry) else None
            answer = ("err", message.id, reason, delay)
        else:
            answer = ("ok", message.id, "", result if forwarding else None)
        finally:
            _Task.conn = None
        with _Task.lock:
            try:
                conn.send((*answer, _resident_bytes() if measure_memory else None))
            except (TypeError, AttributeError, pickle.PicklingError) as exc:
                # (only a forwarded result can be unpicklable): a failed task, not a dead
                # child
                reason = f"the handler's result cannot be forwarded: {type(exc).__name__}: {exc}"
                conn.send(("err", message.id, reason, None, None))


class _Child:
    """One worker process and what it is doing."""

    def __init__(
        self, ctx: Any, handler: Handler, measure_memory: bool, forwarding: bool = False
    ) -> None:
        owner_end, child_end = ctx.Pipe()
        self.process = ctx.Process(
            target=_child_main,
            args=(handler, child_end, os.getpid(), measure_memory, forwarding),
            daemon=True,
        )
        self.process.start()
        child_end.close()
        self.conn: Connection = owner_end
        self.task: Message | None = None
        self.started = 0.0
        self.touched = 0.0  # when its lease was last kept (assign, heartbeat)
        self.tasks_done = 0
        self.reported = False  # whether its task has a progress record

    def assign(self, message: Message) -> bool:
        """Send ``message`` to the child; False when its pipe is closed (it died idle)."""
        try:
            self.conn.send(message)
        except OSError:  # BrokenPipeError, ConnectionResetError: the child is gone
            return False
        self.task = message
        self.reported = False
        self.started = self.touched = time.monotonic()
        return True

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)

    def kill(self) -> None:
        """Kill the process and reap it; its pipe stays open (a result may be in it)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()

    def close(self, timeout: float = 5.0) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class _Wakeup:
    """A self-pipe: other threads and signal handlers write a byte to wake the owner."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)

    def poke(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self.write_fd, b"\0")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.read_fd, 4096):
                pass

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


@contextlib.contextmanager
def _signals(on_signal: Callable[[], None], wakeup: _Wakeup) -> Iterator[None]:
    """Route SIGINT/SIGTERM to ``on_signal`` while running (main thread only).

    The kernel may deliver a signal to any thread of the process - a queue's housekeeper
    thread, say.  Python then runs the handler only when the main thread next gets to
    run bytecode, and a main thread asleep in ``wait()`` with no timeout (tasks that
    block) would never get there: ``set_wakeup_fd`` makes the C-level handler write a
    byte to the pool's self-pipe, which ``wait()`` watches, whichever thread it ran on.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        sig: signal.signal(sig, lambda _signum, _frame: on_signal())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    previous_fd = signal.set_wakeup_fd(wakeup.write_fd, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _nack(consumer: ledgerq.Reader, message_id: int, reason: str, delay: object) -> None:
    """Nack for a handler that raised; a ``Retry`` with an unusable delay (negative,
    NaN, not a number) is logged and nacked with the retry policy's delay instead."""
    if delay is not None:
        try:
            consumer.nack(message_id, reason, delay=delay)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            logger.warning("ledgerq worker: Retry(%r) of message %d: %s", delay, message_id, exc)
        else:
            return
    consumer.nack(message_id, reason)


def _forwarded(result: Any) -> Any:
    """The items a handler's result stands for (``run(forward_to=)``): None is none."""
    return [] if result is None else result


def _heartbeat(consumer: ledgerq.Reader, busy: list[_Child], every: float) -> float:
    """Touch the leases of busy, live children not touched for ``every`` seconds; return
    the seconds until the next touch is due."""
    now = time.monotonic()
    for child in busy:
        task = child.task
        if task is not None and now - child.touched >= every:
            # A dead child's lease is not kept: its sentinel has fired (or will), and the
            # crash handling nacks its message; touching it would only delay that.
            if not child.process.is_alive():
                continue
            child.touched = now
            try:
                consumer.touch(task.id)
            except ledgerq.UnknownMessageError:
                pass  # the lease ended already: the result's ack or nack says so
    return max(0.0, min(c.touched for c in busy) + every - now)


def _check_positive(name: str, value: object, kinds: type | tuple[type, ...], what: str) -> None:
    """TypeError unless ``value`` is one of ``kinds`` (a bool is not), ValueError unless > 0
    (NaN is not)."""
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    if not value > 0:  # type: ignore[operator]  # an int or a float, checked above
        raise ValueError(f"{name} must be > 0, got {value!r}")


class _Pool:
    """The owner's side of :func:`run`: its children, their leases and the counts."""

    def __init__(
        self,
        consumer: ledgerq.Reader,
        handler: Handler,
        *,
        processes: int,
        task_timeout: float | None,
        max_tasks_per_child: int | None,
        max_memory_per_child: int | None,
        forward_to: ledgerq.Queue | None = None,
        limiter: RateLimiter | None = None,
        queue_dir: str = "",
        reader: str = "default",
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        methods = multiprocessing.get_all_start_methods()
        # fork lets handlers be any callable (closures too) and starts children fast.
        self.ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        self.consumer = consumer
        self.handler = handler
        self.task_timeout = task_timeout
        self.max_tasks_per_child = max_tasks_per_child
        self.max_memory_per_child = max_memory_per_child
        self.forward_to = forward_to
        self.stop_requests = 0  # set by the signal handlers: 1 drain, 2 stop at once
        self.processed = self.failed = self.crashed = self.timed_out = 0
        self.released = self.recycled = 0
        self.limiter = limiter
        self.limit_wait: float | None = None  # seconds until the limiter allows a start
        self.queue_dir = queue_dir
        self.reader = reader
        self.wall_ns = wall_ns
        self.children = [self._spawn() for _ in range(processes)]

    def _spawn(self) -> _Child:
        return _Child(
            self.ctx,
            self.handler,
            self.max_memory_per_child is not None,
            self.forward_to is not None,
        )

    def _release(self, message_id: int) -> None:
        self.consumer.release(message_id)
        self.released += 1

    def _ended(self, child: _Child) -> None:
        """``child``'s task is settled: its progress record goes.  Only a task that
        reported has one - or a message delivered before, whose earlier delivery's pool
        may have died with a record (no syscall for the first delivery that did not)."""
        task = child.task
        if task is not None and (child.reported or task.attempts > 1):
            child.reported = False
            try:
                remove_progress(self.queue_dir, self.reader, task.id)
            except OSError as exc:  # a stale record shows; the task is settled anyway
                logger.warning("ledgerq worker: progress of message %d: %s", task.id, exc)

    def _report(self, child: _Child, report: tuple[str, int, float, str]) -> None:
        """Keep a child's progress report (the newest of those read together)."""
        task = child.task
        if task is None or report[1] != task.id:
            return  # a late report of a task already settled
        try:
            write_progress(
                self.queue_dir,
                self.reader,
                task.id,
                task.attempts,
                report[2],
                report[3],
                self.wall_ns(),
            )
        except OSError as exc:  # progress is for people: it never fails a task
            logger.warning("ledgerq worker: progress of message %d: %s", task.id, exc)
        else:
            child.reported = True

    def _receive(self, child: _Child) -> tuple[str, int, str, object, int | None] | None:
        """The child's answer, if one is there; progress reports read on the way are
        kept (the newest).  Raises EOFError/OSError when the pipe broke."""
        latest = None
        try:
            while True:
                item = child.conn.recv()
                if item[0] != _PROGRESS:
                    return item  # type: ignore[no-any-return]
                latest = item
                if not child.conn.poll(0):
                    return None
        finally:
            if latest is not None:
                self._report(child, latest)

    def lease(self) -> None:
        """Lease one message for each idle child and hand it over - with a rate limit,
        each only as the limiter grants a start (else :attr:`limit_wait` says when)."""
        self.limit_wait = None
        for child in self.children:
            if child.task is not None:
                continue
            grant: Grant | None = None
            if self.limiter is not None:
                answer = self.limiter.acquire()
                if not isinstance(answer, Grant):
                    self.limit_wait = answer / 1e9
                    return
                grant = answer
            message = self.consumer.dequeue()
            if message is None:
                if grant is not None and self.limiter is not None:
                    self.limiter.cancel(grant)  # no start: not counted (if still newest)
                return
            if self.stop_requests:  # the signal came during the dequeue: not started
                self._release(message.id)
                return
            if not child.assign(message):
                # It died idle since the last wait: its sentinel replaces it next time.
                self._release(message.id)

    def _replace(self, child: _Child) -> None:
        """Put a fresh child in ``child``'s place - or none while stopping: nothing is
        leased any more."""
        index = self.children.index(child)
        if self.stop_requests:
            del self.children[index]
        else:
            self.children[index] = self._spawn()

    def _settle(self, child: _Child, answer: tuple[str, int, str, object, int | None]) -> None:
        """Ack or nack a task as its child answered."""
        self._ended(child)
        kind, message_id, reason, delay, _resident = answer
        if kind == "ok" and self.forward_to is not None:
            try:
                # ``delay`` holds what the handler returned (see _child_main).
                self.consumer.forward(message_id, self.forward_to, _forwarded(delay))
            except (TypeError, ValueError, ledgerq.QueueFullError) as exc:
                kind, reason, delay = "err", f"forward: {type(exc).__name__}: {exc}", None
            else:
                self.processed += 1
                return
        if kind == "ok":
            self.consumer.ack(message_id)
            self.processed += 1
        else:
            _nack(self.consumer, message_id, reason, delay)
            self.failed += 1

    def _is_spent(self, child: _Child, resident_bytes: int | None) -> bool:
        """Whether ``child`` has done its share of tasks or grown past the limit."""
        if self.max_tasks_per_child is not None and child.tasks_done >= self.max_tasks_per_child:
            return True
        limit = self.max_memory_per_child
        return limit is not None and resident_bytes is not None and resident_bytes > limit

    def collect(self, ready: list[Any]) -> None:
        """Act on what ``wait`` found ready: answers, dead children, timed-out tasks."""
        for child in list(self.children):
            if child.task is not None and child.conn in ready:
                try:
                    answer = self._receive(child)
                except (EOFError, OSError):
                    answer = None
                    ready.append(child.process.sentinel)
                if answer is not None:
                    self._settle(child, answer)
                    child.task = None
                    child.tasks_done += 1
                    if self._is_spent(child, answer[4]) and child.process.sentinel not in ready:
                        # The task is settled (acked or nacked as it ended); only the
                        # process goes.  It exits at once on None: the join is short.
                        child.stop()
                        child.close()
                        self.recycled += 1
                        self._replace(child)
                        continue
            # Died: its sentinel fired, or its pipe hit EOF (a dying process closes the
            # pipe before it can be reaped: it may look alive).
            died = child.process.sentinel in ready
            timeout = self.task_timeout
            if died or (
                child.task is not None
                and timeout is not None
                and time.monotonic() - child.started >= timeout
            ):
                task = child.task
                if task is not None:
                    if died:
                        child.process.join(_REAP_SECONDS)
                        code = child.process.exitcode
                        reason = f"worker process crashed (exit code {code})"
                        self.crashed += 1
                    else:
                        # A failed delivery like any other: the retry policy's delay
                        # (no delay given here) and max_retries apply.
                        reason = f"task timed out after {timeout:g} s (its process was killed)"
                        self.timed_out += 1
                    self._ended(child)
                    self.consumer.nack(task.id, reason)
                    self.failed += 1
                child.kill()
                child.conn.close()
                self._replace(child)

    def wait_timeout(self, busy: list[_Child], heartbeat: float | None) -> float | None:
        """Seconds until the owner must look again without an event (None: never)."""
        timeout = None
        if self.task_timeout is not None and busy:
            now = time.monotonic()
            timeout = max(0.0, min(c.started for c in busy) + self.task_timeout - now)
        if heartbeat is not None and busy:
            beat = _heartbeat(self.consumer, busy, heartbeat)
            timeout = beat if timeout is None else min(timeout, beat)
        hint = self.consumer.seconds_to_next_expiry()
        if hint is not None:
            timeout = hint if timeout is None else min(timeout, hint)
        if self.limit_wait is not None and not self.stop_requests:
            timeout = self.limit_wait if timeout is None else min(timeout, self.limit_wait)
        if timeout is not None:
            # wait() polls, which takes at most 2**31 ms (~24 days): look again after a
            # day at most.
            timeout = min(timeout, _MAX_WAIT_SLICE_S)
        return timeout

    def shut_down(self) -> None:
        """Stop idle children; kill busy ones and settle or release their messages.

        Busy children are left only by a second signal (or an error escaping the loop):
        a task's answer already in the pipe is acked or nacked as it says; the others
        were cut short by the stop, not by their own failure, so they are released.
        """
        idle = [c for c in self.children if c.task is None]
        for child in idle:
            child.stop()
        for child in self.children:
            task = child.task
            if task is None:
                continue
            child.kill()
            answer = None
            try:
                while answer is None and child.conn.poll(0):
                    answer = self._receive(child)
            except (EOFError, OSError):  # cut in the middle of its answer
                answer = None
            try:
                if answer is not None:
                    self._settle(child, answer)
                else:
                    self._ended(child)
                    self._release(task.id)
            except ledgerq.LedgerQError as exc:  # the queue failed: it returns them itself
                logger.error("ledgerq worker: giving back message %d: %s", task.id, exc)
            child.conn.close()
        for child in idle:
            child.close()


@contextlib.contextmanager
def _open_target(
    forward_to: str | os.PathLike[str] | None, shared: bool, options: Mapping[str, Any]
) -> Iterator[ledgerq.Queue | None]:
    """The queue ``run(forward_to=)`` forwards into (None: none)."""
    if forward_to is None:
        yield None
        return
    passed = {k: options[k] for k in ("encryption_key", "lock_timeout") if k in options}
    with ledgerq.open(forward_to, shared=shared, **passed) as target:
        yield target


def run(
    path: str | os.PathLike[str],
    handler: Handler,
    *,
    processes: int = 4,
    task_timeout: float | None = None,
    until_empty: bool = False,
    shared: bool = True,
    reader: str = "default",
    max_tasks_per_child: int | None = None,
    max_memory_per_child: int | None = None,
    forward_to: str | os.PathLike[str] | None = None,
    rate_limit: str | None = None,
    **options: Unpack[ledgerq.OpenOptions],
) -> WorkerReport:
    """Process the queue at ``path`` with ``handler`` in ``processes`` child processes.

    ``handler(message)`` returning means ack, raising means nack with the exception's
    text (a :class:`Retry` with its delay), and a crash or a run past ``task_timeout``
    seconds is a failed delivery like a nack without delay: the queue's retry policy
    (``retry_delay``, ``retry_backoff``) and ``max_retries`` apply, the reason says
    ``"task timed out after N s"`` (``None``, infinity or more than 100 years: no
    limit).  Queue options (``max_retries``, ``visibility_timeout``, ...) pass through
    ``options``; with a ``visibility_timeout``, the lease of a task whose child is alive
    is kept (``touch``) at half of it.  ``reader`` names the reader consumed (created
    on first use, from the earliest message).

    ``max_tasks_per_child``: a child is replaced by a fresh process after that many
    tasks (None: never).  ``max_memory_per_child``: in **bytes** (not Celery's KiB); a
    child whose resident size after a task is above it is replaced - that task ended
    and was acked or nacked as usual.  The size is the current RSS where
    ``/proc/self/statm`` exists (Linux), else the peak RSS (``getrusage``); it includes
    what a forked child shares with the owner, so a fresh child starts near the
    owner's size: set the limit above it.

    ``rate_limit``: ``"N/s"``, ``"N/m"`` or ``"N/h"`` - at most N task starts in any
    window of one second, minute or hour, across every pool on this machine that
    consumes the queue at once (in either mode, whatever reader), bursts of up to N
    allowed.  The start times are kept in the queue directory (``shared/ratelimit``),
    so the limit holds across pools, reopens and a pool killed with -9 (its starts age
    out: nothing stays held).  It is the queue's: the last pool started with a
    ``rate_limit`` sets it for every pool running with one (a pool without one is not
    limited).  Times are the machine's monotonic clock (the ``clock`` option's
    ``monotonic_ns`` when given).

    A handler may call :func:`progress` to report how far its task is.

    Runs until SIGINT/SIGTERM or, with ``until_empty``, until no message is pending or
    in flight.  The first signal (to the owner or to its whole process group: children
    leave signals to the owner) stops leasing and lets running tasks finish, acked or
    nacked as usual but not retried by this pool; a second signal kills the running
    children and releases their messages (``release``: no failure counted).

    The queue is opened with ``shared=True`` (the default): other processes enqueue
    into it (``ledgerq.open(path, shared=True)``, ``ledgerq enqueue``) while the pool
    runs, their enqueues wake the owner at once, and several pools may share one queue;
    a killed owner's messages go back to the others within a second.  ``shared=False``
    opens it exclusively (a little faster; no other process may open it meanwhile).
    ``forward_to``: a queue path (opened in the same mode, with the same
    ``encryption_key`` and ``lock_timeout``): what the handler returns - bytes, an
    ``Item``, a list of them, or None for nothing - is ``forward``ed there, exactly once
    (``Reader.forward``), in place of the ack; a result that cannot be forwarded (a
    str, an unpicklable object, a full bounded target) fails the task like an exception.

    Raises ``QueueLockedError`` when a process holds the queue in the other mode,
    ``ValueError`` for ``max_memory_per_child`` where no resident size can be read, and
    TypeError or ValueError for a malformed ``rate_limit`` (before the queue is opened).
    """
    _check_positive("processes", processes, int, "an int")
    limit = None if rate_limit is None else parse_rate_limit(rate_limit)
    if not isinstance(shared, bool):
        raise TypeError(f"shared must be a bool, got {type(shared).__name__}")
    if task_timeout is not None:
        _check_positive("task_timeout", task_timeout, (int, float), "a number of seconds")
        if task_timeout > MAX_SECONDS:  # infinity too: as long as it takes, like None
            task_timeout = None
    if max_tasks_per_child is not None:
        _check_positive("max_tasks_per_child", max_tasks_per_child, int, "an int")
    if max_memory_per_child is not None:
        _check_positive("max_memory_per_child", max_memory_per_child, int, "an int (bytes)")
        own_bytes = _resident_bytes()
        if own_bytes is None:
            raise ValueError("max_memory_per_child: this platform reports no resident size")
        if own_bytes >= max_memory_per_child:
            logger.warning(
                "ledgerq worker: max_memory_per_child (%d bytes) is below this process's "
                "resident size (%d bytes), near which forked children start: each will be "
                "replaced after every task",
                max_memory_per_child,
                own_bytes,
            )
    if not isinstance(reader, str):
        raise TypeError(f"reader must be a str, got {type(reader).__name__}")
    if not callable(handler):
        raise TypeError(f"handler must be callable, got {type(handler).__name__}")
    if forward_to is not None:
        if not isinstance(forward_to, (str, os.PathLike)):
            raise TypeError(f"forward_to must be a queue path, got {type(forward_to).__name__}")
        if os.path.realpath(forward_to) == os.path.realpath(path):
            raise ValueError(
                f"forward_to is the queue the pool consumes ({os.fspath(path)}); "
                "forward into another queue"
            )
    wakeup = _Wakeup()
    started = time.monotonic()
    with (
        ledgerq.open(path, shared=shared, **options) as queue,
        _open_target(forward_to, shared, options) as target,
    ):
        consumer = queue.reader(reader)
        dead_before = queue.stats().dead_lettered
        # While a child is alive its lease is kept (touch) at half the visibility
        # timeout: a long task is not delivered again under it; a dead or stuck child is
        # the task_timeout's and the crash handling's to judge.
        visibility = queue.options.visibility_timeout
        heartbeat = None if visibility is None else visibility / 2
        # Not an OpenOptions key (tests pass one through to ledgerq.open): the pool's
        # rate limit and progress times come from it too.
        clock: ledgerq.Clock | None = cast("dict[str, Any]", options).get("clock")
        limiter = None
        if limit is not None:
            monotonic_ns = time.monotonic_ns if clock is None else clock.monotonic_ns
            limiter = RateLimiter(queue.path, *limit, monotonic_ns)
        remove_listener = queue.add_listener(wakeup.poke)
        pool = _Pool(
            consumer,
            handler,
            processes=processes,
            task_timeout=task_timeout,
            max_tasks_per_child=max_tasks_per_child,
            max_memory_per_child=max_memory_per_child,
            forward_to=target,
            limiter=limiter,
            queue_dir=queue.path,
            reader=reader,
            wall_ns=time.time_ns if clock is None else clock.time_ns,
        )

        def request_stop() -> None:
            pool.stop_requests += 1
            wakeup.poke()

        announced = False
        try:
            with _signals(request_stop, wakeup):
                while pool.stop_requests < 2:
                    if not pool.stop_requests:
                        pool.lease()
                    busy = [c for c in pool.children if c.task is not None]
                    if pool.stop_requests and not announced:
                        announced = True
                        logger.warning(
                            "ledgerq worker: stopping: %d running task(s) finish first, "
                            "nothing more is leased (signal again to stop at once)",
                            len(busy),
                        )
                    if not busy and (pool.stop_requests or (until_empty and len(consumer) == 0)):
                        break
                    ready = wait(
                        [c.conn for c in busy]
                        + [c.process.sentinel for c in pool.children]
                        + [wakeup.read_fd],
                        pool.wait_timeout(busy, heartbeat),
                    )
                    wakeup.drain()
                    pool.collect(ready)
                if pool.stop_requests >= 2:
                    logger.warning(
                        "ledgerq worker: stopping at once: killing %d running task(s), "
                        "their messages are released",
                        sum(c.task is not None for c in pool.children),
                    )
        finally:
            remove_listener()
            pool.shut_down()
            wakeup.close()
            if limiter is not None:
                limiter.close()
        dead_lettered = queue.stats().dead_lettered - dead_before
    return WorkerReport(
        processed=pool.processed,
        failed=pool.failed,
        dead_lettered=dead_lettered,
        crashed=pool.crashed,
        timed_out=pool.timed_out,
        elapsed=time.monotonic() - started,
        released=pool.released,
        recycled=pool.recycled,
    )
