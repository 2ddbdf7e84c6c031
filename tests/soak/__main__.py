"""The long server soak: real ``ledgerq serve``, honest and abusive clients, for minutes.

    python -m tests.soak --seconds 300             # the long run docs/reliability.md quotes
    python -m tests.soak --seconds 60 --seed 7     # another mix of the same load
    python -m tests.soak --seconds 600 --idle 1000 --keep

Prints the figures (items, abuse, server RSS, latency percentiles) and exits 0 when
every promise held, 1 with the broken ones listed otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from tests.soak._driver import SoakConfig, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=300, help="load time (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="seed of every client (default 1)")
    parser.add_argument("--idle", type=int, default=300, help="idle connections (default 300)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory; print it")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress every 30 s")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.idle < 0:
        parser.error("--seconds must be > 0 and --idle >= 0")
    config = SoakConfig(args.seconds, seed=args.seed, idle_connections=args.idle)
    workdir = Path(tempfile.mkdtemp(prefix="ledgerq-soak-"))
    try:
        report = run_soak(config, workdir, progress=print if args.verbose else None)
    finally:
        if args.keep:
            print(f"data kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
