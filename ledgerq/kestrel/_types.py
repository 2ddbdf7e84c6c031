"""Values shared by the Kestrel journal readers and the importer."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JournalDamage", "KestrelItem"]


@dataclass(frozen=True, slots=True)
class KestrelItem:
    """One item found in a Kestrel journal, as a restarted Kestrel would serve it.

    Times are Kestrel's: integer milliseconds since the epoch.  ``add_time_ms`` is
    None for starling-era ``ADD`` records (Kestrel stamps them "now" at replay);
    ``expire_time_ms`` is None for "never".  ``item_id`` and ``error_count`` exist
    only in Kestrel 3 journals; ``xid`` is set on an item restored from an open
    transaction of an old journal.  ``file``/``offset`` say where its record is.
    """

    data: bytes
    add_time_ms: int | None
    expire_time_ms: int | None
    file: str
    offset: int
    item_id: int | None = None
    error_count: int | None = None
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class JournalDamage:
    """A journal region that could not be read: from ``offset`` to the end of ``file``.

    ``is_torn`` when the file ends inside a record that was read well up to there: a
    write cut short, as a crash leaves at the end of the file being written.  Bytes
    that cannot be a record (an unknown opcode, an impossible size) are not torn.
    """

    file: str
    offset: int
    message: str
    is_torn: bool = False

    def __str__(self) -> str:
        return f"{self.file}:{self.offset}: {self.message}"
