"""Kestrel journals: readers for both formats, and the importer into ledgerq queues.

* :mod:`ledgerq.kestrel.oldjournal` - Kestrel 1.x/2.x opcode journals (replay).
* :mod:`ledgerq.kestrel.journal3` - Kestrel 3 (libkestrel) writer and reader files.
* :func:`import_kestrel` - what ``ledgerq import-kestrel`` runs.

See ``docs/kestrel.md``.
"""

from __future__ import annotations

from ledgerq.kestrel._import import KestrelImportError, import_kestrel
from ledgerq.kestrel._ledger import LEDGER_NAME
from ledgerq.kestrel._report import ImportReport
from ledgerq.kestrel._scan import KESTREL2, KESTREL3, KestrelQueue, scan_directory
from ledgerq.kestrel._types import JournalDamage, KestrelItem

__all__ = [
    "KESTREL2",
    "KESTREL3",
    "LEDGER_NAME",
    "ImportReport",
    "JournalDamage",
    "KestrelImportError",
    "KestrelItem",
    "KestrelQueue",
    "import_kestrel",
    "scan_directory",
]
