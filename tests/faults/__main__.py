"""Every fault at every site: ``python -m tests.faults [--sync always|never] [--steps N]``.

Runs the fault sweep of ``test_faults.py`` without sampling - each site of the
workload, both errnos (ENOSPC only where a call can need space), and each mode - and
prints the figures docs/reliability.md quotes.  Exits 1 if any problem is not one of
the known bugs.

``--shared`` runs it in shared mode, another process working beside the faulted one
(``test_shared_faults.py``): every fault of every site, and every call of the other
process must succeed.

``--real`` runs the real-ENOSPC sweep instead (``_realsweep.py``; root: it mounts a
tmpfs): every space-needing call of its workload meets a real full disk, each run
crashed twice over (with the disk still full, and after freeing it), in each mode.
Exits 1 on any problem.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from tests.faults._inject import KNOWN_BUGS, all_faults, list_sites, run_with_fault, sort_problems
from tests.faults._realsweep import count_sites, run_at
from tests.faults._shim import quiet_ledgerq, scratch_dir
from tests.faults.test_faults import OPTIONS
from tests.realfs import SmallDisk, can_mount


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
        sort_problems(run, f"{sync} {fault}", known, unknown)
    return len(faults), known, unknown


def real_sweep(workdir: Path, syncs: list[str], steps: int, seed: int) -> int:
    """Every site of the real-ENOSPC sweep; print its figures; return the problems."""
    reason = can_mount()
    if reason is not None:
        print(f"cannot run the real sweep: {reason}", file=sys.stderr)
        return 1
    started = time.monotonic()
    disk = SmallDisk(workdir / "disk", 8 * 1024 * 1024)
    problems: list[str] = []
    runs = filled = 0
    refused: Counter[str] = Counter()
    try:
        for sync in syncs:
            sites = count_sites(disk, sync, seed=seed, steps=steps)
            for nth in range(1, sites + 1):
                for crash_full in (True, False):
                    with quiet_ledgerq():
                        run = run_at(disk, sync, nth, seed=seed, steps=steps, crash_full=crash_full)
                    runs += 1
                    filled += run.filled
                    refused.update(run.errors)
                    where = "still full" if crash_full else "freed"
                    problems += [f"{sync} site {nth} ({where}): {p}" for p in run.problems]
            print(f"sync={sync}: {sites} sites, {2 * sites} runs")
    finally:
        disk.unmount()
    print(
        f"{runs} runs in {time.monotonic() - started:.0f} s (steps={steps}, seed={seed}); "
        f"the disk filled in {filled}; {sum(refused.values())} calls refused:"
    )
    for error, n in refused.most_common():
        print(f"  {error}: {n}")
    print(f"{len(problems)} problems")
    classes = Counter(re.sub(r"\d+", "#", p.partition(": ")[2])[:120] for p in problems)
    for text, n in classes.most_common():
        print(f"  {n} x {text}")
    for problem in problems[:30]:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


def shared(syncs: list[str]) -> int:
    """Every fault of the shared-mode sweep; print its figures; return 1 on a problem."""
    from tests.faults._inject import Partner
    from tests.faults.test_shared_faults import shared_sweep

    started = time.monotonic()
    problems: list[str] = []
    with scratch_dir(Path.cwd()) as workdir:
        partner = Partner(workdir / "partner.stderr")
        try:
            for sync in syncs:
                with quiet_ledgerq():
                    found, fired, count = shared_sweep(workdir / sync, sync, partner, None)
                problems += [f"{sync} {p}" for p in found]
                print(f"sync={sync}: {count} faults, {fired} fired, {len(found)} problems")
        finally:
            partner.close()
    print(
        f"{time.monotonic() - started:.0f} s; the other process made {partner.steps} "
        f"enqueues and reads beside the faults"
    )
    for problem in problems[:40]:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--sync", choices=("always", "never"), action="append")
    parser.add_argument("--steps", type=int, help="workload operations (30; --real: 100)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--real", action="store_true", help="the real-ENOSPC sweep (root)")
    parser.add_argument("--shared", action="store_true", help="shared mode, beside another process")
    args = parser.parse_args(argv)
    if args.shared:
        return shared(args.sync or ["always", "never"])
    if args.real:
        with scratch_dir(Path.cwd()) as workdir:
            return real_sweep(
                workdir, args.sync or ["always", "never"], args.steps or 100, args.seed
            )
    args.steps = args.steps or 30
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
