"""The delay index: ids waiting for a not-before time, ordered by (due time, id).

A reader parks here the entries it read that may not be delivered yet (``enqueue(...,
delay=)``) and takes back the ids whose time has come.  It keeps ids and due times
only, never the entries (the reader reads a due entry back from the log): a queue can
hold millions of delayed messages, and each costs 16 bytes here - two machine words in
``array`` blocks - instead of the hundreds an ``Entry`` and a tuple would.

The blocks are sorted runs, each at most ``_MAX_BLOCK`` long, every key of a block
below every key of the next (the structure of ``sortedcontainers.SortedList``, with
typed arrays instead of lists of int objects): an insert bisects the blocks' last keys,
then the block (O(log n)), and moves at most one block's tail (a ``memmove``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable

__all__ = ["NEVER_NS", "DelayIndex"]

NEVER_NS = 1 << 63  # later than any due time (an i64 nanosecond field)
_MAX_BLOCK = 2048


class DelayIndex:
    """Ids by due time (ns); all operations but :meth:`discard` are O(log n)."""

    __slots__ = ("_count", "_dues", "_ids", "_last_keys", "_min_id")

    def __init__(self) -> None:
        self._dues: list[array[int]] = []  # per block, ascending (ties: by id)
        self._ids: list[array[int]] = []  # per block, beside its due times
        self._last_keys: list[tuple[int, int]] = []  # each block's last (due, id)
        self._count = 0
        self._min_id: int | None = None  # cached smallest id; None: to compute

    def __len__(self) -> int:
        return self._count

    @property
    def next_due_ns(self) -> int:
        """The earliest due time, or :data:`NEVER_NS` when empty."""
        return self._dues[0][0] if self._count else NEVER_NS

    def add(self, due_ns: int, message_id: int) -> None:
        """Park ``message_id`` until ``due_ns``."""
        key = (due_ns, message_id)
        if not self._count:
            self._dues = [array("q", (due_ns,))]
            self._ids = [array("Q", (message_id,))]
            self._last_keys = [key]
            self._count = 1
            self._min_id = message_id
            return
        last_keys = self._last_keys
        if key > last_keys[-1]:
            # After every key: the common case (one delay for all, enqueued in order).
            b = len(last_keys) - 1
            dues = self._dues[b]
            ids = self._ids[b]
            dues.append(due_ns)
            ids.append(message_id)
            last_keys[b] = key
        else:
            b = bisect_left(last_keys, key)
            dues = self._dues[b]
            ids = self._ids[b]
            lo = bisect_left(dues, due_ns)
            hi = bisect_right(dues, due_ns, lo)
            at = bisect_left(ids, message_id, lo, hi) if hi > lo else lo
            dues.insert(at, due_ns)
            ids.insert(at, message_id)
            last_keys[b] = (dues[-1], ids[-1])
        self._count += 1
        if self._min_id is not None and message_id < self._min_id:
            self._min_id = message_id
        if len(dues) > _MAX_BLOCK:
            half = len(dues) // 2
            self._dues[b + 1 : b + 1] = [dues[half:]]
            self._ids[b + 1 : b + 1] = [ids[half:]]
            del dues[half:]
            del ids[half:]
            self._last_keys[b : b + 1] = [(dues[-1], ids[-1]), self._last_keys[b]]

    def pop_due(self, now_ns: int) -> list[int]:
        """Remove and return the ids due at ``now_ns`` (in due order, ties by id)."""
        found: list[int] = []
        while self._count and self._dues[0][0] <= now_ns:
            dues = self._dues[0]
            ids = self._ids[0]
            k = bisect_right(dues, now_ns)
            found.extend(ids[:k])
            if k == len(dues):
                del self._dues[0], self._ids[0], self._last_keys[0]
            else:
                del dues[:k]
                del ids[:k]
            self._count -= k
        if found and self._min_id is not None and self._min_id in found:
            self._min_id = None
        return found

    def min_id(self) -> int | None:
        """The smallest id parked, if any (cached; a scan after the smallest left)."""
        if not self._count:
            return None
        if self._min_id is None:
            self._min_id = min(min(ids) for ids in self._ids)
        return self._min_id

    def discard(self, message_id: int) -> bool:
        """Forget ``message_id`` (settled elsewhere); True if it was parked.  O(n)."""
        for b, ids in enumerate(self._ids):
            if message_id in ids:
                at = ids.index(message_id)
                del ids[at]
                del self._dues[b][at]
                self._count -= 1
                self._reshape(b)
                if message_id == self._min_id:
                    self._min_id = None
                return True
        return False

    def drop_through(self, last_id: int) -> int:
        """Forget every id <= ``last_id`` (retention deleted its segment); return how many."""
        return self._remove_where(lambda message_id: message_id <= last_id)

    def ids(self) -> set[int]:
        """Every id parked (a copy).  O(n)."""
        return {message_id for ids in self._ids for message_id in ids}

    def discard_all(self, gone: set[int]) -> int:
        """Forget every id of ``gone`` that is parked; return how many.  O(n), once."""
        return self._remove_where(gone.__contains__)

    def _remove_where(self, doomed: Callable[[int], bool]) -> int:
        removed = 0
        for b in range(len(self._ids) - 1, -1, -1):
            ids, dues = self._ids[b], self._dues[b]
            keep = [i for i, message_id in enumerate(ids) if not doomed(message_id)]
            if len(keep) == len(ids):
                continue
            removed += len(ids) - len(keep)
            self._ids[b] = array("Q", (ids[i] for i in keep))
            self._dues[b] = array("q", (dues[i] for i in keep))
            self._reshape(b)
        self._count -= removed
        if removed:
            self._min_id = None
        return removed

    def __contains__(self, message_id: int) -> bool:
        return any(message_id in ids for ids in self._ids)

    def clear(self) -> None:
        """Forget every id."""
        self._dues, self._ids, self._last_keys = [], [], []
        self._count = 0
        self._min_id = None

    def _reshape(self, b: int) -> None:
        """Block ``b`` shrank: drop it if empty, else refresh its last key."""
        if not self._ids[b]:
            del self._dues[b], self._ids[b], self._last_keys[b]
        else:
            self._last_keys[b] = (self._dues[b][-1], self._ids[b][-1])

    def _check(self) -> None:
        """Assert the invariants (tests)."""
        keys = [
            (d, i)
            for dues, ids in zip(self._dues, self._ids, strict=True)
            for d, i in zip(dues, ids, strict=True)
        ]
        assert keys == sorted(keys)
        assert len(keys) == self._count
        assert self._last_keys == [
            (dues[-1], ids[-1]) for dues, ids in zip(self._dues, self._ids, strict=True)
        ]
        if self._min_id is not None:
            assert self._min_id == min(i for _, i in keys)
