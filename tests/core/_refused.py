"""A bad value of an enqueue option refused, alone and inside a batch, nothing written."""

from __future__ import annotations

from typing import Any

import pytest

import ledgerq
from ledgerq import Item

__all__ = ["check_refused_and_nothing_written"]


def check_refused_and_nothing_written(
    q: ledgerq.Queue, option: str, value: Any, error: type[Exception]
) -> None:
    """``enqueue`` and ``enqueue_batch`` (its bad item after a good one), given
    ``option=value``, raise ``error`` naming the option, and nothing is enqueued."""
    with pytest.raises(error, match=option):
        q.enqueue(b"x", **{option: value})
    with pytest.raises(error, match=option):
        q.enqueue_batch([b"ok", Item(b"x", **{option: value})])
    assert q.stats().enqueued == 0
