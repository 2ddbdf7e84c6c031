"""Edge buffering with ledgerq, aggregation with Spark, a derived work queue back out.

Three "edge devices" buffer sensor readings into their own local queues (as they would
while offline), and the queues are gathered under one directory (as ``ledgerq ship``
does).  A Spark job then reads every queue of that tree in one DataFrame, aggregates
the readings per device and sensor, and writes one maintenance task per overheating
sensor into a sharded work queue, keyed by device.  A worker drains the work queue with
``ledgerq.open_sharded``.  (Streaming reads: see docs/spark.md.)

Needs the spark extra (``pip install 'ledgerq[spark]'``) and Java 17+.

Run: python examples/spark_pipeline.py [DIR]
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import ledgerq

DEVICES = ("pump-station-1", "pump-station-2", "substation-7")
SENSORS = ("bearing", "motor", "inverter")


def buffer_readings(edge: Path, rng: random.Random, per_device: int) -> int:
    """Each device appends its readings to its own queue, in small batches."""
    total = 0
    for device in DEVICES:
        with ledgerq.open(edge / device / "readings", segment_size=16 * 1024) as q:
            for _ in range(per_device // 50):
                batch = []
                for _ in range(50):
                    sensor = rng.choice(SENSORS)
                    hot = device == "substation-7" and sensor == "inverter"
                    celsius = rng.gauss(92 if hot else 61, 4)
                    batch.append(
                        ledgerq.Item(
                            json.dumps({"sensor": sensor, "celsius": round(celsius, 1)}).encode(),
                            headers={"device": device, "unit": "C"},
                        )
                    )
                total += len(q.enqueue_batch(batch))
    return total


def main(base: Path) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        from ledgerq.spark import register
    except ImportError as exc:
        print(f"skipped: this example needs the spark extra ({exc})")
        return
    if shutil.which("java") is None:
        print("skipped: this example needs Java 17+ for Spark")
        return

    edge, work = base / "edge", base / "work"
    rng = random.Random(7)
    print(f"buffered {buffer_readings(edge, rng, per_device=600)} readings on 3 devices")

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("ledgerq-spark-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        readings = spark.read.format("ledgerq").load(str(edge))
        parsed = readings.select(
            F.col("headers")["device"].alias("device"),
            F.from_json(F.col("payload").cast("string"), "sensor string, celsius double").alias(
                "r"
            ),
        ).select("device", "r.sensor", "r.celsius")
        stats = parsed.groupBy("device", "sensor").agg(
            F.count("*").alias("n"),
            F.round(F.avg("celsius"), 1).alias("avg_c"),
            F.max("celsius").alias("max_c"),
        )
        print("per device and sensor:")
        for row in stats.orderBy("device", "sensor").collect():
            print(
                f"  {row.device:15s} {row.sensor:9s} n={row.n:4d} avg={row.avg_c}C max={row.max_c}C"
            )

        tasks = stats.where(F.col("avg_c") > 80).select(
            F.to_json(F.struct("device", "sensor", "avg_c", "max_c"))
            .cast("binary")
            .alias("payload"),
            F.col("device").alias("key"),
            F.create_map(F.lit("action"), F.lit("inspect-cooling")).alias("headers"),
            F.lit(2).alias("priority"),  # HIGH
            F.lit(24 * 3600.0).alias("ttl"),
        )
        tasks.write.format("ledgerq").mode("append").option("shards", "2").save(str(work))

        with ledgerq.open_sharded(work, 2) as queue:
            print(f"work queue holds {len(queue)} task(s)")
            while (task := queue.dequeue()) is not None:
                print(
                    f"  worker got task {task.id}: {task.headers['action']} {task.payload.decode()}"
                )
                queue.ack(task.id)

    finally:
        spark.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
