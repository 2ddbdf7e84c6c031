"""Batch writes into sharded queues, read back through the Python API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.spark import require_spark

require_spark()

from pyspark.sql import functions as F  # noqa: E402

import ledgerq  # noqa: E402
from ledgerq.shard import read_shard_count, shard_dir_name, shard_index  # noqa: E402
from ledgerq.spark._write import STAGING_DIR  # noqa: E402


def _messages(root: Path, shards: int) -> dict[int, list[ledgerq.Message]]:
    found = {}
    for i in range(shards):
        with ledgerq.open(root / shard_dir_name("", shards, i)) as q:
            found[i] = q.peek(1 << 30)
    return found


def test_write_then_read_back_through_the_python_api(spark: Any, tmp_path: Path) -> None:
    rows = [
        (f"payload {i}".encode(), f"user-{i % 13}", {"i": str(i)}, i % 3, 600.0 if i % 2 else None)
        for i in range(300)
    ]
    df = spark.createDataFrame(
        rows, "payload binary, key string, headers map<string,string>, priority int, ttl double"
    ).repartition(3)
    df.write.format("ledgerq").mode("append").option("shards", "4").save(str(tmp_path))
    assert read_shard_count(tmp_path, "") == 4
    assert not (tmp_path / STAGING_DIR).exists()
    by_shard = _messages(tmp_path, 4)
    seen = {}
    for shard, messages in by_shard.items():
        for m in messages:
            i = int(m.headers["i"])
            assert shard == shard_index(f"user-{i % 13}", 4), "routed by xxhash of the key"
            seen[i] = m
    assert sorted(seen) == list(range(300))
    for i, m in seen.items():
        assert m.payload == f"payload {i}".encode()
        assert int(m.priority) == i % 3
        assert (m.expires_at is not None) == bool(i % 2)
        if m.expires_at is not None:
            assert 590e9 < m.expires_at - m.timestamp <= 600e9
    # the sharded queue API sees the same messages, with its global ids
    with ledgerq.open_sharded(tmp_path, 4) as sq:
        assert len(sq) == 300
    # ... and so does the Spark reader
    back = spark.read.format("ledgerq").load(str(tmp_path))
    assert back.count() == 300
    assert {r["queue"] for r in back.select("queue").distinct().collect()} == {
        shard_dir_name("", 4, i) for i, messages in by_shard.items() if messages
    }


def test_without_a_key_rows_go_by_partition_and_appends_add_up(spark: Any, tmp_path: Path) -> None:
    df = spark.range(0, 100, 1, 2).select(F.col("id").cast("string").alias("payload"))
    df.write.format("ledgerq").mode("append").option("shards", "2").save(str(tmp_path))
    by_shard = _messages(tmp_path, 2)
    assert {len(m) for m in by_shard.values()} == {50}  # partition p -> shard p % 2
    # a second job appends, with the recorded shard count (no option needed)
    df.write.format("ledgerq").mode("append").save(str(tmp_path))
    payloads = sorted(m.payload for ms in _messages(tmp_path, 2).values() for m in ms)
    assert payloads == sorted([str(i).encode() for i in range(100)] * 2)


def test_modes_other_than_append_fail_clearly(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"x",)], "payload binary")
    with pytest.raises(Exception, match="append-only"):
        df.write.format("ledgerq").mode("overwrite").save(str(tmp_path))
    for mode in ("errorifexists", "ignore"):
        with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
            df.write.format("ledgerq").mode(mode).save(str(tmp_path))
    assert not any(tmp_path.iterdir())


def test_bad_columns_and_shard_counts_fail_before_any_task(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="unexpected column"):
        spark.createDataFrame([(b"x", 1)], "payload binary, extra int").write.format(
            "ledgerq"
        ).mode("append").save(str(tmp_path))
    with pytest.raises(Exception, match="needs a payload column"):
        spark.createDataFrame([("k",)], "key string").write.format("ledgerq").mode("append").save(
            str(tmp_path)
        )
    ledgerq.open_sharded(tmp_path / "taken", 2).close()
    with pytest.raises(Exception, match="holds 2 shards, not 4"):
        spark.createDataFrame([(b"x",)], "payload binary").write.format("ledgerq").mode(
            "append"
        ).option("shards", "4").save(str(tmp_path / "taken"))


def test_a_failed_job_publishes_nothing(spark: Any, tmp_path: Path) -> None:
    good = spark.createDataFrame([(f"m{i}".encode(),) for i in range(20)], "payload binary")
    good.write.format("ledgerq").mode("append").option("shards", "2").save(str(tmp_path))
    # Partition 1 fails half-way, after partition 0 has staged its rows.
    failing = spark.range(0, 200, 1, 2).select(
        F.when(F.col("id") == 150, F.raise_error(F.lit("task blew up")))
        .otherwise(F.col("id").cast("string"))
        .alias("payload")
    )
    with pytest.raises(Exception, match="task blew up"):
        failing.write.format("ledgerq").mode("append").save(str(tmp_path))
    payloads = sorted(m.payload for ms in _messages(tmp_path, 2).values() for m in ms)
    assert payloads == sorted(f"m{i}".encode() for i in range(20))
    assert not (tmp_path / STAGING_DIR).exists(), "abort deletes the staged files"


def test_a_shard_held_open_elsewhere_blocks_the_whole_commit(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame(
        [(f"m{i}".encode(), str(i)) for i in range(40)], "payload binary, key string"
    )
    ledgerq.open_sharded(tmp_path, 2).close()
    holder = ledgerq.open(tmp_path / shard_dir_name("", 2, 1))  # a consumer owns shard 1
    try:
        with pytest.raises(
            Exception,
            match=r"QueueLockedError.*open exclusively by another handle.*waited 0.5 s"
            r".*opens its queues in shared mode",
        ):
            df.write.format("ledgerq").mode("append").option("lock_timeout", "0.5").save(
                str(tmp_path)
            )
    finally:
        holder.close()
    assert sum(len(m) for m in _messages(tmp_path, 2).values()) == 0  # not even shard 0
    assert not (tmp_path / STAGING_DIR).exists(), "Spark aborts a failed commit"
    df.write.format("ledgerq").mode("append").save(str(tmp_path))
    assert sum(len(m) for m in _messages(tmp_path, 2).values()) == 40


def test_delivery_columns_reach_the_queues(spark: Any, tmp_path: Path) -> None:
    now = datetime.now(UTC)
    hour = timedelta(hours=1)
    rows = [  # payload, group, delay, deliver_at, dedup_id, priority, ttl, headers
        ("a1", "a", None, None, None, None, None, None),
        ("a2", "a", None, None, None, None, None, None),  # held until a1 is acked
        ("later", None, 3600.0, None, None, None, None, None),
        ("due", None, None, now - hour, None, None, None, None),  # past: delivered now
        ("future", None, None, now + hour, None, None, None, None),
        ("dup1", None, None, None, "d", None, None, None),
        ("dup2", None, None, None, "d", None, None, None),  # the same dedup id: dropped
        ("plain", None, 0.0, None, None, 2, 60.0, {"h": "v"}),
    ]
    schema = (
        "payload string, group string, delay double, deliver_at timestamp, "
        "dedup_id string, priority int, ttl double, headers map<string,string>"
    )
    df = spark.createDataFrame(rows, schema).coalesce(1)
    df.write.format("ledgerq").mode("append").option("shards", "2").option(
        "queue.dedup_window", "600"
    ).save(str(tmp_path))
    got: dict[str, ledgerq.Message] = {}
    order = []
    with ledgerq.open_sharded(tmp_path, 2) as sq:
        while (m := sq.dequeue()) is not None:
            got[m.payload.decode()] = m
            order.append(m.payload.decode())
            sq.ack(m.id)
        assert sq.stats().delayed == 2
    assert sorted(got) == ["a1", "a2", "due", "dup1", "plain"]
    assert order.index("a1") < order.index("a2") and got["a2"].group == "a"
    plain = got["plain"]
    assert (int(plain.priority), plain.headers) == (2, {"h": "v"})
    assert plain.expires_at is not None and 59e9 < plain.expires_at - plain.timestamp <= 60e9
    assert {m.group for m in got.values()} == {"a", None}
    # ... and the reader shows the future messages' delivery times
    back = spark.read.format("ledgerq").load(str(tmp_path)).where("deliver_at is not null")
    due = {r["payload"].decode(): r["deliver_at"] for r in back.collect()}
    assert sorted(due) == ["future", "later"]
    assert abs(due["future"].replace(tzinfo=UTC) - (now + hour)) < timedelta(seconds=1)


def test_a_unique_key_column_adds_a_job_once_while_it_is_not_finished(
    spark: Any, tmp_path: Path
) -> None:
    rows = [("j1", "job-1"), ("j1 again", "job-1"), ("j2", "job-2"), ("free", None)]
    df = spark.createDataFrame(rows, "payload string, unique_key string").coalesce(1)
    df.write.format("ledgerq").mode("append").option("shards", "4").save(str(tmp_path))
    by_shard = _messages(tmp_path, 4)
    got = {m.payload.decode(): shard for shard, ms in by_shard.items() for m in ms}
    assert sorted(got) == ["free", "j1", "j2"], "the second job-1 added nothing"
    assert got["j1"] == shard_index("job-1", 4), "routed by its unique key, as open_sharded"
    assert got["j2"] == shard_index("job-2", 4)
    with ledgerq.open_sharded(tmp_path, 4) as sq:
        while (m := sq.dequeue()) is not None:
            if m.payload == b"j1":
                sq.ack(m.id)  # job-1 finished: its key is free again; job-2 stays leased
    again = spark.createDataFrame([("j1 later", "job-1"), ("j2 later", "job-2")], df.schema)
    again.write.format("ledgerq").mode("append").save(str(tmp_path))
    payloads = sorted(m.payload for ms in _messages(tmp_path, 4).values() for m in ms)
    assert payloads == [b"free", b"j1 later", b"j2"], "job-2 was still held"


@pytest.mark.parametrize(
    ("schema", "error"),
    [
        ("payload binary, delay string", "column delay has type string; .* a number of seconds"),
        ("payload binary, deliver_at string", "column deliver_at has type string; .* timestamp"),
        ("payload binary, group int", "column group has type int; .* as a string"),
        ("payload binary, unique_key int", "column unique_key has type int; .* as a string"),
        ("payload binary, headers map<string,int>", "column headers .* map<string,string>"),
    ],
)
def test_a_column_of_a_wrong_type_fails_before_any_task(
    spark: Any, tmp_path: Path, schema: str, error: str
) -> None:
    df = spark.createDataFrame([], schema)
    with pytest.raises(Exception, match=error):
        df.write.format("ledgerq").mode("append").save(str(tmp_path))
    assert not any(tmp_path.iterdir())


def test_a_bad_delivery_value_fails_its_task_and_publishes_nothing(
    spark: Any, tmp_path: Path
) -> None:
    rows = [(b"ok", 1.0, None), (b"both", 1.0, datetime.now(UTC))]
    df = spark.createDataFrame(rows, "payload binary, delay double, deliver_at timestamp")
    with pytest.raises(Exception, match="both a delay and a deliver_at"):
        df.write.format("ledgerq").mode("append").option("shards", "2").save(str(tmp_path))
    assert not (tmp_path / STAGING_DIR).exists()
    assert sum(len(m) for m in _messages(tmp_path, 2).values()) == 0
