"""Streaming writes: every micro-batch enqueued exactly once, across replays and kill -9."""

from __future__ import annotations

import copy
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark import require_spark

require_spark()

import pyarrow as pa  # noqa: E402
from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
)

import ledgerq  # noqa: E402
from ledgerq._errors import ConfigError  # noqa: E402
from ledgerq.shard import shard_dir_name, shard_index  # noqa: E402
from ledgerq.spark._stream_write import (  # noqa: E402
    MARK_HEADER,
    STREAMS_DIR,
    LedgerqStreamWriter,
    StagedBatch,
)
from tests.spark.helpers import shard_payloads, stream_into_ledgerq  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
SCHEMA = StructType([StructField("payload", BinaryType()), StructField("key", BinaryType())])


def _stage(writer: LedgerqStreamWriter, batch: int, payloads: list[bytes]) -> StagedBatch:
    """What a task of micro-batch ``batch`` reports, staged as ``write`` stages it."""
    task = copy.copy(writer.target)
    task.job = f"{writer.target.job}.b{batch}"
    keys = [p[:3] for p in payloads]  # spread over the shards
    rows = pa.RecordBatch.from_arrays(
        [pa.array(payloads, pa.binary()), pa.array(keys, pa.binary())], names=["payload", "key"]
    )
    return StagedBatch(task.write(iter([rows])), "query-1", batch)


def _writer(root: Path, **options: str) -> LedgerqStreamWriter:
    return LedgerqStreamWriter.create({"path": str(root), "shards": "4", **options}, SCHEMA, False)


def test_a_replayed_batch_id_adds_nothing(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    first = [f"r{i}".encode() for i in range(50)]
    writer.commit([_stage(writer, 0, first)], 0)
    assert sorted(shard_payloads(tmp_path, 4)) == sorted(first)
    # the query restarted: batch 0 again (a new writer, new staged files), then batch 1
    again = _writer(tmp_path)
    again.commit([_stage(again, 0, first)], 0)
    assert sorted(shard_payloads(tmp_path, 4)) == sorted(first), "a replay adds nothing"
    second = [f"s{i}".encode() for i in range(20)]
    again.commit([_stage(again, 1, second)], 1)
    assert sorted(shard_payloads(tmp_path, 4)) == sorted(first + second)
    assert not list((tmp_path / "_ledgerq_staging").glob("*")), "staged files are deleted"


def test_a_commit_opens_only_the_shards_its_batch_writes(tmp_path: Path) -> None:
    # A consumer holds shard 2 exclusively: a micro-batch with no row for shard 2 is
    # published all the same; one with a row for it waits lock_timeout, then fails
    # saying so and publishes nothing - not even its rows for the other shards.
    writer = _writer(tmp_path, lock_timeout="0.3")
    ledgerq.open_sharded(tmp_path, 4).close()
    elsewhere = [p for p in (f"a{i}".encode() for i in range(200)) if shard_index(p[:3], 4) != 2]
    for_two = [p for p in (f"b{i}".encode() for i in range(200)) if shard_index(p[:3], 4) == 2]
    holder = ledgerq.open(tmp_path / shard_dir_name("", 4, 2))
    try:
        writer.commit([_stage(writer, 0, elsewhere[:30])], 0)
        assert sorted(shard_payloads(tmp_path, 4)) == sorted(elsewhere[:30])
        with pytest.raises(ledgerq.QueueLockedError, match="exclusively"):
            writer.commit([_stage(writer, 1, elsewhere[30:40] + for_two[:5])], 1)
        assert sorted(shard_payloads(tmp_path, 4)) == sorted(elsewhere[:30])
        assert len(holder) == 0
    finally:
        holder.close()
    again = _writer(tmp_path)  # the query restarted: batch 1 is published once
    again.commit([_stage(again, 1, elsewhere[30:40] + for_two[:5])], 1)
    assert sorted(shard_payloads(tmp_path, 4)) == sorted(elsewhere[:40] + for_two[:5])


def test_unique_keys_in_a_stream_and_the_marker_on_a_row_that_is_surely_written(
    tmp_path: Path,
) -> None:
    schema = StructType(
        [StructField("payload", BinaryType()), StructField("unique_key", StringType())]
    )
    writer = LedgerqStreamWriter.create({"path": str(tmp_path), "shards": "2"}, schema, False)
    task = copy.copy(writer.target)
    task.job = f"{writer.target.job}.b0"
    rows = pa.RecordBatch.from_arrays(
        [pa.array([b"a", b"b", b"c", b"d"]), pa.array(["u1", "u1", None, "u1"])],
        names=["payload", "unique_key"],
    )
    staged = StagedBatch(task.write(iter([rows])), "query-1", 0)
    writer.commit([staged], 0)
    got = {}
    for i in range(2):
        with ledgerq.follow(tmp_path / shard_dir_name("", 2, i), timeout=0) as follower:
            got.update({m.payload: m.headers.get(MARK_HEADER) for m in follower})
    # u1 is held by a: b and d add nothing.  A row with a unique key may add nothing,
    # so it never carries the marker: c (shard 0) does; u1's shard 1 has no row without
    # a unique key and gets none (a replay there is held off by the key itself).
    assert shard_index("u1", 2) == 1
    assert got == {b"a": None, b"c": "query-1:0"}
    writer.commit([staged], 0)  # replayed: nothing more
    assert sorted(shard_payloads(tmp_path, 2)) == [b"a", b"c"]
    assert not (tmp_path / "_ledgerq_staging").exists()


_KILLED_COMMIT = """
import os, pickle, signal, sys
import ledgerq.spark._stream_write as sw

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if sys.argv[2] == "between-shards":  # the second shard's rows are read after the first's append
    real, calls = sw._items, []
    def items(path):
        if calls:
            die()
        calls.append(path)
        return real(path)
    sw._items = items
else:  # every shard written, the batch not yet recorded as published
    sw.StreamLog.set_last = die
with open(sys.argv[1], "rb") as f:
    writer, message = pickle.load(f)
writer.commit([message], 0)
"""


@pytest.mark.parametrize("where", ["between-shards", "before-last"])
def test_a_commit_killed_midway_is_finished_by_the_replay(tmp_path: Path, where: str) -> None:
    root = tmp_path / "root"
    writer = _writer(root)
    rows = [f"{k}-{i}".encode() for k in ("aaa", "bbb", "ccc", "ddd") for i in range(30)]
    message = _stage(writer, 0, rows)
    assert len({f.shard for f in message.task.files}) > 1
    state = tmp_path / "commit.pickle"
    state.write_bytes(pickle.dumps((writer, message)))
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_COMMIT, str(state), where],
        env={**os.environ, "PYTHONPATH": path},
        stderr=subprocess.PIPE,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    partial = shard_payloads(root, 4)
    if where == "between-shards":
        assert 0 < len(partial) < len(rows), "killed with some shards written"
    else:
        assert sorted(partial) == sorted(rows)
    # Spark replays batch 0 after the restart: a new attempt stages the rows again
    again = _writer(root)
    again.commit([_stage(again, 0, rows)], 0)
    assert sorted(shard_payloads(root, 4)) == sorted(rows), "every row exactly once"
    assert not list((root / "_ledgerq_staging").glob("*")), "both attempts' files deleted"


