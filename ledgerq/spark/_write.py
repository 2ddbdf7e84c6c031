"""``df.write.format("ledgerq").mode("append").save(root)``: rows into sharded queues.

The rows go into the shards of a sharded queue under ``root`` - the directories
:func:`ledgerq.open_sharded` uses (``root/[prefix.]<bits>.<index:03x>``, the count
recorded in ``root/[prefix.]ledgerq-shards.json``), so ``open_sharded(root, shards)``
and the Spark reader both see what a job wrote.  A row with a ``key`` goes to shard
``xxh3_64(key) % shards`` (as ``open_sharded`` routes it); without a key, to the shard
of its ``dedup_id`` if it has one, else to shard ``partition % shards``.

A ledgerq queue has one owner at a time (its lock), and a job must not leave half of
itself visible, so a write has two phases:

1. **Tasks stage.**  Each task (``write``, on an executor) splits its rows by shard and
   writes each shard's rows to its own Arrow IPC file under
   ``root/_ledgerq_staging/<job>/`` (temp file, fsync, rename, fsync of the directory).
   Nothing is visible to consumers yet, and tasks never contend for a queue's lock.
2. **The driver publishes.**  ``commit`` (on the driver, once every task succeeded)
   opens *every* shard queue first - waiting up to ``lock_timeout`` seconds for a lock
   another process holds - then appends each staged file with one ``enqueue_batch``
   (all-or-nothing, one write), fsyncs each shard and closes it, and deletes the
   staging directory.  If any shard cannot be opened, nothing is published.

``abort`` (a task or the job failed) deletes the job's staging directory: nothing was
published, nothing is visible.  The one window left is a crash or an I/O error *while*
``commit`` publishes: shards already appended keep their batches, each of which is
whole (never a torn batch), and the staging directory is left for inspection.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
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
)

import ledgerq
from ledgerq import Item, Options
from ledgerq._errors import ConfigError, QueueLockedError
from ledgerq.segment.files import fsync_dir
from ledgerq.shard import (
    existing_shard_counts,
    read_shard_count,
    shard_dir_name,
    shard_index,
    write_shard_count,
)
from ledgerq.spark._plan import encryption_key_option

__all__ = ["STAGING_DIR", "LedgerqWriter", "StagedFile", "StagedTask"]

logger = logging.getLogger("ledgerq")

STAGING_DIR = "_ledgerq_staging"  # under root; "_" hides it from readers (Spark's rule)
_DEFAULT_SHARDS = 8
_DEFAULT_LOCK_TIMEOUT_S = 30.0
_INTS = (ByteType, ShortType, IntegerType, LongType)
_NUMBERS = (*_INTS, FloatType, DoubleType, DecimalType)
_TEXT_OR_BYTES = (StringType, BinaryType)
_COLUMNS: dict[str, tuple[type[DataType], ...]] = {
    "payload": _TEXT_OR_BYTES,
    "headers": (MapType,),
    "priority": _INTS,
    "ttl": _NUMBERS,
    "key": _TEXT_OR_BYTES,
    "dedup_id": _TEXT_OR_BYTES,
}
_STAGED: dict[
    str, pa.DataType | None
] = {  # the Arrow types staged files hold, whatever the DataFrame's types were
    "payload": pa.binary(),
    "headers": pa.map_(pa.string(), pa.string()),
    "priority": pa.int32(),
    "ttl": pa.float64(),
    "dedup_id": None,  # kept as it comes: str and bytes dedup ids are different ids
}


@dataclass(frozen=True, slots=True)
class StagedFile:
    """One staged Arrow IPC file: the rows one task wrote for one shard."""

    shard: int
    path: str
    rows: int
    max_payload: int


@dataclass(frozen=True, slots=True)
class StagedTask(WriterCommitMessage):
    """What a task reports to the driver: its staged files."""

    partition: int
    attempt: int
    files: tuple[StagedFile, ...]


def _check_columns(schema: StructType) -> None:
    names = [f.name for f in schema.fields]
    unknown = [n for n in names if n not in _COLUMNS]
    if unknown:
        raise ConfigError(
            f"a ledgerq write got unexpected column(s) {', '.join(unknown)}; it takes payload "
            "(binary or string) and optionally headers (map<string,string>), priority (int "
            "0-2), ttl (seconds), key (string or binary) and dedup_id (string or binary)"
        )
    if "payload" not in names:
        raise ConfigError("a ledgerq write needs a payload column (binary or string)")
    for f in schema.fields:
        if not isinstance(f.dataType, _COLUMNS[f.name]):
            raise ConfigError(
                f"column {f.name} has type {f.dataType.simpleString()}, which a "
                "ledgerq write cannot take (see docs/spark.md)"
            )
        if f.name == "headers":
            mt = f.dataType
            assert isinstance(mt, MapType)
            if not (isinstance(mt.keyType, StringType) and isinstance(mt.valueType, StringType)):
                raise ConfigError("column headers must be map<string,string>")


def _queue_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``queue.<name>`` writer options, for ``ledgerq.open`` of the shard queues."""
    found: dict[str, Any] = {}
    for raw_name, raw in options.items():
        name = raw_name.lower()
        if not name.startswith("queue."):
            continue
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw  # a plain string such as sync=always
        found[name.removeprefix("queue.")] = value
    return found


