"""ledgerq's own scenarios at two revisions, side by side in one run.

    python benchmarks/versus.py                          # 100 B scenarios, vs format 1
    python benchmarks/versus.py --base REV --only 'throughput/*/4096/*' --repeats 5
    python benchmarks/versus.py --against REV2          # two revisions, not this tree

The suite (``benchmarks/run.py``) compares ledgerq with its peers; this compares ledgerq
with itself.  ``--base`` (default: the last commit before entry format version 2, which
wrote format 1, CRC-32) is checked out into a temporary git worktree (and so is
``--against``, when given, in place of this tree); then every selected ledgerq
scenario of ``run.py``'s plan runs in a fresh interpreter against the base tree and
against the other, alternately (base, now, base, now, ...), each on a new
directory, so a drift of the machine hits both alike.  Both use this interpreter and its
dependencies; ``PYTHONPATH`` and the working directory pick the tree.  The table gives
each scenario's median rate at both revisions and their ratio (now / base).

Without ``--only`` the selection is every 100 B scenario of ledgerq in the suite:
throughput (one at a time and in batches of 100, each durability level), threads and
depth.  Rates differ from the suite's report (fewer repeats, a different day); the
ratios are what this measures.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(REPO))

from benchmarks.run import FULL, build_plan  # noqa: E402

# The parent of the merge of entry format version 2 (issue 18): the last format-1 tree.
FORMAT_1_TREE = "b956be0^1"
DEFAULT_ONLY = ("throughput/*/100/*/ledgerq", "threads/*/ledgerq", "depth/*/ledgerq")


def run_in(tree: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one scenario with ``tree``'s ledgerq and benchmark code; return its result."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "benchmarks.scenarios", json.dumps(spec)]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{tree}: exit {proc.returncode}: {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def imported_from(tree: Path) -> str:
    """Where ``import ledgerq`` finds the package when run as :func:`run_in` runs."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", "import ledgerq; print(ledgerq.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def short_rev(rev: str) -> str:
    """The abbreviated commit id of ``rev``."""
    return subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


def checkout(rev: str, path: Path) -> Path:
    """Check ``rev`` out into a new detached worktree at ``path``."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(path), rev], cwd=REPO, check=True
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=FORMAT_1_TREE, help="git revision to compare with")
    parser.add_argument("--against", help="git revision in place of this tree")
    parser.add_argument("--only", action="append", help="task ids or globs (run.py's names)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", help="where the scenario directories go")
    args = parser.parse_args(argv)
    patterns = args.only or list(DEFAULT_ONLY)
    tasks = [
        t
        for t in build_plan(FULL, ["ledgerq"])
        if any(t.tid.startswith(p) or fnmatch.fnmatchcase(t.tid, p) for p in patterns)
        and t.spec["kind"] in ("throughput", "threads", "depth")
    ]
    if not tasks:
        print(f"no scenario matches {patterns}", file=sys.stderr)
        return 2
    base_rev = short_rev(args.base)
    now_label = short_rev(args.against) if args.against else "now"
    root = Path(tempfile.mkdtemp(prefix="lq-versus-", dir=args.dir))
    base_tree = checkout(base_rev, root / "base")
    now_tree = checkout(now_label, root / "now") if args.against else REPO
    rates: dict[str, dict[str, list[float]]] = {t.tid: {"base": [], "now": []} for t in tasks}
    try:
        for tree in (base_tree, now_tree):
            where = imported_from(tree)
            if not where.startswith(str(tree)):
                raise SystemExit(f"ledgerq imported from {where}, not from {tree}")
        for rep in range(args.repeats):
            for task in tasks:
                for label, tree in (("base", base_tree), ("now", now_tree)):
                    work = tempfile.mkdtemp(prefix="s-", dir=root)
                    try:
                        result = run_in(tree, {**task.spec, "dir": os.path.join(work, "q")})
                    finally:
                        shutil.rmtree(work, ignore_errors=True)
                    rates[task.tid][label].append(float(result["rate"]))
                    print(
                        f"r{rep + 1} {task.tid} {label}: {result['rate']:,.0f}/s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for tree in (base_tree, now_tree):
            if tree != REPO:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO)
        shutil.rmtree(root, ignore_errors=True)
    print(f"| scenario (ledgerq) | {base_rev} (base) | {now_label} | {now_label} / base |")
    print("|---|---|---|---|")
    for tid, seen in rates.items():
        base, now = statistics.median(seen["base"]), statistics.median(seen["now"])
        print(f"| {tid} | {base:,.0f}/s | {now:,.0f}/s | {now / base:.2f}x |")
    command = " ".join(["python benchmarks/versus.py", *(argv or sys.argv[1:])])
    print(f"\nMedians of {args.repeats} alternating runs each. Command: `{command}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
