"""The owner's side of a worker pool: its children (:class:`Pool`: one lease per idle
child, the answers settled as acks, nacks and forwards, crashes, timeouts and
recycling), the self-pipe that wakes it and the signals routed to it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import ledgerq
from ledgerq._types import Message
from ledgerq.segment.progress import remove_progress, write_progress
from ledgerq.segment.ratelimit import Grant, RateLimiter
from ledgerq.workers._child import PROGRESS, Handler, child_main

__all__ = ["Pool", "Wakeup", "routed_signals"]

logger = logging.getLogger("ledgerq")

# How long to wait for a worker that died (its pipe closed) to be reaped, for its
# exit code; it is already exiting, so this is a bound, not a delay.
_REAP_SECONDS = 5.0

_MAX_WAIT_SLICE_S = 86_400.0  # one wait of the owner, at most


class _Child:
    """One worker process and what it is doing."""

    def __init__(
        self, ctx: Any, handler: Handler, measure_memory: bool, forwarding: bool = False
    ) -> None:
        owner_end, child_end = ctx.Pipe()
        self.process = ctx.Process(
            target=child_main,
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


class Wakeup:
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
def routed_signals(on_signal: Callable[[], None], wakeup: Wakeup) -> Iterator[None]:
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


class Pool:
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
                if item[0] != PROGRESS:
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
                # ``delay`` holds what the handler returned (see child_main).
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
