"""Priorities: HIGH before MEDIUM before LOW, oldest first inside a level, with
starvation promotion.

Messages are still written in arrival order; only the delivery order changes.
The index holds every pending message the reader's cursor has passed, in three
per-level columns of 64-bit integers (id, enqueue time, offset in its segment):
24 bytes a message, no Python object per message.  Inside a level the columns
are in id order, so each level's oldest message is at its front.  A message
given back (nack, lost lease) goes to a small per-level heap instead.

Starvation: a message is promoted one level for every ``starvation_after``
seconds it has waited, so the candidate of each level is its oldest message and
choosing among three candidates is enough: the highest effective level wins,
then the older message.

The index is memory only: on open it is rebuilt from the reader's head onwards,
which is the unconsumed part of the log.
"""

from __future__ import annotations

import bisect
import heapq
from array import array
from typing import TYPE_CHECKING

from ledgerq._options import Options
from ledgerq.core.feature import Feature, Selector
from ledgerq.format.entry import Entry
from ledgerq.format.errors import DecodeError

if TYPE_CHECKING:
    from ledgerq.core.reader import ReaderCore

__all__ = ["PriorityFeature", "PrioritySelector"]

_LEVELS = 3
_HIGH = _LEVELS - 1
_NS = 1_000_000_000
_COMPACT_AT = 4096


class _Level:
    """One priority level: columns of pending messages plus returned entries."""

    __slots__ = ("discarded", "head", "ids", "offsets", "returned", "returned_ids", "stamps")

    def __init__(self) -> None:
        self.ids = array("q")
        self.stamps = array("q")
        self.offsets = array("q")
        self.head = 0
        self.returned: list[tuple[int, int, Entry]] = []  # heap of (id, timestamp, entry)
        self.returned_ids: set[int] = set()  # the ids in ``returned``
        self.discarded: set[int] = set()

    def _drop_discarded_front(self) -> None:
        while self.head < len(self.ids) and self.ids[self.head] in self.discarded:
            self.discarded.discard(self.ids[self.head])
            self.head += 1
        while self.returned and self.returned[0][0] in self.discarded:
            message_id = heapq.heappop(self.returned)[0]
            self.discarded.discard(message_id)
            self.returned_ids.discard(message_id)

    def front(self) -> tuple[int, int] | None:
        """(id, timestamp) of this level's oldest message, if any."""
        self._drop_discarded_front()
        best: tuple[int, int] | None = None
        if self.head < len(self.ids):
            best = (self.ids[self.head], self.stamps[self.head])
        if self.returned and (best is None or self.returned[0][0] < best[0]):
            best = (self.returned[0][0], self.returned[0][1])
        return best

    def pop(self, reader: ReaderCore) -> Entry | None:
        """Remove the front message and return its entry (read back from the log)."""
        self._drop_discarded_front()
        if self.returned and (
            self.head >= len(self.ids) or self.returned[0][0] < self.ids[self.head]
        ):
            entry = heapq.heappop(self.returned)[2]
            self.returned_ids.discard(entry.id)
            return entry
        if self.head >= len(self.ids):
            return None
        message_id, offset = self.ids[self.head], self.offsets[self.head]
        self.head += 1
        if self.head >= _COMPACT_AT and self.head * 2 >= len(self.ids):
            del self.ids[: self.head]
            del self.stamps[: self.head]
            del self.offsets[: self.head]
            self.head = 0
        try:
            return reader.read_entry_at(message_id, offset)
        except (DecodeError, OSError, IndexError):
            return None  # its segment was dropped (retention_max_bytes) or damaged

    def holds(self, message_id: int) -> bool:
        """Whether ``message_id`` is in this level's column (ahead of its head) or among
        its returned entries - discarded or not."""
        ids = self.ids
        i = bisect.bisect_left(ids, message_id, lo=self.head)
        if i < len(ids) and ids[i] == message_id:
            return True
        return message_id in self.returned_ids

    def size(self) -> int:
        return len(self.ids) - self.head + len(self.returned) - len(self.discarded)


