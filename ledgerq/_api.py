"""``ledgerq.open``: the one way in."""

from __future__ import annotations

import os
from typing import Unpack

from ledgerq._options import OpenOptions, Options
from ledgerq._queue import Queue, open_configured
from ledgerq.core.args import DEFAULT_LOCK_TIMEOUT, check_lock_timeout, check_queue_path
from ledgerq.core.clock import Clock
from ledgerq.segment.meta import stored_options

__all__ = ["open"]


def open(  # noqa: A001 - the stdlib-like verb is the point
    path: str | os.PathLike[str],
    options: Options | None = None,
    *,
    clock: Clock | None = None,
    remember_options: bool = True,
    shared: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    **kwargs: Unpack[OpenOptions],
) -> Queue:
    """Open (creating if missing) the queue in directory ``path``.

    Options come as an :class:`Options` object, as keyword arguments (their names and
    types are :class:`OpenOptions`, which type checkers read), or both (keywords
    override).  A queue remembers the options it was opened with: options
    not given as keywords (and no ``Options`` object) keep their stored values, so
    ``ledgerq.open(path)`` reopens a queue as it was configured.  With
    ``remember_options=False`` the options are used while this handle is open and
    not stored: the queue keeps the options it had stored (none, for a new queue),
    as a tool that overrides an option for one run needs.

    ``shared=True`` (not an option, never stored) opens the queue in shared mode: any
    number of processes, and handles in one process, may have it open at once, each
    with the whole API (docs/usage.md, "Many processes on one queue").  Exclusive (the
    default) and shared opens exclude each other.

    ``lock_timeout`` (seconds, default 10; not an option, never stored) bounds every
    wait for another handle's step: a process stopped in the middle of one (SIGSTOP, a
    debugger) holds its lock, and is never taken over while it lives, so a call that
    needs that lock gives up after ``lock_timeout`` - ``open`` with
    :class:`QueueLockedError`, every other call with :class:`QueueBusyError` (nothing
    done); a ``dequeue(timeout=t)`` returns by ``t`` (docs/usage.md, "Many processes").

    ``clock`` (not an option, never stored) replaces the system's clocks: an object
    with ``time_ns()`` and ``monotonic_ns()`` like the ``time`` module's (see
    :class:`ledgerq.Clock`) - for tests that step the wall clock or let time pass
    without sleeping.  Whatever the clock, the queue's time is fixed at open and then
    only moves with the monotonic clock (docs/usage.md, "Time").

    Raises ``TypeError`` for an unknown option, :class:`ConfigError` for an invalid
    value, ``ValueError`` for an empty path, :class:`QueueLockedError` if the queue is
    already open (in this or another process) in the other mode, or at all for an
    exclusive open (its ``held_by`` says which mode holds it), :class:`NotAQueueError`
    if ``path`` holds something else, :class:`StorageError` if the directory cannot be
    created or read
    (permission denied, ...).
    """
    check_queue_path(path)
    if not isinstance(remember_options, bool):
        raise TypeError(f"remember_options must be a bool, got {type(remember_options).__name__}")
    if not isinstance(shared, bool):
        raise TypeError(f"shared must be a bool, got {type(shared).__name__}")
    lock_timeout = check_lock_timeout(lock_timeout)
    stored = stored_options(os.fspath(path)) if os.path.isdir(path) else {}
    return open_configured(
        path,
        Options.from_kwargs(options, kwargs, stored),
        clock,
        remember_options=remember_options,
        shared=shared,
        lock_timeout=lock_timeout,
    )
