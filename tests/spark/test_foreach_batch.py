"""``foreachBatch(ledgerq.spark.foreach_batch_writer(root))``: each batch id written once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark import require_spark

require_spark()

import ledgerq  # noqa: E402
from ledgerq.shard import shard_dir_name  # noqa: E402
from ledgerq.spark import foreach_batch_writer  # noqa: E402
from ledgerq.spark._stream_write import MARK_HEADER, STREAMS_DIR  # noqa: E402
from ledgerq.spark._write import STAGING_DIR  # noqa: E402
from tests.spark.helpers import await_termination  # noqa: E402


def _payloads(root: Path, shards: int) -> list[bytes]:
    """Every payload in the shard queues under ``root`` (a log view)."""
    found: list[bytes] = []
    for i in range(shards):
        path = root / shard_dir_name("", shards, i)
        if path.exists():
            with ledgerq.follow(path, timeout=0) as follower:
                found.extend(m.payload for m in follower)
    return found


def test_a_batch_id_called_again_adds_nothing(spark: Any, tmp_path: Path) -> None:
    write = foreach_batch_writer(str(tmp_path), query_id="nightly", shards=2)
    rows = [(f"r{i}", f"k{i}") for i in range(30)]
    df = spark.createDataFrame(rows, "payload string, key string").repartition(2)
    write(df, 0)
    write(df, 0)  # Spark replays batch 0
    expected = sorted(p.encode() for p, _ in rows)
    assert sorted(_payloads(tmp_path, 2)) == expected, "the replay added nothing"
    write(spark.createDataFrame([("late", None)], df.schema), 1)
    assert sorted(_payloads(tmp_path, 2)) == sorted([*expected, b"late"])
    assert (tmp_path / STREAMS_DIR / "nightly" / "last.json").exists()
    assert not (tmp_path / STAGING_DIR).exists(), "staged files are deleted"
    # another query id is another stream: its batch 0 is written
    foreach_batch_writer(str(tmp_path), query_id="other")(df.limit(1), 0)
    assert len(_payloads(tmp_path, 2)) == len(rows) + 2
    # a wrong column type fails the call, with nothing written
    with pytest.raises(Exception, match="column payload has type bigint"):
        write(spark.range(3).withColumnRenamed("id", "payload"), 2)
    assert len(_payloads(tmp_path, 2)) == len(rows) + 2
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
        spark.readStream.format("parquet")
        .schema("payload binary")
        .option("maxFilesPerTrigger", 1)
        .load(str(source))
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
    expected = []
    for n in range(2):
        rows = [(f"f{n}-{i}".encode(),) for i in range(20)]
        expected += [r[0] for r in rows]
        spark.createDataFrame(rows, "payload binary").coalesce(1).write.mode("append").parquet(
            str(source)
        )
    query = _run(spark, source, root, checkpoint)
    assert sorted(_payloads(root, 2)) == sorted(expected)
    # As if the query died after the last batch was published but before Spark's
    # checkpoint recorded it: the restart runs that batch again, with the same id.
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    spark.createDataFrame([(b"late",)], "payload binary").write.mode("append").parquet(str(source))
    assert _run(spark, source, root, checkpoint) == query, "the same query, restarted"
    got = _payloads(root, 2)
    assert sorted(got) == sorted([*expected, b"late"]), "every row once"
    marks = []
    for i in range(2):
        with ledgerq.follow(root / shard_dir_name("", 2, i), timeout=0) as follower:
            marks += [m.headers[MARK_HEADER] for m in follower if MARK_HEADER in m.headers]
    assert f"{query}:{last}" in marks and len(marks) == len(set(marks))
