"""The JVM reader against the Python one: the same rows, skips and failures.

The JVM reader (``ledgerq/spark/jvm``) runs the tasks the Python planner makes.  Here
it runs without Spark (``_jvm.jvm_scan``: one ``java`` process for many tasks) on the
segments ``test_scan.py`` damages - a flipped bit at every offset, a cut at every
offset of the tail, pushed bounds, reader state - and must give exactly what the Python
scan gives, rows and counts.  Through Spark, the plan says which reader served it.
"""

from __future__ import annotations

import logging
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.spark import require_spark

require_spark()

import ledgerq  # noqa: E402
from ledgerq.spark import READER_CONF  # noqa: E402
from ledgerq.spark._jvm import jvm_scan  # noqa: E402
from ledgerq.spark._layout import ReaderSnapshot, list_segments  # noqa: E402
from ledgerq.spark._plan import task_to_json  # noqa: E402
from ledgerq.spark._scan import ScanStats, SegmentTask, scan_segment  # noqa: E402
from ledgerq.tools import iter_messages  # noqa: E402
from tests.encryption._files import KEY  # noqa: E402
from tests.spark.helpers import flipped_copy, segment_files  # noqa: E402
from tests.spark.test_scan import _fixed_queue, _queue  # noqa: E402

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _us(t: datetime | None) -> int | None:
    return None if t is None else (t - _EPOCH) // _US


def _python(task: SegmentTask) -> dict[str, Any]:
    """What the Python reader gives for ``task``, in the shape of ``jvm_scan``."""
    stats = ScanStats()
    try:
        rows = [
            [r[1], _us(r[2]), _us(r[3]), r[4], dict(r[5]), r[6].hex(), _us(r[7])]
            for r in scan_segment(task, arrow=False, stats=stats)
        ]
    except ledgerq.CorruptionError:
        return {"error": True}
    return {
        "rows": rows,
        "corrupt_regions": stats.corrupt_regions,
        "corrupt_bytes": stats.corrupt_bytes,
        "lost_messages": stats.lost_messages,
    }


def _tasks(queue: Path, **fields: Any) -> list[SegmentTask]:
    return [
        SegmentTask(
            queue.name, str(queue), s.first_id, s.next_first_id, name_id=s.name_id, **fields
        )
        for s in list_segments(str(queue))
    ]


def _compare(tasks: list[SegmentTask]) -> None:
    got = jvm_scan([task_to_json(t) for t in tasks])
    if got is None:
        pytest.skip("no JDK: the JVM reader cannot be built")
    for task, jvm in zip(tasks, got, strict=True):
        expected = _python(task)
        if "error" in expected:
            assert "error" in jvm, task
        else:
            assert jvm == expected, task


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="ledgerq")  # the Python skips are logged


def _damaged_copies(clean: Path, root: Path) -> list[Path]:
    size = segment_files(clean)[0].stat().st_size
    return [flipped_copy(clean, root / f"d{offset}", offset) for offset in range(size)]


@pytest.mark.parametrize("kind", ["mixed", "fixed"])
@pytest.mark.parametrize("failfast", [False, True], ids=["permissive", "failfast"])
def test_a_flipped_bit_anywhere_reads_as_in_python(
    tmp_path: Path, kind: str, failfast: bool
) -> None:
    clean = _queue(tmp_path / "clean", n=12) if kind == "mixed" else _fixed_queue(tmp_path / "c")
    tasks = [_tasks(clean)[0]]
    for damaged in _damaged_copies(clean, tmp_path):
        tasks.extend(_tasks(damaged, failfast=failfast)[:1])
    _compare(tasks)


@pytest.mark.parametrize("live_tail", [True, False], ids=["live", "sealed"])
def test_a_cut_tail_reads_as_in_python(tmp_path: Path, live_tail: bool) -> None:
    clean = _queue(tmp_path / "clean", n=10)
    size = segment_files(clean)[0].stat().st_size
    tasks = []
    for cut in range(size - 80, size):
        queue = tmp_path / f"cut{cut}"
        shutil.copytree(clean, queue)
        log = segment_files(queue)[0]
        log.write_bytes(log.read_bytes()[:cut])
        tasks.extend(_tasks(queue, live_tail=live_tail))
        tasks.extend(_tasks(queue, live_tail=live_tail, failfast=True))
    _compare(tasks)


