"""The ``with`` protocol of everything that has a ``close()``."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Closing"]


class Closing:
    """``with thing:`` returns ``thing`` and closes it on the way out, error or not.

    For classes whose ``close()`` is idempotent and releases what they hold (a queue,
    a sharded queue, a follower); they define ``close``, this adds the rest.
    """

    __slots__ = ()

    def close(self) -> None:
        """Release what this holds (subclasses define it)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
