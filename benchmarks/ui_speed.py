"""How fast ``ledgerq ui`` answers: the overview of 100 queues, a DLQ of 100,000,
the next 500 messages of a queue of 100,000 with 50,000 delayed.

    python benchmarks/ui_speed.py [--dir DIR]

Builds 100 queues (200 messages each, a few leased, acked and dead-lettered) and one
queue with 100,000 dead letters (written straight into its ``dlq/`` queue, with the
headers the dead-letter feature writes), starts ``ledgerq ui`` on them as a user
would, and times requests with ``time.perf_counter`` around ``urllib``: the first one
(nothing cached) and the median and max of 20 more.  Then a queue of 100,000 messages,
every other one delayed by an hour, in a directory of its own: ``/api/messages`` of
its next 500, from a console without its sampler and from one sampling every 2 s
beside it (issue 25: each message's not-before time once cost a walk of the delayed
messages).  The numbers go into docs/ui.md by hand, with the machine they ran on.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ledgerq  # noqa: E402


def build(root: Path) -> None:
    for i in range(100):
        with ledgerq.open(root / f"shard-{i // 10}" / f"q{i:03d}", max_retries=1) as q:
            q.enqueue_batch([b'{"n": %d}' % n for n in range(200)])
            for m in q.dequeue_batch(20):
                q.ack(m.id)
            for m in q.dequeue_batch(2):
                q.nack(m.id, "boom")
            q.dequeue_batch(3)
    big = root / "big"
    with ledgerq.open(big) as q:
        q.enqueue(b"x")
    with ledgerq.open(big / "dlq") as dlq:
        now = time.time_ns()
        for start in range(0, 100_000, 1000):
            dlq.enqueue_batch(
                [
                    ledgerq.Item(
                        b'{"order": %d}' % n,
                        headers={
                            "dlq.original_id": str(n + 1),
                            "dlq.retry_count": "3",
                            "dlq.failure_reason": ("timeout", "bad input", "reset")[n % 3],
                            "dlq.last_failure": str(now),
                        },
                    )
                    for n in range(start, start + 1000)
                ]
            )


def build_delayed(root: Path) -> None:
    with ledgerq.open(root / "delayed") as q:
        for start in range(0, 100_000, 1000):
            q.enqueue_batch(
                [
                    ledgerq.Item(b'{"n": %d}' % n, delay=3600.0 if n % 2 else None)
                    for n in range(start, start + 1000)
                ]
            )


def start_console(root: Path, interval: str) -> tuple[subprocess.Popen[bytes], str]:
    console = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ledgerq.cli",
            "ui",
            str(root),
            "--port",
            "0",
            "--interval",
            interval,
        ],
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    assert console.stdout is not None
    base = re.search(r"http://\S+?/", console.stdout.readline().decode()).group(0)  # type: ignore[union-attr]
    return console, base


def timed(url: str, n: int = 20, gap_s: float = 0.0) -> tuple[float, float, float]:
    """(first, median, max) milliseconds of GET ``url``; ``gap_s`` between requests
    (over a second: the console's figures, reused for a second, are read afresh)."""
    times = []
    for _ in range(n + 1):
        time.sleep(gap_s)
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as resp:
            resp.read()
        times.append((time.perf_counter() - started) * 1000)
    return times[0], statistics.median(times[1:]), max(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", help="where the queues go (default: a temporary directory)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="ledgerq-ui-speed-"))
    build(root / "queues")
    console, base = start_console(root / "queues", "0")
    try:
        first, median, most = timed(base, 10, gap_s=1.1)
        print(
            f"overview of 101 queues (HTML), every figure read afresh: first {first:.0f} ms, "
            f"median {median:.0f} ms, max {most:.0f} ms"
        )
        for what, path in (
            ("overview of 101 queues (HTML)", ""),
            ("overview of 101 queues (/api/queues)", "api/queues"),
            ("DLQ page, 100,000 dead letters, first page of 50", "dlq?q=big"),
            ("DLQ page, filter matching a third", "dlq?q=big&reason=timeout"),
            ("DLQ page, filter matching nothing (stops after 20,000)", "dlq?q=big&reason=nomatch"),
            ("count of the matches (reads all 100,000)", "api/dlq/count?q=big&reason=timeout"),
        ):
            first, median, most = timed(base + path, 5 if "count" in path else 20)
            print(f"{what}: first {first:.0f} ms, median {median:.0f} ms, max {most:.0f} ms")
    finally:
        console.terminate()
        console.wait()
    build_delayed(root / "delayed")
    for interval, beside in (("0", "no sampler"), ("2", "the sampler every 2 s")):
        console, base = start_console(root / "delayed", interval)
        try:
            first, median, most = timed(base + "api/messages?q=delayed&limit=500", 20, 0.1)
            print(
                f"next 500 of 100,000 messages, 50,000 delayed (/api/messages), {beside}: "
                f"first {first:.0f} ms, median {median:.0f} ms, max {most:.0f} ms"
            )
        finally:
            console.terminate()
            console.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
