"""The child's side of a worker pool: the loop that runs ``handler(message)`` for each
task the owner sends down its pipe and answers, :func:`progress` and :class:`Retry` (what
a handler may call and raise), and the child's own set-up (it dies with its owner, and
leaves SIGINT and SIGTERM to it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from ledgerq._types import Message
from ledgerq.segment.progress import MAX_NOTE_CHARS

try:
    import resource
except ImportError:  # not Unix: /proc or nothing
    resource = None  # type: ignore[assignment]

__all__ = ["PROGRESS", "Handler", "Retry", "child_main", "progress", "resident_bytes"]

Handler = Callable[[Message], Any]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

PROGRESS = "progress"  # the kind of a child's progress report (its answers: "ok", "err")

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
        conn.send((PROGRESS, _Task.message_id, float(fraction), note))


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


def resident_bytes() -> int | None:
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
    """Do nothing: the owner decides when a child stops (see :func:`child_main`)."""


def child_main(
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
                conn.send((*answer, resident_bytes() if measure_memory else None))
            except (TypeError, AttributeError, pickle.PicklingError) as exc:
                # (only a forwarded result can be unpicklable): a failed task, not a dead
                # child
                reason = f"the handler's result cannot be forwarded: {type(exc).__name__}: {exc}"
                conn.send(("err", message.id, reason, None, None))
