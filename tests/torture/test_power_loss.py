"""Power-loss simulation, short run (the model and its limits: ``_powerloss.py``).

Each test records a workload's file operations, then reopens every distinct crash state
the disk model allows at every point after the queue was opened, and checks what the
sync mode promised.  The long run is ``python -m tests.torture --power-loss``.
"""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from tests.torture._child import Workload
from tests.torture._powerloss import (
    SCENARIOS,
    Report,
    Scenario,
    check_scenario,
    record_scenario,
)
from tests.torture._runner import start_child

STEPS = 10  # per scenario in the short run (the CLI runs the full ones)
STATE_SHARE = 0.4  # of the crash states at each point, in the short run


def _assert_clean(report: Report) -> None:
    assert report.states > 0
    assert not report.failures, "\n".join(report.failures[:10])


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_every_crash_state(tmp_path: Path, scratch: Path, scenario: Scenario) -> None:
    short = dataclasses.replace(scenario, steps=STEPS)
    recording = record_scenario(tmp_path, short)
    _assert_clean(check_scenario(recording, scratch, share=STATE_SHARE))


def _prepare_torn(queue_dir: Path) -> None:
    """A queue left by a child killed in the middle of a write (torn tail to recover)."""
    config = {
        "path": str(queue_dir),
        "options": {"sync": "never", "segment_size": 900, "max_retries": 0},
        "seed": 5,
        "token_base": 5_000_000,
        "kill": {"target": "anywhere", "nth": 60, "torn": True},
    }
    child = start_child(config, queue_dir.parent / "prepare.stderr")
    while child.read_line() is not None:
        pass
    assert child.finish() == -signal.SIGKILL


def test_power_loss_during_recovery(tmp_path: Path, scratch: Path) -> None:
    """Crash points inside the recovery of a killed queue (cutting its torn tails) too."""
    scenario = Scenario(
        "recovery", {"sync": "never", "segment_size": 900, "max_retries": 0}, steps=6, seed=21
    )
    recording = record_scenario(tmp_path, scenario, prepare=_prepare_torn)
    assert any(op[0] == "truncate" for op in recording.ops), "no torn tail was cut"
    _assert_clean(check_scenario(recording, scratch, from_mark="O", share=STATE_SHARE))


# ---------------------------------------------------------------------- bugs found (fixed)


def _steps(*names: str) -> Any:
    """A workload of the named Workload operations, each reported like a random step."""

    def run(work: Workload) -> None:
        for name in names:
            if name == "nack":
                work.settle(ack=False)
            elif name == "ack":
                work.settle(ack=True)
            else:
                getattr(work, name)()
            work.emit("Z\n")

    return run


def _first_failure(
    tmp_path: Path,
    scratch: Path,
    options: dict[str, Any],
    steps: tuple[str, ...],
    *,
    strict_mkdir: bool = False,
    seed: int = 3,
) -> Report:
    scenario = Scenario("bug", options, steps=0, seed=seed, strict_mkdir=strict_mkdir)
    recording = record_scenario(tmp_path, scenario, workload=_steps(*steps))
    return check_scenario(recording, scratch, max_failures=1)


def test_dlq_move_keeps_a_synced_message(tmp_path: Path, scratch: Path) -> None:
    options = {"sync": "never", "max_retries": 1}
    _assert_clean(
        _first_failure(tmp_path, scratch, options, ("enqueue", "sync", "dequeue", "nack"))
    )


def test_requeue_keeps_a_synced_message(tmp_path: Path, scratch: Path) -> None:
    options = {"sync": "never", "max_retries": 1}
    steps = ("enqueue", "dequeue", "nack", "sync", "requeue")
    _assert_clean(_first_failure(tmp_path, scratch, options, steps))


def test_new_directories_are_durable(tmp_path: Path, scratch: Path) -> None:
    options = {"sync": "always", "max_retries": 1}
    steps = ("enqueue", "dequeue", "ack", "enqueue")
    _assert_clean(_first_failure(tmp_path, scratch, options, steps, strict_mkdir=True))


def test_pending_count_after_power_loss(tmp_path: Path, scratch: Path) -> None:
    options = {"sync": "never", "max_retries": 0}
    steps = ("enqueue", "enqueue", "dequeue", "ack")  # seed 5: leases both, acks the second
    _assert_clean(_first_failure(tmp_path, scratch, options, steps, seed=5))


def test_the_recorder_sees_every_change(tmp_path: Path) -> None:
    """record_scenario replays its log and compares with the disk; a gap would raise."""
    scenario = dataclasses.replace(SCENARIOS[0], steps=8)
    recording = record_scenario(tmp_path, scenario)
    kinds = {op[0] for op in recording.ops}
    assert {"create", "write", "sync", "syncdir", "rename", "mark"} <= kinds
    with ledgerq.open(tmp_path / "q", **scenario.options) as q:
        q._check()
