"""Streaming reads: per-queue offsets, micro-batches, exact resume from a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark import require_spark

require_spark()

import ledgerq  # noqa: E402
from tests.spark.helpers import await_termination, process_all_available  # noqa: E402


def _enqueue(path: Path, payloads: list[bytes], **options: Any) -> list[int]:
    with ledgerq.open(path, **options) as q:
        return q.enqueue_batch(payloads)


def _run_available_now(spark: Any, source: Path, sink: Path, checkpoint: Path) -> None:
    query = (
        spark.readStream.format("ledgerq")
        .load(str(source))
        .select("queue", "id", "payload")
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_termination(query)


def test_restart_from_a_checkpoint_resumes_exactly(spark: Any, tmp_path: Path) -> None:
    source, sink, checkpoint = tmp_path / "queues", tmp_path / "sink", tmp_path / "checkpoint"
    _enqueue(source / "a", [f"a{i}".encode() for i in range(30)], segment_size=256)
    _enqueue(source / "b", [f"b{i}".encode() for i in range(10)])
    _run_available_now(spark, source, sink, checkpoint)
    first = spark.read.parquet(str(sink)).collect()
    assert len(first) == 40
    # more messages, in the old queues (and a new segment) and in a queue that is new
    _enqueue(source / "a", [f"a{i}".encode() for i in range(30, 45)])
    _enqueue(source / "c", [b"c0", b"c1"])
    _run_available_now(spark, source, sink, checkpoint)
    rows = spark.read.parquet(str(sink)).collect()
    keys = [(r["queue"], r["id"]) for r in rows]
    assert len(keys) == len(set(keys)) == 57, "each message exactly once"
    assert sorted(r["payload"] for r in rows) == sorted(
        [f"a{i}".encode() for i in range(45)]
        + [f"b{i}".encode() for i in range(10)]
        + [b"c0", b"c1"]
    )
    # nothing new: a third run adds nothing
    _run_available_now(spark, source, sink, checkpoint)
    assert spark.read.parquet(str(sink)).count() == 57


def test_a_live_queue_feeds_micro_batches(spark: Any, tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "live", segment_size=512) as q:  # open: the owner writes on
        q.enqueue_batch([f"m{i}".encode() for i in range(20)])
        query = (
            spark.readStream.format("ledgerq")
            .load(str(tmp_path / "live"))
            .writeStream.format("memory")
            .queryName("ledgerq_live")
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            process_all_available(query)
            assert spark.table("ledgerq_live").count() == 20
            for i in range(20, 50):
                q.enqueue(f"m{i}".encode())
            process_all_available(query)
            got = sorted(r["id"] for r in spark.table("ledgerq_live").collect())
            assert got == list(range(1, 51))
            assert query.lastProgress["numInputRows"] > 0
        finally:
            query.stop()


def test_max_records_per_trigger_splits_the_backlog(spark: Any, tmp_path: Path) -> None:
    _enqueue(tmp_path / "q" / "x", [b"x"] * 50)
    _enqueue(tmp_path / "q" / "y", [b"y"] * 50)
    query = (
        spark.readStream.format("ledgerq")
        .option("maxRecordsPerTrigger", "30")
        .load(str(tmp_path / "q"))
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "sink"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    await_termination(query)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [30, 30, 30, 10]
    assert spark.read.parquet(str(tmp_path / "sink")).count() == 100


def test_starting_offsets(spark: Any, tmp_path: Path) -> None:
    _enqueue(tmp_path / "q", [f"m{i}".encode() for i in range(10)])
    query = (
        spark.readStream.format("ledgerq")
        .option("startingOffsets", '{"q": 7}')
        .load(str(tmp_path / "q"))
        .writeStream.format("memory")
        .queryName("ledgerq_from_7")
        .trigger(availableNow=True)
        .start()
    )
    await_termination(query)
    assert sorted(r["id"] for r in spark.table("ledgerq_from_7").collect()) == [8, 9, 10]
    with pytest.raises(Exception, match="startingOffsets"):
        spark.readStream.format("ledgerq").option("startingOffsets", "[1]").load(
            str(tmp_path / "q")
        ).writeStream.format("memory").queryName("bad").start().awaitTermination(30)
