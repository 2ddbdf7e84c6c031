"""``python -m ledgerq.cli``: the same as the ``ledgerq`` console script."""

from __future__ import annotations

import sys

from ledgerq.cli import main

if __name__ == "__main__":
    sys.exit(main())
