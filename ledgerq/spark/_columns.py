"""The columns a ledgerq write takes: one table, used by the schema check, the tasks and
the commit.

Every column but ``payload`` is optional.  Each row of :data:`COLUMNS` says which Spark
types a column takes (checked against the DataFrame's schema on the driver, before any
task runs), how a task normalises and checks its values (an Arrow kernel per batch, so
a bad value fails its task and nothing is published), the Arrow type staged files hold
it in, which keyword of :class:`ledgerq.Item` it becomes at commit, and whether it
chooses the row's shard (the first routing column a row has a value in, in table order,
as ``open_sharded`` routes).  A delivery feature that gains an ``Item`` keyword is one
more row, with its check - placed among the routing columns with ``routes=True`` if
``open_sharded`` routes by it (as ``unique_key`` is).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from ledgerq import Item
from ledgerq._errors import ConfigError
from ledgerq._options import MAX_SECONDS

__all__ = ["COLUMNS", "ROUTED_BY", "Column", "check_columns", "items", "normalize"]

_INTS = (ByteType, ShortType, IntegerType, LongType)
_NUMBERS = (*_INTS, FloatType, DoubleType, DecimalType)
_TEXT = (StringType,)
_TEXT_OR_BYTES = (StringType, BinaryType)
_MAX_GROUP_BYTES = 255  # format.entry.MAX_GROUP_BYTES: a u8 length (not importable here)
_MAX_UNIQUE_KEY_BYTES = 1024  # core.args._MAX_UNIQUE_KEY_BYTES (not importable here either)
_US = 1_000_000

# A task's check of one column: the batch's array in, the staged array out (ValueError
# for a value ``enqueue`` would refuse; ``where`` names the partition).
Normalize = Callable[[pa.Array, str], pa.Array]


@dataclass(frozen=True, slots=True)
class Column:
    """One column a ledgerq write takes.

    ``accepts``: the Spark types; ``what``: them in words, for errors; ``normalize``:
    the task's check and conversion (None: the column only routes rows and is not
    staged); ``item``: the :class:`ledgerq.Item` keyword it fills at commit;
    ``routes``: whether it chooses the row's shard.
    """

    name: str
    accepts: tuple[type[DataType], ...]
    what: str
    normalize: Normalize | None
    item: str | None
    routes: bool = False


def _fail(bad: pa.Array, message: str, where: str) -> None:
    if pc.any(bad).as_py():
        raise ValueError(f"{message} ({where}); nothing was published")


def _payload(column: pa.Array, where: str) -> pa.Array:
    column = column.cast(pa.binary())
    if column.null_count:
        raise ValueError(f"payload must not be null ({where}); nothing was published")
    return column


def _headers(column: pa.Array, where: str) -> pa.Array:
    column = column.cast(pa.map_(pa.string(), pa.string()))
    if column.items.null_count:
        raise ValueError(f"header values must not be null ({where}); nothing was published")
    return column


def _priority(column: pa.Array, where: str) -> pa.Array:
    column = column.cast(pa.int32())
    _fail(
        pc.or_(pc.less(column, 0), pc.greater(column, 2)),
        "priority must be 0 (LOW), 1 (MEDIUM) or 2 (HIGH)",
        where,
    )
    return column


def _seconds(name: str, *, zero_ok: bool) -> Normalize:
    low = "from 0" if zero_ok else "above 0"

    def normalize(column: pa.Array, where: str) -> pa.Array:
        column = column.cast(pa.float64())
        too_low = pc.less(column, 0.0) if zero_ok else pc.less_equal(column, 0.0)
        bad = pc.or_(pc.or_(too_low, pc.greater(column, MAX_SECONDS)), pc.is_nan(column))
        _fail(bad, f"{name} must be a number of seconds {low} to 100 years", where)
        return column

    return normalize


def _deliver_at(column: pa.Array, where: str) -> pa.Array:
    # Staged as microseconds since the epoch (UTC whatever the session's time zone):
    # the commit turns it into a delay from the moment it publishes.
    micros = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    latest = int((time.time() + MAX_SECONDS) * _US)
    _fail(pc.greater(micros, latest), "deliver_at must be within 100 years from now", where)
    return micros


def _utf8(name: str, max_bytes: int) -> Normalize:
    """The check of a text column ``enqueue`` takes as 1 to ``max_bytes`` bytes of UTF-8."""

    def normalize(column: pa.Array, where: str) -> pa.Array:
        column = column.cast(pa.string())
        size = pc.binary_length(column)
        _fail(
            pc.or_(pc.equal(size, 0), pc.greater(size, max_bytes)),
            f"{name} must be 1 to {max_bytes} bytes of UTF-8",
            where,
        )
        return column

    return normalize


_group = _utf8("group", _MAX_GROUP_BYTES)
_unique_key = _utf8("unique_key", _MAX_UNIQUE_KEY_BYTES)


def _dedup_id(column: pa.Array, where: str) -> pa.Array:
    # Kept as it comes: a str and a bytes dedup id are different ids.
    return column.cast(pa.binary() if pa.types.is_binary(column.type) else pa.string())


COLUMNS: dict[str, Column] = {
    c.name: c
    for c in (
        Column("payload", _TEXT_OR_BYTES, "binary or string (UTF-8)", _payload, "payload"),
        Column("headers", (MapType,), "map<string,string>", _headers, "headers"),
        Column("priority", _INTS, "an integer 0-2", _priority, "priority"),
        Column("ttl", _NUMBERS, "a number of seconds", _seconds("ttl", zero_ok=False), "ttl"),
        Column("delay", _NUMBERS, "a number of seconds", _seconds("delay", zero_ok=True), "delay"),
        Column("deliver_at", (TimestampType,), "a timestamp", _deliver_at, "delay"),
        # The routing columns, in the order open_sharded routes by them: a group's order
        # holds inside one shard, and a unique key or a dedup id is checked in one.
        Column("key", _TEXT_OR_BYTES, "string or binary", None, None, routes=True),
        Column("group", _TEXT, "a string", _group, "group", routes=True),
        Column("unique_key", _TEXT, "a string", _unique_key, "unique_key", routes=True),
        Column("dedup_id", _TEXT_OR_BYTES, "string or binary", _dedup_id, "dedup_id", routes=True),
    )
}
ROUTED_BY = tuple(c.name for c in COLUMNS.values() if c.routes)


def _described() -> str:
    return "; ".join(f"{c.name} ({c.what})" for c in COLUMNS.values())


def check_columns(schema: StructType) -> None:
    """Raise :class:`ConfigError` unless ``schema`` is one a ledgerq write takes."""
    names = [f.name for f in schema.fields]
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:
        raise ConfigError(
            f"a ledgerq write got unexpected column(s) {', '.join(unknown)}; it takes "
            f"payload and optionally the others of: {_described()} (select those first)"
        )
    if "payload" not in names:
        raise ConfigError("a ledgerq write needs a payload column (binary or string)")
    for f in schema.fields:
        column = COLUMNS[f.name]
        ok = isinstance(f.dataType, column.accepts)
        if ok and isinstance(f.dataType, MapType):
            ok = isinstance(f.dataType.keyType, StringType) and isinstance(
                f.dataType.valueType, StringType
            )
        if not ok:
            raise ConfigError(
                f"column {f.name} has type {f.dataType.simpleString()}; a ledgerq write "
                f"takes {f.name} as {column.what} (cast it, e.g. "
                f"F.col({f.name!r}).cast(...)); nothing was written"
            )


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


def normalize(batch: pa.RecordBatch, where: str) -> pa.RecordBatch:
    """The staged columns of a batch, in their staged types; checks what enqueue would.

    Raises ``ValueError`` (naming ``where``) for a value ``enqueue`` would refuse, so
    that a bad row fails its task before anything is published.
    """
    arrays, names = [], []
    for column in COLUMNS.values():
        found = _column(batch, column.name)
        if found is None or column.normalize is None:
            continue
        arrays.append(column.normalize(found, where))
        names.append(column.name)
    if "delay" in names and "deliver_at" in names:
        both = pc.and_(
            pc.is_valid(arrays[names.index("delay")]),
            pc.is_valid(arrays[names.index("deliver_at")]),
        )
        _fail(both, "a row has both a delay and a deliver_at: give one of them", where)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _converters(now_us: int) -> dict[str, Callable[[Any], Any]]:
    """Staged value -> ``Item`` keyword value, for the columns that need one."""

    def deliver_at(micros: int | None) -> float | None:
        if micros is None or micros <= now_us:
            return None  # due already: delivered at once
        return (micros - now_us) / _US

    return {
        "headers": lambda h: dict(h) if h else None,  # an empty map: no headers
        "deliver_at": deliver_at,
    }


def items(table: pa.Table) -> list[Any]:
    """The messages of a staged table, for ``enqueue_batch`` (bytes when payload-only).

    A ``deliver_at`` becomes a delay from now (the commit's clock): a time already past
    is no delay.
    """
    payloads: list[Any] = table.column("payload").to_pylist()
    if table.num_columns == 1:
        return payloads
    convert = _converters(time.time_ns() // 1000)
    fields: list[tuple[str, list[Any]]] = []
    for name in table.column_names:
        keyword = COLUMNS[name].item
        if name == "payload" or keyword is None:
            continue
        values = table.column(name).to_pylist()
        if name in convert:
            values = [convert[name](v) for v in values]
        fields.append((keyword, values))
    found: list[Any] = []
    for i, payload in enumerate(payloads):
        keywords: dict[str, Any] = {}
        for keyword, values in fields:
            value = values[i]
            # Null is the keyword's default (priority MEDIUM, ...); delay and deliver_at:
            # at most one of them per row (normalize checked it).
            if value is not None:
                keywords[keyword] = value
        found.append(Item(payload, **keywords))
    return found
