"""Key rotation: ``ledgerq rekey``, the entries of an encrypted queue sealed again.

Every sealed entry keeps its size, fields and position (only its nonce, ciphertext and
tag change, and its CRC with them), so the sparse indexes stay right and a segment is
rewritten as a whole, atomically (temp file, fsync, rename, fsync of the directory).

The order, and why a crash at any point is safe (``docs/encryption.md``, "Rotation"):

1. **Recover** each queue (the queue and its DLQ) by opening and closing it with the old
   key: torn tails are cut, so every byte left is whole entries.
2. **Lock** each queue exclusively (a rekey needs the queue alone: an open handle, or a
   shared-mode process, makes it refuse with ``QueueLockedError``).
3. **Mark** the rotation in ``meta.json`` (and ``options.json``): ``encryption.rekey_to``
   holds the new key's check.  From here on every open refuses the queue ("run rekey
   again"), since its segments may be under either key.
4. **Rewrite** every segment: an entry that opens under the new key is kept (a previous,
   interrupted run did it), one that opens under the old key is sealed again under the
   new one, and one that opens under neither is kept as it is (it was corrupt, and stays
   so).  A crash leaves each segment wholly old or wholly new.
5. **Switch** ``meta.json``'s key check to the new key and drop ``rekey_to`` - the DLQ
   first, then the queue - after which only the new key opens the queue.  The same save
   stores the key of the dedup ids' and unique keys' digests (``digest_key``: the one
   the old key derived, or an earlier rotation stored) wrapped under the new key, so
   the dedup window and the held unique keys outlive the rotation.

Running it again with the same two keys after a crash finishes the rotation: every step
is idempotent (a queue whose key check is already the new key's is done).  Both keys are
needed until then, never after.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ledgerq._api import open as open_queue
from ledgerq._errors import ConfigError
from ledgerq.format.entry import EntryFlags, decode_entry
from ledgerq.format.errors import CorruptRecord, DecodeError
from ledgerq.format.sealing import EntrySealer, key_check, wrap_digest_key
from ledgerq.segment.encryption import check_key_type, digest_key_for, stored_block
from ledgerq.segment.files import atomic_write, storage_errors
from ledgerq.segment.lock import DirLock
from ledgerq.segment.meta import MetaStore, OptionsCopy, OptionsStore
from ledgerq.segment.naming import DLQ_DIR, META_NAME, SEGMENTS_DIR, parse_log_name

__all__ = ["rekey"]

_ENCRYPTED = int(EntryFlags.ENCRYPTED)
Step = Callable[[str], None]


def _queues(path: str) -> list[str]:
    """The queue at ``path`` and its DLQ, when it has one."""
    found = [path]
    dlq = os.path.join(path, DLQ_DIR)
    if os.path.exists(os.path.join(dlq, META_NAME)):
        found.append(dlq)
    return found


def _state(directory: str, old: bytes, new: bytes) -> str:
    """``"done"``, ``"marked"`` (an interrupted run) or ``"fresh"``; raises
    :class:`ConfigError` for a plain queue or keys that are not this queue's."""
    block = stored_block(directory) or {}
    if not block:
        raise ConfigError(f"queue {directory} is not encrypted: there is no key to rotate")
    try:
        queue_id = bytes.fromhex(block.get("queue_id", ""))
    except ValueError:
        queue_id = b""
    if len(queue_id) != 16:
        raise ConfigError(f"the encryption object of {directory} is damaged")
    old_check = key_check(old, queue_id).hex()
    new_check = key_check(new, queue_id).hex()
    if block.get("key_check") == new_check and "rekey_to" not in block:
        return "done"
    if block.get("key_check") != old_check:
        raise ConfigError(
            f"the old key is not the key of queue {directory} (its key check differs); "
            "nothing was changed"
        )
    if "rekey_to" in block:
        if block["rekey_to"] != new_check:
            raise ConfigError(
                f"an interrupted rotation of queue {directory} was to another new key: run "
                "rekey with that key to finish it first"
            )
        return "marked"
    return "fresh"


def _save_block(directory: str, block: dict[str, str]) -> None:
    """Durably replace the ``encryption`` object of ``meta.json``, then of ``options.json``."""
    store = MetaStore(directory)
    meta = store.load()
    meta.encryption = block
    store.save(meta)
    options = OptionsStore(directory)
    copy = options.load()
    if copy is not None:
        copy.encryption = block
        options.save(copy)
    else:
        options.save(
            OptionsCopy(created_ns=meta.created_ns, options=dict(meta.options), encryption=block)
        )


