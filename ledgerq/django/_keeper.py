"""The keeper: what a ``ledgerq_worker`` does besides running tasks, in one thread of its
main process.

* **Dead letters.**  A task whose deliveries all failed (``max_retries`` of them: its
  process died each time, or it raised ``Retry``) is moved by ledgerq to its queue's
  dead-letter queue, with no task process left to say so.  The keeper reads each served
  queue's DLQ with its own reader (``django-results``: the DLQ's messages stay there for
  ``ledgerq dlq list``/``requeue``) and marks the result ``FAILED``, the last attempt's
  error saying why (``dlq.failure_reason``).  A DLQ message is acked in that reader after
  the result is written, so a keeper killed in between marks it at its next start.
* **Pruning.**  Results past ``result_ttl`` are deleted at start and then every tenth of
  the ttl (hourly at most).

It runs in the main process after the pools are forked (that process forks nothing
later: an SQLite connection must never be open in a thread while its process forks).
It waits on the DLQ handles' listeners - an append by any process wakes it - and at
most a second between looks, for what a listener cannot see (a DLQ made by another
process after the keeper opened its queue).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import ledgerq
from ledgerq.django._config import BackendConfig
from ledgerq.django._payload import PayloadError, decode
from ledgerq.django._results import ResultStore

__all__ = ["DLQ_READER", "Keeper"]

logger = logging.getLogger("ledgerq.django")

DLQ_READER = "django-results"
_LOOK_EVERY_S = 1.0
_PRUNE_EVERY_MAX_S = 3600.0


class Keeper(threading.Thread):
    """Marks dead-lettered tasks ``FAILED`` and prunes old results until :meth:`stop`."""

    def __init__(self, config: BackendConfig, queue_names: list[str], store: ResultStore) -> None:
        super().__init__(name="ledgerq-django-keeper", daemon=True)
        self.config = config
        self.queue_names = queue_names
        self.store = store
        self._wake = threading.Event()
        self._stopping = False
        self.marked = 0  # results marked FAILED (for the logs and the tests)

    def stop(self) -> None:
        """Finish: one last look at the DLQs, then return from :meth:`run`."""
        self._stopping = True
        self._wake.set()

    def run(self) -> None:
        handles: list[ledgerq.Queue] = []
        removers = []
        try:
            for name in self.queue_names:
                handle = ledgerq.open(
                    self.config.queue_path(name),
                    shared=True,
                    remember_options=False,
                    **self.config.queue_options,
                )
                handles.append(handle)
            readers = [(handle, handle.dlq.reader(DLQ_READER)) for handle in handles]
            removers = [handle.dlq.add_listener(self._wake.set) for handle in handles]
            prune_every = min(self.config.result_ttl / 10, _PRUNE_EVERY_MAX_S)
            next_prune = 0.0
            while True:
                self._wake.clear()
                for handle, reader in readers:
                    self._settle(handle, reader)
                if time.monotonic() >= next_prune:
                    pruned = self.store.prune(time.time_ns())
                    if pruned:
                        logger.info("ledgerq_worker: pruned %d result(s) past result_ttl", pruned)
                    next_prune = time.monotonic() + prune_every
                if self._stopping:
                    return
                self._wake.wait(min(_LOOK_EVERY_S, max(0.0, next_prune - time.monotonic())))
        except Exception:
            logger.exception("ledgerq_worker: the keeper stopped (dead letters are not marked)")
        finally:
            for remove in removers:
                remove()
            for handle in handles:
                with contextlib.suppress(ledgerq.LedgerQError):
                    handle.close()
            self.store.close()

    def _settle(self, handle: ledgerq.Queue, reader: ledgerq.Reader) -> None:
        """Mark the result of every new dead letter of ``handle``'s queue."""
        while (message := reader.dequeue()) is not None:
            try:
                task = decode(message.payload)
            except PayloadError as exc:
                logger.warning(
                    "ledgerq_worker: dead letter %d of %s is not a task (%s)",
                    message.id,
                    handle.path,
                    exc,
                )
            else:
                original = int(message.headers.get("dlq.original_id", "0"))
                reason = message.headers.get("dlq.failure_reason", "failed deliveries")
                count = message.headers.get("dlq.retry_count", "?")
                why = f"{reason} - delivery {count}, the last max_retries allows"
                if self.store.dead_lettered(task.result_id, original, why, time.time_ns()):
                    self.marked += 1
                    logger.warning(
                        "ledgerq_worker: task %s (result %s) moved to the dead-letter queue "
                        "of %s after %s failed deliveries: its result is FAILED",
                        task.task_path,
                        task.result_id,
                        handle.path,
                        count,
                    )
            reader.ack(message.id)
