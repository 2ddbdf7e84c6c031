"""Power-loss simulation in shared mode, short run (the model: ``_powerloss.py``).

Three shared-mode handles use one queue, their steps interleaved; the recorder logs
every handle's writes in one sequence, and every crash state the disk model allows at
every point is reopened (by a shared handle: the first of a session recovers) and
checked against what each call's sync mode promised.  The long run is ``python -m
tests.torture --power-loss --shared``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.torture._powerloss import (
    SHARED_SCENARIOS,
    check_scenario,
    record_scenario,
)

STEPS = 8  # per scenario in the short run (the CLI runs the full ones)
STATE_SHARE = 0.35  # of the crash states at each point, in the short run


@pytest.mark.parametrize("scenario", SHARED_SCENARIOS, ids=lambda s: s.name)
def test_power_loss_with_three_shared_handles(
    tmp_path: Path, scratch: Path, scenario: object
) -> None:
    short = dataclasses.replace(scenario, steps=STEPS)  # type: ignore[type-var]
    recording = record_scenario(tmp_path / "rec", short)
    handles = {op[1].split("|", 1)[0] for op in recording.ops if op[0] == "mark" and "|" in op[1]}
    assert handles == {"0", "1", "2"}, "every handle's writes are in the workload"
    assert any(op[0] == "mark" and op[1].split("|")[-1].startswith("L ") for op in recording.ops)
    report = check_scenario(recording, scratch, share=STATE_SHARE)
    assert report.states > 100
    assert not report.failures, "\n".join(report.failures[:10])
