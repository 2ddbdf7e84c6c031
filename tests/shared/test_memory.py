"""Memory of a shared-mode process does not grow with queue depth beyond exclusive mode's.

Each measurement is a fresh process: its resident memory before the open and after
opening the queue, consuming a little and reading its stats - once on a shallow queue,
once on a deep one, in each mode.  What shared mode adds (the state page, the locks,
catching up, other handles' leases) is per handle and per lease, never per message.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ledgerq
from tests._child import child_environment

_MEASURE = """
import os, sys
import ledgerq
import ledgerq.core.shared_queue  # imported before the baseline in both modes

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

before = rss()
q = ledgerq.open(sys.argv[1], shared=sys.argv[2] == "shared")
for message in q.dequeue_batch(100):
    q.ack(message.id)
q.stats()
print(rss() - before)
q.close()
"""

_MIB = 1 << 20


def _growth(path: Path, mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path), mode],
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(done.stdout)


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc/self/statm")
def test_memory_does_not_grow_with_depth_beyond_exclusive_modes(tmp_path: Path) -> None:
    growth: dict[tuple[int, str], int] = {}
    for depth in (10_000, 300_000):
        path = tmp_path / f"q{depth}"
        with ledgerq.open(path) as q:
            for _ in range(depth // 1000):
                q.enqueue_batch([b"x" * 10] * 1000)
        for mode in ("exclusive", "shared"):
            growth[depth, mode] = _growth(path, mode)
    deeper = {
        mode: growth[300_000, mode] - growth[10_000, mode] for mode in ("exclusive", "shared")
    }
    assert deeper["shared"] <= deeper["exclusive"] + _MIB, (growth, deeper)
    assert growth[300_000, "shared"] <= growth[300_000, "exclusive"] + 2 * _MIB, growth
