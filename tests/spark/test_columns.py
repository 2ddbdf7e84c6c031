"""The writer's column table without a Spark session: the checks a task makes on its
values, and the messages the commit builds from staged rows."""

from __future__ import annotations

import time

import pytest

from tests.spark import require_spark

require_spark()

import pyarrow as pa  # noqa: E402

from ledgerq import Item  # noqa: E402
from ledgerq.spark._columns import items, normalize  # noqa: E402


def _batch(**columns: pa.Array) -> pa.RecordBatch:
    payload = pa.array([b"x"] * len(next(iter(columns.values()))), pa.binary())
    return pa.RecordBatch.from_arrays([payload, *columns.values()], ["payload", *columns])


@pytest.mark.parametrize(
    ("columns", "error"),
    [
        ({"delay": pa.array([1.0, -1.0])}, "delay must be a number of seconds from 0"),
        ({"delay": pa.array([float("nan")])}, "delay must be a number of seconds from 0"),
        ({"ttl": pa.array([0.0])}, "ttl must be a number of seconds above 0"),
        ({"priority": pa.array([3], pa.int32())}, "priority must be 0"),
        ({"group": pa.array(["", "a"])}, "group must be 1 to 255 bytes"),
        ({"group": pa.array(["é" * 128])}, "group must be 1 to 255 bytes"),
        (
            {
                "delay": pa.array([1.0]),
                "deliver_at": pa.array([0], pa.timestamp("us", tz="UTC")),
            },
            "both a delay and a deliver_at",
        ),
    ],
)
def test_a_value_enqueue_would_refuse_fails_the_task(
    columns: dict[str, pa.Array], error: str
) -> None:
    with pytest.raises(ValueError, match=f"{error}.*partition 7.*nothing was published"):
        normalize(_batch(**columns), "partition 7")


def test_staged_rows_become_the_items_enqueue_takes() -> None:
    now_us = time.time_ns() // 1000
    staged = normalize(
        _batch(
            delay=pa.array([None, 5.0, None, None]),
            deliver_at=pa.array(
                [None, None, now_us - 10**6, now_us + 3600 * 10**6], pa.timestamp("us", tz="UTC")
            ),
            group=pa.array(["g", None, None, None]),
            priority=pa.array([None, 2, None, None], pa.int8()),
        ),
        "partition 0",
    )
    got = items(pa.Table.from_batches([staged]))
    assert got[0] == Item(b"x", group="g")  # nulls: the defaults (MEDIUM, no delay)
    assert got[1] == Item(b"x", delay=5.0, priority=2)
    assert got[2] == Item(b"x"), "a deliver_at already past is no delay"
    assert got[3].delay is not None and 3590 < got[3].delay <= 3600


@pytest.mark.parametrize(
    "keys", [["", "a"], ["é" * 513], ["k" * 1025]], ids=["empty", "2-byte chars", "too long"]
)
def test_a_unique_key_enqueue_would_refuse_fails_the_task(keys: list[str]) -> None:
    with pytest.raises(ValueError, match=r"unique_key must be 1 to 1024 bytes.*partition 3"):
        normalize(_batch(unique_key=pa.array(keys)), "partition 3")


def test_a_unique_key_becomes_the_item_keyword_and_routes_as_open_sharded_does() -> None:
    from ledgerq.core.args import MAX_UNIQUE_KEY_BYTES
    from ledgerq.spark import _columns

    assert _columns._MAX_UNIQUE_KEY_BYTES == MAX_UNIQUE_KEY_BYTES  # a copy: one bound
    staged = normalize(_batch(unique_key=pa.array(["job-1", None])), "partition 0")
    assert items(pa.Table.from_batches([staged])) == [Item(b"x", unique_key="job-1"), Item(b"x")]
    # open_sharded routes by key, then group, then unique_key, then dedup_id
    assert _columns.ROUTED_BY == ("key", "group", "unique_key", "dedup_id")
