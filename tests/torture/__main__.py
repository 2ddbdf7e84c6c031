"""Long runs of the crash torture and of the power-loss simulation.

    python -m tests.torture --rounds 2000                 # kill -9 torture, all sync modes
    python -m tests.torture --rounds 500 --target requeue # only kills inside requeue_dlq
    python -m tests.torture --power-loss --scenarios 40   # power-loss simulation
    python -m tests.torture --power-loss --exhaustive     # every prefix of every file
    python -m tests.torture --shared --rounds 100         # shared mode: several processes
    python -m tests.torture --shared --option visibility_timeout=0.5 --option max_retries=0
    python -m tests.torture --power-loss --shared         # shared mode: three handles

Exits 0 when every check passed and prints the figures that docs/reliability.md quotes;
on a broken promise it prints the failure (with the seed that reproduces it) and exits 1.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.torture._common import Totals
from tests.torture._model import ModelError
from tests.torture._runner import TARGETS, run_rounds
from tests.torture._shared import SHARED_TARGETS, run_shared_rounds


def _option(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


def _torture(args: argparse.Namespace, workdir: Path) -> int:
    """The kill -9 torture, exclusive or (``--shared``) shared; its figures printed."""
    started = time.monotonic()
    how: dict[str, Any] = {
        "seed": args.seed,
        "per_campaign": args.per_campaign,
        "target": args.target,
        "sync": args.sync,
        "keep": args.keep,
        "progress": print if args.verbose else None,
    }
    try:
        if args.shared:
            totals: Totals = run_shared_rounds(
                workdir, args.rounds, overrides=dict(args.option), **how
            )
        else:
            totals = run_rounds(workdir, args.rounds, **how)
    except ModelError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(totals.report(time.monotonic() - started))
    return 0


def _power_loss(args: argparse.Namespace, workdir: Path) -> int:
    from tests.torture._powerloss import run_scenarios

    started = time.monotonic()
    progress = print if args.verbose else None
    report = run_scenarios(
        workdir,
        args.scenarios,
        seed=args.seed,
        exhaustive=args.exhaustive,
        progress=progress,
        shared=args.shared,
    )
    elapsed = time.monotonic() - started
    print(f"power-loss simulation: {report.scenarios} workloads, {elapsed:.0f} s")
    print(f"  file operations recorded: {report.operations}; crash points: {report.points}")
    print(
        f"  crash states generated: {report.generated}; distinct states reopened: {report.states}"
    )
    if report.failures:
        for failure in report.failures[:20]:
            print(f"FAILED: {failure}", file=sys.stderr)
        print(f"{len(report.failures)} states broke a promise", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.torture", description=__doc__)
    parser.add_argument("--rounds", type=int, default=200, help="kill -9 rounds (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="base seed (default 1)")
    parser.add_argument("--per-campaign", type=int, default=10, help="rounds per queue")
    parser.add_argument(
        "--target", choices=sorted({*TARGETS, *SHARED_TARGETS}), help="kill only this way"
    )
    parser.add_argument(
        "--shared", action="store_true", help="shared mode: several processes on one queue"
    )
    parser.add_argument("--sync", choices=("always", "interval", "never"), help="one sync mode")
    parser.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="(--shared) a queue option for every campaign, e.g. visibility_timeout=0.5",
    )
    parser.add_argument("--power-loss", action="store_true", help="run the power-loss simulation")
    parser.add_argument(
        "--scenarios", type=int, default=24, help="random power-loss workloads (besides 3 fixed)"
    )
    parser.add_argument(
        "--exhaustive", action="store_true", help="every prefix of every file (slow)"
    )
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the queues")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every round")
    args = parser.parse_args(argv)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="ledgerq-torture-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        if args.power_loss:
            return _power_loss(args, workdir)
        return _torture(args, workdir)
    finally:
        if args.dir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
