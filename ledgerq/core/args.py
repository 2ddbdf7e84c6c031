"""Argument checks shared by the queue and its readers: the same bad value, the same error."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import get_args

from ledgerq._errors import MessageTooLargeError
from ledgerq._options import MAX_SECONDS
from ledgerq._types import ReaderStart
from ledgerq.core.cron import CronSchedule, parse_cron
from ledgerq.format.entry import MAX_GROUP_BYTES

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "READER_NAME",
    "check_count",
    "check_dedup_id",
    "check_headers_size",
    "check_id",
    "check_ids",
    "check_lock_timeout",
    "check_payload",
    "check_periodic_name",
    "check_periodic_schedule",
    "check_queue_path",
    "check_priority",
    "check_reader_name",
    "check_reader_start",
    "check_timeout",
    "check_ttl",
    "check_unique_key",
    "MAX_PERIODIC_NAME_BYTES",
    "MAX_UNIQUE_KEY_BYTES",
]

READER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\Z")
"""A reader's name: 1-100 of ``[A-Za-z0-9_.-]``, not starting with ``.`` or ``-``."""

_READER_STARTS: tuple[ReaderStart, ...] = get_args(ReaderStart)

_BYTES_TYPES = (bytes, bytearray, memoryview)


def check_queue_path(path: object, what: str = "path") -> None:
    """A queue directory's path: a str or ``os.PathLike``, not empty.

    ``""`` would resolve to the current directory and turn it into a queue; a caller
    who means it says ``"."``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a str or os.PathLike, got {type(path).__name__}")
    if os.fspath(path) in ("", b""):
        raise ValueError(
            f"{what} is empty; name the queue directory (use '.' to mean the current one)"
        )


def check_payload(payload: object, limit: int) -> bytes | bytearray | memoryview:
    """A bytes-like payload of at most ``limit`` bytes (contiguous)."""
    if not isinstance(payload, _BYTES_TYPES):
        hint = " (encode text first, e.g. text.encode())" if isinstance(payload, str) else ""
        raise TypeError(f"payload must be bytes-like, got {type(payload).__name__}{hint}")
    size = payload.nbytes if isinstance(payload, memoryview) else len(payload)
    if size > limit:
        raise MessageTooLargeError(
            f"payload of {size} bytes exceeds max_message_size={limit}; "
            "split it or open the queue with a larger max_message_size"
        )
    if isinstance(payload, memoryview) and not payload.c_contiguous:
        return payload.tobytes()
    return payload


def check_headers_size(blob: bytes, limit: int) -> bytes:
    """Encoded headers of at most ``limit`` bytes (``max_message_size``: payload and
    headers are bounded alike, each on its own)."""
    if len(blob) > limit:
        raise MessageTooLargeError(
            f"headers of {len(blob)} bytes (encoded) exceed max_message_size={limit}; "
            "put large data in the payload, or open the queue with a larger max_message_size"
        )
    return blob


def check_priority(priority: object) -> int:
    """A priority level: an int (or ``Priority``) from 0 to 2."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be a ledgerq.Priority, got {type(priority).__name__}")
    if not 0 <= priority <= 2:
        raise ValueError(f"priority must be LOW (0), MEDIUM (1) or HIGH (2), got {priority}")
    return int(priority)


def check_ttl(ttl: object) -> float | None:
    """None (no expiry), or a number of seconds above 0 and at most :data:`MAX_SECONDS`.

    NaN, infinity and anything beyond 100 years raise ``ValueError``: an expiry
    time must be a real instant that fits the entry's nanosecond field.
    """
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"ttl must be a number of seconds or None, got {type(ttl).__name__}")
    # Compared before any conversion: float() of a huge int raises OverflowError.
    if not 0 < ttl <= MAX_SECONDS:  # NaN fails both
        raise ValueError(
            f"ttl must be a number of seconds > 0 and at most {MAX_SECONDS:.0f} (100 years), "
            f"got {ttl!r}; use None for a message that never expires"
        )
    return float(ttl)


