"""Memory per pending message of the priority index, and the time to build it.

Run: python benchmarks/priority_memory.py [N]   (default 1,000,000)
tracemalloc slows allocation, so the build time is measured in a second, untraced pass.
"""

from __future__ import annotations

import sys
import tempfile
import time
import tracemalloc

import ledgerq
from ledgerq import Item, Priority


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = tmp + "/q"
        with ledgerq.open(path, priorities=True, sync="never") as q:
            for start in range(0, n, 10_000):
                count = min(10_000, n - start)
                q.enqueue_batch([Item(b"x" * 100, priority=Priority(i % 3)) for i in range(count)])
        with ledgerq.open(path, priorities=True, sync="never") as q:
            started = time.perf_counter()
            q.peek(1)  # builds the index
            build = time.perf_counter() - started
        with ledgerq.open(path, priorities=True, sync="never") as q:
            tracemalloc.start()
            q.peek(1)
            retained, _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        print(
            f"{n} pending messages: index {retained / n:.1f} bytes/message, built in {build:.2f} s"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
