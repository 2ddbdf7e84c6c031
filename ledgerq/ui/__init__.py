"""``ledgerq ui``: a web console over queues, beside the processes that use them.

>>> from ledgerq.ui import run                     # doctest: +SKIP
>>> run("/data/queues", port=8642)                 # what `ledgerq ui /data/queues` does

Pages for every queue at or under a directory (figures, rates and charts, readers,
the next messages, any message by id) and for its dead letters (filters, requeue and
purge, each confirmed), and the same data as JSON under ``/api/``.  It reads the
queues' files without their locks and opens a queue only for an action, so it runs
beside the application.  See ``docs/ui.md``.

Needs the ``ui`` extra (``pip install 'ledgerq[ui]'``: Starlette, uvicorn, Jinja2);
``import ledgerq`` never imports them, and importing this module without them raises
``ImportError`` saying what to install.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        f"ledgerq ui needs Starlette, uvicorn and Jinja2, which are not installed ({exc}); "
        "install them with: pip install 'ledgerq[ui]'"
    ) from exc

from ledgerq.ui._app import create_app
from ledgerq.ui._run import run
from ledgerq.ui._security import InsecureAddressError, check_listen_address

__all__ = ["InsecureAddressError", "check_listen_address", "create_app", "run"]
