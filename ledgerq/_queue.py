"""The public ``ledgerq.Queue``: the core queue with its features and DLQ tooling."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Mapping

from ledgerq._errors import LedgerQError
from ledgerq._options import Options
from ledgerq._types import Item, PeriodicJob, Priority
from ledgerq.core.args import (
    DEFAULT_LOCK_TIMEOUT,
    check_delay,
    check_headers_size,
    check_ids,
    check_payload,
    check_periodic_name,
    check_periodic_schedule,
    check_priority,
)
from ledgerq.core.clock import Clock
from ledgerq.core.queue import DEFAULT_READER, QueueCore
from ledgerq.core.shared_queue import SharedQueueCore
from ledgerq.features import build_features
from ledgerq.features.dlq import DeadLetterStore
from ledgerq.features.periodic import NAME_HEADER, TICK_HEADER, PeriodicFeature
from ledgerq.format.entry import Entry, encode_headers

__all__ = ["Queue", "SharedQueue", "open_configured"]

logger = logging.getLogger("ledgerq")

# Messages requeue_dlq writes with one enqueue_batch (and, unless sync="always", one
# fsync) before settling them in the DLQ: bounds the size of one write.
_REQUEUE_BATCH = 256


class Queue(QueueCore):
    """A durable message queue in one directory.  Use :func:`ledgerq.open` to get one."""

    @property
    def dlq(self) -> Queue:
        """The dead-letter queue: a full queue in ``<path>/dlq/`` (created on first use)."""
        self._ensure_open()
        store = self._dlq_store()
        dlq = store.queue()
        assert isinstance(dlq, Queue)
        return dlq

    def _dlq_store(self) -> DeadLetterStore:
        for feature in self._features:
            if isinstance(feature, DeadLetterStore):
                return feature
        raise AssertionError("every queue has a dead-letter store")  # pragma: no cover

    def requeue_dlq(self, ids: Iterable[int] | None = None, *, delay: float | None = None) -> int:
        """Move dead-lettered messages back to this queue; return how many moved.

        ``ids`` are ids *in the DLQ* (default: every message there).  Each comes back
        as a new message (new id, attempts starting again) with its original payload,
        priority and headers, the ``dlq.*`` headers removed, and is removed from the
        DLQ - so requeueing the same id twice moves it once.  Ids not in the DLQ are
        skipped.  A crash mid-way can leave a message in both queues, never in neither;
        so can a power cut, for messages that were durable in the DLQ: the copies are
        written in batches, each fsynced before its messages are settled in the DLQ.

        Raises ``TypeError`` before anything moves if ``ids`` is a str or bytes (not
        iterated: ``"12"`` is not the ids 1 and 2) or holds anything but ints.
        ``delay`` (seconds) holds the requeued messages back: each is first delivered no
        earlier than that from now (checked like ``enqueue``'s, before anything moves).
        """
        wanted = None if ids is None else check_ids(ids)
        delay = check_delay(delay)
        self._ensure_open()
        dlq = self.dlq
        # In shared mode another process may requeue too: the DLQ's reader is held across
        # finding the messages, copying them and settling them, so each moves once.
        with dlq.holding_reader(DEFAULT_READER):
            entries = dlq._pending_entries(wanted)
            moved = 0
            for start in range(0, len(entries), _REQUEUE_BATCH):
                chunk = entries[start : start + _REQUEUE_BATCH]
                copies = self.enqueue_batch(
                    [self._requeued_item(dlq, entry, data, delay) for entry, data in chunk]
                )
                settled = 0
                try:
                    if not self._sync_always:
                        # The DLQ's settle records below may reach the disk before these
                        # copies (page cache writeback keeps no order between files): a
                        # power cut would then lose messages that a sync() had made
                        # durable.  One fsync per batch.
                        self._log_commit.sync_now()
                    for entry, _ in chunk:
                        if dlq._settle(entry.id):
                            moved += 1
                        settled += 1
                except LedgerQError as exc:
                    self._take_back_copies(copies[settled:])
                    exc.add_note(
                        f"requeue_dlq moved {moved} of {len(entries)} messages before this "
                        "error; the others are still in the dead-letter queue only"
                    )
                    raise
        return moved

    def _take_back_copies(self, copies: list[int]) -> None:
        """Settle the copies of messages a requeue could not remove from the DLQ.

        So that a requeue that raised leaves each message in one queue, as before it
        (if this fails too, a message is in both: a duplicate, never a loss).
        """
        for copy_id in copies:
            try:
                self._settle(copy_id)
            except LedgerQError as exc:
                logger.warning(
                    "ledgerq: message %d of %s is in the dead-letter queue and, as a copy, "
                    "in the queue too (%s)",
                    copy_id,
                    self.path,
                    exc,
                )

    def _requeued_item(self, dlq: Queue, entry: Entry, payload: bytes, delay: float | None) -> Item:
        """The message ``entry`` of the DLQ as it comes back: ``dlq.*`` headers removed."""
        headers = {k: v for k, v in (entry.headers or {}).items() if not k.startswith("dlq.")}
        dedup = (
            f"ledgerq.requeue:{os.path.basename(dlq.path)}:{entry.id}"
            if (self.options.dedup_window is not None)
            else None
        )
        group = (entry.headers or {}).get("dlq.group")
        return Item(
            payload,
            headers=headers,
            priority=entry.priority,
            dedup_id=dedup,
            group=group,
            delay=delay,
        )

    def purge(self, ids: Iterable[int] | None = None) -> int:
        """Remove messages that are not leased, for good; return how many.

        Default: every one of them - ready, delayed, waiting for a retry, held behind
        its group.  A leased message is never removed (this handle's or, in shared
        mode, another's): its holder's ``ack`` still works.  ``ids`` are checked as
        :meth:`requeue_dlq` checks them, before anything is removed; ids that are not
        pending (leased, finished, unknown) are skipped.  Durable as an ack is.
        """
        wanted = None if ids is None else check_ids(ids)
        with self._lock:
            self._ensure_open()
            core = self._default._core
            removed, ticket = core.purge(wanted)
            if removed:
                self._retire_consumed()
                self._waits.room_made()
                if core.group_freed:  # a kept message of a purged head's group is free
                    core.group_freed = False
                    self._waits.wake()
        if removed and self._sync_always:
            core.journal.commit.wait_durable(ticket)
        return len(removed)

    # ------------------------------------------------------------------ periodic jobs

    def _periodic_feature(self) -> PeriodicFeature:
        for feature in self._features:
            if isinstance(feature, PeriodicFeature):
                return feature
        raise AssertionError("every queue has periodic jobs")  # pragma: no cover

    def add_periodic(
        self,
        name: str,
        payload: bytes,
        *,
        every: float | None = None,
        cron: str | None = None,
        headers: Mapping[str, str] | None = None,
        priority: Priority | int = Priority.MEDIUM,
    ) -> None:
        """Enqueue ``payload`` on every tick of a schedule, once per tick, durably.

        Exactly one of ``every`` (seconds: ticks at the time of this call plus every
        multiple of it) and ``cron`` (a 5-field expression read in UTC, such as
        ``"*/5 * * * *"``; see docs/usage.md) is given.  Each tick's message carries
        ``headers`` plus ``periodic.name`` (``name``) and ``periodic.tick`` (the tick's
        time, ns since the epoch), and ``priority``.  It is enqueued exactly once per
        tick whatever number of handles and processes have the queue open, by
        whichever looks first (a dequeue or a wait for one; in shared mode also the
        housekeeper thread, within 0.25 s); ticks missed while no handle looked - the
        queue closed - give one message, for the latest of them, at the next look.
        Adding an existing name replaces that job (its ticks start again from now).

        Raises ``TypeError``/``ValueError`` for a bad name, payload, schedule or
        headers, :class:`MessageTooLargeError` for a payload or headers over
        ``max_message_size``, before anything is written.  Durable as an enqueue is:
        the job has reached the OS when this returns (it survives a crash of the
        process), and the disk with ``sync="always"`` (else at the next sync).
        """
        name = check_periodic_name(name)
        limit = self.options.max_message_size
        data = bytes(check_payload(payload, limit))
        every_ns, schedule = check_periodic_schedule(every, cron)
        level = check_priority(priority)
        if headers is not None:
            headers = dict(headers)
            # As the messages will carry them (a tick is at most 20 digits).
            check_headers_size(
                encode_headers({**headers, NAME_HEADER: name, TICK_HEADER: "9" * 20}), limit
            )
        self._periodic_feature().add(name, data, every_ns, schedule, headers, level)

    def remove_periodic(self, name: str) -> bool:
        """Stop the periodic job ``name``; return whether there was one.  Messages it
        already enqueued stay.  Durable as :meth:`add_periodic`."""
        return self._periodic_feature().remove(check_periodic_name(name))

    def periodic(self) -> list[PeriodicJob]:
        """The periodic jobs, by name: each one's schedule, next and last run."""
        return self._periodic_feature().jobs()


class SharedQueue(Queue, SharedQueueCore):
    """A :class:`Queue` handle in shared mode (``ledgerq.open(path, shared=True)``)."""


def open_configured(
    path: str | os.PathLike[str],
    options: Options,
    clock: Clock | None = None,
    *,
    remember_options: bool = True,
    shared: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> Queue:
    """Open a queue with exactly ``options`` (not merged with the stored ones) and the
    features they turn on.  Its DLQ, when opened, reads the same ``clock`` and is
    opened in the same mode; with ``remember_options=False`` neither stores its
    options.  :func:`ledgerq.open` is the public way in."""
    opener = functools.partial(
        open_configured,
        clock=clock,
        remember_options=remember_options,
        shared=shared,
        lock_timeout=lock_timeout,
    )
    cls = SharedQueue if shared else Queue
    return cls(
        path,
        options,
        build_features(options, opener),
        clock,
        remember_options=remember_options,
        lock_timeout=lock_timeout,
    )
