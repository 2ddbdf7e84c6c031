"""Crash torture, short run: a few campaigns of kill -9 (see ``_runner.py``).

The long run is ``python -m tests.torture --rounds N`` (docs/reliability.md).  Here each
sync mode gets one campaign of random kills, and each kill site (rotation, compaction,
checkpoint, DLQ move, requeue_dlq, open, right after open, anywhere) a short campaign of
its own.  Seeds are fixed; the moment of a parent-driven kill is not, so every run
covers slightly different crash points.
"""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

import ledgerq
from tests._child import run_python
from tests.faults._shim import FAMILIES, Interposer
from tests.torture._child import Workload
from tests.torture._runner import SELF_KILL, run_rounds, start_child

ROUNDS_PER_MODE = 8
ROUNDS_PER_SITE = 3


@pytest.mark.parametrize("sync", ["always", "interval", "never"])
def test_random_kills(tmp_path: Path, sync: str) -> None:
    totals = run_rounds(tmp_path, ROUNDS_PER_MODE, seed=1000, sync=sync)
    assert totals.rounds == ROUNDS_PER_MODE
    assert totals.checks >= ROUNDS_PER_MODE // 2
    assert totals.counts["enqueued"] > 0 and totals.counts["leased"] > 0


@pytest.mark.parametrize("site", [*SELF_KILL, "after_open"])
def test_kills_inside(tmp_path: Path, site: str) -> None:
    totals = run_rounds(tmp_path, ROUNDS_PER_SITE, seed=2000, target=site)
    landed = sum(n for kind, n in totals.kills.items() if kind.split("/")[0] == site)
    assert landed >= 1, f"no kill landed inside {site}: {dict(totals.kills)}"


# ---------------------------------------------------------------------- known bugs


def _first_open_calls(path: Path) -> list[tuple[str, str]]:
    """The file-changing calls (function, path) of a first open, as the child makes them."""
    calls: list[tuple[str, str]] = []

    class Count(Interposer):
        def around(self, name, target, call, args):  # type: ignore[no-untyped-def]
            if FAMILIES[name] != "open" or self.is_mutating_open(args[1]):
                calls.append((name, target))
            return call()

    counter = Count(path)
    config = {"path": str(path), "options": {"sync": "never"}, "seed": 0, "token_base": 0}
    with counter.installed():
        work = Workload(config, lambda text: None)
    work.close()
    return calls


@pytest.mark.parametrize("which", ["queue", "dlq"])
def test_kill_inside_first_open(tmp_path: Path, which: str) -> None:
    meta = "meta.json" if which == "queue" else "dlq/meta.json"
    calls = _first_open_calls(tmp_path / "dry")
    renames = [
        n
        for n, (name, target) in enumerate(calls, 1)
        if name == "replace" and target.endswith(f"/dry/{meta}")
    ]
    path = tmp_path / "q"
    config = {
        "path": str(path),
        "options": {"sync": "never"},
        "seed": 0,
        "token_base": 0,
        "kill": {"target": "open", "nth": renames[0]},  # die just before the first rename
    }
    child = start_child(config, tmp_path / "child.stderr")
    while child.read_line() is not None:
        pass
    assert child.finish() == -signal.SIGKILL
    assert (path / f"{meta}.tmp").exists() and not (path / meta).exists()
    with ledgerq.open(path, sync="never") as q:  # raises NotAQueueError
        assert len(q) == 0
        assert len(q.dlq) == 0


TORN_BATCH = textwrap.dedent(
    """
    import sys
    import ledgerq
    from tests.torture._child import SelfKill
    path = sys.argv[1]
    killer = SelfKill(path, 1, torn=True)
    killer.install()
    q = ledgerq.open(path, sync="never")
    q.enqueue_batch([b"warm-up %d" % i for i in range(3)])
    killer.depth = 1  # die inside the next write, as SIGKILL would (first page kept)
    q.enqueue_batch([b"%04d" % i + b"x" * 300 for i in range(40)])
    """
)


def test_batch_is_all_or_nothing_when_killed_inside_its_write(tmp_path: Path) -> None:
    path = tmp_path / "q"
    result = run_python("-c", TORN_BATCH, str(path))
    assert result.returncode == -signal.SIGKILL, result.stderr
    with ledgerq.open(path, sync="never") as q:
        count = len(q.peek(1000))
    assert count in (3, 43), f"the killed batch of 40 left {count - 3} messages"
