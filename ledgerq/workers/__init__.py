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

The child's side (its loop, :func:`progress`, :class:`Retry`) is in ``_child.py``, the
owner's (the pool of children and their leases) in ``_pool.py``; :func:`run` here
checks its arguments, opens the queues and drives the pool.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Unpack, cast

import ledgerq
from ledgerq._options import MAX_SECONDS
from ledgerq._public import publish
from ledgerq.segment.ratelimit import MAX_COUNT, RateLimiter
from ledgerq.workers._child import Handler, Retry, progress, resident_bytes
from ledgerq.workers._pool import Pool, Wakeup, routed_signals

__all__ = ["Retry", "WorkerReport", "progress", "run"]

logger = logging.getLogger("ledgerq")

_PERIODS_NS = {"s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}


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


def _check_positive(name: str, value: object, kinds: type | tuple[type, ...], what: str) -> None:
    """TypeError unless ``value`` is one of ``kinds`` (a bool is not), ValueError unless > 0
    (NaN is not)."""
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    if not value > 0:  # type: ignore[operator]  # an int or a float, checked above
        raise ValueError(f"{name} must be > 0, got {value!r}")


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
        own_bytes = resident_bytes()
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
    wakeup = Wakeup()
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
        pool = Pool(
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
            with routed_signals(request_stop, wakeup):
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


publish(__name__, globals(), __all__)  # (the names defined in private modules)
