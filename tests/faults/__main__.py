"""Every fault at every site: ``python -m tests.faults [--sync always|never] [--steps N]``.

Runs the fault sweep of ``test_faults.py`` without sampling - each site of the
workload, both errnos (ENOSPC only where a call can need space), and each mode - and
prints the figures docs/reliability.md quotes.  Exits 1 if any problem is not one of
the known bugs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from tests.faults._inject import KNOWN_BUGS, all_faults, classify, list_sites, run_with_fault
from tests.faults._shim import quiet_ledgerq, scratch_dir
from tests.faults.test_faults import OPTIONS


def sweep(workdir: Path, sync: str, steps: int, seed: int) -> tuple[int, Counter[str], list[str]]:
    """Run every fault; return the count, the known bugs met, and the unknown problems."""
    options = {**OPTIONS, "sync": sync}
    sites = list_sites(workdir / "dry", options=options, seed=seed, steps=steps)
    faults = all_faults(sites)
    known: Counter[str] = Counter()
    unknown: list[str] = []
    for n, fault in enumerate(faults):
        root = workdir / f"run{n}"
        with quiet_ledgerq():
            run, _ = run_with_fault(root, fault, options=options, seed=seed, steps=steps)
        shutil.rmtree(root)
        for problem in run.problems:
            bug = classify(problem, run)
            if bug is None:
                unknown.append(f"{sync} {fault}: {problem}")
            else:
                known[bug] += 1
    return len(faults), known, unknown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--sync", choices=("always", "never"), action="append")
    parser.add_argument("--steps", type=int, default=30, help="workload operations (30)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    started = time.monotonic()
    total = 0
    known: Counter[str] = Counter()
    unknown: list[str] = []
    with scratch_dir(Path.cwd()) as workdir:
        for sync in args.sync or ["always", "never"]:
            count, found, new = sweep(workdir / sync, sync, args.steps, args.seed)
            total += count
            known.update(found)
            unknown.extend(new)
            print(f"sync={sync}: {count} faults injected")
    print(f"{total} faults in {time.monotonic() - started:.0f} s")
    print(f"{sum(known.values())} problems of known bugs, {len(unknown)} new problems")
    for bug, n in known.most_common():
        print(f"  known bug {bug} ({n} problems): {KNOWN_BUGS[bug]}")
    for problem in unknown[:30]:
        print(f"NEW PROBLEM: {problem}", file=sys.stderr)
    return 1 if unknown else 0


if __name__ == "__main__":
    sys.exit(main())
