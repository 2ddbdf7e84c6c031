"""A pool of worker processes over a queue: ack/nack retry loops without the boilerplate.

The owner process (the caller of :func:`run`) opens the queue - in shared mode unless
told otherwise, so producers in other processes (and other pools) use the queue while
it runs - leases one message per idle child and sends it down that child's pipe; the
child calls ``handler(message)`` and answers.  The owner then:

* acks when the handler returned;
* nacks with ``"<ExceptionType>: <text>"`` when it raised - so ``max_retries`` and the
  dead-letter queue apply;
* nacks with a reason and starts a fresh child when the child died (``os._exit``, a
  segfault, the OOM killer) or ran longer than ``task_timeout`` (it is killed).

Nothing here polls: the owner blocks in ``multiprocessing.connection.wait`` on the
children's pipes and process sentinels, plus a self-pipe that the queue pokes (via
``Queue.add_listener``) when messages arrive - from any process, in shared mode - and
the signal handlers poke on SIGINT/SIGTERM.  On the first signal the owner stops
leasing and lets in-flight tasks finish (each is then acked or nacked as usual); a
second signal kills the children and their messages are returned by the queue
(delivered again: at once to other pools, else after a restart).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Unpack

import ledgerq
from ledgerq._options import MAX_SECONDS
from ledgerq._types import Message

__all__ = ["Retry", "WorkerReport", "run"]

logger = logging.getLogger("ledgerq")

Handler = Callable[[Message], Any]

# How long to wait for a worker that died (its pipe closed) to be reaped, for its
# exit code; it is already exiting, so this is a bound, not a delay.
_REAP_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_MAX_WAIT_SLICE_S = 86_400.0  # one wait of the owner, at most


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What a :func:`run` did: messages acked, failed deliveries, dead letters, time."""

    processed: int
    failed: int
    dead_lettered: int
    crashed: int = 0
    timed_out: int = 0
    elapsed: float = 0.0

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


