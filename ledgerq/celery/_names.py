"""Broker URLs and kombu names as paths: what may become a directory, and what may not.

A broker is one directory (``ledgerq:///abs/dir``); each kombu queue is the ledgerq queue
``dir/queues/<name>`` and each exchange's bindings the file ``dir/exchanges/<name>.json``.
A name becomes one path component as it is, so that ``ledgerq stats dir/queues/celery``
finds the queue Celery uses: names that cannot be one component (``/``, ``..``, NUL,
longer than a file name may be) are refused with an error that says why, before
anything is created.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from ledgerq import LedgerQError

__all__ = ["BrokerURLError", "InvalidNameError", "broker_root", "check_name"]

SCHEME = "ledgerq"
# The longest file name Linux (and most file systems) take, in bytes; the exchange
# table adds ".json" and a temporary copy "..tmp-<pid>" (NAME_MAX counts the longest).
_NAME_MAX_BYTES = 255 - len(".json.tmp-4194304")


class BrokerURLError(LedgerQError, ValueError):
    """A broker URL that does not name a directory by its absolute path."""


class InvalidNameError(LedgerQError, ValueError):
    """A kombu queue or exchange name that cannot be a directory or file name."""


def broker_root(url: str) -> str:
    """Return the directory a ``ledgerq:///abs/dir`` URL names.

    Raises :class:`BrokerURLError` naming the URL when it has a host part
    (``ledgerq://dir`` - two slashes make ``dir`` a host), a relative or empty path,
    or a query (transport options go in ``broker_transport_options``).
    """
    parts = urlsplit(url)
    fix = "write ledgerq:///absolute/path/to/dir (three slashes, then the absolute path)"
    if parts.scheme != SCHEME:
        raise BrokerURLError(f"not a ledgerq broker URL: {url!r} ({fix})")
    if parts.netloc not in ("", "localhost"):
        raise BrokerURLError(
            f"broker URL {url!r} has the host part {parts.netloc!r}, not an absolute path: "
            f"the broker is a local directory ({fix})"
        )
    if parts.query or parts.fragment:
        raise BrokerURLError(
            f"broker URL {url!r} has a query: the transport's options go in Celery's "
            "broker_transport_options (docs/celery.md)"
        )
    path = unquote(parts.path)
    if not path or not os.path.isabs(path):
        raise BrokerURLError(f"broker URL {url!r} does not name an absolute path ({fix})")
    if "\0" in path:
        raise BrokerURLError(f"broker URL {url!r} holds a NUL character")
    return os.path.normpath(path)


def check_name(kind: str, name: object) -> str:
    """Return ``name`` if it can be one path component; else raise :class:`InvalidNameError`.

    ``kind`` ("queue", "exchange") goes into the message.
    """
    if not isinstance(name, str) or not name:
        raise InvalidNameError(f"kombu {kind} name {name!r} is not a non-empty str")
    problem = None
    if name in (".", ".."):
        problem = "is a relative directory"
    elif "/" in name or "\\" in name:
        problem = "holds a path separator"
    elif "\0" in name:
        problem = "holds a NUL character"
    elif name.startswith("."):
        problem = "starts with '.' (hidden, and the broker's own temporary files do)"
    else:
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            problem = "is not valid unicode"
        else:
            if size > _NAME_MAX_BYTES:
                problem = f"is {size} bytes long (at most {_NAME_MAX_BYTES} in UTF-8)"
    if problem is not None:
        raise InvalidNameError(
            f"kombu {kind} name {name!r} {problem}: with the ledgerq transport each {kind} "
            "is a file or directory named after it; choose a name without '/' that is "
            "not '.' or '..'"
        )
    return name