def test_bad_input_fails_at_the_start_and_writes_nothing(tmp_path: Path) -> None:
    bad = StructType([StructField("payload", LongType())])
    with pytest.raises(ConfigError, match="column payload has type bigint"):
        LedgerqStreamWriter.create({"path": str(tmp_path)}, bad, False)
    _writer(tmp_path)  # records 4 shards at the first commit
    writer = _writer(tmp_path)
    writer.commit([_stage(writer, 0, [b"x"])], 0)
    with pytest.raises(ConfigError, match="holds 4 shards, not 8"):
        LedgerqStreamWriter.create({"path": str(tmp_path), "shards": "8"}, SCHEMA, False)
    with pytest.raises(ConfigError, match="outputMode"):
        LedgerqStreamWriter.create({"path": str(tmp_path)}, SCHEMA, True)
    # a checkpoint whose query committed batches to another root
    checkpoint = tmp_path / "ck"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"8c1f6f44-0000-4000-8000-000000000000"}\n')
    (checkpoint / "commits" / "0").write_text("v1\n{}\n")
    other = tmp_path / "other"
    with pytest.raises(ConfigError, match="committed batches up to 0 but none of them to"):
        LedgerqStreamWriter.create(
            {"path": str(other), "checkpointLocation": str(checkpoint)}, SCHEMA, False
        )
    assert not other.exists(), "nothing was written"
    # a copy of a live checkpoint: the same query id, counting batches alike
    first, copy = tmp_path / "ck1", tmp_path / "ck2"
    first.mkdir()
    (first / "metadata").write_text('{"id":"1d1f6f44-0000-4000-8000-000000000000"}\n')
    _writer(tmp_path, checkpointLocation=str(first))  # the query's record: this checkpoint
    shutil.copytree(first, copy)
    before = sorted(p.name for p in (tmp_path / STREAMS_DIR).rglob("*"))
    with pytest.raises(ConfigError, match=r"checkpoints .*ck2 and .*ck1 are of one query"):
        _writer(tmp_path, checkpointLocation=str(copy))
    assert sorted(p.name for p in (tmp_path / STREAMS_DIR).rglob("*")) == before
    _writer(tmp_path, checkpointLocation=str(first))  # the original goes on
    shutil.rmtree(first)  # moved, or restored from a copy: the copy takes the record over
    _writer(tmp_path, checkpointLocation=str(copy))


