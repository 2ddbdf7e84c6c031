"""The ``ledgerq`` command line (the full tool arrives with issue 6)."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ledgerq`` console script."""
    args = sys.argv[1:] if argv is None else argv
    if args in ([], ["--help"], ["-h"]):
        print("usage: ledgerq COMMAND ...\n\nThe command line is not built yet (issue 6).")
        return 0
    if args == ["--version"]:
        from ledgerq import __version__

        print(f"ledgerq {__version__}")
        return 0
    print(
        f"ledgerq: command {args[0]!r} is not available yet (issue 6 brings the CLI)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
