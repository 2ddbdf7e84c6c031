"""Retention: which segments of the log go, and when (a mixin of the queue core).

A sealed segment every reader has consumed is deleted - at once, or with
``retention_max_age`` once its newest message is older than that; with
``retention_max_bytes`` the oldest segments go while the log is larger, settled as
dropped in every reader that had not settled them.  The active segment never goes.
Retention runs after a settle or a rotation (housekeeping: a deletion the disk refuses
is logged and tried again later) and on ``compact()``.  In shared mode it runs under
the append lock and reads the heads the readers published
(``SharedQueueCore._retire_locked``, through the append session).
"""

from __future__ import annotations

import logging

from ledgerq.core.opening import DEFAULT_READER
from ledgerq.core.queue_state import QueueState
from ledgerq.core.reader import ReaderCore
from ledgerq.segment.files import StorageError

__all__ = ["Retention"]

logger = logging.getLogger("ledgerq")

_NS = 1_000_000_000


class Retention(QueueState):
    """The retention half of :class:`~ledgerq.core.queue.QueueCore` (a mixin: its
    methods take the queue as ``self``)."""

    def _retire_after_settle(self, core: ReaderCore) -> None:
        """A settle of ``core``'s may have finished the oldest segment: apply retention
        (shared mode: after publishing the head, which the others' retention reads)."""
        core.publish_head()
        self._retire_consumed()

    def _retire_consumed(self) -> None:
        """Apply retention after a call whose effect has happened (lock held); never raises.

        Deleting a segment is housekeeping: a deletion the disk refuses is logged, and
        the segment, still listed, is tried again at the next settle or rotation.
        """
        segments = len(self._manager.segments)
        if segments < 2:
            return
        try:
            self._retire()
        except StorageError as exc:
            logger.warning("ledgerq: retention could not delete a segment (%s)", exc)
        if len(self._manager.segments) < segments and not self._disk_reserve.is_held:
            self._restore_disk_reserve()  # the space of a deleted segment refills it first

    def _retire(self) -> None:
        """Apply retention (lock held): here, or under the append lock in shared mode."""
        if self._appends is None:
            self._apply_retention()
        else:
            self._appends.retire_consumed()

    def _apply_retention(self) -> None:
        """Apply retention (lock held); cheap when there is nothing to delete.

        A sealed segment every reader has consumed is deleted at once, or - with
        ``retention_max_age`` - once its newest message is older than that.
        Unconsumed data is never deleted by age; only ``retention_max_bytes`` drops
        the oldest segments even if unconsumed (:meth:`_drop_oldest_segment`).  The
        active segment is never deleted.
        """
        if len(self._manager.segments) < 2:
            return
        self._delete_consumed(min(r._core.head for r in self._readers.values()))
        self._drop_oldest_while_over()

    def _delete_consumed(self, head: int) -> bool:
        """Delete the sealed segments wholly below ``head`` (every reader's, or a lower
        bound of it), with ``retention_max_age`` only those old enough; whether any
        went.  In shared mode the append lock is held: see SharedQueueCore._retire_locked."""
        manager = self._manager
        segments = manager.segments
        if len(segments) < 2 or segments[0].last_id >= head:
            return False
        max_age = self.options.retention_max_age
        cutoff = None if max_age is None else self._clock.now_ns() - int(max_age * _NS)
        deleted = False
        while len(segments) > 1 and segments[0].last_id < head:
            if cutoff is not None and segments[0].last_timestamp >= cutoff:
                break
            if not deleted and self._appends is not None:
                self._appends.deleting()
            manager.delete_first()
            deleted = True
        return deleted

    def _drop_oldest_while_over(self) -> None:
        """``retention_max_bytes``: drop the oldest segments while the log is larger (in
        shared mode every reader's step and the append lock held, each drop published)."""
        max_bytes = self.options.retention_max_bytes
        if max_bytes is None:
            return
        manager = self._manager
        while len(manager.segments) > 1 and manager.disk_bytes > max_bytes:
            if not self._drop_oldest_segment(max_bytes):
                break
            if self._appends is not None:
                self._appends.publish_log()

    def _drop_oldest_segment(self, max_bytes: int) -> bool:
        """Delete the oldest segment for ``retention_max_bytes`` (lock held); False if
        it must wait.

        Every reader settles what it had not settled there - unread, given back or
        leased - as dropped (``ReaderCore.drop_segment``; ``stats().dropped`` is the
        default reader's count, so that enqueued = acked + dead-lettered + expired +
        dropped + pending + in flight).  Each reader that lost messages is
        checkpointed before the bytes go: a crash in between finds them settled, not
        lost uncounted.  If a checkpoint fails (a full disk), the drop stands in memory
        and the segment stays until a later pass finds it consumed.
        """
        seg = self._manager.segments[0]
        if seg.count:
            for name, core in self._cores.items():
                lost, leased = core.drop_segment(seg.first_id, seg.last_id)
                if not lost:
                    continue
                if name == DEFAULT_READER:
                    self._tally.dropped += lost
                logger.warning(
                    "ledgerq: retention_max_bytes=%d deleted segment %d-%d of %s with %d "
                    "messages reader %r had not acked (%d of them leased: their ack or nack "
                    "now raises UnknownMessageError); counted as dropped",
                    max_bytes,
                    seg.first_id,
                    seg.last_id,
                    self.path,
                    lost,
                    name,
                    leased,
                )
                try:
                    core.checkpoint()
                except StorageError as exc:
                    logger.warning("ledgerq: the segment stays for now: %s", exc)
                    return False
        self._manager.delete_first()
        self._waits.room_made()
        return True

    def compact(self) -> None:
        """Apply retention now (delete segments that every reader has consumed), and
        rewrite every reader's journal as a checkpoint."""
        with self._lock:
            self._ensure_open()
            appends = self._appends
            if appends is not None:
                appends.look()  # the readers other handles created count too
            cores = [reader._core for reader in self._readers.values()]
            for core in cores:
                core.publish_head()  # (shared mode: what the retention below reads)
            # Retention first: on a full disk the space it frees lets the checkpoints in.
            self._retire()
            self._restore_disk_reserve()
            for core in cores:
                core.checkpoint()
