"""The ``ledgerq`` Spark data source, on PySpark's Python Data Source API.

Where each piece runs (PySpark 4.3): ``DataSource.reader``/``pushFilters``/
``partitions`` in a planner Python process on the driver side (the reader is pickled
between them), ``read`` in executor Python workers, one call per input partition
(one segment file); the stream reader's offsets and partitions in one long-lived
Python process per query.  Everything a reader holds is plain picklable data.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ledgerq._errors import ConfigError
from ledgerq.segment.readonly import find_queues, last_complete_id
from ledgerq.spark._foreach_batch import QUERY_OPTION, StreamBatchWriter
from ledgerq.spark._layout import list_segments
from ledgerq.spark._plan import (
    Pushed,
    ReadOptions,
    encryption_key_option,
    plan_queue,
    plan_tasks,
    task_from_json,
    task_to_json,
)
from ledgerq.spark._scan import SegmentTask, scan_segment
from ledgerq.spark._stream_write import LedgerqStreamWriter
from ledgerq.spark._write import LedgerqWriter

__all__ = ["READ_SCHEMA", "READ_SCHEMA_WITH_STATE", "LedgerqDataSource"]

logger = logging.getLogger("ledgerq")

READ_SCHEMA = StructType(
    [
        StructField("queue", StringType()),
        StructField("id", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("expires_at", TimestampType()),
        StructField("priority", IntegerType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("payload", BinaryType()),
        StructField("deliver_at", TimestampType()),
    ]
)
READ_SCHEMA_WITH_STATE = StructType([*READ_SCHEMA.fields, StructField("state", StringType())])

_PUSHDOWN_PLANNER = "pyspark.sql.worker.data_source_pushdown_filters"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")
_MODES = {"PERMISSIVE": False, "DROPMALFORMED": False, "FAILFAST": True}


class LedgerqDataSource(DataSource):
    """``spark.read.format("ledgerq")``: messages of ledgerq queues as a DataFrame.

    Batch reads, streaming reads, batch writes and streaming writes; see ``docs/spark.md``
    for the options.
    """

    @classmethod
    def name(cls) -> str:
        return "ledgerq"

    def schema(self) -> StructType:
        full = READ_SCHEMA_WITH_STATE if self.options.get("reader") else READ_SCHEMA
        columns = _columns_option(self.options, full)
        if columns is None:
            return full
        return StructType([full[name] for name in columns])

    def reader(self, schema: StructType) -> DataSourceReader:
        options = read_options(self.options)
        _check_schema(schema, self.schema())
        # Spark refuses a reader that implements pushFilters when the session's
        # spark.sql.python.filterPushdown.enabled is off, and tells the source nothing:
        # the JVM plans through data_source_pushdown_filters only when it is on.  So
        # this returns the pushdown-capable reader only when called from there.  If that
        # module is ever renamed, reads lose pushdown, never correctness.
        if options.pushdown and _called_by(_PUSHDOWN_PLANNER):
            return LedgerqPushdownReader(options)
        return LedgerqReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = read_options(self.options)
        _check_schema(schema, self.schema())
        return LedgerqStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if self.options.get(QUERY_OPTION) is not None:  # a batch of foreach_batch_writer
            return StreamBatchWriter.create(self.options, schema, overwrite)
        return LedgerqWriter.create(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return LedgerqStreamWriter.create(self.options, schema, overwrite)


def _called_by(module: str) -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == module:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _check_schema(given: StructType, expected: StructType) -> None:
    if given != expected:
        raise ConfigError(
            "the ledgerq source has a fixed schema; drop .schema(...) or give exactly "
            f"{expected.simpleString()} (got {given.simpleString()})"
        )


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"option {name} must be true or false, got {raw!r}")


def _columns_option(options: Mapping[str, str], full: StructType) -> tuple[str, ...] | None:
    """Option ``columns``: the names of the columns to read, in order (None: all)."""
    raw = options.get("columns")
    if raw is None:
        return None
    names = tuple(part.strip().lower() for part in str(raw).split(","))
    valid = full.fieldNames()
    unknown = [n for n in names if n not in valid]
    if not all(names) or unknown or len(set(names)) != len(names):
        what = (
            f"unknown column {unknown[0]!r}"
            if unknown and unknown[0]
            else ("a column named twice" if all(names) else "an empty name")
        )
        extra = "" if "state" in valid else " (state needs the reader option)"
        raise ConfigError(
            f"option columns must name columns of the ledgerq schema, each once, separated "
            f"by commas; got {raw!r}: {what}. The columns: {', '.join(valid)}{extra}"
        )
    return names


def read_options(options: Mapping[str, str]) -> ReadOptions:
    """Parse the string options of a read (names are case-insensitive)."""
    paths: list[str] = []
    if options.get("paths"):
        paths.extend(json.loads(options["paths"]))
    if options.get("path"):
        paths.append(options["path"])
    if not paths:
        raise ConfigError('a ledgerq read needs a path: spark.read.format("ledgerq").load(path)')
    mode = str(options.get("mode", "PERMISSIVE")).upper()
    if mode not in _MODES:
        raise ConfigError(f"option mode must be PERMISSIVE or FAILFAST, got {options['mode']!r}")
    limit = options.get("maxRecordsPerTrigger")
    max_rows = None
    if limit is not None:
        try:
            max_rows = int(limit)
        except ValueError:
            max_rows = 0
        if max_rows <= 0:
            raise ConfigError(
                f"option maxRecordsPerTrigger must be a positive integer, got {limit!r}"
            )
    starting = str(options.get("startingOffsets", "earliest")).strip()
    if starting.lower() in ("earliest", "latest"):
        starting = starting.lower()
    else:
        _parse_offsets(starting)  # validate now
    reader = options.get("reader") or None
    full = READ_SCHEMA_WITH_STATE if reader else READ_SCHEMA
    return ReadOptions(
        paths=tuple(paths),
        reader=reader,
        include_dlq=_flag(options, "include_dlq", False),
        failfast=_MODES[mode],
        arrow=_flag(options, "arrow", True),
        pushdown=_flag(options, "pushdown", True),
        encryption_key=encryption_key_option(options),
        starting_offsets=starting,
        max_records_per_trigger=max_rows,
        columns=_columns_option(options, full),
    )


# ---------------------------------------------------------------------- batch reads


def _read(partition: InputPartition, options: ReadOptions) -> Iterator[Any]:
    task = partition.value
    if task is None:  # Spark's stand-in partition when the plan is empty
        return iter(())
    if isinstance(task, str):  # a batch read's task, as text (see _plan.task_to_json)
        task = task_from_json(task)
    assert isinstance(task, SegmentTask)
    return scan_segment(task, arrow=options.arrow)


class LedgerqReader(DataSourceReader):
    """A batch read without filter pushdown: every segment of every queue."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.pushed = Pushed()

    def partitions(self) -> Sequence[InputPartition]:
        # As text: the JVM reader runs these same tasks when it serves the read.
        tasks = plan_tasks(self.options, self.pushed)
        return [InputPartition(task_to_json(task)) for task in tasks]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition, self.options)