class PrioritySelector:
    """The delivery order of one reader with priorities on (see the module docstring)."""

    def __init__(self, reader: ReaderCore, starvation_ns: int | None):
        self._reader = reader
        self._starvation_ns = starvation_ns
        self._levels = [_Level() for _ in range(_LEVELS)]

    def _pull(self) -> None:
        """Index every entry the cursor has not read yet."""
        reader = self._reader
        levels = self._levels
        while True:
            entry = reader.read_next()
            if entry is None:
                return
            level = levels[entry.priority]
            level.ids.append(entry.id)
            level.stamps.append(entry.timestamp)
            level.offsets.append(reader.last_offset)

    def _effective(self, level: int, stamp: int, now_ns: int) -> int:
        starvation = self._starvation_ns
        if starvation is None or level == _HIGH:
            return level
        return min(_HIGH, level + max(0, now_ns - stamp) // starvation)

    def _choose(self, now_ns: int) -> int | None:
        best_level = None
        best_key: tuple[int, int, int] | None = None
        for number, level in enumerate(self._levels):
            front = level.front()
            if front is None:
                continue
            message_id, stamp = front
            # Highest effective level first, then the oldest, then the smallest id.
            key = (-self._effective(number, stamp, now_ns), stamp, message_id)
            if best_key is None or key < best_key:
                best_key, best_level = key, number
        return best_level

    def take(self, now_ns: int) -> Entry | None:
        self._pull()
        while True:
            number = self._choose(now_ns)
            if number is None:
                return None
            entry = self._levels[number].pop(self._reader)
            if entry is not None:
                return entry

    def give_back(self, entry: Entry) -> None:
        level = self._levels[entry.priority]
        # A discarded id still in its place (another handle's lease of it ended) is live
        # again there; one already available (given back twice: a lease reclaimed while
        # another handle's delay entry for it fell due) stays once, as in FifoSelector.
        level.discarded.discard(entry.id)
        if level.holds(entry.id):
            return
        heapq.heappush(level.returned, (entry.id, entry.timestamp, entry))
        level.returned_ids.add(entry.id)

    def discard(self, message_id: int) -> bool:
        # Without reading the log further: a shared handle discards while it applies
        # other handles' records, and decides per id, by its cursor, between this and
        # passing over an id not read yet.  A read here would move the cursor past ids
        # the records after this one lease, settle or give back - leased twice, acked
        # and delivered again, a nacked one never again (issue 25 item 7).  An id not
        # read yet is not held: the cursor's caller deals with it.
        level = self._holder(message_id, pull=False)
        if level is None:
            return False
        level.discarded.add(message_id)
        return True

    def holds(self, message_id: int) -> bool:
        return self._holder(message_id) is not None

    def _holder(self, message_id: int, *, pull: bool = True) -> _Level | None:
        """The level holding ``message_id`` available, if any (``pull``: after reading
        what the cursor has not read yet)."""
        if pull:
            self._pull()
        for level in self._levels:
            if message_id not in level.discarded and level.holds(message_id):
                return level
        return None

    def drop_through(self, last_id: int) -> list[int]:
        # Columns are in id order: the dropped ids are a prefix of each level's.
        dropped: list[int] = []
        for level in self._levels:
            end = bisect.bisect_right(level.ids, last_id, lo=level.head)
            gone = [*level.ids[level.head : end]]
            level.head = end
            kept = [item for item in level.returned if item[0] > last_id]
            if len(kept) != len(level.returned):
                gone.extend(item[0] for item in level.returned if item[0] <= last_id)
                heapq.heapify(kept)
                level.returned = kept
                level.returned_ids = {item[0] for item in kept}
            for message_id in gone:
                if message_id in level.discarded:
                    level.discarded.discard(message_id)  # settled already: not held
                else:
                    dropped.append(message_id)
        return dropped

    def held(self) -> int:
        return sum(level.size() for level in self._levels)

    # Every entry of the log is read into the columns at once: a delayed one waits there,
    # not parked, until a take reaches it - the reader's stats count it from these.

    def unexamined_from(self) -> int | None:
        fronts = [level.ids[level.head] for level in self._levels if level.head < len(level.ids)]
        return min(fronts) if fronts else None

    def holds_unexamined(self, message_id: int) -> bool:
        for level in self._levels:
            ids = level.ids
            i = bisect.bisect_left(ids, message_id, lo=level.head)
            if i < len(ids) and ids[i] == message_id:
                return message_id not in level.discarded
        return False

    def min_id(self) -> int | None:
        fronts = [level.front() for level in self._levels]
        ids = [f[0] for f in fronts if f is not None]
        return min(ids) if ids else None

    def peek(self, n: int, now_ns: int) -> list[Entry]:
        self._pull()
        saved = [
            (lv.head, list(lv.returned), set(lv.returned_ids), set(lv.discarded))
            for lv in self._levels
        ]
        found: list[Entry] = []
        try:
            while len(found) < n:
                number = self._choose(now_ns)
                if number is None:
                    break
                level = self._levels[number]
                level._drop_discarded_front()
                if level.returned and (
                    level.head >= len(level.ids) or level.returned[0][0] < level.ids[level.head]
                ):
                    found.append(heapq.heappop(level.returned)[2])
                    continue
                message_id, offset = level.ids[level.head], level.offsets[level.head]
                level.head += 1
                try:
                    found.append(self._reader.read_entry_at(message_id, offset))
                except (DecodeError, OSError, IndexError):
                    continue
        finally:
            for level, (head, returned, returned_ids, discarded) in zip(
                self._levels, saved, strict=True
            ):
                level.head, level.returned, level.discarded = head, returned, discarded
                level.returned_ids = returned_ids
        return found

    def oldest_timestamp(self) -> int | None:
        self._pull()
        stamps = [f[1] for f in (lv.front() for lv in self._levels) if f is not None]
        return min(stamps) if stamps else None


class PriorityFeature(Feature):
    """Turns on the priority order for every reader of the queue."""

    name = "priorities"

    def __init__(self, options: Options) -> None:
        after = options.starvation_after
        self._starvation_ns = None if after is None else max(1, int(after * _NS))

    def selector(self, reader: ReaderCore) -> Selector | None:
        return PrioritySelector(reader, self._starvation_ns)
