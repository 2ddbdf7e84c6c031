"""``df.write.format("ledgerq").mode("append").save(root)``: rows into sharded queues.

The rows go into the shards of a sharded queue under ``root`` - the directories
:func:`ledgerq.open_sharded` uses (``root/[prefix.]<bits>.<index:03x>``, the count
recorded in ``root/[prefix.]ledgerq-shards.json``), so ``open_sharded(root, shards)``
and the Spark reader both see what a job wrote.  A row with a ``key`` goes to shard
``xxh3_64(key) % shards`` (as ``open_sharded`` routes it); without a key, to the shard
of its ``group``, else of its ``dedup_id``, else to shard ``partition % shards``.

A job must not leave half of itself visible, and its tasks must not contend for the
queues, so a write has two phases:

1. **Tasks stage.**  Each task (``write``, on an executor) splits its rows by shard and
   writes each shard's rows to its own Arrow IPC file under
   ``root/_ledgerq_staging/<job>/`` (temp file, fsync, rename, fsync of the directory).
   Nothing is visible to consumers yet, and tasks never open a queue.
2. **The driver publishes.**  ``commit`` (on the driver, once every task succeeded)
   opens *every* shard queue first, in shared mode, so beside the processes that use
   them (``ledgerq.open(path, shared=True)``, worker pools) - waiting up to
   ``lock_timeout`` seconds for a handle that holds one exclusively - then appends each
   staged file with one ``enqueue_batch``
   (all-or-nothing, one write), fsyncs each shard and closes it, and deletes the
   staging directory.  If any shard cannot be opened, nothing is published.

``abort`` (a task or the job failed) deletes the job's staging directory: nothing was
published, nothing is visible.  The one window left is a crash or an I/O error *while*
``commit`` publishes: shards already appended keep their batches, each of which is
whole (never a torn batch), and the staging directory is left for inspection.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

import ledgerq
from ledgerq import Options
from ledgerq._errors import ConfigError, QueueLockedError
from ledgerq._options import MAX_SECONDS
from ledgerq.segment.encryption import sealer_for, stored_block
from ledgerq.segment.files import fsync_dir
from ledgerq.shard import (
    existing_shard_counts,
    read_shard_count,
    shard_dir_name,
    shard_index,
    write_shard_count,
)
from ledgerq.spark._columns import ROUTED_BY, check_columns, items, normalize
from ledgerq.spark._plan import encryption_key_option

__all__ = ["STAGING_DIR", "LedgerqWriter", "StagedFile", "StagedTask"]

logger = logging.getLogger("ledgerq")

STAGING_DIR = "_ledgerq_staging"  # under root; "_" hides it from readers (Spark's rule)
_DEFAULT_SHARDS = 8
_DEFAULT_LOCK_TIMEOUT_S = 30.0
# Keyword arguments of ledgerq.open that are not queue options, and why a write
# takes none of them as queue.<name>.
_NOT_QUEUE_OPTIONS = {
    "shared": "a ledgerq write always opens its queues in shared mode, beside the processes "
    "that use them; drop the option",
    "lock_timeout": "give the writer option lock_timeout (seconds) instead",
    "encryption_key": "give the key as the writer option encryption_key_hex (64 hex digits)",
    "remember_options": "a write stores the queue.* options it is given, as ledgerq.open does",
    "clock": "a write uses the system clock",
}
_EXAMPLES = "queue.segment_size=1048576, queue.sync=always, queue.dedup_window=600"


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


def _queue_option_names() -> list[str]:
    return sorted(f.name for f in dataclasses.fields(Options) if f.name not in _NOT_QUEUE_OPTIONS)


def _queue_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``queue.<name>`` writer options, for ``ledgerq.open`` of the shard queues.

    Values are parsed as JSON, else taken as strings.  Raises :class:`ConfigError`
    naming the option for an unknown one or a bad value, before anything is written.
    """
    found: dict[str, Any] = {}
    raws: dict[str, str] = {}
    valid = _queue_option_names()
    for raw_name, raw in options.items():
        name = raw_name.lower()
        if not name.startswith("queue."):
            continue
        option = name.removeprefix("queue.")
        if option in _NOT_QUEUE_OPTIONS:
            raise ConfigError(f"option {name} is not taken: {_NOT_QUEUE_OPTIONS[option]}")
        if option not in valid:
            raise ConfigError(
                f"unknown option {name}; the queue.* options are those of ledgerq.open: "
                f"{', '.join('queue.' + v for v in valid)}"
            )
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw  # a plain string such as sync=always
        try:
            Options(**{option: value})
        except (ConfigError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"option {name}={raw!r} is invalid: {exc} (values are read as JSON, "
                f"else as text: {_EXAMPLES})"
            ) from None
        found[option] = value
        raws[name] = raw
    try:
        Options(**found)  # the options one by one were fine; together?
    except (ConfigError, TypeError, ValueError) as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in sorted(raws.items()))
        raise ConfigError(f"the options {given} do not go together: {exc}") from None
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
        lock_timeout = _lock_timeout(options.get("lock_timeout"))
        queue_options = _queue_options(options)
        key = encryption_key_option(options)  # the shard queues are encrypted with it
        for index in range(shards):
            _check_key(os.path.join(root, shard_dir_name(prefix, shards, index)), key)
        if key is not None:
            queue_options["encryption_key"] = key
        check_columns(schema)
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
        staged = normalize(batch, f"partition {partition}")
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
        columns = [c for c in (_column(batch, name) for name in ROUTED_BY) if c is not None]
        if not columns:
            return {fallback: None}
        shards = self.shards
        groups: dict[int, list[int]] = {}
        for row, values in enumerate(zip(*(c.to_pylist() for c in columns), strict=True)):
            chosen = next((v for v in values if v is not None), None)  # the first one given
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
        """Open every shard queue in shared mode, waiting for exclusive holders; all or none.

        Shared, so that the write runs beside the processes that use the queues
        (``ledgerq.open(path, shared=True)``, worker pools); only a handle that holds a
        queue exclusively keeps the write out, for up to ``lock_timeout`` seconds.
        """
        return list(self._open_shards(range(self.shards)).values())

    def _open_shards(self, indexes: Iterable[int]) -> dict[int, Any]:
        """:meth:`_open_all` for the shards ``indexes`` only, by index."""
        opened: dict[int, Any] = {}
        deadline = time.monotonic() + self.lock_timeout
        try:
            for index in indexes:
                path = os.path.join(self.root, shard_dir_name(self.prefix, self.shards, index))
                delay = 0.01
                while True:
                    try:
                        queue = ledgerq.open(
                            path, shared=True, lock_timeout=self.lock_timeout, **self.queue_options
                        )
                        break
                    except QueueLockedError as exc:
                        if time.monotonic() >= deadline:
                            raise self._locked(path, exc) from exc
                        time.sleep(delay)  # a poll of the lock: nothing to wait on across processes
                        delay = min(delay * 2, 0.5)
                opened[index] = queue
        except BaseException:
            for q in opened.values():
                q.close()
            raise
        return opened

    def _locked(self, path: str, exc: QueueLockedError) -> QueueLockedError:
        """The error of a shard that stayed locked: what holds it and what to do, for Spark."""
        if exc.held_by != "exclusive":
            return exc
        return QueueLockedError(
            path,
            held_by="exclusive",
            detail=(
                "is open exclusively by another handle (ledgerq.open without shared=True, "
                f"in this or another process); the write waited {self.lock_timeout:g} s "
                "(option lock_timeout) and published nothing. A ledgerq write opens its "
                "queues in shared mode: open the other handles with shared=True to use "
                "them beside it, or close them, then write again"
            ),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Delete the job's staged files: nothing of it was published."""
        shutil.rmtree(self.staging, ignore_errors=True)
        _remove_if_empty(os.path.dirname(self.staging))
        logger.warning("ledgerq: write to %s aborted; its staged rows were deleted", self.root)


def _check_key(path: str, key: bytes | None) -> None:
    """Refuse a key (or its absence) that does not fit the shard queue at ``path``, from
    its stored files, before anything is written (a queue not created yet takes any)."""
    block = stored_block(path)
    if block is None:
        return
    if block and key is None:
        raise ConfigError(
            f"the shard queue {path} is encrypted: give its key with "
            ".option('encryption_key_hex', KEY.hex()) (64 hex digits); nothing was written"
        )
    if not block and key is not None:
        raise ConfigError(
            f"the shard queue {path} is not encrypted, and a plain queue is not encrypted in "
            "place: write without option encryption_key_hex, or to a new root; nothing was "
            "written"
        )
    try:
        sealer_for(block, key, path)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (option encryption_key_hex); nothing was written") from None


def _lock_timeout(raw: str | None) -> float:
    if raw is None:
        return _DEFAULT_LOCK_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_SECONDS:  # NaN and infinity too
        raise ConfigError(f"option lock_timeout must be a number of seconds above 0, got {raw!r}")
    return seconds


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


def _remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass  # another job is staging there, or it is gone already


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
    """The messages of a staged file, for ``enqueue_batch``."""
    with pa.memory_map(path) as source:
        return items(pa.ipc.open_file(source).read_all())