class LedgerqPushdownReader(LedgerqReader):
    """A batch read that takes id, timestamp and queue filters from Spark.

    Taken filters are applied exactly (Spark does not apply them again): segments that
    cannot match are not read at all, a task seeks to the sparse-index point before its
    first wanted row, and rows are filtered column-wise.
    """

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        return [f for f in filters if not _push(self.pushed, f)]


def _push(pushed: Pushed, f: Filter) -> bool:
    """Fold one filter into ``pushed``; False when ledgerq cannot apply it exactly."""
    attribute: tuple[str, ...] = getattr(f, "attribute", ())
    if len(attribute) != 1:
        return False
    column = attribute[0].lower()
    taken = False
    if column == "id":
        taken = _push_id(pushed, f)
    elif column == "timestamp":
        taken = _push_time(pushed, f)
    elif column == "queue":
        taken = _push_queue(pushed, f)
    if taken:
        pushed.taken.append(f"{type(f).__name__}({column}, {getattr(f, 'value', '')!r})")
    return taken


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _push_id(pushed: Pushed, f: Filter) -> bool:
    if isinstance(f, In):
        if not all(_is_int(v) for v in f.value):
            return False
        values = frozenset(int(v) for v in f.value)
        pushed.ids = values if pushed.ids is None else pushed.ids & values
        return True
    value = getattr(f, "value", None)
    if not _is_int(value):
        return False
    assert isinstance(value, int)
    return _narrow(pushed, "id", f, value)