def _rewrite_segment(log: str, old: EntrySealer, new: EntrySealer) -> bool:
    """Seal every entry of the segment ``log`` under ``new``; True if it was rewritten."""
    with storage_errors("read", log), open(log, "rb") as f:
        data = bytearray(f.read())
    changed = False
    pos = 0
    while pos < len(data):
        try:
            entry, end = decode_entry(data, pos)
        except DecodeError:
            pos += 1  # damage (recovery kept it: not a tail): look for the next entry
            continue
        if entry.flags & _ENCRYPTED:
            try:
                new.open_content(entry)
            except CorruptRecord:
                try:
                    content = old.open_content(entry)
                except CorruptRecord:
                    pass  # under neither key: corrupt before, corrupt after
                else:
                    data[pos:end] = new.reseal(entry, content)
                    changed = True
        pos = end
    if changed:
        atomic_write(log, bytes(data))  # temp file, fsync, rename, fsync of the directory
    return changed


def _recover(directory: str, old: bytes) -> None:
    """Open and close the queue with the old key: recovery cuts torn tails."""
    open_queue(directory, encryption_key=old, remember_options=False).close()


def rekey(
    path: str | os.PathLike[str],
    old_key: bytes,
    new_key: bytes,
    *,
    on_step: Step | None = None,
) -> int:
    """Seal every entry of the encrypted queue at ``path`` (and of its DLQ) under
    ``new_key`` instead of ``old_key``; return how many segments were rewritten.

    Needs the queue alone: raises :class:`QueueLockedError` while any process has it
    open.  Raises :class:`ConfigError` for a plain queue or an ``old_key`` that is not
    the queue's (nothing changed).  Crash-safe and resumable: after a crash, run it again
    with the same keys (until then the queue refuses to open).  ``on_step`` is called
    with a description after each durable step (for progress, and crash tests).
    """
    directory = os.path.abspath(os.fspath(path))
    old = check_key_type(old_key)
    new = check_key_type(new_key)
    if old is None or new is None:
        raise TypeError("rekey takes the old and the new key, 32 bytes each")
    if old == new:
        raise ConfigError("the old and the new key are the same: nothing to rotate")
    step: Step = on_step if on_step is not None else (lambda _: None)
    queues = _queues(directory)
    states = {d: _state(d, old, new) for d in queues}
    for d in queues:
        if states[d] == "fresh":
            _recover(d, old)
            step(f"recovered {d}")
    queues = _queues(directory)  # recovery may not create a DLQ, but be exact
    states = {d: _state(d, old, new) for d in queues}
    locks: list[DirLock] = []
    try:
        for d in queues:
            locks.append(DirLock(d))
        pending = [d for d in queues if states[d] != "done"]
        for d in pending:
            if states[d] == "fresh":
                block = dict(stored_block(d) or {})
                queue_id = bytes.fromhex(block["queue_id"])
                block["rekey_to"] = key_check(new, queue_id).hex()
                _save_block(d, block)
                step(f"marked {d}")
        rewritten = 0
        for d in pending:
            block = stored_block(d) or {}
            queue_id = bytes.fromhex(block["queue_id"])
            old_sealer, new_sealer = EntrySealer(old, queue_id), EntrySealer(new, queue_id)
            seg_dir = os.path.join(d, SEGMENTS_DIR)
            names = sorted(n for n in os.listdir(seg_dir) if parse_log_name(n) is not None)
            for name in names:
                if _rewrite_segment(os.path.join(seg_dir, name), old_sealer, new_sealer):
                    rewritten += 1
                step(f"segment {os.path.join(seg_dir, name)}")
        for d in reversed(pending):  # the DLQ first: the queue opens its DLQ
            block = dict(stored_block(d) or {})
            queue_id = bytes.fromhex(block["queue_id"])
            # The digests of the dedup ids and unique keys stay what they were: their
            # key, under the old key until now, is kept wrapped under the new one - in
            # the same save as the new key check.
            digest_key = digest_key_for(block, old, d)
            block["digest_key"] = wrap_digest_key(new, queue_id, digest_key).hex()
            block.pop("rekey_to", None)
            block["key_check"] = key_check(new, queue_id).hex()
            _save_block(d, block)
            step(f"switched {d}")
        return rewritten
    finally:
        for lock in reversed(locks):
            lock.release()
