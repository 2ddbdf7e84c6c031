"""Crash torture: campaigns of child processes killed with SIGKILL, checked after each kill.

A *campaign* is one queue with options drawn from the seed (sync mode, segment size,
priorities, dedup, compression, max_retries).  Each *round* starts a child on it
(``_child.py``) that runs a random workload and is killed:

* ``random``: by the parent, after it has read a random number of report lines;
* ``anywhere``: by itself, just before its ``nth`` file-changing system call;
* ``rotation``, ``compaction``, ``checkpoint``, ``dlq_move``, ``requeue``, ``open``: by
  itself, just before the ``nth`` file-changing call made *inside* that operation (a
  segment rotation, ``compact()``, a reader-journal checkpoint, a move to the DLQ,
  ``requeue_dlq()``, ``ledgerq.open``); the count runs on across calls of the
  operation, so every crash point inside it is reachable;
* ``after_open``: by itself, as soon as ``ledgerq.open`` returned.

After the kill the parent reopens the queue, compares it with the model (``_model.py``)
and closes it - except before an ``open`` or ``after_open`` round, whose child then
opens the queue the killed one left.  At the end of a campaign the parent drains the
queue and its DLQ and checks that every message is accounted for.
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ledgerq
from tests._child import Child
from tests.drain import drain
from tests.torture import _common as common
from tests.torture._common import Plan, Result, draw_options, run_campaigns
from tests.torture._model import Model, ModelError

__all__ = ["TARGETS", "CampaignResult", "Totals", "run_campaign", "run_rounds", "start_child"]

REPO = Path(__file__).resolve().parents[2]
WATCHDOG_SECONDS = 120.0
LINE_CAP = 4000  # a self-kill that has not happened after this many reports: kill anyway
TOKEN_STRIDE = 1_000_000
SELF_KILL = ("anywhere", "rotation", "compaction", "checkpoint", "dlq_move", "requeue", "open")
TARGETS = ("random", *SELF_KILL, "after_open")
_NTH = {"anywhere": 300, "open": 36, "requeue": 30}  # upper bound of nth; 14 otherwise
_EVERYTHING = 1_000_000


def start_child(config: dict[str, Any], stderr_path: Path) -> Child:
    """Start a torture child (``_child.py``) with ``config``; its stderr goes to a file."""
    return common.start_child(
        "tests.torture._child", config, stderr_path, watchdog_seconds=WATCHDOG_SECONDS
    )


@dataclass
class CampaignResult(Result):
    """What one campaign did."""

    checks: int = 0


@dataclass
class Totals(common.Totals):
    """Sums over campaigns, for the CLI and docs/reliability.md."""

    checks: int = 0

    def figures(self) -> list[str]:
        return [f"  reopen checks: {self.checks}; report lines checked: {self.lines}"]


def campaign_options(rng: random.Random, sync: str | None = None) -> dict[str, Any]:
    """Queue options of a campaign, drawn from ``rng``."""
    return draw_options(
        rng,
        sync,
        segment_sizes=(512, 1024, 2048, 8192),
        index_intervals=(64, 512, 4096),
        priorities=0.5,
        dedup=0.6,
        zstd=0.4,
    )


def _observe(path: Path, options: dict[str, Any], model: Model) -> None:
    """Reopen the queue, check it against the model, close it."""
    with ledgerq.open(path, **options) as q:
        q._check()
        stats = q.stats()
        model.require(stats.in_flight == 0, f"in_flight={stats.in_flight} after a reopen")
        model.require(stats.corrupt_skipped == 0, "kill -9 left corrupt entries")
        main = q.peek(_EVERYTHING)
        model.require(len(q) == len(main), f"len()={len(q)} but peek() shows {len(main)}")
        dlq = q.dlq.peek(_EVERYTHING)
        model.require(len(q.dlq) == len(dlq), "DLQ len() disagrees with its peek()")
    model.reconcile(main, dlq)


def _drain(path: Path, options: dict[str, Any], model: Model) -> None:
    """Dequeue and ack everything (main queue, then DLQ) and check it against the model."""
    with ledgerq.open(path, **options) as q:
        delivered = drain(q)
        dlq = q.dlq.peek(_EVERYTHING)
        q._check()
    model.check_drain(delivered, dlq)
    with ledgerq.open(path, **options) as q:
        model.require(q.dequeue() is None and len(q) == 0, "messages left after the drain")


def _plan(rng: random.Random, target: str | None) -> tuple[str, int]:
    kind = target or rng.choice((*TARGETS, "random", "random", "anywhere"))
    if kind == "random":
        return kind, rng.randint(1, 400)
    if kind in SELF_KILL:
        return kind, rng.randint(1, _NTH.get(kind, 14))
    return kind, 0


def run_campaign(workdir: Path, seed: int, rounds: int, plan: Plan) -> CampaignResult:
    """Run one campaign of ``rounds`` kills; raise :class:`ModelError` on a broken promise."""
    rng = random.Random(seed)
    options = campaign_options(rng, plan.sync)
    result = CampaignResult(seed, options)
    path = workdir / f"q-{seed}"
    where = f"campaign seed={seed} options={options}"
    model = Model(options["max_retries"], where=where)
    plans = [_plan(rng, plan.target) for _ in range(rounds)]
    # Create the queue and its DLQ first: a kill inside the very first open of a queue
    # leaves meta.json.tmp behind and the directory can no longer be opened (a known
    # bug, tests/torture/test_first_open.py), which would end the campaign at once.
    with ledgerq.open(path, **options) as q:
        q.dlq.stats()
    for round_no, (kind, nth) in enumerate(plans):
        # A third of the self-kills die in the middle of a write, as SIGKILL can on
        # Linux: the write keeps its bytes up to the next page boundary of the file.
        torn = kind in SELF_KILL and rng.random() < 0.3
        model.where = f"{where} round {round_no} kill={kind}:{nth}{'/torn' if torn else ''}"
        config = {
            "path": str(path),
            "options": options,
            "seed": rng.randrange(1 << 32),
            "token_base": (round_no + 1) * TOKEN_STRIDE,
            "kill": {"target": kind, "nth": nth, "torn": torn} if kind != "random" else {},
        }
        child = start_child(config, workdir / f"child-{seed}-{round_no}.stderr")
        model.start_child()
        lines = 0
        opened = False
        try:
            while (line := child.read_line()) is not None:
                if line.startswith("X "):
                    raise model.fail(f"the child raised: {line[2:]}")
                model.feed(line)
                opened = opened or line == "P"
                lines += 1
                if (kind == "random" and lines >= nth) or lines >= LINE_CAP:
                    child.kill()
            code = child.finish()
        except BaseException:
            child.kill()
            child.finish()
            raise
        if code != -signal.SIGKILL:
            raise model.fail(child.failure(f"exited with {code} instead of being killed"))
        model.killed()
        if kind in SELF_KILL and lines >= LINE_CAP:
            result.kills[f"{kind}:not_reached"] += 1
        elif kind == "open" and opened:
            result.kills["open:after_open"] += 1
        else:
            result.kills[kind + ("/torn" if torn else "")] += 1
        result.lines += lines
        result.rounds += 1
        following = plans[round_no + 1][0] if round_no + 1 < len(plans) else None
        if following not in ("open", "after_open"):
            _observe(path, options, model)
            result.checks += 1
        if plan.progress is not None:
            plan.progress(f"seed {seed} round {round_no}: kill {kind}:{nth} after {lines} reports")
    model.where = f"{where} final drain"
    _drain(path, options, model)
    result.checks += 1
    result.counts.update(model.counts)
    return result


def run_rounds(workdir: Path, rounds: int, **how: Any) -> Totals:
    """Run ``rounds`` rounds in campaigns; return the totals.

    ``how``: ``seed``, ``per_campaign``, ``keep``, ``progress`` (see
    :func:`~tests.torture._common.run_campaigns`), ``target``, ``sync`` (see
    :class:`~tests.torture._common.Plan`).
    """
    return run_campaigns(
        Totals(), run_campaign, workdir, rounds, queue="q-{}", stderr="child-{}-*.stderr", **how
    )


__all__ += ["ModelError"]
