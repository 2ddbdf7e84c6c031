"""The ``ledgerq`` command line (``ledgerq --help``; reference in docs/cli.md).

Built on click (commands, options, help, usage errors) and rich (tables, and progress
bars drawn only when stderr is a terminal).  ``main(argv)`` returns the exit code;
the console script and ``python -m ledgerq.cli`` both call it.
"""

from __future__ import annotations

from ledgerq.cli._app import cli, main

__all__ = ["cli", "main"]
