"""``sdf.writeStream.foreachBatch(foreach_batch_writer(root))``: exactly once, by hand.

``foreachBatch`` hands each micro-batch to a function as a plain DataFrame and its batch
id; Spark calls it again with the same id when the query died before its checkpoint
recorded the batch.  The function :func:`foreach_batch_writer` returns writes the batch
as a batch write does (``_write.py``: tasks stage Arrow files, the driver publishes
them), but commits it through the streaming writer's protocol (``_stream_write``'s
:func:`commit_once`: the record under ``root/_ledgerq_streams/<query id>/``, the
manifest, the marker on each shard's last message, ``last.json``), so a replayed batch
id adds nothing and a commit killed midway is finished by the replay.  The batch write
learns that it is a stream's batch from two writer options that only this module sets
(:data:`QUERY_OPTION`, :data:`BATCH_OPTION`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import BinaryType, StructField, StructType

from ledgerq._errors import ConfigError
from ledgerq.spark._stream_write import commit_once, rows_needed
from ledgerq.spark._write import LedgerqWriter, StagedTask

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["BATCH_OPTION", "QUERY_OPTION", "StreamBatchWriter", "foreach_batch_writer"]

QUERY_OPTION = "ledgerq.stream.query"
BATCH_OPTION = "ledgerq.stream.batch"
_PAYLOAD_ONLY = StructType([StructField("payload", BinaryType())])
_QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's, on the thread running a batch
_OPTIONS = {"shards", "prefix", "lock_timeout", "encryption_key_hex"}  # and queue.*


class StreamBatchWriter(LedgerqWriter):
    """A batch write that is one micro-batch of a stream: committed exactly once."""

    def __init__(self, base: LedgerqWriter, query: str, batch: int) -> None:
        super().__init__(base.root, base.shards, base.prefix, base.queue_options, base.lock_timeout)
        self.query = query
        self.batch = batch

    @classmethod
    def create(
        cls, options: Mapping[str, str], schema: StructType, overwrite: bool
    ) -> StreamBatchWriter:
        """Check the write as a batch write is checked; read the stream's query and batch."""
        base = LedgerqWriter.create(options, schema, overwrite)
        query = _query_name(str(options.get(QUERY_OPTION)))
        try:
            batch = int(str(options.get(BATCH_OPTION)))
        except ValueError:
            raise ConfigError(f"option {BATCH_OPTION} must be a batch id (an integer)") from None
        return cls(base, query, batch)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        fresh = [f for m in messages if isinstance(m, StagedTask) for f in m.files]
        commit_once(self, self.query, self.batch, fresh, self.staging)


def _query_name(query: str) -> str:
    """``query`` if it can name a directory of the stream's record; else ConfigError."""
    if not query or query in (".", "..") or "/" in query or "\\" in query or "\0" in query:
        raise ConfigError(
            f"query_id {query!r} cannot name a stream's record: give a non-empty name "
            "without / (the record is root/_ledgerq_streams/<query_id>/)"
        )
    return query


def _text(name: str, value: object) -> str:
    """A writer option's value as Spark passes it: text (JSON for numbers, booleans, ...)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"option {name}={value!r} is not text, a number, a boolean or JSON"
        ) from None


def foreach_batch_writer(
    root: str | os.PathLike[str], *, query_id: str | None = None, **options: object
) -> Callable[[DataFrame, int], None]:
    """Return ``fn(df, batch_id)`` for ``sdf.writeStream.foreachBatch(fn)``: each micro-batch
    enqueued exactly once into the sharded queues under ``root``.

    ``fn`` writes ``df`` as ``df.write.format("ledgerq").mode("append").save(root)`` does
    (the same columns, routing and ``options``: ``shards=8``, ``prefix=``,
    ``lock_timeout=``, ``encryption_key_hex=``, ``**{"queue.segment_size": 1 << 20}``),
    and records the batch id with what it wrote, atomically with the data, as a
    ``writeStream.format("ledgerq")`` query does: called again with a batch id already
    published (a query restarted from its checkpoint replays the batch it had not
    recorded), it adds nothing; a call killed while publishing is finished by the next
    call with that id.  When ``fn`` returns, the batch is durable (fsynced).

    The record is ``root/_ledgerq_streams/<query_id>/``; ``query_id`` defaults to the
    running query's id (Spark's, kept in the checkpoint, so the same across restarts).
    Give one to call ``fn`` outside a streaming query; batch ids count per ``query_id``.

    Raises :class:`ledgerq.ConfigError` for an unknown or bad option, a shard count
    other than the one recorded under ``root``, or an encrypted target without its key -
    here, before the query starts; a column of a wrong type fails the call, with nothing
    written.
    """
    unknown = sorted(n for n in options if n not in _OPTIONS and not n.startswith("queue."))
    if unknown:
        raise ConfigError(
            f"foreach_batch_writer got unknown option(s) {', '.join(unknown)}; it takes the "
            f"options of a ledgerq write: {', '.join(sorted(_OPTIONS))} and queue.<option>"
        )
    given = {name: _text(name, value) for name, value in options.items()}
    # Absolute here, on the driver: the commit runs in another process.
    given["path"] = os.path.abspath(root)
    LedgerqWriter.create(given, _PAYLOAD_ONLY, False)  # the options' checks, now
    fixed = None if query_id is None else _query_name(query_id)

    def write(df: DataFrame, batch_id: int) -> None:
        query = fixed or _running_query(df)
        batch = int(batch_id)
        if not rows_needed(given["path"], query, batch):
            # Published already, or a killed attempt left its rows: no job to run.
            target = LedgerqWriter.create(given, _PAYLOAD_ONLY, False)
            commit_once(target, query, batch, [], None)
            return
        writer = df.write.format("ledgerq").mode("append").options(**given)
        writer.option(QUERY_OPTION, query).option(BATCH_OPTION, str(batch)).save()

    write.__doc__ = f"Write a micro-batch into the sharded queues under {root} exactly once."
    return write


def _running_query(df: DataFrame) -> str:
    """The id of the streaming query running ``df``'s batch (a ConfigError outside one)."""
    query = None
    try:
        query = df.sparkSession.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
    except Exception:
        pass
    if not query:
        raise ConfigError(
            "foreach_batch_writer's function was called outside a streaming query (no query "
            "id): pass it to writeStream.foreachBatch, or give foreach_batch_writer(root, "
            "query_id=...) a name for the stream's record"
        )
    return _query_name(query)
