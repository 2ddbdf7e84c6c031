"""``sdf.writeStream.format("ledgerq").option("checkpointLocation", CK).start(root)``.

Each micro-batch is written as a batch write is (``_write.py``: tasks stage Arrow files,
the driver publishes them into every shard queue, opened shared), plus what makes it
exactly once across a killed query restarted from its checkpoint.  Spark replays a
micro-batch with its original batch id when the query died before the checkpoint
recorded the batch as committed; the commit must then add nothing it added before.

The stream's record is ``root/_ledgerq_streams/<query id>/`` (the query id is Spark's,
kept in the checkpoint's ``metadata``: the same across restarts):

* ``stream.json`` - the checkpoint it belongs to (an absolute path), written when the query
  first starts with a checkpoint that has its id, taken over by a moved one;
* ``last.json`` - the last batch id whose every shard is published (temp, fsync,
  rename);
* ``<batch>.json`` - the manifest of a batch being published: its staged files and,
  per shard, an id below which nothing of it can be.

``commit(messages, batch)``, under a lock of the stream directory:

1. ``batch <= last``: a replay of a published batch - its new staged files are deleted,
   nothing is enqueued.
2. No manifest: the first commit of the batch.  Open the shards it writes (shared;
   every shard at the first batch, which creates them), write the manifest (the
   staged files, each shard's last complete id), then enqueue each shard's rows with
   one ``enqueue_batch`` - all or nothing, and the batch's **last item carries the
   header** ``ledgerq-stream: <query id>:<batch>`` (bytes and that one ``Item``:
   ``enqueue_batch`` keeps its plain encoding for the bytes) - then fsync every
   opened shard, write ``last.json``, delete the manifest and the staged files.
3. A manifest is there: a commit of this batch was killed while publishing.  The new
   staged files are deleted and the manifest's (the first attempt's rows) are used;
   a shard whose log holds the marker after the recorded id already has its rows
   (the marker is in the same all-or-nothing append as they are) and is skipped; the
   others are appended; then as in 2.

So a kill at any point leaves each shard with all of a batch's rows or none of them,
and the record of which, in the shard itself; the replay finishes exactly the shards
that are missing.  :func:`commit_once` is that commit; ``_foreach_batch.py`` runs it for
the batches of ``foreachBatch`` too.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

import ledgerq
from ledgerq import Item
from ledgerq._errors import ConfigError
from ledgerq.segment.files import fsync_dir
from ledgerq.segment.readonly import last_complete_id
from ledgerq.shard import shard_dir_name, write_shard_count
from ledgerq.spark._write import (
    STAGING_DIR,
    LedgerqWriter,
    StagedFile,
    StagedTask,
    _items,
    _remove_if_empty,
)

__all__ = [
    "MARK_HEADER",
    "STREAMS_DIR",
    "LedgerqStreamWriter",
    "StagedBatch",
    "commit_once",
    "rows_needed",
]

logger = logging.getLogger("ledgerq")

STREAMS_DIR = "_ledgerq_streams"  # under root; "_" hides it from readers
MARK_HEADER = "ledgerq-stream"  # on the last message of each shard's part of a batch


@dataclass(frozen=True, slots=True)
class StagedBatch(WriterCommitMessage):
    """What a task of a micro-batch reports: its staged files and the query's id."""

    task: StagedTask
    query: str
    batch: int