def check_delay(delay: object, what: str = "delay") -> float | None:
    """None (no delay), or a number of seconds from 0 to :data:`MAX_SECONDS`.

    Negative, NaN and infinite delays, and anything beyond 100 years, raise
    ``ValueError``; a non-number (a bool, a str) ``TypeError``.
    """
    if delay is None:
        return None
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None, got {type(delay).__name__}")
    if not 0 <= delay <= MAX_SECONDS:  # NaN fails both
        raise ValueError(
            f"{what} must be a number of seconds from 0 to {MAX_SECONDS:.0f} (100 years), "
            f"got {delay!r}"
        )
    return float(delay)


def check_group(group: object) -> bytes | None:
    """None (no group), or a group name as the UTF-8 bytes the entry stores.

    A group is a ``str`` of 1 to 255 bytes of UTF-8 (``TypeError`` for anything else,
    ``ValueError`` for an empty or longer one, or one that is not valid unicode).
    """
    if group is None:
        return None
    if type(group) is not str:
        raise TypeError(f"group must be a str or None, got {type(group).__name__}")
    try:
        raw = group.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(f"group must be valid unicode text: {exc}") from exc
    if not 0 < len(raw) <= MAX_GROUP_BYTES:
        raise ValueError(
            f"group must be 1 to {MAX_GROUP_BYTES} bytes of UTF-8, got {len(raw)} bytes"
        )
    return raw


def check_id(message_id: object) -> int:
    """A message id: an int (not a bool)."""
    if isinstance(message_id, bool) or not isinstance(message_id, int):
        raise TypeError(f"message id must be an int, got {type(message_id).__name__}")
    return message_id


def check_ids(ids: object) -> set[int]:
    """The message ids of an iterable, each an int as :func:`check_id` wants it.

    A str or bytes is refused (``TypeError``), not iterated: ``"12"`` is not the ids
    1 and 2.  Every id is checked before the caller moves anything.
    """
    if isinstance(ids, (str, bytes, bytearray, memoryview)) or not isinstance(ids, Iterable):
        raise TypeError(f"ids must be an iterable of int message ids, got {type(ids).__name__}")
    return {check_id(message_id) for message_id in ids}


def check_timeout(timeout: object) -> float | None:
    """None (forever), or a number of seconds >= 0; infinity (or more than 100 years) is None.

    NaN raises ``ValueError``: a wait of NaN seconds has no end, and compares false
    with every deadline (a wait loop would spin).
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"timeout must be a number of seconds or None, got {type(timeout).__name__}"
        )
    if not timeout >= 0:  # NaN too
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
    if timeout > MAX_SECONDS:
        # Waits take at most threading.TIMEOUT_MAX (~292 years) and float() of a huge
        # int overflows: beyond 100 years, a wait is as good as forever.
        return None
    return float(timeout)


DEFAULT_LOCK_TIMEOUT = 10.0  # seconds; open(lock_timeout=): see ledgerq.open


def check_lock_timeout(lock_timeout: object) -> float:
    """Seconds above 0 that a call may wait for another handle's step (``open``'s
    ``lock_timeout``); ``TypeError``/``ValueError`` otherwise (a wait without end is
    what the bound is there to prevent: None and infinity are refused)."""
    if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float)):
        raise TypeError(
            f"lock_timeout must be a number of seconds, got {type(lock_timeout).__name__}"
        )
    if not 0 < lock_timeout <= MAX_SECONDS:  # NaN and infinity too
        raise ValueError(
            f"lock_timeout must be a number of seconds above 0 (and finite), got {lock_timeout!r}"
        )
    return float(lock_timeout)


def check_dedup_id(dedup_id: object) -> str | bytes | None:
    """None, or a str or bytes dedup id."""
    if dedup_id is None or isinstance(dedup_id, (str, bytes)):
        return dedup_id
    raise TypeError(f"dedup_id must be a str or bytes, got {type(dedup_id).__name__}")


MAX_UNIQUE_KEY_BYTES = 1024
"""The longest ``unique_key`` (UTF-8 bytes).  Only a 16-byte digest of it is kept, so the
bound is not about space: a longer key is almost surely a payload passed by mistake."""


def check_unique_key(unique_key: object) -> str | None:
    """None, or a unique job's key: a ``str`` of 1 to :data:`MAX_UNIQUE_KEY_BYTES` bytes
    of UTF-8 (``TypeError`` for another type, ``ValueError`` for an empty, longer or
    invalid one)."""
    if unique_key is None:
        return None
    return _check_short_text(
        unique_key,
        "unique_key",
        "a str or None",
        MAX_UNIQUE_KEY_BYTES,
        type_hint="; pass the job's key as text (e.g. str(user_id))",
        size_hint="; use a short name of the job (hash a long one)",
    )


def _check_short_text(
    value: object, what: str, kinds: str, most: int, *, type_hint: str, size_hint: str = ""
) -> str:
    """``value`` if it is a ``str`` of 1 to ``most`` bytes of UTF-8: ``TypeError`` for
    another type, ``ValueError`` for an empty, longer or invalid one (``what`` names it in
    the message, the hints say what to do)."""
    if type(value) is not str:
        raise TypeError(f"{what} must be {kinds}, got {type(value).__name__}{type_hint}")
    try:
        size = len(value.encode())
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} must be valid unicode text: {exc}") from exc
    if not 0 < size <= most:
        raise ValueError(f"{what} must be 1 to {most} bytes of UTF-8, got {size}{size_hint}")
    return value


def check_count(name: str, n: object) -> int:
    """A positive int (how many messages); TypeError for another type, ValueError if < 1."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {n}")
    return n


