"""Spark read/write throughput of the ``ledgerq`` data source, against Parquet.

    python benchmarks/spark_bench.py                    # 1,000,000 x 100 B, local[2]
    python benchmarks/spark_bench.py --rows 200000 --repeats 3 --queues 2

Run by hand (it is not part of the test suite).  Method:

* two queue directory trees are built with ``ledgerq.open(..., sync="never")``, the
  same ``--rows`` payloads of ``--size`` random bytes in the same order, spread over
  ``--queues`` queues with the default ``segment_size`` (64 MiB), so one input
  partition per segment file: one with ``enqueue_batch`` (batches of 10,000, whose
  entries but the last carry BATCH_CONTINUES) and one with ``enqueue``, one at a time;
* the very same rows (every column of the read schema) are written once to Parquet
  by Spark (``spark.read.format("ledgerq").load(...).write.parquet(...)``, from the
  batch-written tree);
* one Spark session (``--master``, default ``local[2]``) then reads, repeatedly and
  interleaved (each tree with the JVM reader, and with the Python reader's Arrow
  batches and tuples - option ``jvm=false`` -, Parquet), each into
  the ``noop`` sink, which materialises every column of every row;
* each variant first runs once untimed (Python worker start-up, JIT); the table shows
  the median and the min-max of ``--repeats`` timed runs (no means), as rows/s;
* the CPU time each run costs, the JVM's and its Python workers' together (read from
  ``/proc``, Linux only): on a shared machine, wall times swing with other work, CPU
  time much less, so its ratio is the steadier comparison;
* two columns (``id``, ``payload``): ``select`` after a whole read, option ``columns``,
  and Parquet's ``select`` (which reads only those columns);
* also measured: the same scan without Spark, in this process (the Python cost per row
  that Spark's workers pay), a pushed-down id range against the same filter applied by
  Spark after a full scan, and a write of the rows back into sharded queues.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLOOR_NAME = "the same rows made in memory by a Python data source that reads nothing"
TWO = ("id", "payload")
TWO_SELECT = "ledgerq (enqueue_batch), select(id, payload) of a whole read"
TWO_OPTION = "ledgerq (enqueue_batch), option columns=id,payload"
TWO_PARQUET = "Parquet, select(id, payload)"
JVM_BATCH = "ledgerq written with enqueue_batch, JVM reader"
JVM_SINGLE = "ledgerq written with enqueue, JVM reader"
PY_BATCH = "ledgerq written with enqueue_batch, read() yields Arrow record batches"
PY_SINGLE = "ledgerq written with enqueue, read() yields Arrow record batches"
JVM_TWO_SELECT = "ledgerq (enqueue_batch), JVM reader, select(id, payload) of a whole read"
JVM_TWO_OPTION = "ledgerq (enqueue_batch), JVM reader, option columns=id,payload"


def _build(root: Path, payloads: list[bytes], queues: int, *, batch: bool) -> None:
    import ledgerq

    rows = len(payloads)
    per_queue = [rows // queues + (1 if i < rows % queues else 0) for i in range(queues)]
    done = 0
    for i, count in enumerate(per_queue):
        mine = payloads[done : done + count]
        done += count
        with ledgerq.open(root / f"q{i}", sync="never") as q:
            if batch:
                for start in range(0, count, 10_000):
                    q.enqueue_batch(mine[start : start + 10_000])
            else:
                for payload in mine:
                    q.enqueue(payload)


def _timed(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up: worker start-up, JIT, page cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` and its descendants (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        parents[int(name)] = int(fields[1])
        # utime, stime, and those of waited-for children
        used[int(name)] = sum(int(v) for v in fields[11:15]) / tick
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += used.get(current, 0.0)
        stack.extend(child for child, parent in parents.items() if parent == current)
    return total


def _rate(rows: int, times: list[float]) -> str:
    rates = sorted(rows / t for t in times)
    return (
        f"{statistics.median(rates) / 1e3:,.0f}k ({rates[0] / 1e3:,.0f}k-{rates[-1] / 1e3:,.0f}k)"
    )


def _floor_source(rows: int, size: int, partitions: int) -> type:
    """A Python data source that makes the rows of the read schema in memory, reading nothing.

    Its rate is what Spark's Python data source API can carry on this machine: the
    rows still go through a Python worker, Arrow serialisation, a socket and the
    JVM's conversion, as ledgerq's do; only the reading and checking of segment files
    is missing.  Same schema, row count, payload size and partition count as the
    ledgerq read; Arrow batches of 4 MiB of payload at most, as ledgerq's scan yields.
    """
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from ledgerq.spark._scan import ARROW_SCHEMA
    from ledgerq.spark._source import READ_SCHEMA

    def batches(first: int, count: int) -> Iterator[object]:
        import pyarrow as pa

        step = max(1, (4 << 20) // (size + 26))
        blob = pa.py_buffer(os.urandom(size * step))
        stamp = pa.timestamp("us", tz="UTC")
        for start in range(first, first + count, step):
            n = min(step, first + count - start)
            offsets = pa.array(range(0, size * (n + 1), size), pa.int32()).buffers()[1]
            no_strings = pa.array([], pa.string())
            yield pa.RecordBatch.from_arrays(
                [
                    pa.repeat(pa.scalar("q0", pa.string()), n),
                    pa.array(range(start, start + n), pa.int64()),
                    pa.array(range(start, start + n), pa.int64()).cast(stamp),
                    pa.nulls(n, stamp),
                    pa.repeat(pa.scalar(1, pa.int32()), n),
                    pa.MapArray.from_arrays(
                        pa.repeat(pa.scalar(0, pa.int32()), n + 1), no_strings, no_strings
                    ),
                    pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets, blob]),
                    pa.nulls(n, stamp),
                ],
                schema=ARROW_SCHEMA,
            )

    class FloorReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            share = [rows // partitions + (i < rows % partitions) for i in range(partitions)]
            return [InputPartition((sum(share[:i]) + 1, share[i])) for i in range(partitions)]

        def read(self, partition: InputPartition) -> Iterator[object]:
            first, count = partition.value
            return batches(first, count)

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ledgerq_floor"

        def schema(self) -> object:
            return READ_SCHEMA

        def reader(self, schema: object) -> DataSourceReader:
            return FloorReader()

    return FloorSource


def _machine() -> list[tuple[str, str]]:
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if "model name" in ln), "?")
    except OSError:
        model = platform.processor() or "?"
    return [
        ("cpu", f"{model}, {os.cpu_count()} cores"),
        ("python", platform.python_version()),
        ("pyspark", metadata.version("pyspark")),
        ("pyarrow", metadata.version("pyarrow")),
        ("java", os.environ.get("JAVA_HOME") or shutil.which("java") or "?"),
        ("os", platform.platform()),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--queues", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", help="work directory (default: a new temporary one)")
    parser.add_argument("--skip-write", action="store_true", help="do not time the write")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from ledgerq.segment.readonly import find_queues
    from ledgerq.spark import register
    from ledgerq.spark._layout import list_segments
    from ledgerq.spark._plan import Pushed, ReadOptions, plan_tasks
    from ledgerq.spark._scan import scan_segment

    work = Path(args.dir or tempfile.mkdtemp(prefix="ledgerq-spark-bench-"))
    root, parquet, written = work / "queues", work / "parquet", work / "written"
    singles = work / "queues-enqueue"
    for p in (root, singles, parquet, written):
        shutil.rmtree(p, ignore_errors=True)
    started = time.perf_counter()
    payloads = [os.urandom(args.size) for _ in range(args.rows)]
    _build(root, payloads, args.queues, batch=True)
    _build(singles, payloads, args.queues, batch=False)
    del payloads
    segments = sum(len(list_segments(q.path)) for q in find_queues(str(root), include_dlq=False))
    print(
        f"built 2 x {args.rows:,} x {args.size} B messages in {args.queues} queue(s), {segments} "
        f"segments each, in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )

    spark = (
        SparkSession.builder.master(args.master)
        .appName("ledgerq-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    has_jvm = register(spark)
    try:
        source = str(root)
        spark.read.format("ledgerq").load(source).write.parquet(str(parquet))
        spark.dataSource.register(_floor_source(args.rows, args.size, segments))

        def noop(df: object) -> None:
            df.write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]

        single_source = str(singles)
        parquet_name = "Parquet (the same rows, written by Spark)"

        def read(path: str, **options: str) -> object:
            return spark.read.format("ledgerq").options(**options).load(path)

        py = {"jvm": "false"}  # the Python reader, whatever the session has
        variants: dict[str, Callable[[], object]] = {
            JVM_BATCH: lambda: noop(read(source)),
            JVM_SINGLE: lambda: noop(read(single_source)),
            PY_BATCH: lambda: noop(read(source, **py)),
            "ledgerq written with enqueue_batch, read() yields tuples": lambda: noop(
                read(source, arrow="false", **py)
            ),
            PY_SINGLE: lambda: noop(read(single_source, **py)),
            "ledgerq written with enqueue, read() yields tuples": lambda: noop(
                read(single_source, arrow="false", **py)
            ),
            parquet_name: lambda: noop(spark.read.parquet(str(parquet))),
            FLOOR_NAME: lambda: noop(spark.read.format("ledgerq_floor").load()),
            JVM_TWO_SELECT: lambda: noop(read(source).select(*TWO)),
            JVM_TWO_OPTION: lambda: noop(read(source, columns=",".join(TWO))),
            TWO_SELECT: lambda: noop(read(source, **py).select(*TWO)),
            TWO_OPTION: lambda: noop(read(source, columns=",".join(TWO), **py)),
            TWO_PARQUET: lambda: noop(spark.read.parquet(str(parquet)).select(*TWO)),
        }
        if not has_jvm:
            for name in (JVM_BATCH, JVM_SINGLE, JVM_TWO_SELECT, JVM_TWO_OPTION):
                del variants[name]
        jvm = spark._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[attr-defined]
        times: dict[str, list[float]] = {name: [] for name in variants}
        cpus: dict[str, list[float]] = {name: [] for name in variants}
        for fn in variants.values():
            fn()  # warm-up
        for _ in range(args.repeats):  # interleaved, so drift hits every variant alike
            for name, fn in variants.items():
                cpu = _cpu_seconds(jvm)
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
                cpus[name].append(_cpu_seconds(jvm) - cpu)

        def local_scan(path: str) -> Callable[[], None]:
            tasks = plan_tasks(ReadOptions(paths=(path,)), Pushed())

            def scan() -> None:
                for task in tasks:
                    for _ in scan_segment(task):
                        pass

            return scan

        local = _timed(local_scan(source), args.repeats)
        local_singles = _timed(local_scan(single_source), args.repeats)
        lo, hi = args.rows // 3, args.rows // 3 + 1999
        pushed = _timed(
            lambda: (
                spark.read.format("ledgerq").load(source).where(f"id between {lo} and {hi}").count()
            ),
            args.repeats,
        )
        unpushed = _timed(
            lambda: (
                spark.read.format("ledgerq")
                .option("pushdown", "false")
                .load(source)
                .where(f"id between {lo} and {hi}")
                .count()
            ),
            args.repeats,
        )

        def write() -> None:
            shutil.rmtree(written, ignore_errors=True)
            spark.read.parquet(str(parquet)).select("payload").write.format("ledgerq").mode(
                "append"
            ).option("shards", "2").save(str(written))

        writes = [] if args.skip_write else _timed(write, max(1, args.repeats // 2))
    finally:
        spark.stop()

    def rate(name: str) -> float:
        return statistics.median(args.rows / t for t in times[name])

    parquet_rate = rate(parquet_name)
    floor_rate = rate(FLOOR_NAME)
    print(f"## Spark throughput: {args.rows:,} messages of {args.size} B, {args.master}\n")
    print("| what | rows/s, median (min-max) | best | CPU s (JVM + workers), median |")
    print("|---|---|---|---|")
    for name, values in times.items():
        print(
            f"| {name}, noop sink | {_rate(args.rows, values)} | "
            f"{args.rows / min(values) / 1e3:,.0f}k | {statistics.median(cpus[name]):.2f} |"
        )
    print(
        "| the same scan without Spark, one Python process (enqueue_batch) | "
        f"{_rate(args.rows, local)} | | |"
    )
    print(
        "| the same scan without Spark, one Python process (enqueue) | "
        f"{_rate(args.rows, local_singles)} | | |"
    )
    if writes:
        print(
            '| Spark write into 2 sharded queues (`mode("append")`, payload only) | '
            f"{_rate(args.rows, writes)} | | |"
        )
    best = {name: args.rows / min(values) for name, values in times.items()}
    cpu = {name: statistics.median(values) for name, values in cpus.items()}
    if has_jvm:
        print(
            f"\nThe JVM reader reads at **{rate(JVM_BATCH) / parquet_rate:.2f}x** of Parquet's "
            f"rate for the queue written with enqueue_batch, "
            f"**{rate(JVM_SINGLE) / parquet_rate:.2f}x** for the one written with enqueue "
            f"(medians; best of each: {best[JVM_BATCH] / best[parquet_name]:.2f}x and "
            f"{best[JVM_SINGLE] / best[parquet_name]:.2f}x; CPU time per read, Parquet's over "
            f"ledgerq's: {cpu[parquet_name] / cpu[JVM_BATCH]:.2f}x and "
            f"{cpu[parquet_name] / cpu[JVM_SINGLE]:.2f}x). Two columns: option columns at "
            f"{best[JVM_TWO_OPTION] / best[TWO_PARQUET]:.2f}x Parquet's select (best of each)."
        )
    else:
        print("\nNo JVM reader in this run (no javac): the Python reader only.")
    print(
        f"\nThe Python reader (Arrow) reads at **{rate(PY_BATCH) / parquet_rate:.2f}x** of "
        f"Parquet's rate for the queue written with enqueue_batch, "
        f"**{rate(PY_SINGLE) / parquet_rate:.2f}x** for the one written with enqueue, in this "
        "run. The rows made in memory by a Python data source that reads nothing came at "
        f"**{floor_rate / parquet_rate:.2f}x** of Parquet's rate: the Python reader reads at "
        f"{rate(PY_BATCH) / floor_rate:.2f}x and {rate(PY_SINGLE) / floor_rate:.2f}x of what "
        "the Python data source API carries here."
    )
    print(
        f"\nBest-of-{args.repeats} rates against Parquet's best, Python reader: "
        f"**{best[PY_BATCH] / best[parquet_name]:.2f}x** (enqueue_batch) and "
        f"**{best[PY_SINGLE] / best[parquet_name]:.2f}x** (enqueue); CPU time per read, "
        f"Parquet's over ledgerq's: {cpu[parquet_name] / cpu[PY_BATCH]:.2f}x and "
        f"{cpu[parquet_name] / cpu[PY_SINGLE]:.2f}x. Two columns: option columns at "
        f"{best[TWO_OPTION] / best[TWO_SELECT]:.2f}x the rate of a select after a whole "
        f"read (CPU {cpu[TWO_OPTION]:.2f} s against {cpu[TWO_SELECT]:.2f} s), "
        f"{best[TWO_OPTION] / best[TWO_PARQUET]:.2f}x Parquet's select (best of each)."
    )
    print(
        f"\nA pushed-down id range (2,000 of {args.rows:,} rows, `where id between ...`, "
        f"{'JVM' if has_jvm else 'Python'} reader): "
        f"median {statistics.median(pushed):.2f} s, against {statistics.median(unpushed):.2f} s "
        "with `pushdown=false` (Spark filters after a full scan)."
    )
    print("\n| machine | |\n|---|---|")
    for key, value in _machine():
        print(f"| {key} | {value} |")
    print(f"| segments | {segments} per tree ({args.queues} queue(s), default segment_size) |")
    print(f"\nCommand: `python benchmarks/spark_bench.py {' '.join(argv or sys.argv[1:])}`")
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
