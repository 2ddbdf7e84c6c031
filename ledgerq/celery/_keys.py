"""An encrypted broker: the key the transport options give, and the check at connection.

``broker_transport_options={"encryption_key": KEY}`` (32 bytes, or a str of 64
hexadecimal digits) or ``{"encryption_key_file": PATH}`` (read as ``ledgerq --key-file``
reads one: ``ledgerq.tools.read_key_file``) makes every ledgerq queue the transport
creates - task queues, control (pidbox) and reply queues, and their DLQs - encrypted
with that key, and reopens them with it (docs/encryption.md).  A broker directory is
encrypted as a whole: ledgerq never encrypts a plain queue in place, so a key meets only
queues created with it.

When a connection is established, every queue already in the broker directory is
checked against the key (:func:`check_broker`: its ``meta.json`` only - nothing is
opened or written), so a producer or worker without the key, with another key, or with
a key for a plain broker stops at once with an error naming the option to set, not at
its first task.  The key itself appears in no message (Celery's own ``celery report``
masks every option whose name holds ``key``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import ledgerq
from ledgerq import tools
from ledgerq.segment.readonly import load_meta, view_sealer

__all__ = ["FILE_OPTION", "OPTION", "broker_key", "check_broker", "check_queue"]

OPTION = "encryption_key"
FILE_OPTION = "encryption_key_file"
_HOW = (
    f"broker_transport_options={{'{OPTION}': <32 bytes, or 64 hexadecimal digits>}} or "
    f"{{'{FILE_OPTION}': '/path/to/key'}}"
)


def broker_key(options: Mapping[str, object], queue_options: Mapping[str, object]) -> bytes | None:
    """The broker's encryption key as the transport ``options`` give it (None: a
    plain broker).

    ``queue_options`` may hold ``encryption_key`` too (it is a ``ledgerq.open`` option);
    the key is given once, in one of the three places.  Raises ``ConfigError`` naming
    the option (never the key) for a value that is not a key, an unreadable key file,
    and a key given twice.
    """
    given = [name for name in (OPTION, FILE_OPTION) if options.get(name) is not None]
    if queue_options.get(OPTION) is not None:
        given.append(f"queue_options['{OPTION}']")
    if len(given) > 1:
        raise ledgerq.ConfigError(
            f"the broker's encryption key is given {len(given)} times ({', '.join(given)}): "
            f"give it once, as {_HOW}"
        )
    if not given:
        return None
    if given[0] == OPTION:
        return _key_value(options[OPTION])
    if given[0] == FILE_OPTION:
        path = options[FILE_OPTION]
        if not isinstance(path, (str, os.PathLike)):
            raise ledgerq.ConfigError(
                f"transport option {FILE_OPTION} must be a path (str), got {type(path).__name__}"
            )
        try:
            return tools.read_key_file(path)
        except tools.KeyFileError as exc:
            raise ledgerq.ConfigError(f"transport option {FILE_OPTION}: {exc}") from None
    key = queue_options[OPTION]
    ledgerq.Options(encryption_key=key)  # type: ignore[arg-type]  # its checks and messages
    assert isinstance(key, bytes)
    return key


def _key_value(value: object) -> bytes:
    """The key of the ``encryption_key`` option: 32 bytes, or 64 hex digits (str or
    bytes).  Raises ``ConfigError`` saying what was given - its type and size only."""
    key = None
    if isinstance(value, str):
        if len(value.strip()) == 2 * tools.KEY_SIZE:  # a str is the hex form, never raw
            key = tools.key_from_bytes(value.encode("utf-8", "replace"))
    elif isinstance(value, (bytes, bytearray)):
        key = tools.key_from_bytes(bytes(value))
    if key is None:
        size = f" of length {len(value)}" if isinstance(value, (str, bytes, bytearray)) else ""
        raise ledgerq.ConfigError(
            f"transport option {OPTION} must be the key: 32 bytes, or a str of 64 "
            f"hexadecimal digits (got a {type(value).__name__}{size})"
        )
    return key


def check_broker(queues_dir: str, key: bytes | None) -> None:
    """Check ``key`` against every queue in ``queues_dir`` (see :func:`check_queue`)."""
    try:
        names = sorted(os.listdir(queues_dir))
    except FileNotFoundError:
        return
    for name in names:
        if not name.startswith("."):  # the transport's own trash (.deleted-*)
            check_queue(os.path.join(queues_dir, name), key)


def check_queue(path: str, key: bytes | None) -> None:
    """Refuse (``ConfigError`` naming the transport option) a ``key`` that does not
    fit the queue at ``path``: none for an encrypted queue, another one, or one for a
    plain queue.  Reads its ``meta.json`` only; a directory that is not a queue yet
    passes (the open that creates it applies the key)."""
    try:
        block = load_meta(path).encryption
    except (ledgerq.NotAQueueError, ledgerq.IncompatibleFormatError):
        return
    if not block and key is None:
        return
    try:
        view_sealer(path, key)
    except ledgerq.ConfigError as exc:
        raise ledgerq.ConfigError(_advice(path, block, key, exc)) from None


def _advice(path: str, block: Mapping[str, str], key: bytes | None, exc: Exception) -> str:
    if not block:
        return (
            f"the broker's queue {path} is not encrypted, and the transport was given an "
            f"encryption key ({OPTION} / {FILE_OPTION} in broker_transport_options): a "
            "plain queue is never encrypted in place - give an encrypted broker a new, "
            "empty directory, or leave the key out to use this one"
        )
    if key is None:
        return (
            f"the broker's queue {path} is encrypted: give the transport its key, as "
            f"{_HOW} (docs/celery.md)"
        )
    if "rekey_to" in block:
        return str(exc)  # an interrupted `ledgerq rekey`: the message says to finish it
    return (
        f"the encryption key in broker_transport_options ({OPTION} / {FILE_OPTION}) is "
        f"not the key of the broker's queue {path}: give the key the broker was created "
        "with (nothing was read or written)"
    )
