"""Shared handles of one process driven at random (see ``_shared_fuzz.py``): seeded,
no processes, about a second a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.torture._shared_fuzz import run_handles_fuzz


@pytest.mark.parametrize(("seed", "priorities"), [(1, False), (4, True)])
def test_shared_handles_lose_nothing_and_deliver_no_ack_again(
    tmp_path: Path, seed: int, priorities: bool
) -> None:
    # Leases expire (the clock moves), handles compact and close with leases held.
    # Before bug 36's fix both lost messages; with it alone, the one with priorities
    # delivered an acked message again (bug 37).
    run_handles_fuzz(tmp_path / "q", seed, priorities=priorities, skew=0.3, steps=1500)


def test_shared_handles_without_a_visibility_timeout(tmp_path: Path) -> None:
    # Bug 37 needs no expiry: an acked message delivered again, seed 8 by step 43.
    run_handles_fuzz(
        tmp_path / "q", 8, priorities=True, visibility_timeout=None, skew=0.3, steps=1500
    )
