"""Reading one segment file into Arrow record batches (or tuples) for a Spark task.

The hot path is written for the common case - a run of valid entries without optional
fields - and hands everything else to the code the rest of ledgerq reads with:

1. **Plain runs, vectorised.**  A chunk of the file (4 MiB, one ``pread``) is cut into
   entries by stepping from length field to length field (a Python loop, or none at all
   for a run of same-size entries, found column-wise); the entries become a
   ``BinaryArray`` over the file bytes (offsets only, no copy), from which ids,
   timestamps and payloads are sliced by Arrow kernels.  The checksums of the whole run
   are checked with one call (``format.checksum.count_valid_records``, which knows the
   checksum's algebra).  A run is of one entry format (the high nibble of the type
   byte: CRC-32C in format 2, CRC-32 in format 1), checked with that format's CRC: an
   entry of the other format ends the run and starts the next one, so segments of
   either format, and one a newer ledgerq appended to, stay on this path.  The first
   entry whose checksum does not match, or whose id does not increase, ends the run.
2. **Entries with optional fields** (TTL, priority, headers, compression) in a run
   whose CRCs check out are decoded one by one with :func:`decode_entry`.
3. **Anything else** - a bad CRC, a bad length, ids out of order, a torn or damaged
   tail - switches the rest of the segment to ledgerq's own resynchronising scanner
   (``TailScanner``: an ``EntryScanner`` that, on the live tail, stops at an append in
   flight instead of searching inside it): corrupt regions are skipped, logged through the
   ``ledgerq`` logger and counted, or raise :class:`CorruptionError` in FAILFAST mode.
   What a task returns is exactly what that scanner alone would (a test flips every
   bit of a segment and compares).

Segments are read with ``pread`` and never locked, so a live queue can be read beside
its owner: sealed segments are final, and the newest one is read up to its last
complete entry (an append in flight is not an error).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ledgerq.spark._layout import ReaderSnapshot
from ledgerq.spark._runs import CRC_SIZE, HEADER_SIZE, ID_AT, TS_AT, entry_field, slice_entries
from ledgerq.spark._task import (
    ACKED,
    ARROW_SCHEMA,
    ARROW_SCHEMA_WITH_STATE,
    COLUMNS,
    HEADERS_MAP,
    LEASED,
    PENDING,
    TIMESTAMP_US,
    ScanStats,
    SegmentTask,
)
from ledgerq.spark._tiers import Decoded, Plain, SegmentScan

__all__ = [
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_WITH_STATE",
    "COLUMNS",
    "ScanStats",
    "SegmentTask",
    "scan_segment",
]

logger = logging.getLogger("ledgerq")

_TS_NS = pa.timestamp("ns", tz="UTC")
_ID_TS = struct.Struct("<Qq")
_unpack_id_ts = _ID_TS.unpack_from
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EMPTY_STRINGS = pa.array([], pa.string())


# ---------------------------------------------------------------------- entry point


def scan_segment(
    task: SegmentTask, *, arrow: bool = True, stats: ScanStats | None = None
) -> Iterator[pa.RecordBatch] | Iterator[tuple[Any, ...]]:
    """Yield the rows of ``task`` as Arrow record batches (``arrow``) or as tuples."""
    if arrow:
        return _ArrowSink(task, stats or ScanStats()).run()
    return _TupleSink(task, stats or ScanStats()).run()


# ---------------------------------------------------------------------- row filters


class _Filter:
    """The exact row filter a task applies (what was pushed down), id and time."""

    def __init__(self, task: SegmentTask) -> None:
        self.id_lo = task.id_lo if task.id_lo > 1 else None
        self.id_hi = task.id_hi
        self.ids = task.ids
        self.ts_lo = task.ts_lo
        self.ts_hi = task.ts_hi
        self.active = any(
            v is not None for v in (self.id_lo, self.id_hi, self.ids, self.ts_lo, self.ts_hi)
        )

    def mask(self, ids: pa.Array, ts_us: pa.Array) -> pa.Array | None:
        """A boolean mask of the rows to keep, or None when every row is kept."""
        if not self.active:
            return None
        conditions = []
        if self.id_lo is not None:
            conditions.append(pc.greater_equal(ids, self.id_lo))
        if self.id_hi is not None:
            conditions.append(pc.less_equal(ids, self.id_hi))
        if self.ids is not None:
            conditions.append(pc.is_in(ids, value_set=pa.array(sorted(self.ids), pa.int64())))
        ts_int = ts_us.cast(pa.int64())
        if self.ts_lo is not None:
            conditions.append(pc.greater_equal(ts_int, self.ts_lo))
        if self.ts_hi is not None:
            conditions.append(pc.less_equal(ts_int, self.ts_hi))
        mask = conditions[0]
        for condition in conditions[1:]:
            mask = pc.and_(mask, condition)
        return None if pc.all(mask).as_py() else mask

    def keep(self, message_id: int, ts_us: int) -> bool:
        """The same test for one row."""
        return (
            (self.id_lo is None or message_id >= self.id_lo)
            and (self.id_hi is None or message_id <= self.id_hi)
            and (self.ids is None or message_id in self.ids)
            and (self.ts_lo is None or ts_us >= self.ts_lo)
            and (self.ts_hi is None or ts_us <= self.ts_hi)
        )


def _ns_to_us(ns: pa.Array) -> pa.Array:
    return ns.view(_TS_NS).cast(TIMESTAMP_US, safe=False)


def _state_of(state: ReaderSnapshot, message_id: int) -> str:
    if message_id < state.head or message_id in state.done:
        return ACKED
    return LEASED if message_id in state.leased else PENDING


# ---------------------------------------------------------------------- Arrow output


class _ArrowSink:
    def __init__(self, task: SegmentTask, stats: ScanStats) -> None:
        self.task = task
        self.stats = stats
        self.filter = _Filter(task)
        full = ARROW_SCHEMA if task.state is None else ARROW_SCHEMA_WITH_STATE
        self.names = full.names if task.columns is None else list(task.columns)
        self.schema = pa.schema([full.field(name) for name in self.names])
        # Only the columns asked for are built (and sent to Spark): less to make, to
        # serialise and for the JVM to convert, row by row.
        self.wanted = frozenset(self.names)

    def run(self) -> Iterator[pa.RecordBatch]:
        scan = SegmentScan(self.task, self.stats)
        for piece in scan.pieces():
            batch = self._plain(piece) if isinstance(piece, Plain) else self._decoded(piece)
            if batch is not None and batch.num_rows:
                self.stats.rows += batch.num_rows
                yield batch
        _summary(self.task, self.stats)

    def _plain(self, piece: Plain) -> pa.RecordBatch | None:
        run = piece.run
        entries, size = run.entries, run.size
        ids = run.ids.cast(pa.int64())
        ts = _ns_to_us(entry_field(entries, TS_AT, 8, pa.int64(), size))
        mask = self.filter.mask(ids, ts)
        if mask is not None:
            entries, ids, ts = entries.filter(mask), ids.filter(mask), ts.filter(mask)
        rows = len(ids)
        if not rows:
            return None
        wanted = self.wanted
        columns: dict[str, pa.Array] = {"id": ids, "timestamp": ts}
        if "queue" in wanted:
            columns["queue"] = pa.repeat(pa.scalar(self.task.queue, pa.string()), rows)
        for name in ("expires_at", "deliver_at"):
            if name in wanted:
                columns[name] = pa.nulls(rows, TIMESTAMP_US)
        if "priority" in wanted:
            columns["priority"] = pa.repeat(pa.scalar(1, pa.int32()), rows)
        if "headers" in wanted:
            columns["headers"] = _empty_maps(rows)
        if "payload" in wanted:
            columns["payload"] = slice_entries(entries, HEADER_SIZE, -CRC_SIZE, size)
        return self._batch(columns, ids)

    def _decoded(self, piece: Decoded) -> pa.RecordBatch | None:
        ids = pa.array(piece.ids, pa.int64())
        ts = _ns_to_us(pa.array(piece.timestamps, pa.int64()))
        wanted = self.wanted
        columns: dict[str, pa.Array] = {"id": ids, "timestamp": ts}
        if "queue" in wanted:
            columns["queue"] = pa.repeat(pa.scalar(self.task.queue, pa.string()), len(ids))
        if "expires_at" in wanted:
            columns["expires_at"] = _ns_to_us(pa.array(piece.expires, pa.int64()))
        if "priority" in wanted:
            columns["priority"] = pa.array(piece.priorities, pa.int32())
        if "headers" in wanted:
            columns["headers"] = pa.array([list(h.items()) for h in piece.headers], HEADERS_MAP)
        if "payload" in wanted:
            columns["payload"] = pa.array(piece.payloads, pa.binary())
        if "deliver_at" in wanted:
            columns["deliver_at"] = _ns_to_us(pa.array(piece.deliver, pa.int64()))
        mask = self.filter.mask(ids, ts)
        if mask is not None:
            columns = {name: c.filter(mask) for name, c in columns.items()}
            ids = columns["id"]
        if not len(ids):
            return None
        return self._batch(columns, ids)

    def _batch(self, columns: dict[str, pa.Array], ids: pa.Array) -> pa.RecordBatch:
        state = self.task.state
        if state is not None and "state" in self.wanted:
            acked = pc.less(ids, state.head)
            if state.done:
                acked = pc.or_(acked, pc.is_in(ids, value_set=pa.array(sorted(state.done))))
            other = pa.repeat(pa.scalar(PENDING), len(ids))
            if state.leased:
                leased = pc.is_in(ids, value_set=pa.array(sorted(state.leased)))
                other = pc.if_else(leased, LEASED, other)
            columns["state"] = pc.if_else(acked, ACKED, other)
        return pa.RecordBatch.from_arrays(
            [columns[name] for name in self.names], schema=self.schema
        )


def _empty_maps(rows: int) -> pa.MapArray:
    return pa.MapArray.from_arrays(
        pa.repeat(pa.scalar(0, pa.int32()), rows + 1), _EMPTY_STRINGS, _EMPTY_STRINGS
    )


# ---------------------------------------------------------------------- tuple output


def _datetime(ns: int) -> datetime:
    # aware UTC datetimes: a naive one would be taken as the worker's local time
    return _EPOCH + timedelta(microseconds=int(ns / 1000) if ns < 0 else ns // 1000)


class _TupleSink:
    def __init__(self, task: SegmentTask, stats: ScanStats) -> None:
        self.task = task
        self.stats = stats
        self.filter = _Filter(task)
        full = COLUMNS if task.state is not None else COLUMNS[:-1]
        # the positions of the asked-for columns in a whole row (None: the whole row)
        self.pick = None if task.columns is None else [full.index(c) for c in task.columns]

    def run(self) -> Iterator[tuple[Any, ...]]:
        scan = SegmentScan(self.task, self.stats)
        for piece in scan.pieces():
            rows = self._plain(piece) if isinstance(piece, Plain) else self._decoded(piece)
            for row in rows:
                self.stats.rows += 1
                yield row
        _summary(self.task, self.stats)

    def _row(
        self,
        message_id: int,
        ts_ns: int,
        expires: int | None,
        priority: int,
        headers: dict[str, str],
        payload: bytes,
        deliver: int | None = None,
    ) -> tuple[Any, ...] | None:
        ts_us = int(ts_ns / 1000) if ts_ns < 0 else ts_ns // 1000
        if self.filter.active and not self.filter.keep(message_id, ts_us):
            return None
        row: tuple[Any, ...] = (
            self.task.queue,
            message_id,
            _datetime(ts_ns),
            None if expires is None else _datetime(expires),
            priority,
            headers,
            payload,
            None if deliver is None else _datetime(deliver),
        )
        state = self.task.state
        if state is not None:
            row = (*row, _state_of(state, message_id))
        return row if self.pick is None else tuple(row[i] for i in self.pick)

    def _plain(self, piece: Plain) -> Iterator[tuple[Any, ...]]:
        buf, offsets = piece.buf, piece.offsets
        for i in range(len(offsets) - 1):
            start, stop = offsets[i], offsets[i + 1]
            message_id, ts_ns = _unpack_id_ts(buf, start + ID_AT)
            row = self._row(
                message_id, ts_ns, None, 1, {}, buf[start + HEADER_SIZE : stop - CRC_SIZE]
            )
            if row is not None:
                yield row

    def _decoded(self, piece: Decoded) -> Iterator[tuple[Any, ...]]:
        for i in range(len(piece)):
            row = self._row(
                piece.ids[i],
                piece.timestamps[i],
                piece.expires[i],
                piece.priorities[i],
                piece.headers[i],
                piece.payloads[i],
                piece.deliver[i],
            )
            if row is not None:
                yield row


def _summary(task: SegmentTask, stats: ScanStats) -> None:
    if stats.corrupt_regions:
        logger.warning(
            "ledgerq: read %d rows of queue %s from %s; %d corrupt regions skipped "
            "(%d bytes, %d messages lost)",
            stats.rows,
            task.queue,
            task.log_path,
            stats.corrupt_regions,
            stats.corrupt_bytes,
            stats.lost_messages,
        )
