"""``foreachBatch(ledgerq.spark.foreach_batch_writer(root))``: each batch id written once."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark import require_spark

require_spark()

import pyarrow as pa  # noqa: E402
from pyspark.sql.types import StringType, StructField, StructType  # noqa: E402

import ledgerq  # noqa: E402
from ledgerq.shard import shard_dir_name  # noqa: E402
from ledgerq.spark import foreach_batch_writer  # noqa: E402
from ledgerq.spark._foreach_batch import (  # noqa: E402
    BATCH_OPTION,
    QUERY_OPTION,
    StreamBatchWriter,
)
from ledgerq.spark._stream_write import MARK_HEADER, STREAMS_DIR  # noqa: E402
from ledgerq.spark._write import STAGING_DIR  # noqa: E402
from tests.spark.helpers import await_termination, parquet_stream, shard_payloads  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
_SCHEMA = StructType([StructField("payload", StringType()), StructField("key", StringType())])


def test_a_batch_id_called_again_adds_nothing(spark: Any, tmp_path: Path) -> None:
    write = foreach_batch_writer(str(tmp_path), query_id="nightly", shards=2)
    rows = [(f"r{i}", f"k{i}") for i in range(30)]
    df = spark.createDataFrame(rows, "payload string, key string").repartition(2)
    write(df, 0)
    write(df, 0)  # Spark replays batch 0
    expected = sorted(p.encode() for p, _ in rows)
    assert sorted(shard_payloads(tmp_path, 2)) == expected, "the replay added nothing"
    write(spark.createDataFrame([("late", None)], df.schema), 1)
    assert sorted(shard_payloads(tmp_path, 2)) == sorted([*expected, b"late"])
    assert (tmp_path / STREAMS_DIR / "nightly" / "last.json").exists()
    assert not (tmp_path / STAGING_DIR).exists(), "staged files are deleted"
    # another query id is another stream: its batch 0 is written
    foreach_batch_writer(str(tmp_path), query_id="other")(df.limit(1), 0)
    assert len(shard_payloads(tmp_path, 2)) == len(rows) + 2
    # a wrong column type fails the call, with nothing written
    with pytest.raises(Exception, match="column payload has type bigint"):
        write(spark.range(3).withColumnRenamed("id", "payload"), 2)
    assert len(shard_payloads(tmp_path, 2)) == len(rows) + 2
    with pytest.raises(ledgerq.ConfigError, match="called outside a streaming query"):
        foreach_batch_writer(str(tmp_path))(df, 5)
    with pytest.raises(ledgerq.ConfigError, match="holds 2 shards, not 4"):
        foreach_batch_writer(str(tmp_path), shards=4)
    with pytest.raises(ledgerq.ConfigError, match=r"unknown option queue\.segmnt_size"):
        foreach_batch_writer(str(tmp_path), **{"queue.segmnt_size": 4096})
    with pytest.raises(ledgerq.ConfigError, match=r"unknown option\(s\) shard; .* shards"):
        foreach_batch_writer(str(tmp_path), shard=4)


def _run(spark: Any, source: Path, root: Path, checkpoint: Path) -> str:
    query = (
        parquet_stream(spark, source, "payload binary")
        .writeStream.foreachBatch(foreach_batch_writer(str(root), shards=2))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_termination(query)
    return str(query.id)


def test_a_query_restarted_from_its_checkpoint_replays_a_batch_once(
    spark: Any, tmp_path: Path
) -> None:
    source, root, checkpoint = tmp_path / "in", tmp_path / "root", tmp_path / "ck"
    rows = [(f"f-{i}".encode(),) for i in range(20)]
    expected = [r[0] for r in rows]
    spark.createDataFrame(rows, "payload binary").coalesce(1).write.parquet(str(source))
    query = _run(spark, source, root, checkpoint)
    assert sorted(shard_payloads(root, 2)) == sorted(expected)
    # As if the query died after the last batch was published but before Spark's
    # checkpoint recorded it: the restart runs that batch again, with the same id.
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    spark.createDataFrame([(b"late",)], "payload binary").write.mode("append").parquet(str(source))
    assert _run(spark, source, root, checkpoint) == query, "the same query, restarted"
    got = shard_payloads(root, 2)
    assert sorted(got) == sorted([*expected, b"late"]), "every row once"
    marks = []
    for i in range(2):
        with ledgerq.follow(root / shard_dir_name("", 2, i), timeout=0) as follower:
            marks += [m.headers[MARK_HEADER] for m in follower if MARK_HEADER in m.headers]
    assert f"{query}:{last}" in marks and len(marks) == len(set(marks))


# The commit of a foreachBatch batch, killed (SIGKILL) after its first shard's append.
_KILLED_COMMIT = """
import os, pickle, signal, sys
import ledgerq.spark._stream_write as sw
real, calls = sw._items, []
def items(path):
    if calls:
        os.kill(os.getpid(), signal.SIGKILL)
    calls.append(path)
    return real(path)
sw._items = items
with open(sys.argv[1], "rb") as f:
    writer, message = pickle.load(f)
writer.commit([message])
"""


def test_a_call_killed_while_publishing_is_finished_by_the_next(tmp_path: Path) -> None:
    root = tmp_path / "root"
    options = {"path": str(root), "shards": "4", QUERY_OPTION: "q", BATCH_OPTION: "0"}
    writer = StreamBatchWriter.create(options, _SCHEMA, False)
    rows = [f"{k}-{i}" for k in ("aaa", "bbb", "ccc", "ddd") for i in range(10)]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(rows), pa.array([r[:3] for r in rows])], ["payload", "key"]
    )
    message = writer.write(iter([batch]))  # what the job's task staged
    assert len({f.shard for f in message.files}) > 1
    state = tmp_path / "commit.pickle"
    state.write_bytes(pickle.dumps((writer, message)))
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_COMMIT, str(state)],
        env={**os.environ, "PYTHONPATH": path},
        stderr=subprocess.PIPE,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert 0 < len(shard_payloads(root, 4)) < len(rows), "killed with some shards written"
    # Spark calls the function again with batch 0: the manifest holds the rows, so no
    # job runs (the DataFrame is not even looked at) and the missing shards are added.
    foreach_batch_writer(str(root), query_id="q", shards=4)(None, 0)  # type: ignore[arg-type]
    assert sorted(shard_payloads(root, 4)) == sorted(r.encode() for r in rows), "every row once"
    assert not (root / STAGING_DIR).exists()
