"""Encryption at rest, on disk: the ``encryption`` object of ``meta.json`` and the key check.

An encrypted queue's ``meta.json`` (version 3) holds::

    "encryption": {"cipher": "AES-256-GCM", "queue_id": <32 hex>, "key_check": <64 hex>}

``queue_id`` is the queue's identity (random, made when the queue is created with a
key): the salt of the key derivation and the start of every entry's associated data
(``format.sealing``).  ``key_check`` is HMAC-SHA256 of a fixed message under a key
derived from the encryption key: it tells a wrong key without revealing the key.  After
a key rotation, ``digest_key`` (hex) holds the key of the dedup ids' and unique keys'
digests, wrapped under the new key: the digests stay what they were under the old key
(:func:`digest_key_for`).

The rules, in one place, for the queue and the readers that work without its lock:

* an encrypted queue opened without a key, or with another key, and a plain queue
  opened with a key, raise :class:`ConfigError` - a plain queue is never encrypted in
  place: its earlier messages would stay in clear while the user believed them sealed;
* :func:`check_key_before_open` applies them by *reading* ``meta.json`` (or
  ``options.json`` when ``meta.json`` is lost) before the queue takes its lock or
  writes anything, so a refused open leaves every byte and every mtime as it was.
"""

from __future__ import annotations

import hmac
import os

from ledgerq._errors import ConfigError, NotAQueueError
from ledgerq.format.errors import CorruptRecord
from ledgerq.format.sealing import (
    CIPHER_NAME,
    KEY_SIZE,
    QUEUE_ID_SIZE,
    EntrySealer,
    derived_digest_key,
    key_check,
    new_queue_id,
    unwrap_digest_key,
)
from ledgerq.segment.meta import DamagedMetaError, Meta, MetaStore, OptionsStore

__all__ = [
    "check_key",
    "check_key_before_open",
    "check_key_type",
    "digest_key_for",
    "new_encryption_block",
    "sealer_for",
    "stored_block",
]


def check_key_type(key: object) -> bytes | None:
    """Return ``key`` if it is a valid ``encryption_key`` (None or 32 bytes).

    Raises ``TypeError`` for anything but bytes or None and :class:`ConfigError` for
    bytes of another length.  The key itself never appears in a message.
    """
    if key is None:
        return None
    if type(key) is not bytes:
        raise TypeError(
            f"option encryption_key must be bytes (32 of them) or None, got {type(key).__name__}"
        )
    if len(key) != KEY_SIZE:
        raise ConfigError(
            f"option encryption_key must be exactly {KEY_SIZE} bytes (AES-256), got "
            f"{len(key)} bytes"
        )
    return key


def new_encryption_block(key: bytes) -> dict[str, str]:
    """The ``encryption`` object of a queue encrypted from now on with ``key``."""
    queue_id = new_queue_id()
    return {
        "cipher": CIPHER_NAME,
        "queue_id": queue_id.hex(),
        "key_check": key_check(key, queue_id).hex(),
    }


def _queue_id(block: dict[str, str], where: str) -> bytes:
    """The queue identity of a stored ``encryption`` object, checked."""
    try:
        queue_id = bytes.fromhex(block.get("queue_id", ""))
        check = bytes.fromhex(block.get("key_check", ""))
    except ValueError:
        queue_id = check = b""
    if block.get("cipher") != CIPHER_NAME or len(queue_id) != QUEUE_ID_SIZE or len(check) != 32:
        raise ConfigError(
            f"the encryption object of {where} is damaged or of an unknown cipher "
            f"({block.get('cipher')!r}); restore the file from a backup - the queue's "
            "messages cannot be read without its queue_id"
        )
    return queue_id


def check_key(block: dict[str, str], key: bytes | None, where: str) -> bytes | None:
    """Apply the key rules to a queue whose stored ``encryption`` object is ``block``.

    Returns the queue identity (None for a plain queue opened without a key).  Raises
    :class:`ConfigError` for a missing, unexpected or wrong key (``where`` names the
    queue in the message).
    """
    if not block:
        if key is not None:
            raise ConfigError(
                f"queue {where} is not encrypted, and a plain queue is not encrypted in "
                "place (its earlier messages would stay in clear); open it without "
                "encryption_key, or create a new queue with the key and move the messages"
            )
        return None
    if key is None:
        raise ConfigError(
            f"queue {where} is encrypted: open it with its encryption_key (the CLI: --key-file)"
        )
    queue_id = _queue_id(block, where)
    if "rekey_to" in block:
        raise ConfigError(
            f"a key rotation of queue {where} was interrupted: run `ledgerq rekey {where} "
            "--old-key-file OLD --new-key-file NEW` again to finish it (its segments are "
            "under either key until then)"
        )
    expected = bytes.fromhex(block["key_check"])
    if not hmac.compare_digest(key_check(key, queue_id), expected):
        raise ConfigError(
            f"wrong encryption_key for queue {where}: it does not match the key check "
            "stored in meta.json (nothing was read or written)"
        )
    return queue_id


def digest_key_for(block: dict[str, str], key: bytes, where: str) -> bytes:
    """The key of the queue's keyed digests (dedup ids, unique keys) under ``key``: the
    one a rotation stored (``digest_key``, wrapped under the key that was new then), or
    the one ``key`` derives.  Raises :class:`ConfigError` for a stored one that does not
    open under ``key`` (its key check does: the field was damaged or forged)."""
    stored = block.get("digest_key")
    if stored is None:
        return derived_digest_key(key)
    try:
        return unwrap_digest_key(key, _queue_id(block, where), bytes.fromhex(stored))
    except (ValueError, CorruptRecord):
        raise ConfigError(
            f"the digest key stored in meta.json of {where} (encryption.digest_key, written "
            "by ledgerq rekey) does not open under the queue's key: restore meta.json from a "
            "backup, or delete that field to start the dedup window and the unique keys "
            "again (the messages are unaffected)"
        ) from None


def sealer_for(block: dict[str, str], key: bytes | None, where: str) -> EntrySealer | None:
    """The sealer of a queue (None when it is plain), after :func:`check_key`."""
    queue_id = check_key(block, key, where)
    if queue_id is None or key is None:
        return None
    return EntrySealer(key, queue_id)


def stored_block(directory: str) -> dict[str, str] | None:
    """The ``encryption`` object stored with the queue at ``directory``; None for a
    directory without ``meta.json`` and without a usable ``options.json`` (a new queue,
    or one the open refuses or rebuilds for other reasons)."""
    store = MetaStore(directory)
    try:
        if store.exists():
            meta: Meta = store.load()
            return meta.encryption
    except DamagedMetaError:
        pass
    except NotAQueueError:
        return None
    copy = OptionsStore(directory).load()
    return copy.encryption if copy is not None else None


def check_key_before_open(directory: str, key: bytes | None) -> None:
    """Refuse (``ConfigError``) a key that does not fit the queue at ``directory``,
    reading its files only: called before the queue takes its lock or writes.

    A directory with nothing stored (a new queue) passes; the open then checks again
    under the lock (a rekey may have run in between) with :func:`sealer_for`.
    """
    if not os.path.isdir(directory):
        return
    block = stored_block(directory)
    if block is not None:
        check_key(block, key, directory)
