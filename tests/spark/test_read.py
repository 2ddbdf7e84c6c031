"""Batch reads: ``spark.read.format("ledgerq").load(path)`` against what ledgerq itself sees."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.spark import require_spark

require_spark()

import ledgerq  # noqa: E402
from ledgerq.format.entry import encode_entry  # noqa: E402
from ledgerq.spark import READ_SCHEMA, READ_SCHEMA_WITH_STATE  # noqa: E402
from tests.spark.helpers import log_view, rows_by_key, segment_files  # noqa: E402

# Every test here runs on both readers (conftest.py: the JVM one and the Python one).
pytestmark = pytest.mark.usefixtures("reader")


def _ns(value: datetime | None) -> int | None:
    # collect() gives naive datetimes in this process's local time zone
    if value is None:
        return None
    return round(value.timestamp() * 1_000_000) * 1000


def test_rows_match_what_ledgerq_open_sees(spark: Any, tree: Path) -> None:
    df = spark.read.format("ledgerq").load(str(tree))
    assert df.schema == READ_SCHEMA
    rows = rows_by_key(df.collect())
    expected = {}
    for name in ("edge-1/events", "edge-2/events", "orders"):
        segments = segment_files(tree / name)
        assert len(segments) >= 5, "many small segments"
        for m in log_view(tree / name):
            expected[(name, m.id)] = m
    assert rows.keys() == expected.keys()
    assert df.rdd.getNumPartitions() == sum(
        len(segment_files(tree / n)) for n in ("edge-1/events", "edge-2/events", "orders")
    ), "one input partition per segment file"
    for key, m in expected.items():
        row = rows[key]
        assert row["payload"] == m.payload, key
        assert dict(row["headers"]) == m.headers, key
        assert row["priority"] == int(m.priority), key
        assert _ns(row["timestamp"]) == m.timestamp // 1000 * 1000, key
        assert _ns(row["expires_at"]) == (
            None if m.expires_at is None else m.expires_at // 1000 * 1000
        ), key


def test_tuples_give_the_same_rows_as_arrow(spark: Any, tree: Path) -> None:
    arrow = spark.read.format("ledgerq").load(str(tree))
    tuples = spark.read.format("ledgerq").option("arrow", "false").load(str(tree))
    assert sorted(map(tuple, arrow.collect())) == sorted(map(tuple, tuples.collect()))


def test_a_queue_path_is_named_after_itself(spark: Any, tree: Path) -> None:
    df = spark.read.format("ledgerq").load(str(tree / "edge-1" / "events"))
    names = {r["queue"] for r in df.select("queue").distinct().collect()}
    assert names == {"events"}


def test_reader_option_adds_the_state_of_a_live_queue(spark: Any, tmp_path: Path) -> None:
    # The queue stays open (locked) in this process while Spark reads its files.
    with ledgerq.open(tmp_path / "jobs", segment_size=300) as q:
        ids = q.enqueue_batch([f"job {i}".encode() for i in range(12)])
        billing = q.reader("billing")
        leased = billing.dequeue_batch(5)
        billing.ack(leased[0].id)
        billing.ack(leased[2].id)
        billing.nack(leased[4].id)
        q.enqueue(b"late")  # in the active segment
        df = spark.read.format("ledgerq").option("reader", "billing").load(str(tmp_path / "jobs"))
        assert df.schema == READ_SCHEMA_WITH_STATE
        state = {r["id"]: r["state"] for r in df.select("id", "state").collect()}
    assert len(state) == 13
    assert state[ids[0]] == state[ids[2]] == "acked"
    assert state[ids[1]] == state[ids[3]] == "leased"
    assert state[ids[4]] == "pending"  # nacked: waiting to be delivered again
    assert {state[i] for i in ids[5:]} == {"pending"}


def test_include_dlq(spark: Any, tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "work", max_retries=1) as q:
        q.enqueue_batch([b"ok", b"poison"])
        q.ack(q.dequeue().id)  # type: ignore[union-attr]
        q.nack(q.dequeue().id, "boom")  # type: ignore[union-attr]
    plain = spark.read.format("ledgerq").load(str(tmp_path))
    assert {r["queue"] for r in plain.collect()} == {"work"}
    both = spark.read.format("ledgerq").option("include_dlq", "true").load(str(tmp_path))
    dead = [r for r in both.collect() if r["queue"] == "work/dlq"]
    assert len(dead) == 1
    assert dead[0]["payload"] == b"poison"
    assert dead[0]["headers"]["dlq.failure_reason"] == "boom"


def test_an_append_in_flight_is_not_read_nor_an_error(spark: Any, tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue_batch([b"a", b"b", b"c"])
    newest = segment_files(tmp_path / "q")[-1]
    half = encode_entry(4, 1, b"d" * 100)[:60]  # the first bytes of an append in progress
    with open(newest, "ab") as f:
        f.write(half)
    df = spark.read.format("ledgerq").option("mode", "FAILFAST").load(str(tmp_path / "q"))
    assert sorted(r["payload"] for r in df.collect()) == [b"a", b"b", b"c"]


_WORKER_LOGGING = "spark.sql.pyspark.worker.logging.enabled"


def _worker_logs(spark: Any, needle: str) -> list[str]:
    logs = spark.tvf.python_worker_logs().where("logger = 'ledgerq'").select("msg").collect()
    return [r["msg"] for r in logs if needle in r["msg"]]


def test_corrupt_entries_are_skipped_and_logged(
    spark: Any, tree: Path, tmp_path: Path, reader: str
) -> None:
    queue = tmp_path / "orders"
    shutil.copytree(tree / "orders", queue)
    victim = segment_files(queue)[1]  # a sealed segment
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    clean = len(log_view(tree / "orders"))
    df = spark.read.format("ledgerq").load(str(queue))
    assert df.count() == clean - 1  # one entry lost, the job did not fail
    # The Python reader's worker log names the loss (the JVM one logs it through log4j).
    # Worker logging is on for this query only: it costs a streaming query ~8 s.
    spark.conf.set(_WORKER_LOGGING, "true")
    try:
        python = spark.read.format("ledgerq").option("jvm", "false").load(str(queue))
        assert python.count() == clean - 1
        messages = _worker_logs(spark, str(victim))
    finally:
        spark.conf.unset(_WORKER_LOGGING)
    assert any("corrupt bytes" in m and "1 message lost" in m for m in messages), messages
    assert any("1 corrupt regions skipped" in m for m in messages), messages
    with pytest.raises(Exception, match="FAILFAST"):
        spark.read.format("ledgerq").option("mode", "FAILFAST").load(str(queue)).count()


def test_bad_options_fail_clearly(spark: Any, tree: Path) -> None:
    with pytest.raises(Exception, match="mode must be PERMISSIVE or FAILFAST"):
        spark.read.format("ledgerq").option("mode", "sloppy").load(str(tree)).count()
    with pytest.raises(Exception, match="does not exist"):
        spark.read.format("ledgerq").load(str(tree / "nowhere")).count()
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format("ledgerq").schema("id long").load(str(tree)).count()
