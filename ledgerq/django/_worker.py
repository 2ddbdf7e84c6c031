"""``ledgerq_worker``: pools of task processes over a backend's queues (``ledgerq.workers``).

::

    ledgerq_worker (this process: signals, the keeper thread)
     ├── pool "default"   ledgerq.workers.run(<path>/queues/default, ...)
     │    ├── task process     ├── task process  ...   (--processes of them)
     └── pool "emails"    ledgerq.workers.run(<path>/queues/emails, ...)
          └── ...

One pool per Tasks queue: a pool is :func:`ledgerq.workers.run` over one queue (lease
one message per idle process, ack/nack, a new process after a crash, ``--task-timeout``,
``--max-tasks-per-child``, the dead-letter queue after ``max_retries`` failed
deliveries).  Each pool is this process's child, in a session of its own, and dies with
it (``PR_SET_PDEATHSIG``; its task processes die with the pool): a kill -9 of this
process takes every process of the worker down, and their tasks are delivered again.

Signals.  The first SIGINT or SIGTERM to this process is passed to every pool, which
stops leasing and lets running tasks finish (the pool's drain); a second is passed on
too, and the pools stop at once (the running tasks are killed and their messages
released: they run again, with the same attempt count).  Pools are in sessions of their
own so that a Ctrl-C, which the terminal sends to the whole foreground group, reaches
them once, through this process.  (Under systemd, ``KillMode=mixed`` sends the stop
signal to this process alone, for the same reason.)
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import wait
from types import FrameType
from typing import Any

from django.db import connections

import ledgerq
import ledgerq.workers
from ledgerq.django._execution import TaskHandler
from ledgerq.django._keeper import Keeper
from ledgerq.django._process import die_with_parent
from ledgerq.django.backend import LedgerQBackend

__all__ = ["PoolSettings", "serve"]

logger = logging.getLogger("ledgerq.django")
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """How each pool runs (the command's flags; ``ledgerq.workers.run``'s keywords)."""

    processes: int = 4
    task_timeout: float | None = None
    max_tasks_per_child: int | None = None
    until_empty: bool = False


def _pool_main(backend: LedgerQBackend, name: str, pool: PoolSettings, parent: int) -> None:
    """A pool's process: ``ledgerq.workers.run`` over queue ``name`` until it returns."""
    os.setsid()
    die_with_parent(parent)
    # Until workers.run installs its own handlers, a stop signal ends this process (it
    # holds no lease yet); signals were blocked across the fork, so none was lost.
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    path = backend.config.queue_path(name)
    try:
        report = ledgerq.workers.run(
            path,
            TaskHandler(backend.alias),
            processes=pool.processes,
            task_timeout=pool.task_timeout,
            max_tasks_per_child=pool.max_tasks_per_child,
            until_empty=pool.until_empty,
            **backend.config.queue_options,
        )
    except ledgerq.LedgerQError as exc:
        logger.error("ledgerq_worker: queue %r (%s): %s", name, path, exc)
        sys.exit(1)
    logger.info(
        "ledgerq_worker: queue %r: %d task(s) done, %d failed deliveries, %d dead-lettered",
        name,
        report.processed,
        report.failed,
        report.dead_lettered,
    )


def serve(backend: LedgerQBackend, queue_names: list[str], pool: PoolSettings) -> int:
    """Run a pool per queue in ``queue_names`` until stopped by a signal (or, with
    ``until_empty``, until every queue is empty); return the exit status: 0, or 1 when
    a pool failed (its error is logged)."""
    store = backend.store
    # Nothing this process holds open may be shared with the pools: the framework's
    # database connections and the results database are opened again by each process.
    connections.close_all()
    store.close()
    ctx = multiprocessing.get_context("fork")
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    pools: dict[str, Any] = {}
    stops = 0

    def stop_pools() -> None:
        for process in pools.values():
            if process.exitcode is None:
                os.kill(process.pid, signal.SIGTERM)

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stops
        stops += 1
        if stops == 1:
            logger.warning(
                "ledgerq_worker: stopping: running tasks finish first, nothing more is "
                "started (signal again to stop at once)"
            )
        stop_pools()

    previous = {signum: signal.signal(signum, on_signal) for signum in _STOP_SIGNALS}
    keeper = Keeper(backend.config, queue_names, store)
    failed: list[str] = []
    try:
        for name in queue_names:
            process = ctx.Process(
                target=_pool_main,
                args=(backend, name, pool, os.getpid()),
                name=f"ledgerq-pool-{name}",
            )
            process.start()
            pools[name] = process
        keeper.start()  # after the forks: none follows
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        logger.info(
            "ledgerq_worker: ready: queue(s) %s of backend %r under %s, %d process(es) each",
            ", ".join(queue_names),
            backend.alias,
            backend.config.root,
            pool.processes,
        )
        running = dict(pools)
        while running:
            ready = wait([process.sentinel for process in running.values()])
            for name, process in list(running.items()):
                if process.sentinel not in ready:
                    continue
                process.join()
                del running[name]
                if stops and process.exitcode in (-signal.SIGTERM, -signal.SIGINT):
                    # Stopped before its pool had started (and taken the signal over):
                    # it held no task.
                    logger.info("ledgerq_worker: queue %r: stopped before it started", name)
                    continue
                if stops == 0 and (process.exitcode != 0 or not pool.until_empty):
                    logger.error(
                        "ledgerq_worker: the pool of queue %r ended (exit code %s): "
                        "stopping the others",
                        name,
                        process.exitcode,
                    )
                    failed.append(name)
                    stops += 1
                    stop_pools()
                elif process.exitcode != 0:
                    failed.append(name)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if keeper.is_alive():
            keeper.stop()
            keeper.join()
    return 1 if failed else 0
