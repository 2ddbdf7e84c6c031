"""Planning a read: which segments to read, and what each task keeps.

A :class:`Pushed` holds the filters Spark pushed down (id and timestamp ranges, id
sets, queue names); :func:`plan_tasks` turns it into one :class:`SegmentTask` per
segment that can hold a wanted row.  Segments are skipped by their names (ids are
consecutive inside a segment and increase between segments, so a segment's ids lie in
``[first_id, next_first_id)``) and, for time, by the timestamps of their first and
last entries from the sparse index.  Inside a segment, tasks start at the sparse-index
point that no wanted row precedes (see ``_scan``).  No pyspark here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ledgerq._errors import ConfigError
from ledgerq.segment.encryption import sealer_for, stored_block
from ledgerq.segment.readonly import QueueDir, find_queues
from ledgerq.spark._layout import (
    ReaderSnapshot,
    SegmentInfo,
    list_segments,
    read_reader_state,
    timestamps_non_decreasing,
)
from ledgerq.spark._task import SegmentTask

__all__ = [
    "Pushed",
    "ReadOptions",
    "ns_to_us",
    "plan_queue",
    "plan_tasks",
    "task_from_json",
    "task_to_json",
]

logger = logging.getLogger("ledgerq")


def ns_to_us(ns: int) -> int:
    """Nanoseconds to the microseconds Spark sees (truncated toward zero, as Arrow casts)."""
    return int(ns / 1000) if ns < 0 else ns // 1000


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The read options, parsed (see ``docs/spark.md``)."""

    paths: tuple[str, ...]
    reader: str | None = None
    include_dlq: bool = False
    failfast: bool = False
    arrow: bool = True
    pushdown: bool = True
    starting_offsets: str = "earliest"
    max_records_per_trigger: int | None = None
    columns: tuple[str, ...] | None = None  # option columns: the schema's, in this order
    # encryption_key_hex, decoded: the key of the encrypted queues read (never in repr).
    encryption_key: bytes | None = field(default=None, repr=False)


@dataclass(slots=True)
class Pushed:
    """Filters pushed down by Spark, as inclusive bounds (timestamps in microseconds)."""

    id_lo: int = 1
    id_hi: int | None = None
    ids: frozenset[int] | None = None
    ts_lo: int | None = None
    ts_hi: int | None = None
    queues: frozenset[str] | None = None
    taken: list[str] = field(default_factory=list)  # what was pushed, for the plan log

    @property
    def is_empty(self) -> bool:
        """Whether no row can match (contradictory bounds)."""
        return (
            (self.id_hi is not None and self.id_lo > self.id_hi)
            or (self.ids is not None and not self.ids)
            or (self.ts_lo is not None and self.ts_hi is not None and self.ts_lo > self.ts_hi)
            or (self.queues is not None and not self.queues)
        )

    def ids_in(self, lo: int, hi: int | None) -> bool:
        """Whether a wanted id can lie in ``[lo, hi]`` (``hi`` None: unbounded)."""
        if self.id_hi is not None and self.id_hi < lo:
            return False
        if hi is not None and self.id_lo > hi:
            return False
        if self.ids is not None:
            return any(i >= lo and (hi is None or i <= hi) for i in self.ids)
        return True

    def times_in(self, lo_ns: int | None, hi_ns: int | None) -> bool:
        """Whether a wanted timestamp can lie in ``[lo_ns, hi_ns]`` (None: unknown)."""
        if self.ts_hi is not None and lo_ns is not None and ns_to_us(lo_ns) > self.ts_hi:
            return False
        return not (self.ts_lo is not None and hi_ns is not None and ns_to_us(hi_ns) < self.ts_lo)


def encryption_key_option(options: Mapping[str, str]) -> bytes | None:
    """The key of option ``encryption_key_hex`` (64 hex digits), or None without it.

    Raises :class:`ConfigError` without showing the value.
    """
    raw = options.get("encryption_key_hex")
    if raw is None or raw == "":
        return None
    text = str(raw).strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ConfigError(
            f"option encryption_key_hex must be 64 hexadecimal digits (a 32-byte key); "
            f"got {len(text)} characters"
        )
    return key


def plan_tasks(options: ReadOptions, pushed: Pushed) -> list[SegmentTask]:
    """One task per segment that can hold a wanted row, over every loaded path."""
    if pushed.is_empty:
        return []
    tasks: list[SegmentTask] = []
    considered = 0
    for path in options.paths:
        for queue in find_queues(path, include_dlq=options.include_dlq):
            if pushed.queues is not None and queue.name not in pushed.queues:
                continue
            segments = list_segments(queue.path)
            considered += len(segments)
            tasks.extend(plan_queue(queue, segments, options, pushed, pushed.id_lo, pushed.id_hi))
    logger.info(
        "ledgerq: reading %d of %d segments under %s (pushed down: %s)",
        len(tasks),
        considered,
        ", ".join(options.paths),
        "; ".join(pushed.taken) or "nothing",
    )
    return tasks


