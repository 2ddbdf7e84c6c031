"""Batch and streaming writes beside live queues: processes that hold the shard queues in
shared mode (a consumer, a worker pool) keep working while a Spark job or a streaming
query writes into them."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests._child import Child, Children, child_environment
from tests.spark import require_spark

require_spark()

import ledgerq  # noqa: E402
from ledgerq.shard import shard_dir_name, shard_index  # noqa: E402
from tests.spark.helpers import stream_into_ledgerq  # noqa: E402
from tests.workers._handlers import DONE_LOG  # noqa: E402

# Holds every shard of ROOT open in shared mode, says so, then consumes (dequeue, ack)
# until it has WANT messages and prints them.
_CONSUMER = """
import json, os, sys, ledgerq
from ledgerq.shard import shard_dir_name
root, shards, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
queues = [ledgerq.open(os.path.join(root, shard_dir_name("", shards, i)), shared=True)
          for i in range(shards)]
print("ready", flush=True)
got = []
while len(got) < want:
    for q in queues:
        m = q.dequeue(timeout=0.05)
        if m is not None:
            got.append(m.payload.decode())
            q.ack(m.id)
print("got " + json.dumps(got), flush=True)
for q in queues:
    q.close()
"""


def test_a_write_into_queues_a_shared_consumer_holds(
    spark: Any, tmp_path: Path, children: Children
) -> None:
    ledgerq.open_sharded(tmp_path, 2).close()
    consumer = children.start(["-c", _CONSUMER, str(tmp_path), "2", "60"], watchdog_seconds=60)
    assert consumer.line() == "ready"
    df = spark.createDataFrame(
        [(f"m{i}", f"k{i}") for i in range(60)], "payload string, key string"
    ).repartition(2)
    # Before, the commit opened each shard exclusively and, after lock_timeout, failed
    # with advice to call ledgerq.open(path, shared=True) - which a Spark user cannot.
    df.write.format("ledgerq").mode("append").option("lock_timeout", "5").save(str(tmp_path))
    got = json.loads(consumer.wait_for("got ").removeprefix("got "))
    consumer.expect_exit(0)
    assert sorted(got) == sorted(f"m{i}" for i in range(60)), "each row consumed once"
    for i in range(2):
        with ledgerq.open(tmp_path / shard_dir_name("", 2, i)) as q:
            assert len(q) == 0 and q.stats().in_flight == 0


def _start_pool(
    children: Children, root: Path, log: Path, *, watchdog_seconds: float
) -> tuple[Path, Child]:
    """A worker pool (``announce`` into ``log``) on shard 0 of a new 2-shard tree at
    ``root``, started and seen to hold the shard: it has done one warm-up job."""
    ledgerq.open_sharded(root, 2).close()
    shard = root / shard_dir_name("", 2, 0)
    code = (
        "import sys, ledgerq.workers as w; from tests.workers import _handlers as h;"
        f"r = w.run({str(shard)!r}, h.announce, processes=2);"
        "print('report', r.processed, flush=True)"
    )
    pool = children.start(
        ["-c", code], env=child_environment({DONE_LOG: str(log)}), watchdog_seconds=watchdog_seconds
    )
    with ledgerq.open(shard, shared=True) as q:
        q.enqueue(b"warm-up")
    pool.wait_for("done ")  # the pool runs, and holds the shard
    return shard, pool


def _stop_pool_having_done(pool: Child, log: Path, shard: Path, jobs: list[str]) -> None:
    """Wait for ``jobs`` to be done, stop the pool and check each job (and the warm-up)
    was done exactly once and the shard is left empty."""
    for _ in jobs:
        pool.wait_for("done ")
    pool.signal(signal.SIGTERM)
    assert pool.wait_for("report ") == f"report {len(jobs) + 1}"
    pool.finish()
    done = [line.split(maxsplit=1)[1] for line in log.read_text().splitlines()]
    assert sorted(done) == sorted(["warm-up", *jobs]), "each job done once"
    with ledgerq.open(shard) as q:
        assert len(q) == 0 and q.stats().in_flight == 0


def test_a_worker_pool_drains_what_a_write_puts_in(
    spark: Any, tmp_path: Path, children: Children
) -> None:
    log = tmp_path / "done.log"
    shard, pool = _start_pool(children, tmp_path, log, watchdog_seconds=60)
    # A row goes to the shard of its group (as open_sharded routes it): groups of
    # shard 0, whose jobs the pool runs one after another within a group.
    groups = [g for g in (f"g{i}" for i in range(20)) if shard_index(g, 2) == 0][:4]
    rows = [(f"job-{i}", groups[i % len(groups)]) for i in range(40)]
    df = spark.createDataFrame(rows, "payload string, group string").repartition(2)
    df.write.format("ledgerq").mode("append").option("lock_timeout", "5").save(str(tmp_path))
    _stop_pool_having_done(pool, log, shard, [p for p, _ in rows])


def test_a_worker_pool_drains_what_a_streaming_query_writes(
    spark: Any, tmp_path: Path, children: Children
) -> None:
    root, source, checkpoint = tmp_path / "root", tmp_path / "in", tmp_path / "ck"
    log = tmp_path / "done.log"
    shard, pool = _start_pool(children, root, log, watchdog_seconds=90)
    keys = [k for k in (f"k{i}" for i in range(20)) if shard_index(k, 2) == 0][:3]
    rows = []
    for n in range(2):  # two files: two micro-batches
        batch = [(f"job-{n}-{i}", keys[i % len(keys)]) for i in range(10)]
        rows += batch
        spark.createDataFrame(batch, "payload string, key string").coalesce(1).write.mode(
            "append"
        ).parquet(str(source))
    stream_into_ledgerq(
        spark, source, "payload string, key string", root, checkpoint, lock_timeout="5"
    )
    _stop_pool_having_done(pool, log, shard, [p for p, _ in rows])


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("queue.shared", "true", r"queue\.shared is not taken: a ledgerq write always opens"),
        ("queue.segmnt_size", "4096", r"unknown option queue\.segmnt_size; .*queue\.segment_size"),
        ("queue.segment_size", "big", r"queue\.segment_size='big' is invalid: .* must be an int"),
        ("queue.sync", "sometimes", r"queue\.sync='sometimes' is invalid: .*one of"),
        ("lock_timeout", "soon", r"option lock_timeout must be a number of seconds"),
    ],
)
def test_bad_writer_options_fail_clearly_before_anything_is_written(
    spark: Any, tmp_path: Path, option: str, value: str, error: str
) -> None:
    df = spark.createDataFrame([(b"x",)], "payload binary")
    with pytest.raises(Exception, match=error):
        df.write.format("ledgerq").mode("append").option(option, value).save(str(tmp_path))
    assert not any(tmp_path.iterdir())