class LedgerqWriter(DataSourceArrowWriter):
    """Stages rows per task, publishes them at commit; see the module docstring."""

    def __init__(
        self,
        root: str,
        shards: int,
        prefix: str,
        queue_options: dict[str, Any],
        lock_timeout: float,
    ) -> None:
        self.root = root
        self.shards = shards
        self.prefix = prefix
        self.queue_options = queue_options
        self.lock_timeout = lock_timeout
        self.job = uuid.uuid4().hex  # the same in every task and at commit (pickled once)

    @classmethod
    def create(
        cls, options: Mapping[str, str], schema: StructType, overwrite: bool
    ) -> LedgerqWriter:
        """Check a write before any task runs (on the driver side)."""
        root = options.get("path")
        if not root:
            raise ConfigError('a ledgerq write needs a root: df.write.format("ledgerq").save(root)')
        if overwrite:
            raise ConfigError(
                "ledgerq queues are append-only logs whose ids are never reused, so "
                "mode('overwrite') is not supported; use mode('append'), or delete "
                f"{root} first (with no process holding its queues open)"
            )
        prefix = options.get("prefix", "")
        recorded = read_shard_count(root, prefix)
        given = options.get("shards")
        shards = recorded or _DEFAULT_SHARDS
        if given is not None:
            try:
                shards = int(given)
            except ValueError:
                raise ConfigError(f"option shards must be an integer, got {given!r}") from None
        shard_dir_name(prefix, shards, 0)  # validates the prefix and the count
        if recorded is not None and recorded != shards:
            raise ConfigError(
                f"{root} (prefix {prefix!r}) holds {recorded} shards, not {shards}; write "
                "with the same shard count (resharding would move messages)"
            )
        existing = existing_shard_counts(root, prefix) - {shards}
        if existing:
            raise ConfigError(
                f"{root} already holds shard directories of prefix {prefix!r} for "
                f"{', '.join(map(str, sorted(existing)))} shards, not {shards}"
            )
        try:
            lock_timeout = float(options.get("lock_timeout", _DEFAULT_LOCK_TIMEOUT_S))
        except ValueError:
            raise ConfigError("option lock_timeout must be a number of seconds") from None
        queue_options = _queue_options(options)
        key = encryption_key_option(options)  # the shard queues are encrypted with it
        if key is not None:
            queue_options["encryption_key"] = key
        try:
            Options(**queue_options)  # ConfigError for a bad value
        except TypeError as exc:
            raise ConfigError(f"invalid queue.* option: {exc}") from None
        _check_columns(schema)
        return cls(os.path.abspath(root), shards, prefix, queue_options, lock_timeout)

    @property
    def staging(self) -> str:
        """This job's staging directory."""
        return os.path.join(self.root, STAGING_DIR, self.job)

    # -- phase 1: tasks ------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedTask:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        attempt = context.attemptNumber() if context is not None else 0
        os.makedirs(self.staging, exist_ok=True)
        sinks: dict[int, _Sink] = {}
        try:
            for batch in iterator:
                if batch.num_rows:
                    self._stage(batch, partition, attempt, sinks)
            files = tuple(sink.finish() for _, sink in sorted(sinks.items()))
            if files:
                fsync_dir(self.staging)
        except BaseException:
            for sink in sinks.values():
                sink.discard()
            raise
        return StagedTask(partition, attempt, files)

    def _stage(
        self, batch: pa.RecordBatch, partition: int, attempt: int, sinks: dict[int, _Sink]
    ) -> None:
        staged = _normalize(batch, partition)
        for shard, rows in self._route(batch, partition).items():
            part = staged if rows is None else staged.take(pa.array(rows, pa.int64()))
            sink = sinks.get(shard)
            if sink is None:
                name = f"{shard:03x}.p{partition:05d}.a{attempt}.arrow"
                sink = sinks[shard] = _Sink(shard, os.path.join(self.staging, name), part.schema)
            sink.add(part)

    def _route(self, batch: pa.RecordBatch, partition: int) -> dict[int, list[int] | None]:
        """Rows per shard (None: every row of the batch)."""
        fallback = partition % self.shards
        keys = _column(batch, "key")
        dedup = _column(batch, "dedup_id")
        if keys is None and dedup is None:
            return {fallback: None}
        key_values = keys.to_pylist() if keys is not None else [None] * batch.num_rows
        dedup_values = dedup.to_pylist() if dedup is not None else [None] * batch.num_rows
        shards = self.shards
        groups: dict[int, list[int]] = {}
        for row, (key, dedup_id) in enumerate(zip(key_values, dedup_values, strict=True)):
            chosen = key if key is not None else dedup_id
            shard = fallback if chosen is None else shard_index(chosen, shards)
            groups.setdefault(shard, []).append(row)
        if len(groups) == 1:
            return {next(iter(groups)): None}
        return dict(groups.items())

    # -- phase 2: the driver -------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        files = sorted(
            (f for m in messages if isinstance(m, StagedTask) for f in m.files),
            key=lambda f: (f.shard, f.path),
        )
        write_shard_count(self.root, self.prefix, self.shards)
        queues = self._open_all()
        try:
            for f in files:
                limit = queues[f.shard].options.max_message_size
                if f.max_payload > limit:
                    raise ConfigError(
                        f"a payload of {f.max_payload} bytes exceeds max_message_size={limit} of "
                        f"shard {f.shard}; nothing was published"
                    )
            published = 0
            for f in files:
                queues[f.shard].enqueue_batch(_items(f.path))
                published += f.rows
            for q in queues:
                q.sync()
        finally:
            for q in queues:
                q.close()
        shutil.rmtree(self.staging, ignore_errors=True)
        _remove_if_empty(os.path.dirname(self.staging))
        logger.info(
            "ledgerq: published %d rows into %d shards of %s", published, self.shards, self.root
        )

    def _open_all(self) -> list[Any]:
        """Open every shard queue, waiting for locks; all or none."""
        opened: list[Any] = []
        deadline = time.monotonic() + self.lock_timeout
        try:
            for index in range(self.shards):
                path = os.path.join(self.root, shard_dir_name(self.prefix, self.shards, index))
                delay = 0.01
                while True:
                    try:
                        opened.append(ledgerq.open(path, **self.queue_options))
                        break
                    except QueueLockedError:
                        if time.monotonic() >= deadline:
                            raise
                        time.sleep(delay)
                        delay = min(delay * 2, 0.5)
        except BaseException:
            for q in opened:
                q.close()
            raise
        return opened

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Delete the job's staged files: nothing of it was published."""
        shutil.rmtree(self.staging, ignore_errors=True)
        _remove_if_empty(os.path.dirname(self.staging))
        logger.warning("ledgerq: write to %s aborted; its staged rows were deleted", self.root)


