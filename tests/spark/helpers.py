"""Builders of queue trees and guards for streaming queries, shared by the Spark tests."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from ledgerq.shard import shard_dir_name

__all__ = [
    "await_termination",
    "build_tree",
    "flipped_copy",
    "log_view",
    "parquet_stream",
    "process_all_available",
    "rows_by_key",
    "segment_files",
    "shard_payloads",
    "stream_into_ledgerq",
]


def build_tree(root: Path, *, segment_size: int = 2048) -> dict[str, list[int]]:
    """A small tree of queues with every kind of entry, in many small segments.

    ``root/edge-1/events`` and ``root/edge-2/events`` (plain payloads, some headers,
    priorities, TTLs, compressed payloads) and ``root/orders``; enqueued in several
    batches a few milliseconds apart, so timestamps differ between batches.  Returns
    the ids enqueued per queue name.
    """
    ids: dict[str, list[int]] = {}
    specs = {
        "edge-1/events": {"compression": "zstd", "compression_min_size": 64},
        "edge-2/events": {},
        "orders": {"priorities": True},
    }
    for name, options in specs.items():
        got: list[int] = []
        with ledgerq.open(
            root / name, segment_size=segment_size, index_interval=256, **options
        ) as q:
            for batch in range(8):
                items: list[Any] = []
                for i in range(20):
                    n = batch * 20 + i
                    payload = f"{name}:{n}:".encode() + bytes([n % 251]) * (n % 40)
                    if n % 5 == 0:
                        payload += b"z" * 200  # compressible: stored compressed in edge-1
                    if n % 3 == 0:
                        items.append(
                            ledgerq.Item(
                                payload,
                                headers={"n": str(n), "kind": "odd" if n % 2 else "even"},
                                priority=ledgerq.Priority.HIGH if n % 2 else ledgerq.Priority.LOW,
                                ttl=3600.0 if n % 4 == 0 else None,
                            )
                        )
                    else:
                        items.append(payload)
                got.extend(q.enqueue_batch(items))
                time.sleep(0.003)
        ids[name] = got
    return ids


def log_view(path: Path) -> list[ledgerq.Message]:
    """Every message of a queue as ``ledgerq.open`` sees it (peek: nothing is leased)."""
    with ledgerq.open(path) as q:
        return q.peek(1 << 30)


def shard_payloads(root: Path, shards: int) -> list[bytes]:
    """Every payload in the shard queues under ``root`` (a log view: acked ones too)."""
    found: list[bytes] = []
    for i in range(shards):
        path = root / shard_dir_name("", shards, i)
        if path.exists():
            with ledgerq.follow(path, timeout=0) as follower:
                found.extend(m.payload for m in follower)
    return found


def rows_by_key(rows: list[Any]) -> dict[tuple[str, int], Any]:
    """Collected rows by (queue, id)."""
    return {(r["queue"], r["id"]): r for r in rows}


def segment_files(queue: Path) -> list[Path]:
    """The segment logs of a queue, oldest first."""
    return sorted((queue / "segments").glob("*.log"))


def flipped_copy(clean: Path, damaged: Path, offset: int) -> Path:
    """A copy of queue ``clean`` at ``damaged`` with one bit flipped at ``offset`` of its
    first segment (bit ``offset % 8``)."""
    shutil.copytree(clean, damaged)
    target = segment_files(damaged)[0]
    data = bytearray(target.read_bytes())
    data[offset] ^= 1 << (offset % 8)
    target.write_bytes(bytes(data))
    return damaged


def process_all_available(query: Any, timeout: float = 120.0) -> None:
    """``query.processAllAvailable()`` with a time limit.

    That call has none, and a py4j call interrupted by a test timeout leaves the
    connection busy (the next call, even ``stop()``, then hangs).  It runs on its own
    thread (PySpark's pinned-thread mode gives that thread its own connection); on
    time-out the query is stopped and the test fails.
    """
    failure: list[BaseException] = []

    def run() -> None:
        try:
            query.processAllAvailable()
        except BaseException as exc:  # reported on the test's thread
            failure.append(exc)

    worker = threading.Thread(target=run, name="processAllAvailable", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        query.stop()
        worker.join(30)
        pytest.fail(f"streaming query made no progress in {timeout} s; it was stopped")
    if failure:
        raise failure[0]


def await_termination(query: Any, timeout: float = 120.0) -> None:
    """Wait for an ``availableNow`` query to finish; stop it and fail after ``timeout``."""
    if not query.awaitTermination(timeout):
        query.stop()
        pytest.fail(f"availableNow query did not finish in {timeout} s; it was stopped")
    if query.exception() is not None:
        raise AssertionError(f"streaming query failed: {query.exception()}")


def parquet_stream(spark: Any, source: Path, schema: str) -> Any:
    """A streaming DataFrame of the parquet files in ``source``, one file a micro-batch."""
    return (
        spark.readStream.format("parquet")
        .schema(schema)
        .option("maxFilesPerTrigger", 1)
        .load(str(source))
    )


def stream_into_ledgerq(
    spark: Any, source: Path, schema: str, root: Path, checkpoint: Path, **options: object
) -> None:
    """Run an ``availableNow`` query that writes ``source``'s parquet files into ``root``."""
    writer = (
        parquet_stream(spark, source, schema)
        .writeStream.format("ledgerq")
        .option("checkpointLocation", str(checkpoint))
    )
    for name, value in options.items():
        writer = writer.option(name, value)
    await_termination(writer.trigger(availableNow=True).start(str(root)))