def _run(spark: Any, source: Path, root: Path, checkpoint: Path) -> None:
    stream_into_ledgerq(spark, source, "payload binary", root, checkpoint, shards=4)


def test_a_stream_into_ledgerq_is_read_back_exactly_once(spark: Any, tmp_path: Path) -> None:
    source, root, checkpoint = tmp_path / "in", tmp_path / "root", tmp_path / "ck"
    for n in range(2):
        rows = [(f"f{n}-{i}".encode(),) for i in range(40)]
        spark.createDataFrame(rows, "payload binary").coalesce(1).write.mode("append").parquet(
            str(source)
        )
    _run(spark, source, root, checkpoint)
    expected = [f"f{n}-{i}".encode() for n in range(2) for i in range(40)]
    assert sorted(shard_payloads(root, 4)) == sorted(expected)
    # restarted from its checkpoint with one more file: only that file's rows are added
    spark.createDataFrame([(b"late",)], "payload binary").write.mode("append").parquet(str(source))
    _run(spark, source, root, checkpoint)
    assert sorted(shard_payloads(root, 4)) == sorted([*expected, b"late"])
    assert (root / STREAMS_DIR).is_dir()
    marked = []
    for i in range(4):
        with ledgerq.follow(root / shard_dir_name("", 4, i), timeout=0) as follower:
            marked += [m.headers[MARK_HEADER] for m in follower if MARK_HEADER in m.headers]
    assert len(marked) == len(set(marked)) >= 3, "one marker per shard and batch"
    # the same checkpoint pointed at another root (with a new file to write): refused
    spark.createDataFrame([(b"new",)], "payload binary").write.mode("append").parquet(str(source))
    with pytest.raises(Exception, match="none of them to"):
        _run(spark, source, tmp_path / "elsewhere", checkpoint)
    assert not (tmp_path / "elsewhere" / shard_dir_name("", 4, 0)).exists()


_QUERY = """
import os, sys
from pyspark.sql import SparkSession
from ledgerq.spark import register
source, root, checkpoint = sys.argv[1:4]
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
register(spark)
writer = (spark.readStream.format("parquet").schema("payload binary")
          .option("maxFilesPerTrigger", 1).load(source)
          .writeStream.format("ledgerq").option("checkpointLocation", checkpoint)
          .option("shards", 4))
query = writer.start(root)
query.awaitTermination()
"""


@pytest.mark.slow  # a Spark JVM in a subprocess, killed
def test_a_query_killed_and_restarted_loses_and_repeats_nothing(spark: Any, tmp_path: Path) -> None:
    """kill -9 of the whole query (driver, JVM, workers) while it streams; then a restart."""
    source, root, checkpoint = tmp_path / "in", tmp_path / "root", tmp_path / "ck"
    expected = []
    for n in range(6):  # one file a micro-batch: the kill lands in the second or later
        rows = [(f"f{n}-{i}".encode(),) for i in range(500)]
        expected += [r[0] for r in rows]
        spark.createDataFrame(rows, "payload binary").coalesce(1).write.mode("append").parquet(
            str(source)
        )
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYSPARK_PYTHON": sys.executable}
    args = [sys.executable, "-c", _QUERY, str(source), str(root), str(checkpoint)]
    query = subprocess.Popen(args, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        # kill once a batch is published: the kill lands somewhere in a later batch
        deadline = time.monotonic() + 240
        while not list((root / STREAMS_DIR).glob("*/last.json")):
            assert query.poll() is None and time.monotonic() < deadline, "the query never wrote"
            time.sleep(0.05)  # a poll of files another process writes, not a synchronisation
    finally:
        os.killpg(query.pid, signal.SIGKILL)
        query.wait()
    assert len(shard_payloads(root, 4)) < len(expected), "killed before the end"
    # Restarted from its checkpoint by another driver: this process's session (one JVM
    # start fewer than a second subprocess).
    _run(spark, source, root, checkpoint)
    got = shard_payloads(root, 4)
    assert len(got) == len(expected) and sorted(got) == sorted(expected), "exactly once"
