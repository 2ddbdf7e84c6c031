"""The :class:`~ledgerq.Message` built from a log entry: one home for the reader's
deliveries and the views that read a log without its lock."""

from __future__ import annotations

from ledgerq._types import Message, Priority
from ledgerq.format.entry import Entry

__all__ = ["entry_to_message"]

_PRIORITIES = (Priority.LOW, Priority.MEDIUM, Priority.HIGH)

# Message is a frozen dataclass: its generated __init__ sets each field through
# object.__setattr__, which costs more than the rest of a dequeue's bookkeeping.
# The slot descriptors set the same fields directly (profiled: 1.2 us -> 0.5 us).
_new_message = Message.__new__
_MESSAGE_SLOTS = tuple(
    Message.__dict__[name].__set__
    for name in (
        "id",
        "payload",
        "headers",
        "priority",
        "timestamp",
        "expires_at",
        "attempts",
        "group",
    )
)


def entry_to_message(entry: Entry, attempts: int, payload: bytes) -> Message:
    """The ``Message`` for ``entry`` (``payload`` already restored: opened, decompressed)."""
    message = _new_message(Message)
    (
        set_id,
        set_payload,
        set_headers,
        set_priority,
        set_timestamp,
        set_expiry,
        set_attempts,
        set_group,
    ) = _MESSAGE_SLOTS
    set_id(message, entry.id)
    set_payload(message, payload)
    set_headers(message, dict(entry.headers) if entry.headers else {})
    set_priority(message, _PRIORITIES[entry.priority])
    set_timestamp(message, entry.timestamp)
    set_expiry(message, entry.expires_at)
    set_attempts(message, attempts)
    set_group(message, entry.group)
    return message