class LedgerqStreamWriter(DataSourceStreamArrowWriter):
    """Micro-batches into sharded queues, exactly once; see the module docstring."""

    def __init__(self, target: LedgerqWriter, query: str | None) -> None:
        self.target = target
        self.query = query  # None: no checkpoint was readable at start; tasks tell it

    @classmethod
    def create(
        cls, options: Mapping[str, str], schema: StructType, overwrite: bool
    ) -> LedgerqStreamWriter:
        """Check the stream before any batch runs: columns, shards, options, checkpoint."""
        if overwrite:
            raise ConfigError(
                "a ledgerq stream appends: outputMode('complete') would replace the queues' "
                "contents, which an append-only log does not do; use outputMode('append')"
            )
        target = LedgerqWriter.create(options, schema, False)
        checkpoint = options.get("checkpointLocation")
        query = _check_checkpoint(target.root, checkpoint) if checkpoint else None
        return cls(target, query)

    # -- executors -----------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedBatch:
        from pyspark import TaskContext

        context = TaskContext.get()
        raw = context.getLocalProperty("streaming.sql.batchId") if context else None
        if context is None or raw is None:
            raise RuntimeError("a ledgerq stream write ran outside a streaming micro-batch")
        batch = int(raw)
        query = self.query or context.getLocalProperty("sql.streaming.queryId")
        if not query:  # batch ids are per query: without its id, replays are unknowable
            raise RuntimeError("a ledgerq stream write found no streaming query id")
        task = copy.copy(self.target)
        task.job = f"{self.target.job}.b{batch}"  # one staging directory per micro-batch
        return StagedBatch(task.write(iterator), query, batch)

    # -- the driver ----------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staged = [m for m in messages if isinstance(m, StagedBatch)]
        query = self.query or next((m.query for m in staged), None)
        if query is None:
            return  # no task ran: an empty batch, nothing to publish or remember
        fresh = [f for m in staged for f in m.task.files]
        commit_once(self.target, query, batchId, fresh, self._staging(batchId))

    def _staging(self, batch: int) -> str:
        """Where this attempt of ``batch`` staged (one directory per micro-batch)."""
        return os.path.join(self.target.root, STAGING_DIR, f"{self.target.job}.b{batch}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """A task of the batch failed: delete its staged files; nothing was published."""
        shutil.rmtree(self._staging(batchId), ignore_errors=True)
        logger.warning(
            "ledgerq: batch %d to %s aborted; its staged rows were deleted",
            batchId,
            self.target.root,
        )


def commit_once(
    target: LedgerqWriter, query: str, batch: int, fresh: list[StagedFile], staging: str | None
) -> None:
    """Publish batch ``batch`` of stream ``query`` into ``target``'s shards exactly once.

    ``fresh``: the files this attempt staged, under ``staging`` (deleted when the batch
    was published before, or when a killed first attempt's files are the batch; None
    when the attempt staged nothing).  The protocol of the module docstring; the
    streaming writer's commit and :func:`ledgerq.spark.foreach_batch_writer`'s both
    run it, on the driver side.
    """
    log = StreamLog(target.root, query)
    with log.locked():
        if batch <= log.last():
            logger.info("ledgerq: batch %d of %s was published already", batch, query)
            _discard(staging)
            stale = log.manifest(batch)  # killed after last.json, before its removal
            for path in stale["dirs"] if stale else ():
                shutil.rmtree(path, ignore_errors=True)
            log.drop_manifest(batch)
            _remove_if_empty(os.path.join(target.root, STAGING_DIR))
            return
        manifest = log.manifest(batch)
        if manifest is None and not fresh:
            return  # no rows
        if manifest is not None:
            _discard(staging)  # the first attempt's rows are the batch's
        published = _publish(target, log, batch, fresh, manifest)
        log.set_last(batch)
        log.drop_manifest(batch)
    for path in published:
        shutil.rmtree(path, ignore_errors=True)
    _remove_if_empty(os.path.join(target.root, STAGING_DIR))


def _discard(staging: str | None) -> None:
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)


def rows_needed(root: str, query: str, batch: int) -> bool:
    """Whether a commit of ``batch`` needs new rows: not when it is published, nor when
    a killed attempt's manifest holds the batch's rows (read only, without the lock: a
    commit decides again under it)."""
    log = StreamLog(root, query)
    return batch > log.last() and log.manifest(batch) is None


def _publish(
    target: LedgerqWriter,
    log: StreamLog,
    batch: int,
    fresh: list[StagedFile],
    manifest: dict[str, Any] | None,
) -> list[str]:
    """Publish the batch; return the staging directories it came from."""
    write_shard_count(target.root, target.prefix, target.shards)
    paths = [
        os.path.join(target.root, shard_dir_name(target.prefix, target.shards, i))
        for i in range(target.shards)
    ]
    listed = fresh if manifest is None else [StagedFile(*f) for f in manifest["files"]]
    # The shards the batch writes, and any not created yet (the first batch creates
    # every shard with the write's options, as a batch write does); the others are
    # not opened - an open and a close of a shard queue cost ~10 ms each.
    needed = {f.shard for f in listed} | {
        i for i, path in enumerate(paths) if not os.path.isdir(path)
    }
    queues = target._open_shards(sorted(needed))
    try:
        if manifest is None:
            files = fresh
            floors = {f.shard: last_complete_id(paths[f.shard]) for f in files}
            manifest = {
                "batch": batch,
                "files": [dataclasses.astuple(f) for f in files],
                "dirs": sorted({os.path.dirname(f.path) for f in files}),
                "floors": {str(k): v for k, v in floors.items()},
            }
            log.write_manifest(batch, manifest)
            recovering = False
        else:
            files = listed
            floors = {int(k): v for k, v in manifest["floors"].items()}
            recovering = True
        by_shard: dict[int, list[StagedFile]] = {}
        for f in sorted(files, key=lambda f: (f.shard, f.path)):
            limit = queues[f.shard].options.max_message_size
            if f.max_payload > limit:
                raise ConfigError(
                    f"a payload of {f.max_payload} bytes exceeds max_message_size={limit} "
                    f"of shard {f.shard}; batch {batch} was not published"
                )
            by_shard.setdefault(f.shard, []).append(f)
        marker = f"{log.query}:{batch}"
        key = target.queue_options.get("encryption_key")
        for shard, shard_files in by_shard.items():
            if recovering and _has_marker(paths[shard], floors[shard] + 1, marker, key):
                continue  # this shard got the batch before the kill
            batch_items: list[Any] = []
            for f in shard_files:
                batch_items.extend(_items(f.path))
            if not batch_items:
                continue
            queue = queues[shard]
            _mark(batch_items, marker, dedup=queue.options.dedup_window is not None)
            queue.enqueue_batch(batch_items)
        for q in queues.values():
            q.sync()
    finally:
        for q in queues.values():
            q.close()
    return list(manifest["dirs"])


def _mark(batch_items: list[Any], marker: str, *, dedup: bool) -> None:
    """Put the marker header on the last item that will certainly be written.

    An item with a ``unique_key`` adds nothing while its key is held, and, with a dedup
    window, one with a ``dedup_id`` may be dropped as a duplicate, so the marker goes on
    the last item with neither (if every item has one, the replay of a commit killed
    between shards is deduplicated by those keys alone: within the window, while the
    key is held).
    """
    for i in range(len(batch_items) - 1, -1, -1):
        item = batch_items[i]
        if isinstance(item, Item):
            if item.unique_key is not None or (dedup and item.dedup_id is not None):
                continue
            headers = {**(item.headers or {}), MARK_HEADER: marker}
            batch_items[i] = dataclasses.replace(item, headers=headers)
        else:
            batch_items[i] = Item(item, headers={MARK_HEADER: marker})
        return


def _has_marker(path: str, from_id: int, marker: str, key: bytes | None) -> bool:
    """Whether the shard's log holds the batch's marker at ``from_id`` or after."""
    with ledgerq.follow(path, from_id, timeout=0, encryption_key=key) as follower:
        return any(m.headers.get(MARK_HEADER) == marker for m in follower)


def _check_checkpoint(root: str, checkpoint: str) -> str | None:
    """The query id of ``checkpoint``; refuse a checkpoint that wrote somewhere else.

    A checkpoint that has committed batches but whose query has no record under
    ``root`` wrote those batches to another path (or ``root`` was recreated): going on
    would silently skip them here.  A new query (no metadata yet) gets its id from the
    tasks.
    """
    local = _local(checkpoint)
    query = _checkpoint_query(local)
    if query is None:
        return None
    log = StreamLog(root, query)
    committed = _committed_batches(local)
    if committed and not os.path.exists(log.directory):
        raise ConfigError(
            f"the checkpoint {checkpoint} is of query {query}, which committed batches up to "
            f"{max(committed)} but none of them to {root} (it wrote to another path, or "
            f"{root} was recreated); nothing was written. Start with a new "
            "checkpointLocation to write this stream to this root"
        )
    log.register(checkpoint)
    return query


def _local(checkpoint: str) -> str:
    """A checkpoint location as an absolute local path ('' for none)."""
    if not checkpoint:
        return ""
    return os.path.abspath(checkpoint.removeprefix("file:"))


def _checkpoint_query(checkpoint: str) -> str | None:
    """The query id in a checkpoint's ``metadata``; None without a readable one."""
    try:
        with open(os.path.join(checkpoint, "metadata"), encoding="utf-8") as f:
            return str(json.loads(f.readline())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_checkpoint_of(checkpoint: str, query: str) -> bool:
    return bool(checkpoint) and _checkpoint_query(checkpoint) == query


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _committed_batches(checkpoint: str) -> list[int]:
    try:
        names = os.listdir(os.path.join(checkpoint, "commits"))
    except FileNotFoundError:
        return []
    return [int(n) for n in names if n.isdigit()]


class StreamLog:
    """The record of one query's published batches under ``root``."""

    def __init__(self, root: str, query: str) -> None:
        self.query = query
        self.root = root
        self.directory = os.path.join(root, STREAMS_DIR, query)

    def register(self, checkpoint: str) -> None:
        """Record that ``checkpoint`` is this query's; refuse a second live one.

        A checkpoint copied while its original lives on holds the same query id: the
        two would count batch ids alike, and one's batches would be skipped here as
        replays of the other's.  A checkpoint moved or restored from a copy (the
        recorded one is gone) takes the record over.
        """
        here = _local(checkpoint)
        found = self._read("stream.json")
        if found is not None:
            recorded = _local(str(found.get("checkpoint") or ""))
            if recorded == here:
                return
            if _is_checkpoint_of(recorded, self.query) and not _same_dir(recorded, here):
                raise ConfigError(
                    f"the checkpoints {checkpoint} and {recorded} are of one query, "
                    f"{self.query}, which writes to {self.root} (one is a copy of the other): "
                    "the two would count batches alike and one's would be skipped as the "
                    "other's; nothing was written. Start the new query with a new "
                    f"checkpointLocation (or delete the one no longer used)"
                )
        os.makedirs(self.directory, exist_ok=True)
        self._write("stream.json", {"query": self.query, "checkpoint": here})

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One commit of this query at a time (two restarts racing on one checkpoint)."""
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(os.path.join(self.directory, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def last(self) -> int:
        found = self._read("last.json")
        return -1 if found is None else int(found["batch"])

    def set_last(self, batch: int) -> None:
        self._write("last.json", {"batch": batch})

    def manifest(self, batch: int) -> dict[str, Any] | None:
        return self._read(f"{batch}.json")

    def write_manifest(self, batch: int, manifest: dict[str, Any]) -> None:
        self._write(f"{batch}.json", manifest)

    def drop_manifest(self, batch: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, f"{batch}.json"))

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.directory, name), encoding="utf-8") as f:
                found: dict[str, Any] = json.load(f)
                return found
        except FileNotFoundError:
            return None

    def _write(self, name: str, value: dict[str, Any]) -> None:
        """Whole or not at all: temp file, fsync, rename, fsync of the directory."""
        path = os.path.join(self.directory, name)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(value, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(self.directory)
