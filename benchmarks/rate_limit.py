"""Worker pools with ``rate_limit``: the start rate they reach against the limit.

    python benchmarks/rate_limit.py [--limit 50/s] [--seconds 60] [--pools 1] [--processes 4]

A targeted measurement of issue 28's promise "a pool with ``rate_limit`` starts within
5% of the limit over 60 s".  Method: a queue holds more messages than the limit lets
start in the time; ``--pools`` pools (each its own process, shared mode, ``--processes``
children, a handler that returns at once) run with the same limit; after ``--seconds``
of wall time (the limit is a wall-time promise: this is the one benchmark that times
the wall clock) each pool is stopped with SIGTERM.  Reported: the starts the limiter
granted (its own accounting in ``shared/ratelimit``), the messages acked, both per
second of the run against the limit, and the largest count of handler starts seen in
any window of one period (must not exceed N; handler times are a little later than
the grants, so this is a check, not the promise's proof - tests/segment prove it).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import tempfile
import time

import ledgerq
import ledgerq.workers
from ledgerq.segment.readonly import read_rate_state

_LOG = "LEDGERQ_BENCH_STARTS"


def _handler(message: ledgerq.Message) -> None:
    fd = os.open(os.environ[_LOG], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"%d\n" % time.monotonic_ns())
    finally:
        os.close(fd)


def _pool(path: str, limit: str, processes: int) -> None:
    ledgerq.workers.run(path, _handler, processes=processes, rate_limit=limit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", default="50/s")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pools", type=int, default=1)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    count, period_ns = ledgerq.workers.parse_rate_limit(args.limit)
    per_second = count * 1e9 / period_ns
    root = tempfile.mkdtemp(prefix="lq-rate-")
    path = os.path.join(root, "q")
    os.environ[_LOG] = os.path.join(root, "starts")
    try:
        with ledgerq.open(path) as q:
            q.enqueue_batch([b"x"] * int(per_second * args.seconds * 1.5 + count + 10))
        ctx = multiprocessing.get_context("fork")
        pools = [
            ctx.Process(target=_pool, args=(path, args.limit, args.processes))
            for _ in range(args.pools)
        ]
        started = time.monotonic()
        for pool in pools:
            pool.start()
        time.sleep(args.seconds)  # the measured span itself (not a synchronisation)
        for pool in pools:
            os.kill(pool.pid, signal.SIGTERM)
        for pool in pools:
            pool.join()
        elapsed = time.monotonic() - started
        state = read_rate_state(path, time.monotonic_ns())
        assert state is not None
        with ledgerq.open(path) as q:
            acked = q.stats().acked
        with open(os.environ[_LOG]) as file:
            starts = sorted(int(line) for line in file)
        most, j = 0, 0
        for i in range(len(starts)):
            while starts[i] - starts[j] >= period_ns:
                j += 1
            most = max(most, i - j + 1)
        print(f"limit {args.limit} ({per_second:g}/s), {args.pools} pool(s) x {args.processes}")
        print(f"elapsed {elapsed:.2f} s (wall, pools started to stopped)")
        print(
            f"granted {state.starts} = {state.starts / elapsed:.2f}/s "
            f"({state.starts / elapsed / per_second:.1%} of the limit)"
        )
        print(f"acked   {acked} = {acked / elapsed:.2f}/s ({acked / elapsed / per_second:.1%})")
        print(f"most handler starts in one period: {most} (limit {count})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
