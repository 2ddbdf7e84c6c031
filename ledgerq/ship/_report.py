"""What ``ledgerq ship`` reports and raises: :class:`ShipReport`, its running totals, and
:class:`ShipError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ledgerq._errors import LedgerQError

__all__ = ["ProgressCallback", "ShipError", "ShipReport", "Totals"]

ProgressCallback = Callable[[int, int], None]


class ShipError(LedgerQError):
    """Shipping cannot go on: a bad client id, or a destination that is not this source's."""


@dataclass(frozen=True, slots=True)
class ShipReport:
    """What :func:`ship_queue` did (over all passes when following).

    ``messages``/``bytes`` count entries copied; ``segments`` the destination segment
    files created; ``deleted_*`` the source segments removed by ``delete_shipped``;
    ``corrupt`` the damaged regions copied as they are (``file``, ``offset``,
    ``length``); ``notes`` anything else worth a line (lost data, skipped deletions).
    """

    source: str
    dest: str
    client_id: str
    passes: int
    messages: int
    bytes: int
    segments: int
    last_id: int
    deleted_segments: int
    deleted_bytes: int
    corrupt: tuple[tuple[str, int, int], ...] = ()
    notes: tuple[str, ...] = ()


@dataclass
class Totals:
    passes: int = 0
    messages: int = 0
    bytes: int = 0
    segments: int = 0
    deleted_segments: int = 0
    deleted_bytes: int = 0
    corrupt: list[tuple[str, int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