def _remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass  # another job is staging there, or it is gone already


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


def _normalize(batch: pa.RecordBatch, partition: int) -> pa.RecordBatch:
    """The staged columns of a batch, in their staged types; checks what enqueue would."""
    arrays, fields = [], []
    for name, kind in _STAGED.items():
        column = _column(batch, name)
        if column is None:
            continue
        if name == "ttl":
            column = column.cast(pa.float64())
            bad = pc.less_equal(column, 0.0)
            if pc.any(bad).as_py():
                raise ValueError(
                    f"ttl must be a positive number of seconds (partition {partition})"
                )
        elif name == "priority":
            column = column.cast(pa.int32())
            bad = pc.or_(pc.less(column, 0), pc.greater(column, 2))
            if pc.any(bad).as_py():
                raise ValueError(
                    f"priority must be 0 (LOW), 1 (MEDIUM) or 2 (HIGH) (partition {partition})"
                )
        elif name == "headers":
            column = column.cast(kind)
            if column.items.null_count:
                raise ValueError(f"header values must not be null (partition {partition})")
        elif name == "dedup_id":
            kind = pa.binary() if pa.types.is_binary(column.type) else pa.string()
            column = column.cast(kind)
        else:
            column = column.cast(kind)
        if name == "payload" and column.null_count:
            raise ValueError(f"payload must not be null (partition {partition})")
        arrays.append(column)
        fields.append(pa.field(name, kind))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


