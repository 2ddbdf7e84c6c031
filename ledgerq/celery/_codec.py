"""kombu messages as ledgerq payloads, and Celery's ``eta`` as a delivery delay.

The virtual transport hands ``_put`` a dict: ``body`` (already serialized by kombu, then
base64 by default), ``content-type``, ``content-encoding``, ``headers`` and
``properties`` (delivery info, priority, the body's encoding).  It is stored whole, as
JSON written by kombu's own encoder - the one the Redis transport uses - which keeps
``bytes``, ``datetime``, ``UUID`` and ``Decimal`` values in headers exactly, so a message
comes back as it went in.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from typing import Any

from kombu.utils.json import dumps, loads

__all__ = ["UndecodableMessageError", "clear_due_eta", "decode", "encode", "eta_delay"]

# ledgerq's bound on a delay (100 years, docs/usage.md); an eta past it is Celery's to hold.
_MAX_DELAY_SECONDS = 100 * 365 * 24 * 3600.0


class UndecodableMessageError(ValueError):
    """A stored payload that is not a message this transport wrote."""


def encode(message: dict[str, Any]) -> bytes:
    """Return the bytes stored for kombu's message dict."""
    text: str = dumps(message)
    return text.encode("utf-8")


def decode(payload: bytes) -> dict[str, Any]:
    """Return the message dict stored as ``payload``.

    Raises :class:`UndecodableMessageError` when the payload is not a kombu message
    (not JSON, or without the ``properties`` mapping every kombu message has): a
    message enqueued by something else, or damaged.
    """
    try:
        message = loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, TypeError) as exc:
        raise UndecodableMessageError(f"not a kombu message (not kombu JSON: {exc})") from exc
    if not isinstance(message, dict):
        raise UndecodableMessageError("not a kombu message (not a JSON object)")
    properties = message.get("properties")
    if not isinstance(properties, dict):
        raise UndecodableMessageError("not a kombu message (no 'properties' object)")
    if not isinstance(properties.get("delivery_info", {}), dict):
        raise UndecodableMessageError("not a kombu message ('delivery_info' is not an object)")
    if not isinstance(message.get("headers") or {}, dict):
        raise UndecodableMessageError("not a kombu message ('headers' is not an object)")
    _check_body(message.get("body"), properties.get("body_encoding"))
    return message


def _check_body(body: object, encoding: object) -> None:
    """Raise unless kombu's virtual channel can decode ``body`` (it would raise in the
    consumer's callback, for this message at every delivery)."""
    if encoding is None or (isinstance(encoding, str) and encoding.lower() == "utf-8"):
        return  # handed over as it is
    if encoding != "base64":
        raise UndecodableMessageError(f"not a kombu message (unknown body_encoding {encoding!r})")
    if not isinstance(body, str | bytes):
        raise UndecodableMessageError("not a kombu message (a base64 body that is not text)")
    try:
        base64.b64decode(body)  # as kombu decodes it: not validating, so as lenient
    except (binascii.Error, ValueError) as exc:
        raise UndecodableMessageError(f"not a kombu message (a bad base64 body: {exc})") from exc


def _aware_eta(message: dict[str, Any]) -> dt.datetime | None:
    """The message's ``eta`` header as a time with a UTC offset (None: no eta, or one
    the broker cannot place in time - see :func:`eta_delay`)."""
    headers = message.get("headers")
    eta = headers.get("eta") if isinstance(headers, dict) else None
    if isinstance(eta, str):
        try:
            when = dt.datetime.fromisoformat(eta)
        except ValueError:
            return None
    elif isinstance(eta, dt.datetime):
        when = eta
    else:
        return None
    return None if when.tzinfo is None else when


def clear_due_eta(message: dict[str, Any], now: dt.datetime | None = None) -> bool:
    """Clear the ``eta`` header of a message the broker held until it (True if it did).

    The broker delivers a message with a usable eta no earlier than that eta (its
    ``delay``), so when the worker gets it the task is due.  Celery's worker would
    still hand every task with an eta to its timer, which - while it has anything
    else scheduled (the worker's heartbeat, every 2 s) - sleeps up to
    ``worker_timer_precision`` (1 s) without looking: a countdown of 1 s started
    after up to 2 s.  Without the eta the worker runs the task as it receives it.
    An eta still ahead (a clock stepped back) or naive is left for the worker to hold.
    """
    when = _aware_eta(message)
    if when is None or when > (now or dt.datetime.now(dt.UTC)):
        return False
    message["headers"]["eta"] = None
    return True


def eta_delay(message: dict[str, Any], now: dt.datetime | None = None) -> float | None:
    """Return the seconds until the message's ``eta`` header, if it is in the future.

    Celery (task protocol 2) puts ``apply_async(countdown=/eta=)`` and
    ``retry(countdown=)`` into the header ``eta`` as an ISO 8601 time.  Only a time
    with a UTC offset is used (Celery writes those): a naive one's time zone is the
    app's, which the broker does not know, and guessing wrong would deliver the task
    hours late.  Without a usable eta the message is delivered at once and the worker
    holds it until its eta, as Celery does with every broker.
    """
    when = _aware_eta(message)
    if when is None:
        return None
    now = now or dt.datetime.now(dt.UTC)
    seconds = (when - now).total_seconds()
    if seconds <= 0:
        return None
    return min(seconds, _MAX_DELAY_SECONDS)
