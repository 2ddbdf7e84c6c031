"""``ledgerq.open``: the one way in."""

from __future__ import annotations

import os
from typing import Any

from ledgerq._options import Options
from ledgerq._queue import Queue, open_queue

__all__ = ["open"]


def open(  # noqa: A001 - the stdlib-like verb is the point
    path: str | os.PathLike[str], options: Options | None = None, **kwargs: Any
) -> Queue:
    """Open (creating if missing) the queue in directory ``path``.

    Options come as an :class:`Options` object, as keyword arguments, or both
    (keywords override).  Raises ``TypeError`` for an unknown option,
    :class:`ConfigError` for an invalid value, :class:`QueueLockedError` if the
    queue is already open (in this or another process), :class:`NotAQueueError`
    if ``path`` holds something else.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return open_queue(path, Options.from_kwargs(options, kwargs))