def check_reader_name(name: object) -> str:
    """A reader name (see :data:`READER_NAME`); it is also the name of its state file."""
    if not isinstance(name, str):
        raise TypeError(f"reader name must be a str, got {type(name).__name__}")
    if not READER_NAME.match(name):
        raise ValueError(
            f"invalid reader name {name!r}: use 1-100 characters of letters, digits, "
            "'_', '-' and '.', not starting with '.' or '-'"
        )
    return name


def check_reader_start(start: object) -> ReaderStart | int:
    """Where a new reader starts: ``"earliest"``, ``"latest"`` or an id (bounds: the queue's)."""
    if isinstance(start, int) and not isinstance(start, bool):
        return start
    if not isinstance(start, str):
        raise TypeError(f"start must be 'earliest', 'latest' or an id, got {type(start).__name__}")
    for known in _READER_STARTS:
        if start == known:
            return known
    raise ValueError(f"start must be 'earliest', 'latest' or an id, got {start!r}")


MAX_PERIODIC_NAME_BYTES = 255
"""The longest name of a periodic job (UTF-8 bytes)."""


def check_periodic_name(name: object) -> str:
    """A periodic job's name: a ``str`` of 1 to :data:`MAX_PERIODIC_NAME_BYTES` bytes of
    UTF-8 (``TypeError`` for another type, ``ValueError`` for an empty or longer one)."""
    return _check_short_text(
        name,
        "a periodic job's name",
        "a str",
        MAX_PERIODIC_NAME_BYTES,
        type_hint="; name the job, e.g. 'nightly-report'",
    )


def check_periodic_schedule(every: object, cron: object) -> tuple[int, CronSchedule | None]:
    """Exactly one of ``every`` (seconds, a number above 0 and at most
    :data:`MAX_SECONDS`) and ``cron`` (a 5-field expression): ``(every_ns, None)`` or
    ``(0, schedule)``.  ``TypeError``/``ValueError`` saying what is wrong otherwise."""
    if (every is None) == (cron is None):
        raise TypeError(
            "give exactly one of every= (seconds between runs) and cron= (a 5-field "
            "expression such as '*/5 * * * *'), got " + ("neither" if every is None else "both")
        )
    if cron is not None:
        return 0, parse_cron(cron)
    if isinstance(every, bool) or not isinstance(every, (int, float)):
        raise TypeError(f"every must be a number of seconds, got {type(every).__name__}")
    if not 0 < every <= MAX_SECONDS:  # (NaN fails this too)
        raise ValueError(
            f"every must be above 0 and at most {MAX_SECONDS:g} seconds, got {every!r}"
        )
    every_ns = int(every * 1_000_000_000)
    if every_ns < 1_000_000:
        raise ValueError(f"every must be at least 0.001 seconds, got {every!r}")
    return every_ns, None
