"""The delivery times the console shows: delayed messages, read without the lock.

A message is *delayed* while its not-before time is ahead: the time it was enqueued
with (``enqueue(..., delay=)``, stored in its entry) until its first delivery, or the
retry delay of a failed delivery (a NOT_BEFORE record of the reader's journal, which
``ReaderState.not_before`` already folds).  The journal half costs nothing extra; the
entry half needs the entries, so a :class:`ScheduleTail` follows the log from the
lowest reader head as the owner appends to it - each refresh reads only what was
appended since, at most :data:`ENTRIES_PER_REFRESH` entries (a large backlog is
caught up over a few refreshes instead of in one slow request) - and keeps only the
entries whose not-before time is still ahead.  Memory: one dict item per message
delayed now; an entry whose time has passed is forgotten, since an entry's delay only
holds back its first delivery.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from ledgerq import CorruptionError
from ledgerq.segment.readonly import EntryFlags, LogTail, ReaderState

__all__ = ["ENTRIES_PER_REFRESH", "ScheduleTail"]

# Entries one refresh reads at most (a fraction of a second): bounds a refresh whatever
# the backlog.
ENTRIES_PER_REFRESH = 100_000

_HAS_DELIVER_AT = EntryFlags.HAS_DELIVER_AT


class ScheduleTail:
    """The entries of one queue whose not-before time was ahead when read.

    Not thread-safe: the owner (``QueueFiles``) serialises its calls.
    """

    __slots__ = ("_deliver_at", "_tail", "caught_up")

    def __init__(self) -> None:
        self._tail: LogTail | None = None
        self._deliver_at: dict[int, int] = {}  # id -> not before (ns), only those ahead
        self.caught_up = False  # read every entry on disk at the last refresh

    def refresh(self, queue_dir: str, from_id: int, now_ns: int) -> None:
        """Read what was appended since the last refresh (from ``from_id`` the first
        time, or after a rotation the tail could not follow)."""
        tail = self._tail
        if tail is None:
            tail = self._tail = LogTail(queue_dir, from_id)
        deliver_at = self._deliver_at
        self.caught_up = False
        try:
            for _ in range(ENTRIES_PER_REFRESH):
                entry = tail.next_entry()
                if entry is None:
                    self.caught_up = True
                    break
                if entry.flags & _HAS_DELIVER_AT and (entry.deliver_at or 0) > now_ns:
                    deliver_at[entry.id] = entry.deliver_at or 0
        except (CorruptionError, FileNotFoundError):
            # Retention deleted what the tail was about to read, or the files were
            # replaced: start again from the heads at the next refresh.
            self.reset()
        else:
            tail.close()  # keeps its place; holds no file open between refreshes
        for message_id in [i for i, due in deliver_at.items() if due <= now_ns]:
            del deliver_at[message_id]

    def reset(self) -> None:
        """Forget everything read (the next refresh starts again)."""
        if self._tail is not None:
            self._tail.close()
        self._tail = None
        self._deliver_at.clear()
        self.caught_up = False

    def not_before(self, message_id: int) -> int | None:
        """The entry's not-before time (ns) if it was ahead when last seen."""
        return self._deliver_at.get(message_id)

    def ahead(self, now_ns: int) -> dict[int, int]:
        """Every entry's not-before time that is ahead of ``now_ns``: a copy, for one
        listing to look its messages up in."""
        return {i: due for i, due in self._deliver_at.items() if due > now_ns}

    def delayed(self, state: ReaderState, leased: Set[int], now_ns: int) -> int:
        """Messages of the reader ``state`` held back at ``now_ns``: unfinished, not
        leased, with a not-before time ahead (a retry delay first, else the entry's)."""
        return count_delayed(self._deliver_at, state, leased, now_ns)


def count_delayed(
    deliver_at: Mapping[int, int],
    state: ReaderState,
    leased: Set[int],
    now_ns: int,
) -> int:
    """See :meth:`ScheduleTail.delayed`."""
    head, done = state.durable_head(), state.done
    retries = state.not_before

    def waiting(message_id: int) -> bool:
        return message_id >= head and message_id not in done and message_id not in leased

    count = sum(1 for i, due in retries.items() if due > now_ns and waiting(i))
    # A message that was delivered once waits for its retry delay only (above): its
    # entry's delay held back the first delivery and has passed.
    count += sum(
        1
        for i, due in deliver_at.items()
        if due > now_ns and i not in retries and i not in state.deliveries and waiting(i)
    )
    return count
