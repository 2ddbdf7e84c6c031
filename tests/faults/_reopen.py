"""The last step of a fault run: the queue must reopen and pass the run's checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ledgerq


def reopen_and_check(
    path: Path, options: dict[str, Any], problems: list[str], check: Callable[[ledgerq.Queue], None]
) -> None:
    """Open the queue at ``path`` with ``options`` and run ``check`` on it; a failure to
    open, or an exception from the queue inside ``check``, is appended to ``problems``."""
    try:
        q = ledgerq.open(path, **options)
    except Exception as exc:
        problems.append(f"the queue does not reopen: {type(exc).__name__}: {exc}")
        return
    try:
        with q:
            check(q)
    except Exception as exc:
        problems.append(f"the reopened queue fails: {type(exc).__name__}: {exc}")