class _Sink:
    """One staged file being written: temp name, then fsync and rename in ``finish``."""

    def __init__(self, shard: int, path: str, schema: pa.Schema) -> None:
        self.shard = shard
        self.path = path
        self.tmp = f"{path}.tmp"
        self.rows = 0
        self.max_payload = 0
        self.file = open(self.tmp, "wb")  # noqa: SIM115 - closed in finish/discard
        self.writer = pa.ipc.new_file(self.file, schema)

    def add(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)
        self.rows += batch.num_rows
        lengths = pc.binary_length(batch.column(0))
        longest = pc.max(lengths).as_py()
        self.max_payload = max(self.max_payload, longest or 0)

    def finish(self) -> StagedFile:
        self.writer.close()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        return StagedFile(self.shard, self.path, self.rows, self.max_payload)

    def discard(self) -> None:
        try:
            self.file.close()
        finally:
            for path in (self.tmp, self.path):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass


def _items(path: str) -> list[Any]:
    """The messages of a staged file, for ``enqueue_batch`` (bytes when payload-only)."""
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    payloads: list[Any] = table.column("payload").to_pylist()
    if table.num_columns == 1:
        return payloads
    names = table.column_names
    headers = table.column("headers").to_pylist() if "headers" in names else None
    priority = table.column("priority").to_pylist() if "priority" in names else None
    ttl = table.column("ttl").to_pylist() if "ttl" in names else None
    dedup = table.column("dedup_id").to_pylist() if "dedup_id" in names else None
    items: list[Any] = []
    for i, payload in enumerate(payloads):
        h = headers[i] if headers is not None else None
        p = priority[i] if priority is not None else None
        d = dedup[i] if dedup is not None else None
        items.append(
            Item(
                payload,
                headers=dict(h) if h else None,
                priority=1 if p is None else p,
                ttl=ttl[i] if ttl is not None else None,
                dedup_id=d,
            )
        )
    return items
