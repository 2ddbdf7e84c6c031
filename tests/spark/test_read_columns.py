"""Option ``columns``: a read of some columns gives exactly those columns of the rows a
whole read gives, row for row - with the Spark-free scan and through Spark, on format 1,
format 2 and mixed segments, with optional fields decoded one by one, with the reader's
``state``, pushed-down filters and encrypted queues."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.spark import require_spark

require_spark()

import pyarrow as pa  # noqa: E402

import ledgerq  # noqa: E402
from ledgerq.spark import READ_SCHEMA, READ_SCHEMA_WITH_STATE  # noqa: E402
from ledgerq.spark._plan import Pushed, ReadOptions, plan_tasks  # noqa: E402
from ledgerq.spark._scan import scan_segment  # noqa: E402
from tests.encryption._files import KEY  # noqa: E402
from tests.spark.helpers import segment_files  # noqa: E402
from tests.spark.test_scan import _as_format_1  # noqa: E402

SOME = [
    ("payload",),
    ("id", "payload"),
    ("payload", "queue", "id"),  # any order
    ("headers", "priority", "expires_at", "deliver_at", "timestamp"),
]


def _layouts(root: Path) -> dict[str, Path]:
    """A plain queue of format 2, the same as format 1, and one of both formats."""
    made = {}
    for layout in ("format-2", "format-1", "mixed"):
        queue = root / layout
        with ledgerq.open(queue, segment_size=16 * 1024) as q:
            for start in range(0, 2000, 100):
                q.enqueue_batch([b"row %05d" % i for i in range(start, start + 100)])
            for i in range(50):
                q.enqueue(b"single %03d" % i, delay=0 if i % 2 else None)
        if layout != "format-2":
            for log in segment_files(queue):
                _as_format_1(log, upto_id=1234 if layout == "mixed" else None)
        made[layout] = queue
    return made


def _scan(options: ReadOptions, columns: tuple[str, ...] | None, *, arrow: bool) -> list[Any]:
    rows: list[Any] = []
    for task in plan_tasks(options, Pushed()):
        for out in scan_segment(dataclasses.replace(task, columns=columns), arrow=arrow):
            if arrow:
                assert isinstance(out, pa.RecordBatch)
                assert out.schema.names == list(columns or out.schema.names)
                rows.extend(tuple(r.values()) for r in out.to_pylist())
            else:
                rows.append(out)
    return rows


def _pick(rows: list[Any], names: list[str], columns: tuple[str, ...]) -> list[Any]:
    at = [names.index(c) for c in columns]
    return [tuple(row[i] for i in at) for row in rows]


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow", "tuples"])
def test_the_scan_gives_the_asked_columns_of_the_same_rows(
    tmp_path: Path, tree: Path, arrow: bool
) -> None:
    names = READ_SCHEMA.fieldNames()
    paths = [tree, *_layouts(tmp_path).values()]
    for path in paths:
        options = ReadOptions(paths=(str(path),))
        whole = _scan(options, None, arrow=arrow)
        assert len(whole) > 100, path
        for columns in SOME:
            assert _scan(options, columns, arrow=arrow) == _pick(whole, names, columns), (
                path,
                columns,
            )


def test_the_scan_of_an_encrypted_queue_with_its_key(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, encryption_key=KEY, segment_size=500) as q:
        q.enqueue_batch([ledgerq.Item(b"secret %d" % i, headers={"i": str(i)}) for i in range(30)])
    options = ReadOptions(paths=(str(path),), encryption_key=KEY)
    for arrow in (True, False):
        whole = _scan(options, None, arrow=arrow)
        assert [r[6] for r in whole] == [b"secret %d" % i for i in range(30)]
        for columns in SOME:
            picked = _pick(whole, READ_SCHEMA.fieldNames(), columns)
            assert _scan(options, columns, arrow=arrow) == picked


def _sorted(df: Any) -> list[tuple[Any, ...]]:
    return sorted(map(tuple, df.collect()), key=repr)


@pytest.mark.usefixtures("reader")
def test_spark_reads_the_asked_columns(spark: Any, tree: Path) -> None:
    full = spark.read.format("ledgerq").load(str(tree))
    for columns in SOME:
        df = spark.read.format("ledgerq").option("columns", ",".join(columns)).load(str(tree))
        assert df.schema.fieldNames() == list(columns)
        assert [f.dataType for f in df.schema] == [READ_SCHEMA[c].dataType for c in columns]
        assert _sorted(df) == _sorted(full.select(*columns)), columns
    for arrow in ("true", "false"):  # names are trimmed and case-insensitive
        df = (
            spark.read.format("ledgerq")
            .option("columns", " ID, Payload ")
            .option("arrow", arrow)
            .load(str(tree))
        )
        assert _sorted(df) == _sorted(full.select("id", "payload"))


@pytest.mark.usefixtures("reader")
def test_columns_with_pushdown_state_and_a_key(spark: Any, tree: Path, tmp_path: Path) -> None:
    def read(**options: str) -> Any:
        return spark.read.format("ledgerq").options(**options).load(str(tree))

    where = "id between 3 and 40 and queue = 'orders'"
    assert _sorted(read(columns="queue,id,payload").where(where)) == _sorted(
        read().where(where).select("queue", "id", "payload")
    )
    with_state = read(reader="default", columns="id,state,queue")
    assert with_state.schema.fieldNames() == ["id", "state", "queue"]
    whole = read(reader="default")
    assert whole.schema == READ_SCHEMA_WITH_STATE
    assert _sorted(with_state) == _sorted(whole.select("id", "state", "queue"))

    path = tmp_path / "sealed"
    with ledgerq.open(path, encryption_key=KEY) as q:
        q.enqueue_batch([b"secret %d" % i for i in range(50)])
    sealed = spark.read.format("ledgerq").option("encryption_key_hex", KEY.hex())
    got = sealed.option("columns", "payload").load(str(path))
    assert sorted(r["payload"] for r in got.collect()) == sorted(
        b"secret %d" % i for i in range(50)
    )


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("id,colour", "unknown column 'colour'"),
        ("id,,payload", "an empty name"),
        ("id,ID", "a column named twice"),
        ("id,state", r"unknown column 'state'.*\(state needs the reader option\)"),
    ],
)
def test_bad_columns_fail_when_the_read_is_made(
    spark: Any, tree: Path, given: str, reason: str
) -> None:
    with pytest.raises(Exception, match=r"option columns must name columns of the ledgerq schema"):
        spark.read.format("ledgerq").option("columns", given).load(str(tree))
    from ledgerq.spark._source import read_options

    with pytest.raises(ledgerq.ConfigError, match=reason):
        read_options({"path": str(tree), "columns": given})


def test_a_stream_reads_the_asked_columns(spark: Any, tmp_path: Path) -> None:
    from tests.spark.helpers import await_termination

    source, sink = tmp_path / "queues", tmp_path / "sink"
    with ledgerq.open(source / "a", segment_size=256) as q:
        q.enqueue_batch([b"a%d" % i for i in range(30)])
    stream = spark.readStream.format("ledgerq").option("columns", "payload,id").load(str(source))
    assert stream.schema.fieldNames() == ["payload", "id"]
    query = (
        stream.writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    await_termination(query)
    rows = spark.read.parquet(str(sink)).collect()
    assert sorted((r["id"], r["payload"]) for r in rows) == [(i + 1, b"a%d" % i) for i in range(30)]
