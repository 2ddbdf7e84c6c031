"""Encrypted queues through the Spark source: ``.option("encryption_key_hex", ...)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark import require_spark

require_spark()

from pyspark.sql.types import BinaryType, StructField, StructType  # noqa: E402

import ledgerq  # noqa: E402
from ledgerq.shard import shard_dir_name  # noqa: E402
from ledgerq.spark._plan import Pushed, ReadOptions, plan_tasks  # noqa: E402
from ledgerq.spark._scan import ScanStats, scan_segment  # noqa: E402
from tests.encryption._files import KEY, OTHER_KEY, files_holding  # noqa: E402

SECRET = b"spark secret"


def _fill(path: Path, count: int) -> None:
    with ledgerq.open(path, encryption_key=KEY, segment_size=500) as q:
        q.enqueue_batch(
            [ledgerq.Item(SECRET + b" %d" % i, headers={"i": str(i)}) for i in range(count)]
        )


def _rows(path: Path, key: bytes | None, stats: ScanStats) -> list[tuple[Any, ...]]:
    tasks = plan_tasks(ReadOptions(paths=(str(path),), encryption_key=key), Pushed())
    return [row for task in tasks for row in scan_segment(task, arrow=False, stats=stats)]


def test_the_scan_opens_sealed_entries_with_the_key(tmp_path: Path) -> None:
    path = tmp_path / "q"
    _fill(path, 30)
    stats = ScanStats()
    rows = _rows(path, KEY, stats)
    assert [r[6] for r in rows] == [SECRET + b" %d" % i for i in range(30)]
    assert [r[5]["i"] for r in rows] == [str(i) for i in range(30)]
    assert stats.decoded_one_by_one == 30  # sealed entries are opened one by one
    with pytest.raises(ledgerq.ConfigError, match="is encrypted"):
        _rows(path, None, ScanStats())
    with pytest.raises(ledgerq.ConfigError, match="wrong encryption_key"):
        _rows(path, OTHER_KEY, ScanStats())


def test_a_tampered_sealed_entry_is_skipped(tmp_path: Path) -> None:
    from ledgerq.format.checksum import checksum
    from ledgerq.format.entry import decode_entry

    path = tmp_path / "q"
    _fill(path, 3)
    (log,) = sorted((path / "segments").glob("*.log"))[:1]
    raw = bytearray(log.read_bytes())
    _, end = decode_entry(raw, 0)
    raw[end - 10] ^= 1  # the first entry's tag; its CRC made right again
    raw[end - 4 : end] = checksum(bytes(raw[: end - 4])).to_bytes(4, "little")
    log.write_bytes(bytes(raw))
    stats = ScanStats()
    rows = _rows(path, KEY, stats)
    assert [r[6] for r in rows] == [SECRET + b" 1", SECRET + b" 2"]
    assert stats.lost_messages == 1


def test_spark_writes_and_reads_encrypted_queues(spark: Any, tmp_path: Path) -> None:
    rows = [(SECRET + b" %d" % i, f"k{i % 5}") for i in range(100)]
    df = spark.createDataFrame(rows, "payload binary, key string")
    (
        df.write.format("ledgerq")
        .mode("append")
        .option("shards", "2")
        .option("encryption_key_hex", KEY.hex())
        .save(str(tmp_path))
    )
    assert files_holding(tmp_path, SECRET) == []
    with ledgerq.open(tmp_path / shard_dir_name("", 2, 0), encryption_key=KEY) as q:
        assert all(m.payload.startswith(SECRET) for m in q.peek(100))
    back = spark.read.format("ledgerq").option("encryption_key_hex", KEY.hex()).load(str(tmp_path))
    assert sorted(r["payload"] for r in back.select("payload").collect()) == sorted(
        p for p, _ in rows
    )
    with pytest.raises(Exception, match="is encrypted"):
        spark.read.format("ledgerq").load(str(tmp_path)).count()
    before = _tree(tmp_path)
    with pytest.raises(Exception, match=r"is encrypted: give its key with .option\('encryption_"):
        df.write.format("ledgerq").mode("append").save(str(tmp_path))
    assert _tree(tmp_path) == before, "nothing was written"


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("created_with", "written_with", "error"),
    [
        (KEY, None, r"is encrypted: give its key with .option\('encryption_key_hex'"),
        (KEY, OTHER_KEY, r"wrong encryption_key .*\(option encryption_key_hex\); nothing was"),
        (None, KEY, r"is not encrypted, .* write without option encryption_key_hex"),
    ],
    ids=["no key", "another key", "a key for plain queues"],
)
def test_a_write_with_a_key_that_does_not_fit_fails_at_the_start(
    tmp_path: Path, created_with: bytes | None, written_with: bytes | None, error: str
) -> None:
    from ledgerq.spark import foreach_batch_writer
    from ledgerq.spark._stream_write import LedgerqStreamWriter
    from ledgerq.spark._write import LedgerqWriter

    options = {} if created_with is None else {"encryption_key": created_with}
    ledgerq.open_sharded(tmp_path, 2, **options).close()
    before = _tree(tmp_path)
    key = {} if written_with is None else {"encryption_key_hex": written_with.hex()}
    given = {"path": str(tmp_path), **key}
    schema = StructType([StructField("payload", BinaryType())])
    for create in (LedgerqWriter.create, LedgerqStreamWriter.create):  # batch, writeStream
        with pytest.raises(ledgerq.ConfigError, match=error):
            create(given, schema, False)
    with pytest.raises(ledgerq.ConfigError, match=error):  # foreachBatch: when it is made
        foreach_batch_writer(str(tmp_path), **key)
    assert _tree(tmp_path) == before, "nothing was written"
