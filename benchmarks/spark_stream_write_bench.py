"""Streaming-write throughput of the ``ledgerq`` sink, against the same stream to Parquet.

    python benchmarks/spark_stream_write_bench.py            # 400,000 x 100 B, 8 shards
    python benchmarks/spark_stream_write_bench.py --rows 100000 --files 4 --repeat 1

Run by hand (not part of the test suite).  Method: ``--rows`` payloads of ``--size``
random bytes are written by Spark as ``--files`` Parquet appends (each of 2 partitions,
so twice as many files); then, in one Spark session (``local[2]``), the same stream -
``readStream.parquet`` with ``maxFilesPerTrigger=1`` (one micro-batch per file),
``trigger(availableNow=True)`` - is written to ``format("ledgerq")`` with ``shards=8``,
to ``format("parquet")``, and to a no-op Python streaming sink (a Python data source
whose tasks take the Arrow batches and drop them and whose commit does nothing: the
floor any Python sink pays), each run with a fresh checkpoint, timed from ``start()``
to the end of the query.  A warm-up runs first, untimed: one stream to Parquet and one
to the no-op Python sink (Spark starts its Python worker processes at the first
micro-batch of a Python sink, ~11 s, then reuses them).  The three sinks then run in
turn, ``--repeat`` rounds; prints rows/s of each, median (min-max), and the ratios of
the medians to Parquet's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds of the three sinks")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from ledgerq.spark import register

    work = Path(tempfile.mkdtemp(prefix="lq-stream-bench-"))
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(work / "local"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(_noop_source())
    try:
        source = work / "in"
        per_file = args.rows // args.files
        for _ in range(args.files):
            (
                spark.range(per_file, numPartitions=2)
                .select(F.randstr(args.size).cast("binary").alias("payload"))
                .write.mode("append")
                .parquet(str(source))
            )

        def run(fmt: str, name: str) -> float:
            writer = (
                spark.readStream.format("parquet")
                .schema("payload binary")
                .option("maxFilesPerTrigger", 1)
                .load(str(source))
                .writeStream.format(fmt)
                .option("checkpointLocation", str(work / f"ck-{name}"))
                .trigger(availableNow=True)
            )
            if fmt == "ledgerq":
                writer = writer.option("shards", args.shards)
            began = time.perf_counter()
            query = writer.start(str(work / f"out-{name}"))
            query.awaitTermination()
            if query.exception() is not None:
                raise SystemExit(f"{name}: {query.exception()}")
            took = time.perf_counter() - began
            shutil.rmtree(work / f"out-{name}", ignore_errors=True)
            shutil.rmtree(work / f"ck-{name}", ignore_errors=True)
            return took

        run("parquet", "warmup-parquet")
        run(NOOP, "warmup-noop")
        files = len(list(source.glob("*.parquet")))
        rows = per_file * args.files
        sinks = {"ledgerq": "ledgerq", "parquet": "parquet", NOOP: "no-op Python sink"}
        rates: dict[str, list[float]] = {fmt: [] for fmt in sinks}
        for round_ in range(args.repeat):
            for fmt in sinks:
                took = run(fmt, f"{fmt}-{round_}")
                rates[fmt].append(rows / took)
                print(f"round {round_ + 1}, {sinks[fmt]}: {rows / took:,.0f} rows/s ({took:.1f} s)")
        with open("/proc/loadavg", encoding="ascii") as f:
            load = " ".join(f.read().split()[:3])
        print(
            f"{rows} rows x {args.size} B in {files} files (one micro-batch each), local[2], "
            f"{args.repeat} rounds, load average {load}"
        )
        parquet = statistics.median(rates["parquet"])
        for fmt, label in sinks.items():
            found = sorted(rates[fmt])
            median = statistics.median(found)
            print(
                f"{label + (f', {args.shards} shards' if fmt == 'ledgerq' else '') + ':':<30}"
                f"{median:>9,.0f} rows/s ({found[0]:,.0f}-{found[-1]:,.0f}), "
                f"{median / parquet:.2f}x of parquet"
            )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


NOOP = "ledgerq_bench_noop"


def _noop_source() -> Any:
    """A Python data source whose stream writer drops every row (the floor)."""
    from dataclasses import dataclass

    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )

    @dataclass(frozen=True)
    class Dropped(WriterCommitMessage):
        rows: int

    class NoopStreamWriter(DataSourceStreamArrowWriter):
        def write(self, iterator: Any) -> Dropped:
            return Dropped(sum(batch.num_rows for batch in iterator))

        def commit(self, messages: Any, batchId: int) -> None:
            pass

        def abort(self, messages: Any, batchId: int) -> None:
            pass

    class NoopSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return NOOP

        def streamWriter(self, schema: Any, overwrite: bool) -> NoopStreamWriter:
            return NoopStreamWriter()

    return NoopSource


if __name__ == "__main__":
    main()
