"""Streaming-write throughput of the ``ledgerq`` sink, against the same stream to Parquet.

    python benchmarks/spark_stream_write_bench.py            # 400,000 x 100 B, 8 shards
    python benchmarks/spark_stream_write_bench.py --rows 100000 --files 4

Run by hand (not part of the test suite).  Method: ``--rows`` payloads of ``--size``
random bytes are written by Spark as ``--files`` Parquet files; then, in one Spark
session (``local[2]``), the same stream - ``readStream.parquet`` with
``maxFilesPerTrigger=1`` (one micro-batch per file), ``trigger(availableNow=True)`` - is
written once to ``format("ledgerq")`` with ``shards=8`` and once to ``format("parquet")``,
each with a fresh checkpoint, timed from ``start()`` to the end of the query.  One warm-up
stream (to Parquet) runs first, untimed.  Prints rows/s of each and the ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--shards", type=int, default=8)
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
            return time.perf_counter() - began

        run("parquet", "warmup")
        files = len(list(source.glob("*.parquet")))
        ledgerq_s = run("ledgerq", "ledgerq")
        parquet_s = run("parquet", "parquet")
        rows = per_file * args.files
        print(f"{rows} rows x {args.size} B in {files} files (one micro-batch each), local[2]")
        print(f"ledgerq, {args.shards} shards: {rows / ledgerq_s:,.0f} rows/s ({ledgerq_s:.1f} s)")
        print(f"parquet:           {rows / parquet_s:,.0f} rows/s ({parquet_s:.1f} s)")
        print(f"ratio ledgerq/parquet: {parquet_s / ledgerq_s:.2f}x")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