def plan_queue(
    queue: QueueDir,
    segments: list[SegmentInfo],
    options: ReadOptions,
    pushed: Pushed,
    id_lo: int,
    id_hi: int | None,
    *,
    snapshot: bool = True,
) -> list[SegmentTask]:
    """The tasks of one queue for ids in ``[id_lo, id_hi]`` and the pushed filters.

    ``snapshot``: bound the newest segment to its size now, so every task of a batch
    query reads the same moment (a stream bounds it by ids instead).
    """
    # An encrypted queue needs the key, checked here on the driver (ConfigError) before
    # any task runs; a plain queue among them reads as it is, the key unused.
    block = stored_block(queue.path) or {}
    if block:
        sealer_for(block, options.encryption_key, queue.path)
    key = options.encryption_key if block else None
    lo = max(id_lo, pushed.id_lo)
    hi = (
        id_hi
        if pushed.id_hi is None
        else (pushed.id_hi if id_hi is None else min(id_hi, pushed.id_hi))
    )
    by_time = (pushed.ts_lo is not None or pushed.ts_hi is not None) and timestamps_non_decreasing(
        segments
    )
    state: ReaderSnapshot | None = None
    if options.reader:
        state = read_reader_state(queue.path, options.reader)
    tasks = []
    for i, seg in enumerate(segments):
        seg_hi = None if seg.next_first_id is None else seg.next_first_id - 1
        if hi is not None and hi < seg.first_id:
            break
        if seg_hi is not None and lo > seg_hi:
            continue
        if not pushed.ids_in(seg.first_id, seg_hi):
            continue
        if by_time:
            # With a clock that did not step back, a segment's entries lie between its
            # first entry's time and its last entry's (or the next segment's first).
            upper = seg.last_ts
            if upper is None and i + 1 < len(segments):
                upper = segments[i + 1].first_ts
            if not pushed.times_in(seg.first_ts, upper):
                continue
        tasks.append(
            SegmentTask(
                queue=queue.name,
                path=queue.path,
                first_id=seg.first_id,
                next_first_id=seg.next_first_id,
                size_limit=seg.size if seg.is_newest and snapshot else None,
                live_tail=seg.is_newest,
                id_lo=lo,
                id_hi=hi,
                ids=pushed.ids,
                ts_lo=pushed.ts_lo,
                ts_hi=pushed.ts_hi,
                seek_by_time=by_time,
                state=None if state is None else state.restricted(seg.first_id, seg.next_first_id),
                failfast=options.failfast,
                name_id=seg.name_id,
                columns=options.columns,
                encryption_key=key,
            )
        )
    return tasks


# ---------------------------------------------------------------------- the plan as text

# A batch read's partitions carry their task as JSON text rather than as a pickled
# SegmentTask: the JVM reader (ledgerq/spark/jvm) runs the tasks this planner made, and
# the Python reader the same ones, so the plan is made once, in one place, for both.


# The fields a task's JSON holds as they are, by name, in SegmentTask's order; the others
# (sets, the reader state, the columns, the key) are converted on the way in and out.
_CONVERTED = frozenset({"ids", "state", "columns", "encryption_key"})
_AS_THEY_ARE = tuple(f.name for f in fields(SegmentTask) if f.name not in _CONVERTED)


def task_to_json(task: SegmentTask) -> str:
    """``task`` as the JSON text a partition carries (sets as sorted lists, key as hex)."""
    state = task.state
    raw: dict[str, Any] = {f.name: getattr(task, f.name) for f in fields(SegmentTask)}
    del raw["encryption_key"]  # (bytes: JSON carries it as hex, below)
    raw["ids"] = None if task.ids is None else sorted(task.ids)
    raw["state"] = (
        None
        if state is None
        else {"head": state.head, "done": sorted(state.done), "leased": sorted(state.leased)}
    )
    raw["columns"] = None if task.columns is None else list(task.columns)
    raw["encryption_key_hex"] = None if task.encryption_key is None else task.encryption_key.hex()
    # The JVM reader's: the queue's identity, which salts its entry key and
    # authenticates every sealed entry (the key was checked against it already).
    raw["queue_id_hex"] = (
        None if task.encryption_key is None else (stored_block(task.path) or {}).get("queue_id")
    )
    return json.dumps(raw, separators=(",", ":"))


def task_from_json(text: str) -> SegmentTask:
    """The task :func:`task_to_json` wrote."""
    raw = json.loads(text)
    state = raw["state"]
    ids = raw["ids"]
    key = raw["encryption_key_hex"]
    return SegmentTask(
        **{name: raw[name] for name in _AS_THEY_ARE},
        ids=None if ids is None else frozenset(ids),
        state=None
        if state is None
        else ReaderSnapshot(state["head"], frozenset(state["done"]), frozenset(state["leased"])),
        columns=None if raw["columns"] is None else tuple(raw["columns"]),
        encryption_key=None if key is None else bytes.fromhex(key),
    )
