"""What the exclusive torture (``_runner.py``) and the shared one (``_shared.py``) share.

The figures a campaign returns and their sums, the drawing of a campaign's queue
options, the start of a child (:func:`start_child`), what every campaign is told
(:class:`Plan`), and the loop that runs rounds in campaigns.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from tests._child import Child

__all__ = ["Plan", "Result", "Sums", "Totals", "draw_options", "run_campaigns", "start_child"]


@dataclass
class Sums:
    """Figures that add up: :meth:`add` sums those another object has too."""

    def add(self, other: object) -> None:
        """Add ``other``'s figures of the same names (counts, counters, lists) to these."""
        for name in (f.name for f in fields(self)):
            if not hasattr(other, name):
                continue
            mine, more = getattr(self, name), getattr(other, name)
            if isinstance(mine, Counter):
                mine.update(more)
            elif isinstance(mine, list):
                mine.extend(more)
            else:
                setattr(self, name, mine + more)


@dataclass
class Result:
    """What one campaign did."""

    seed: int
    options: dict[str, Any]
    rounds: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    lines: int = 0


@dataclass
class Totals(Sums):
    """Sums over campaigns, for the CLI and docs/reliability.md."""

    campaigns: int = 0
    rounds: int = 0
    lines: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, other: object) -> None:
        """Count one more campaign and add its figures."""
        super().add(other)
        self.campaigns += 1

    def report(self, elapsed: float) -> str:
        """The figures the CLI prints (docs/reliability.md quotes them)."""
        return "\n".join(
            (
                self.headline(elapsed),
                f"  kills: {sum(self.kills.values())} ({dict(sorted(self.kills.items()))})",
                *self.figures(),
                f"  operations: {dict(sorted(self.counts.items()))}",
            )
        )

    def headline(self, elapsed: float) -> str:
        """The report's first line: what ran, how long."""
        return f"crash torture: {self.rounds} rounds in {self.campaigns} campaigns, {elapsed:.0f} s"

    def figures(self) -> list[str]:
        """The report's lines of this kind of torture, after the kills."""
        return []


def draw_options(
    rng: random.Random,
    sync: str | None,
    *,
    segment_sizes: Sequence[int],
    index_intervals: Sequence[int],
    priorities: float,
    dedup: float,
    zstd: float,
) -> dict[str, Any]:
    """Queue options of a campaign, drawn from ``rng`` (the shares are probabilities)."""
    mode = sync or rng.choice(("always", "interval", "never"))
    options: dict[str, Any] = {
        "sync": mode,
        "segment_size": rng.choice(segment_sizes),
        "index_interval": rng.choice(index_intervals),
        "max_retries": rng.randint(1, 3),
        "priorities": rng.random() < priorities,
        "dedup_window": 3600.0 if rng.random() < dedup else None,
        "compression": "zstd" if rng.random() < zstd else "none",
        "compression_min_size": 64,
    }
    if mode == "interval":
        options["sync_interval"] = 0.005  # let the background fsync run during the rounds
    return options


def start_child(
    module: str, config: dict[str, Any], stderr_path: Path, *, watchdog_seconds: float
) -> Child:
    """Start a torture child (``python -m module CONFIG_JSON``); its stderr goes to a
    file, it reads no stdin, and the watchdog kills it after ``watchdog_seconds``."""
    return Child(
        ["-m", module, json.dumps(config)],
        stderr_path=stderr_path,
        stdin=False,
        watchdog_seconds=watchdog_seconds,
    )


@dataclass(frozen=True)
class Plan:
    """What every campaign is told besides its seed and its number of rounds."""

    target: str | None = None  # kill only this way (None: every way, drawn)
    sync: str | None = None  # only this sync mode (None: drawn)
    progress: Callable[[str], None] | None = None  # told how each round went


T = TypeVar("T", bound=Totals)


def run_campaigns(
    totals: T,
    campaign: Callable[..., Result],
    workdir: Path,
    rounds: int,
    *,
    queue: str,
    stderr: str,
    seed: int = 0,
    per_campaign: int = 10,
    keep: bool = False,
    target: str | None = None,
    sync: str | None = None,
    progress: Callable[[str], None] | None = None,
    **how: Any,
) -> T:
    """Run ``rounds`` rounds in campaigns of ``per_campaign``; add each to ``totals``.

    ``campaign(workdir, seed, rounds, Plan(target, sync, progress), **how)`` runs one;
    unless ``keep``, its queue (``queue`` formatted with its seed, in ``workdir``) and
    its children's stderr files (the glob ``stderr``, formatted likewise) go after it.
    """
    plan = Plan(target, sync, progress)
    done = number = 0
    while done < rounds:
        n = min(per_campaign, rounds - done)
        campaign_seed = seed * 100_003 + number
        started = time.monotonic()
        result = campaign(workdir, campaign_seed, n, plan, **how)
        totals.add(result)
        if progress is not None:
            progress(
                f"campaign {campaign_seed} ({result.options['sync']}): {n} rounds, "
                f"kills {dict(result.kills)}, {time.monotonic() - started:.1f} s"
            )
        if not keep:
            shutil.rmtree(workdir / queue.format(campaign_seed), ignore_errors=True)
            for stale in workdir.glob(stderr.format(campaign_seed)):
                os.unlink(stale)
        done += n
        number += 1
    return totals
