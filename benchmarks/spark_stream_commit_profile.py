"""Profile one commit of the streaming writer (``commit_once``), without Spark.

    python benchmarks/spark_stream_commit_profile.py            # 50,000 x 100 B, 2 of 8 shards
    python benchmarks/spark_stream_commit_profile.py --rows 50000 --written 8 --top 25

Run by hand (not part of the test suite).  Method: the rows of one micro-batch are
staged as the stream writer's tasks stage them (one Arrow file per partition, a
partition's rows in shard ``partition % shards``, as with no ``key`` column), then
committed with ``commit_once``; ``--warm`` commits run first (the shards exist and hold
rows, as in a running query), then one commit is timed under cProfile and ``--timed``
more without it.  Prints the commits' wall times and the profile's top functions by
cumulative time.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import os
import pstats
import shutil
import statistics
import tempfile
import time

import pyarrow as pa
from pyspark.sql.types import BinaryType, StructField, StructType

from ledgerq.spark._stream_write import LedgerqStreamWriter, commit_once
from ledgerq.spark._write import STAGING_DIR, StagedFile, _Sink


def _stage(
    writer: LedgerqStreamWriter, batch: int, rows: int, size: int, written: int
) -> list[StagedFile]:
    """Stage ``rows`` random payloads of micro-batch ``batch`` into ``written`` shards."""
    task = copy.copy(writer.target)
    task.job = f"{writer.target.job}.b{batch}"
    os.makedirs(task.staging, exist_ok=True)
    files: list[StagedFile] = []
    per = rows // written
    schema = pa.schema([("payload", pa.binary())])
    for shard in range(written):
        payloads = [os.urandom(size) for _ in range(per)]
        sink = _Sink(
            shard, os.path.join(task.staging, f"{shard:03x}.p{shard:05d}.a0.arrow"), schema
        )
        sink.add(pa.RecordBatch.from_arrays([pa.array(payloads, pa.binary())], schema=schema))
        files.append(sink.finish())
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--written", type=int, default=2, help="shards a batch writes")
    parser.add_argument("--warm", type=int, default=2)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--timed", type=int, default=5, help="commits timed without cProfile")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="lq-commit-profile-")
    try:
        schema = StructType([StructField("payload", BinaryType())])
        writer = LedgerqStreamWriter.create(
            {"path": root, "shards": str(args.shards)}, schema, False
        )
        target = writer.target
        profile = cProfile.Profile()
        timed: list[float] = []
        for batch in range(args.warm + 1 + args.timed):
            files = _stage(writer, batch, args.rows, args.size, args.written)
            staging = os.path.join(target.root, STAGING_DIR, f"{target.job}.b{batch}")
            began = time.perf_counter()
            if batch == args.warm:
                profile.runcall(commit_once, target, "query-1", batch, files, staging)
                took = time.perf_counter() - began
            else:
                commit_once(target, "query-1", batch, files, staging)
                if batch > args.warm:
                    timed.append(time.perf_counter() - began)
        with open("/proc/loadavg", encoding="ascii") as f:
            load = " ".join(f.read().split()[:3])
        print(
            f"one commit of {args.rows} rows x {args.size} B into {args.written} of "
            f"{args.shards} shards: {took * 1000:.0f} ms under cProfile (load {load})"
        )
        if timed:
            ms = sorted(t * 1000 for t in timed)
            print(
                f"{len(ms)} commits after it, without cProfile: median "
                f"{statistics.median(ms):.0f} ms ({ms[0]:.0f}-{ms[-1]:.0f})"
            )
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
