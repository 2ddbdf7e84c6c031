"""Steps the forward tests share: a leased job, and a forward whose ack is lost."""

from __future__ import annotations

from typing import Any

import pytest

import ledgerq
from ledgerq.core.reader_handle import Reader


class AckLost(Exception):
    """The instant after the items landed: the ack never happens."""


def lease_new(q: Any, payload: bytes = b"job") -> ledgerq.Message:
    """Enqueue ``payload`` into ``q`` (a queue or a shared handle) and lease the next
    message of its default reader: that one, on a queue that held nothing."""
    q.enqueue(payload)
    msg = q.dequeue()
    assert msg is not None
    return msg


def forward_losing_the_ack(
    monkeypatch: pytest.MonkeyPatch, source: Any, message_id: int, target: Any, items: Any
) -> None:
    """``source.forward(message_id, target, items)`` (source: a queue or a named reader)
    with every ack raising :class:`AckLost`: the items land, the message stays leased."""

    def ack(self: Reader, message_id: int) -> None:
        raise AckLost(message_id)

    with monkeypatch.context() as patch:
        patch.setattr(Reader, "ack", ack)
        with pytest.raises(AckLost):
            source.forward(message_id, target, items)