def _push_time(pushed: Pushed, f: Filter) -> bool:
    value = getattr(f, "value", None)
    if isinstance(f, In) or not isinstance(value, datetime):
        return False
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return _narrow(pushed, "ts", f, (aware - _EPOCH) // _ONE_US)


def _narrow(pushed: Pushed, prefix: str, f: Filter, value: int) -> bool:
    lo_name, hi_name = f"{prefix}_lo", f"{prefix}_hi"
    lo: int | None = getattr(pushed, lo_name)
    hi: int | None = getattr(pushed, hi_name)
    if isinstance(f, (EqualTo, EqualNullSafe)):
        new_lo, new_hi = value, value
    elif isinstance(f, GreaterThan):
        new_lo, new_hi = value + 1, None
    elif isinstance(f, GreaterThanOrEqual):
        new_lo, new_hi = value, None
    elif isinstance(f, LessThan):
        new_lo, new_hi = None, value - 1
    elif isinstance(f, LessThanOrEqual):
        new_lo, new_hi = None, value
    else:
        return False
    if new_lo is not None:
        setattr(pushed, lo_name, new_lo if lo is None else max(lo, new_lo))
    if new_hi is not None:
        setattr(pushed, hi_name, new_hi if hi is None else min(hi, new_hi))
    return True


def _push_queue(pushed: Pushed, f: Filter) -> bool:
    if isinstance(f, In):
        values = list(f.value)
    elif isinstance(f, (EqualTo, EqualNullSafe)):
        values = [f.value]
    else:
        return False
    if not all(isinstance(v, str) for v in values):
        return False
    names = frozenset(values)
    pushed.queues = names if pushed.queues is None else pushed.queues & names
    return True


# ---------------------------------------------------------------------- streaming


def _parse_offsets(text: str) -> dict[str, int]:
    try:
        raw = json.loads(text)
    except ValueError:
        raw = None
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and _is_int(v) and v >= 0 for k, v in raw.items()
    ):
        raise ConfigError(
            "option startingOffsets must be earliest, latest, or a JSON object of queue "
            f'name to the last id already read, e.g. {{"orders": 41}}; got {text!r}'
        )
    return dict(raw)


def _offset(ids: Mapping[str, int]) -> dict[str, Any]:
    # Spark compares offsets as JSON text: keep the queue names sorted.
    return {"queues": {name: ids[name] for name in sorted(ids)}}


def _ids_of(offset: Mapping[str, Any]) -> dict[str, int]:
    queues = offset.get("queues", {})
    return {str(k): int(v) for k, v in queues.items()}


class LedgerqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("ledgerq")``: new messages of every queue, in micro-batches.

    An offset is, per queue, the id of the last message read (``{"queues": {name: id}}``);
    a micro-batch reads, per queue, the ids after the start offset up to the end offset,
    so a restart from a checkpoint re-reads exactly the batch that was not committed.
    Queues that appear under the path later are read from their first message.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._target: dict[str, int] | None = None  # the availableNow end, once prepared

    def _latest(self) -> dict[str, int]:
        latest: dict[str, int] = {}
        for path in self.options.paths:
            for queue in find_queues(path, include_dlq=self.options.include_dlq):
                latest[queue.name] = last_complete_id(queue.path)
        return latest

    def initialOffset(self) -> dict[str, Any]:
        starting = self.options.starting_offsets
        if starting == "earliest":
            return _offset(dict.fromkeys(self._latest(), 0))
        if starting == "latest":
            return _offset(self._latest())
        given = _parse_offsets(starting)
        return _offset({**dict.fromkeys(self._latest(), 0), **given})

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        begin = _ids_of(start or {})
        latest = self._latest()
        if self._target is not None:
            latest = {name: min(last, self._target.get(name, 0)) for name, last in latest.items()}
        end = dict(begin)
        for name, last in latest.items():
            end[name] = max(begin.get(name, 0), last)
        if isinstance(limit, ReadMaxRows):
            end = _admit(begin, end, limit.max_rows)
        return _offset(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return _offset(self._latest())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = _ids_of(start), _ids_of(end)
        wanted = {name: last for name, last in stop.items() if last > begin.get(name, 0)}
        tasks: list[SegmentTask] = []
        if not wanted:
            return []
        for path in self.options.paths:
            for queue in find_queues(path, include_dlq=self.options.include_dlq):
                if queue.name not in wanted:
                    continue
                tasks.extend(
                    plan_queue(
                        queue,
                        list_segments(queue.path),
                        self.options,
                        Pushed(),
                        begin.get(queue.name, 0) + 1,
                        wanted.pop(queue.name),
                        snapshot=False,
                    )
                )
        for name in wanted:
            logger.warning(
                "ledgerq: queue %s disappeared before its messages up to id %d were read",
                name,
                stop[name],
            )
        return [InputPartition(task) for task in tasks]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition, self.options)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the source is a log view and never consumes messages."""


def _admit(begin: dict[str, int], end: dict[str, int], max_rows: int) -> dict[str, int]:
    """Cut ``end`` so that at most ``max_rows`` ids are admitted, shared fairly by queues."""
    room = {name: end[name] - begin.get(name, 0) for name in sorted(end)}
    granted = dict.fromkeys(room, 0)
    left = max_rows
    open_queues = [name for name, n in room.items() if n > 0]
    while left > 0 and open_queues:
        share = max(1, left // len(open_queues))
        for name in list(open_queues):
            take = min(share, room[name] - granted[name], left)
            granted[name] += take
            left -= take
            if granted[name] == room[name]:
                open_queues.remove(name)
            if left == 0:
                break
    return {name: begin.get(name, 0) + granted[name] for name in room}
