"""``ledgerq.open``: the one way in."""

from __future__ import annotations

import os
from typing import Unpack

from ledgerq._options import OpenOptions, Options
from ledgerq._queue import Queue, open_configured
from ledgerq.segment.meta import stored_options

__all__ = ["open"]


def open(  # noqa: A001 - the stdlib-like verb is the point
    path: str | os.PathLike[str],
    options: Options | None = None,
    *,
    remember_options: bool = True,
    **kwargs: Unpack[OpenOptions],
) -> Queue:
    """Open (creating if missing) the queue in directory ``path``.

    Options come as an :class:`Options` object, as keyword arguments (their names and
    types are :class:`OpenOptions`, which type checkers read), or both (keywords
    override).  A queue remembers the options it was opened with: options
    not given as keywords (and no ``Options`` object) keep their stored values, so
    ``ledgerq.open(path)`` reopens a queue as it was configured.  With
    ``remember_options=False`` the options are used while this handle is open and
    not stored: the queue keeps the options it had stored (none, for a new queue),
    as a tool that overrides an option for one run needs.

    Raises ``TypeError`` for an unknown option, :class:`ConfigError` for an invalid
    value, :class:`QueueLockedError` if the queue is already open (in this or another
    process), :class:`NotAQueueError` if ``path`` holds something else.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    if not isinstance(remember_options, bool):
        raise TypeError(f"remember_options must be a bool, got {type(remember_options).__name__}")
    stored = stored_options(os.fspath(path)) if os.path.isdir(path) else {}
    return open_configured(
        path, Options.from_kwargs(options, kwargs, stored), remember_options=remember_options
    )
