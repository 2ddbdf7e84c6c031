"""Deterministic messages made from a *token*: anyone holding one can rebuild the other.

The payload starts with the token (8 bytes, little-endian); the rest, the headers, the
priority and the TTL are drawn from a generator seeded with the token.  About a third of
the payloads are repetitive text, so ``compression="zstd"`` really compresses them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import ledgerq

__all__ = ["Made", "make", "matches", "mismatch", "token_of"]

_LONG_TTL = 86_400.0  # exercises the TTL field; never expires during a test


@dataclass(frozen=True, slots=True)
class Made:
    """Everything an enqueue of ``token`` passes."""

    token: int
    payload: bytes
    headers: dict[str, str] | None
    priority: ledgerq.Priority
    ttl: float | None

    def item(self, dedup_id: str | None = None) -> ledgerq.Item:
        """The message as an ``enqueue_batch`` item."""
        return ledgerq.Item(
            self.payload,
            headers=self.headers,
            priority=self.priority,
            ttl=self.ttl,
            dedup_id=dedup_id,
        )


def make(token: int) -> Made:
    """The message of ``token``."""
    rng = random.Random(token * 7919 + 17)
    head = token.to_bytes(8, "little")
    if rng.random() < 0.35:
        body = (b"ledgerq torture %d " % token) * rng.randrange(1, 40)
    else:
        body = rng.randbytes(rng.randrange(0, 200))
    headers = {"token": str(token), "kind": "torture"} if token % 3 == 0 else None
    priority = ledgerq.Priority(rng.choice((0, 1, 1, 2)))
    ttl = _LONG_TTL if rng.random() < 0.1 else None
    return Made(token, head + body, headers, priority, ttl)


def token_of(payload: bytes) -> int:
    """The token a payload was made from."""
    return int.from_bytes(payload[:8], "little")


def matches(message: ledgerq.Message, token: int, *, moved: bool = False) -> bool:
    """Whether ``message`` carries exactly what ``token`` makes (``dlq.*`` headers aside).

    A message that went through the DLQ (``moved``) has no TTL any more: neither the
    move nor ``requeue_dlq`` carries ``expires_at`` over (not promised by the docs).
    """
    return not mismatch(message, token, moved=moved)


def mismatch(message: ledgerq.Message, token: int, *, moved: bool = False) -> str:
    """What differs between ``message`` and the message of ``token`` ("" if nothing)."""
    made = make(token)
    headers = {k: v for k, v in message.headers.items() if not k.startswith("dlq.")}
    problems = []
    if message.payload != made.payload:
        problems.append(f"payload {message.payload[:40]!r}... is not {made.payload[:40]!r}...")
    if headers != (made.headers or {}):
        problems.append(f"headers {headers} are not {made.headers}")
    if message.priority != made.priority:
        problems.append(f"priority {message.priority!r} is not {made.priority!r}")
    if moved and message.expires_at is not None:
        problems.append(f"expires_at {message.expires_at} after a move through the DLQ")
    elif not moved and (message.expires_at is None) != (made.ttl is None):
        problems.append(f"expires_at {message.expires_at} but ttl {made.ttl}")
    return "; ".join(problems)