class Retry(Exception):  # the handler's word: "retry this later"
    """Raise in a handler to nack the message with a delay: it comes back no earlier
    than ``delay`` seconds from now (None: the queue's retry policy), as
    ``Queue.nack(id, reason, delay=delay)``; a failed delivery like any exception."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        super().__init__(reason or (f"retry in {delay} s" if delay is not None else "retry"))
        self.delay = delay


def _child_main(handler: Handler, conn: Connection, owner_pid: int) -> None:
    """Run tasks from ``conn`` until told to stop (None) or the pipe closes."""
    _die_with(owner_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner decides when we stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        try:
            handler(message)
        except BaseException as exc:  # report every failure; the owner nacks it
            reason = f"{type(exc).__name__}: {exc}"
            delay = exc.delay if isinstance(exc, Retry) else None
            conn.send(("err", message.id, reason, delay))
        else:
            conn.send(("ok", message.id, "", None))


class _Child:
    """One worker process and what it is doing."""

    def __init__(self, ctx: Any, handler: Handler) -> None:
        owner_end, child_end = ctx.Pipe()
        self.process = ctx.Process(
            target=_child_main, args=(handler, child_end, os.getpid()), daemon=True
        )
        self.process.start()
        child_end.close()
        self.conn: Connection = owner_end
        self.task: Message | None = None
        self.started = 0.0
        self.touched = 0.0  # when its lease was last kept (assign, heartbeat)

    def assign(self, message: Message) -> None:
        self.task = message
        self.started = self.touched = time.monotonic()
        self.conn.send(message)

    def stop(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(None)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()

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
def _signals(on_signal: Callable[[], None]) -> Iterator[None]:
    """Route SIGINT/SIGTERM to ``on_signal`` while running (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        sig: signal.signal(sig, lambda _signum, _frame: on_signal())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _nack(queue: ledgerq.Queue, message_id: int, reason: str, delay: object) -> None:
    """Nack for a handler that raised; a ``Retry`` with an unusable delay (negative,
    NaN, not a number) is logged and nacked with the retry policy's delay instead."""
    if delay is not None:
        try:
            queue.nack(message_id, reason, delay=delay)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            logger.warning("ledgerq worker: Retry(%r) of message %d: %s", delay, message_id, exc)
        else:
            return
    queue.nack(message_id, reason)


def _heartbeat(queue: ledgerq.Queue, busy: list[_Child], every: float) -> float:
    """Touch the leases of busy children not touched for ``every`` seconds; return the
    seconds until the next touch is due."""
    now = time.monotonic()
    for child in busy:
        task = child.task
        if task is not None and now - child.touched >= every:
            child.touched = now
            try:
                queue.touch(task.id)
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


def run(
    path: str | os.PathLike[str],
    handler: Handler,
    *,
    processes: int = 4,
    task_timeout: float | None = None,
    until_empty: bool = False,
    shared: bool = True,
    **options: Unpack[ledgerq.OpenOptions],
) -> WorkerReport:
    """Process the queue at ``path`` with ``handler`` in ``processes`` child processes.

    ``handler(message)`` returning means ack, raising means nack with the exception's
    text, and a crash or a run past ``task_timeout`` seconds is a failed delivery like
    a nack (``None``, infinity or more than 100 years: no limit).  Queue options
    (``max_retries``, ``visibility_timeout``, ...) pass through ``options``.  Runs until
    SIGINT/SIGTERM (graceful: in-flight tasks finish) or, with ``until_empty``, until no
    message is pending or in flight.

    The queue is opened with ``shared=True`` (the default): other processes enqueue
    into it (``ledgerq.open(path, shared=True)``, ``ledgerq enqueue``) while the pool
    runs, their enqueues wake the owner at once, and several pools may share one queue;
    a killed owner's messages go back to the others within a second.  ``shared=False``
    opens it exclusively (a little faster; no other process may open it meanwhile).
    Raises ``QueueLockedError`` when a process holds the queue in the other mode.
    """
    _check_positive("processes", processes, int, "an int")
    if not isinstance(shared, bool):
        raise TypeError(f"shared must be a bool, got {type(shared).__name__}")
    if task_timeout is not None:
        _check_positive("task_timeout", task_timeout, (int, float), "a number of seconds")
        if task_timeout > MAX_SECONDS:  # infinity too: as long as it takes, like None
            task_timeout = None
    if not callable(handler):
        raise TypeError(f"handler must be callable, got {type(handler).__name__}")
    methods = multiprocessing.get_all_start_methods()
    # fork lets handlers be any callable (closures too) and starts children fast.
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    wakeup = _Wakeup()
    stop_requests = 0

    def request_stop() -> None:
        nonlocal stop_requests
        stop_requests += 1
        wakeup.poke()

    processed = failed = crashed = timed_out = 0
    started = time.monotonic()
    with ledgerq.open(path, shared=shared, **options) as queue:
        dead_before = queue.stats().dead_lettered
        # While a child is alive its lease is kept (touch) at half the visibility
        # timeout: a long task is not delivered again under it; a dead or stuck child is
        # the task_timeout's and the crash handling's to judge.
        visibility = queue.options.visibility_timeout
        heartbeat = None if visibility is None else visibility / 2
        remove_listener = queue.add_listener(wakeup.poke)
        children = [_Child(ctx, handler) for _ in range(processes)]
        try:
            with _signals(request_stop):
                while True:
                    if stop_requests >= 2:
                        break  # impatient: kill below; leases come back on reopen
                    if not stop_requests:
                        for child in children:
                            if child.task is None:
                                message = queue.dequeue()
                                if message is None:
                                    break
                                child.assign(message)
                    busy = [c for c in children if c.task is not None]
                    if not busy and (stop_requests or (until_empty and len(queue) == 0)):
                        break
                    timeout = None
                    if task_timeout is not None and busy:
                        now = time.monotonic()
                        timeout = max(0.0, min(c.started for c in busy) + task_timeout - now)
                    if heartbeat is not None and busy:
                        beat = _heartbeat(queue, busy, heartbeat)
                        timeout = beat if timeout is None else min(timeout, beat)
                    hint = queue.reader("default").seconds_to_next_expiry()
                    if hint is not None:
                        timeout = hint if timeout is None else min(timeout, hint)
                    if timeout is not None:
                        # wait() polls, which takes at most 2**31 ms (~24 days): look again
                        # after a day at most.
                        timeout = min(timeout, _MAX_WAIT_SLICE_S)
                    ready = wait(
                        [c.conn for c in busy]
                        + [c.process.sentinel for c in children]
                        + [wakeup.read_fd],
                        timeout,
                    )
                    wakeup.drain()
                    for i, child in enumerate(children):
                        if child.task is not None and child.conn in ready:
                            try:
                                kind, message_id, reason, delay = child.conn.recv()
                            except (EOFError, OSError):
                                ready.append(child.process.sentinel)
                            else:
                                child.task = None
                                if kind == "ok":
                                    queue.ack(message_id)
                                    processed += 1
                                else:
                                    _nack(queue, message_id, reason, delay)
                                    failed += 1
                        # Died: its sentinel fired, or its pipe hit EOF (a dying process
                        # closes the pipe before it can be reaped: it may look alive).
                        died = child.process.sentinel in ready
                        if died or (
                            child.task is not None
                            and task_timeout is not None
                            and time.monotonic() - child.started >= task_timeout
                        ):
                            task = child.task
                            if task is not None:
                                if died:
                                    child.process.join(_REAP_SECONDS)
                                    code = child.process.exitcode
                                    reason = f"worker process crashed (exit code {code})"
                                    crashed += 1
                                else:
                                    reason = f"task timeout: ran longer than {task_timeout} s"
                                    timed_out += 1
                                queue.nack(task.id, reason)
                                failed += 1
                            child.kill()
                            children[i] = _Child(ctx, handler)
        finally:
            remove_listener()
            for child in children:
                if stop_requests >= 2 or child.task is not None:
                    child.kill()
                else:
                    child.stop()
                    child.close()
            wakeup.close()
        dead_lettered = queue.stats().dead_lettered - dead_before
    return WorkerReport(
        processed=processed,
        failed=failed,
        dead_lettered=dead_lettered,
        crashed=crashed,
        timed_out=timed_out,
        elapsed=time.monotonic() - started,
    )
