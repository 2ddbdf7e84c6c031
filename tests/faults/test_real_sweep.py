"""The real-ENOSPC sweep, sampled (``_realsweep.py``; every site: ``python -m
tests.faults --real``).

A seeded sample of the workload's space-needing calls, in both sync modes that the
injected sweep uses; for each, the disk fills right before that call, then the child
crashes - with the disk still full for every other site, after freeing it for the rest
- and the queue is verified, reopened and checked.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from tests.faults._realsweep import count_sites, run_at
from tests.realfs import SmallDisk, can_mount

SAMPLE = 12  # sites per sync mode (about 0.2 s each)
STEPS = 100
SEED = 7


@pytest.fixture(scope="module")
def sweep_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallDisk]:
    """One small tmpfs for every run of the module."""
    reason = can_mount()
    if reason is not None:
        pytest.skip(reason)
    disk = SmallDisk(tmp_path_factory.mktemp("sweep") / "disk", 8 * 1024 * 1024)
    try:
        yield disk
    finally:
        disk.unmount()


@pytest.mark.parametrize("sync", ["always", "never"])
def test_real_enospc_sweep(sweep_disk: SmallDisk, sync: str) -> None:
    sites = count_sites(sweep_disk, sync, seed=SEED, steps=STEPS)
    assert sites > 50, "the workload writes too little to sweep"
    chosen = random.Random(f"real-{sync}").sample(range(1, sites + 1), SAMPLE)
    problems = []
    refused = 0
    for nth in sorted(chosen):
        run = run_at(sweep_disk, sync, nth, seed=SEED, steps=STEPS, crash_full=nth % 2 == 0)
        assert run.filled, f"site {nth} of {sites} was never reached: not deterministic"
        refused += sum(run.errors.values())
        problems += [
            f"site {nth} ({'full' if run.crash_full else 'freed'}): {p}" for p in run.problems
        ]
    assert not problems, "\n".join(problems[:20])
    assert refused > 0, "no call met the full disk: the sweep tests nothing"
