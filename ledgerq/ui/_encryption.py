"""Encrypted queues in the console: which ones it can read, and what it says of the others.

The console is given at most one key (``ledgerq ui --key-file``) for every queue it
serves.  The key goes to the queues whose ``meta.json`` says they are encrypted, and
only to them: a plain queue beside them is read (and opened for an action) without it,
since ledgerq refuses a key for a plain queue.

An encrypted queue the key does not open - none was given, or another queue's - is
*locked*: its figures stay readable (ids, counts, sizes and times are not encrypted, by
design: docs/encryption.md), but its payloads and headers are not, so the pages that
would show them say why instead (:class:`KeyNeeded`), and its actions are refused
before the queue is opened.  Whether the key fits is told by the key check in
``meta.json`` (``ledgerq.segment.readonly.view_sealer``), which reads nothing else and
writes nothing: looking at a locked queue never touches its files.

The key itself never leaves this process's memory: no page, JSON answer, log line or
error holds it, and no text here is derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import ledgerq
from ledgerq.segment.readonly import load_meta, view_sealer

__all__ = [
    "KEY_NEEDED",
    "PLAIN",
    "REKEY_UNFINISHED",
    "UNLOCKED",
    "WRONG_KEY",
    "KeyNeeded",
    "KeyState",
    "check_console_key",
    "key_state",
]

# Why a queue is locked: short, stable texts (the page's marker and /api/queues'
# ``key_problem``).
KEY_NEEDED = "key needed"  # the console was started without --key-file
WRONG_KEY = "wrong key"  # the key is not this queue's
REKEY_UNFINISHED = "key rotation unfinished"  # `ledgerq rekey` was interrupted


@dataclass(frozen=True, slots=True)
class KeyState:
    """Whether a queue is ``encrypted``, and why the console cannot read its messages
    (``problem``: None when it can - a plain queue, or the right key)."""

    encrypted: bool
    problem: str | None = None

    @property
    def is_locked(self) -> bool:
        """Whether the queue's payloads and headers are out of the console's reach."""
        return self.problem is not None


PLAIN = KeyState(encrypted=False)
UNLOCKED = KeyState(encrypted=True)


class KeyNeeded(Exception):
    """The messages of an encrypted queue were asked for, and the console cannot open them.

    ``state`` says why; the text says what to do (never anything of the key).
    """

    def __init__(self, state: KeyState) -> None:
        self.state = state
        if state.problem == REKEY_UNFINISHED:
            advice = (
                "a key rotation of this queue was interrupted: run `ledgerq rekey` again "
                "with the same two key files to finish it"
            )
        elif state.problem == WRONG_KEY:
            advice = (
                "the console was started with another key than this queue's: start it with "
                "--key-file naming this queue's key"
            )
        else:
            advice = "start the console with --key-file naming the queue's key"
        super().__init__(
            f"its payloads and headers cannot be read ({state.problem}): {advice} "
            "(docs/encryption.md); its figures stay readable"
        )


def key_state(queue_dir: str, key: bytes | None) -> KeyState:
    """What the console can read of the queue at ``queue_dir`` with ``key``.

    Reads ``meta.json`` only.  A queue whose ``meta.json`` cannot be read counts as
    plain: reading its messages raises what it raised before (``NotAQueueError``).
    """
    try:
        block = load_meta(queue_dir).encryption
    except (ledgerq.NotAQueueError, ledgerq.IncompatibleFormatError):
        return PLAIN
    if not block:
        return PLAIN
    if key is None:
        return KeyState(encrypted=True, problem=KEY_NEEDED)
    if "rekey_to" in block:
        return KeyState(encrypted=True, problem=REKEY_UNFINISHED)
    try:
        view_sealer(queue_dir, key)
    except (ledgerq.NotAQueueError, ledgerq.IncompatibleFormatError):
        return PLAIN  # meta.json went away or was replaced since it was read: as above
    except ledgerq.ConfigError:
        return KeyState(encrypted=True, problem=WRONG_KEY)
    return UNLOCKED


def check_console_key(key: bytes | None) -> bytes | None:
    """Return ``key`` if it can be an encryption key (None, or 32 bytes).

    Raises ``TypeError`` for anything but bytes or None and :class:`ledgerq.ConfigError`
    for bytes of another length - the rule of ``ledgerq.open``'s ``encryption_key``
    (checked by ``ledgerq.Options``, with its messages, which never show the key) - so
    a bad key fails when the console starts, not at the first encrypted queue.
    """
    if key is not None:
        ledgerq.Options(encryption_key=key)
    return key
