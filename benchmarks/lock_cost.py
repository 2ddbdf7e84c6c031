"""What one coordination step costs from Python: a lock word against flock and fstat.

    python benchmarks/lock_cost.py

Shared mode's hot path takes and releases a lock word in the state page (two
compare-and-swaps through ``atomicshm``) where the flock design paid a ``flock`` pair
and an ``fstat`` of the reader journal.  Each figure is the best of 5 runs of 200,000
calls, in nanoseconds per call, Python's call overhead included (docs/dependencies.md).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import tempfile
import time
from collections.abc import Callable

import atomicshm


def per_call(fn: Callable[[], None], n: int = 200_000) -> float:
    """The best of 5 timings of ``n`` calls of ``fn``, in ns per call."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - started) / n)
    return best


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        fd = os.open(os.path.join(scratch, "page"), os.O_RDWR | os.O_CREAT)
        os.ftruncate(fd, mmap.PAGESIZE)
        page = mmap.mmap(fd, mmap.PAGESIZE)
        word = atomicshm.AtomicView(page).cell_u64(0)

        def cas_pair() -> None:
            word.cas(0, 7)
            word.cas(7, 0)

        def flock_pair() -> None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            fcntl.flock(fd, fcntl.LOCK_UN)

        def fstat() -> None:
            os.fstat(fd)

        for name, fn in (
            ("lock word: CAS take + CAS release", cas_pair),
            ("flock: LOCK_EX + LOCK_UN", flock_pair),
            ("fstat of a file", fstat),
        ):
            print(f"{name:36s} {per_call(fn):7.0f} ns")
        print(f"atomicshm backend {atomicshm.BACKEND}, load average {os.getloadavg()[0]:.1f}")
        os.close(fd)  # the mapping (which the atomic view holds) goes with the process


if __name__ == "__main__":
    main()
