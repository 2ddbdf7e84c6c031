"""ENOSPC and EIO in one process of a shared queue, another process working beside it.

The sweep of ``_inject.py`` in shared mode: the workload's process opens the queue
shared and meets the injected fault; after each of its operations a second process
(``_partner.py``, no fault in it) enqueues a message and consumes one on its own
reader.  Besides the sweep's own checks (every error a ``StorageError`` with the errno,
naming a queue file; the faulted process goes on once the fault clears; nothing
returned is lost, nothing acked comes back, ids never reused), every call of the other
process must succeed: whatever the failed call left - an append cut back, or left with
the ``writing`` word set; a journal record cut short - holds nobody up.  The long run,
every site: ``python -m tests.faults --shared``.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults._inject import Partner, all_faults, list_sites, run_with_fault
from tests.faults._shim import quiet_ledgerq, scratch_dir

SAMPLE = {"always": 120, "never": 80}
OPTIONS = {
    "shared": True,
    "segment_size": 800,
    "index_interval": 128,
    "max_retries": 2,
    "compression": "zstd",
    "compression_min_size": 64,
}


@pytest.fixture
def partner(tmp_path: Path) -> Iterator[Partner]:
    other = Partner(tmp_path / "partner.stderr")
    try:
        yield other
    finally:
        other.close()


@pytest.mark.parametrize("sync", ["always", "never"])
def test_fault_sweep_beside_another_process(tmp_path: Path, partner: Partner, sync: str) -> None:
    with scratch_dir(tmp_path) as scratch, quiet_ledgerq():
        problems, fired, count = shared_sweep(scratch, sync, partner, SAMPLE[sync])
    # With another process, a few sites move between runs (whether an append writes an
    # index point depends on what the other's appends left): most must fire.
    assert fired >= 0.8 * count, f"only {fired} of {count} faults fired"
    assert not problems, "\n".join(problems[:20])
    assert partner.steps > 30 * count // 2, "the other process did too little"


def shared_sweep(
    root: Path, sync: str, partner: Partner, sample: int | None
) -> tuple[list[str], int, int]:
    """Run a seeded sample (or, with None, every fault): the problems, the faults that
    fired, and the faults tried."""
    options = {**OPTIONS, "sync": sync}
    sites = list_sites(root / "dry", options=options, partner=partner)
    faults = all_faults(sites)
    if sample is not None:
        faults = random.Random(f"shared-faults-{sync}").sample(faults, sample)
    problems: list[str] = []
    fired = 0
    for n, fault in enumerate(faults):
        run, _ = run_with_fault(root / f"run{n}", fault, options=options, partner=partner)
        shutil.rmtree(root / f"run{n}")
        fired += run.fired > 0
        problems.extend(f"{fault}: {problem}" for problem in run.problems)
    return problems, fired, len(faults)
