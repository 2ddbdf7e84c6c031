"""Celery on ledgerq: the kombu transport ``ledgerq`` (``Celery(broker="ledgerq:///dir")``).

Installed with ``pip install 'ledgerq[celery]'``, the transport is found by name without
importing anything (see the top-level module ``kombu_ledgerq``); importing this package
registers it too, for plain kombu programs (``kombu.Connection("ledgerq:///dir")``).
docs/celery.md describes the setup, the options and what ack, reject, retry and eta do.
"""

from __future__ import annotations

try:
    import kombu.transport
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        "ledgerq.celery needs kombu (and Celery for workers): pip install 'ledgerq[celery]'"
    ) from exc

from ledgerq.celery._names import BrokerURLError, InvalidNameError

__all__ = ["TRANSPORT", "BrokerURLError", "InvalidNameError", "register"]

#: Where kombu finds the transport class.
TRANSPORT = "ledgerq.celery.transport:Transport"


def register() -> None:
    """Make ``ledgerq`` a kombu transport name (done on import; idempotent)."""
    kombu.transport.TRANSPORT_ALIASES.setdefault("ledgerq", TRANSPORT)


register()
