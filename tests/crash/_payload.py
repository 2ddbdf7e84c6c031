"""Deterministic messages for the crash tests, shared by the parent and the child scripts.

A message is made from a *token* (an int the writer chooses before the call): the payload
starts with the token and continues with bytes drawn from a generator seeded with it, so
anyone holding a message or a token can rebuild and compare the exact bytes.
"""

from __future__ import annotations

import random

import ledgerq

TOKEN_STRIDE = 1_000_000  # tokens of round r are r * TOKEN_STRIDE + 0, 1, 2, ...


def make_message(token: int) -> tuple[bytes, dict[str, str] | None]:
    """Return the payload and headers (None for most tokens) of the message for ``token``."""
    rng = random.Random(token)
    payload = token.to_bytes(8, "little") + rng.randbytes(rng.randrange(0, 160))
    headers = {"token": str(token), "kind": "crash"} if token % 3 == 0 else None
    return payload, headers


def make_item(token: int) -> ledgerq.Item:
    """The message for ``token`` as an ``enqueue_batch`` item."""
    payload, headers = make_message(token)
    return ledgerq.Item(payload, headers=headers)


def token_of(payload: bytes) -> int:
    """The token a payload was made from (its first eight bytes)."""
    return int.from_bytes(payload[:8], "little")


def matches(message: ledgerq.Message, token: int) -> bool:
    """Whether ``message`` carries exactly the payload and headers made from ``token``."""
    payload, headers = make_message(token)
    return message.payload == payload and message.headers == (headers or {})