def test_pushed_bounds_and_reader_state_read_as_in_python(tmp_path: Path) -> None:
    queue = tmp_path / "q"
    with ledgerq.open(queue, segment_size=1024, index_interval=128) as q:
        for i in range(120):
            q.enqueue(b"m%d" % i * (1 + i % 5), headers={"i": str(i)} if i % 7 == 0 else None)
    first = _tasks(queue)[0]
    stamps = [m.timestamp // 1000 for m in iter_messages(queue)]
    state = ReaderSnapshot(30, frozenset({31, 40, 77}), frozenset({32, 90}))
    tasks = [
        *_tasks(queue, id_lo=17, id_hi=95),
        *_tasks(queue, ids=frozenset({3, 44, 45, 119, 500})),
        *_tasks(queue, ts_lo=stamps[50], ts_hi=stamps[70], seek_by_time=True),
        *_tasks(queue, id_lo=60),
        *_tasks(queue, state=state),
        SegmentTask(first.queue, first.path, first.first_id, first.next_first_id, size_limit=300),
    ]
    _compare(tasks)


def _sealed_queue(path: Path) -> Path:
    with ledgerq.open(
        path, encryption_key=KEY, compression="zstd", compression_min_size=32, index_interval=200
    ) as q:
        for i in range(10):
            payload = f"secret {i} ".encode() * (1 + i % 4)
            q.enqueue(payload, headers={"i": str(i)} if i % 2 else None, priority=i % 3)
    return path


def test_encrypted_queues_read_as_in_python(tmp_path: Path) -> None:
    """Sealed entries opened; a flipped bit anywhere, a tampered entry whose CRC was made
    right again (authentication fails), an entry that is not sealed: all as in Python."""
    from ledgerq.format.checksum import checksum
    from ledgerq.format.entry import decode_entry, encode_entry

    clean = _sealed_queue(tmp_path / "clean")
    tasks = _tasks(clean, encryption_key=KEY)
    log = segment_files(clean)[0]
    raw = log.read_bytes()
    step = 7
    for offset in range(0, len(raw), step):
        tasks.extend(
            _tasks(flipped_copy(clean, tmp_path / f"d{offset}", offset), encryption_key=KEY)
        )
    at = 0
    while at < len(raw):
        _, end = decode_entry(raw, at)
        tampered = tmp_path / f"t{at}"
        shutil.copytree(clean, tampered)
        data = bytearray(raw)
        data[end - 10] ^= 1  # inside the tag
        data[end - 4 : end] = checksum(bytes(data[at : end - 4])).to_bytes(4, "little")
        segment_files(tampered)[0].write_bytes(bytes(data))
        tasks.extend(_tasks(tampered, encryption_key=KEY))
        tasks.extend(_tasks(tampered, encryption_key=KEY, failfast=True))
        at = end
    forged = tmp_path / "forged"
    shutil.copytree(clean, forged)
    with open(segment_files(forged)[0], "ab") as f:
        f.write(encode_entry(11, 1, b"not sealed"))
    tasks.extend(_tasks(forged, encryption_key=KEY))
    _compare(tasks)
    assert jvm_scan([task_to_json(tasks[0])])[0]["rows"][0][5] == (b"secret 0 ").hex()  # type: ignore[index]


def _read_in_jvm(df: Any) -> bool:
    """Whether the batch scan of ``df``'s plan reads its segments in the JVM."""
    plan = df._jdf.queryExecution().executedPlan()
    nodes = plan.collectLeaves()
    for i in range(nodes.size()):
        node = nodes.apply(i)
        if node.getClass().getSimpleName() == "BatchScanExec":
            batch = node.batch()
            return bool(
                batch.getClass().getName() == "ledgerq.jvm.JvmBatch" and batch.isReadInJvm()
            )
    raise AssertionError("no batch scan in the plan")


def test_batch_reads_are_served_by_the_jvm_reader(spark: Any, reader: str, tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "plain") as q:
        q.enqueue_batch([b"a", b"b"])
    with ledgerq.open(tmp_path / "sealed", encryption_key=KEY) as q:
        q.enqueue_batch([b"secret"])
    plain = spark.read.format("ledgerq").load(str(tmp_path / "plain"))
    assert _read_in_jvm(plain) == (reader == "jvm")
    assert sorted(r["payload"] for r in plain.collect()) == [b"a", b"b"]
    # An encrypted queue, with its key: the JVM reader opens it too.
    sealed = (
        spark.read.format("ledgerq")
        .option("encryption_key_hex", KEY.hex())
        .load(str(tmp_path / "sealed"))
    )
    assert _read_in_jvm(sealed) == (reader == "jvm")
    assert [r["payload"] for r in sealed.collect()] == [b"secret"]
    # The option overrides the session's choice, for one read.
    python = spark.read.format("ledgerq").option("jvm", "false").load(str(tmp_path / "plain"))
    assert not _read_in_jvm(python)
    assert spark.conf.get(READER_CONF) == ("true" if reader == "jvm" else "false")


def test_without_javac_there_is_no_jar_and_reads_stay_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledgerq.spark import jvm_jar
    from ledgerq.spark._jvm import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no javac on it
    assert jvm_jar() is None
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*.jar"))
