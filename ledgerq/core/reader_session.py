"""One shared-mode reader's steps: entering (lock, catch up) and leaving (publish, unlock).

Every decision of a shared reader - a dequeue, an ack, ``len`` - is a *step* (see
``core.shared_reader``): take the reader's step lock, bring the log's view and the
in-memory state up to date with what the other handles wrote, decide and append, then
publish the journal's length and release the lock.  :class:`ReaderSession` owns that
entry and exit, so the reader's methods only decide: ``with session:`` around the part
that needs it, or :func:`in_step` around a whole method.

Steps nest: a step entered inside another (``ack`` checking each lease, ``close``
publishing the head) only counts the depth; the outermost one locks and publishes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from ledgerq._errors import QueueClosedError
from ledgerq.core.journal import ReaderRemovedError, SharedReaderJournal
from ledgerq.segment.journal_fold import StateRecord
from ledgerq.segment.shared_manager import SharedSegmentManager
from ledgerq.segment.steplock import StepLock

__all__ = ["NO_SESSION", "NoSession", "ReaderSession", "in_step"]


class ReaderSession:
    """Enters and leaves the steps of reader ``name`` for one shared handle.

    ``step`` is the reader's step lock, ``journal`` this handle's view of the reader's
    journal, ``manager`` the log's (refreshed on entry), ``catch_up`` what folds the
    records the other handles appended since this handle's last step into its state.
    Usable as a context manager (``with session:``), re-entrant in one thread (the
    caller serialises its threads: the queue's lock).
    """

    __slots__ = ("_catch_up", "_depth", "_journal", "_manager", "_step", "name")

    def __init__(
        self,
        name: str,
        step: StepLock,
        journal: SharedReaderJournal,
        manager: SharedSegmentManager,
        catch_up: Callable[[list[StateRecord]], None],
    ) -> None:
        self.name = name
        self._step = step
        self._journal = journal
        self._manager = manager
        self._catch_up = catch_up
        self._depth = 0

    @property
    def is_held(self) -> bool:
        """Whether this handle is inside a step of the reader."""
        return self._depth > 0

    def enter(self) -> None:
        """Begin a step: take the lock, refresh the log's view, catch up.

        Raises :class:`QueueClosedError` when another handle removed the reader, and
        whatever the lock or the catch-up raised (the lock released then: not held).
        """
        if self._depth:
            self._depth += 1
            return
        step = self._step
        repair = step.acquire()
        self._depth = 1
        try:
            self._manager.refresh()
            news = self._journal.changes(repair=repair)
            if news is not None and news[0]:
                self._catch_up(news[0])
        except BaseException as exc:
            self._depth = 0
            if repair:
                step.mark_suspect()  # not repaired: the next holder tries again
            step.release()
            if isinstance(exc, ReaderRemovedError):
                raise QueueClosedError(
                    f"reader {self.name!r} was removed (remove_reader) by another handle"
                ) from None
            raise

    def enter_to_load(self) -> bool:
        """Begin the step that loads the journal (opening the reader): the lock only.

        The load reads the whole file, which is also the repair a holder that died
        mid-step calls for; nothing is caught up (nothing is loaded yet).  Returns
        whether it was such a repair: the dead holder may have replaced the file
        without publishing so, and the others must then be told (a new generation).
        """
        repair = self._step.acquire()
        self._depth = 1
        return repair

    def leave(self, *_exc: object) -> None:
        """End a step: the outermost publishes the journal's length and unlocks.

        (Takes and ignores ``__exit__``'s arguments: it is the context manager's exit,
        one call on the hot path.)
        """
        self._depth -= 1
        if not self._depth:
            if self._journal.publish():
                self._step.mark_suspect()  # a failed write's fragment: the next one cuts it
            self._step.release()

    __enter__ = enter
    __exit__ = leave


class NoSession:
    """The steps of a reader no other handle shares (exclusive mode): nothing to take,
    catch up or publish - the uncontended case of :class:`ReaderSession`."""

    __slots__ = ()

    is_held = False

    def enter(self) -> None:
        pass

    def leave(self, *_exc: object) -> None:
        pass

    __enter__ = enter
    __exit__ = leave


NO_SESSION = NoSession()


class _InSession(Protocol):
    @property
    def session(self) -> ReaderSession: ...


_Owner = TypeVar("_Owner", bound=_InSession)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def in_step(method: Callable[Concatenate[_Owner, _P], _R]) -> Callable[Concatenate[_Owner, _P], _R]:
    """Make ``method`` (of an object with a ``session``) run as one step of it."""

    @functools.wraps(method)
    def step(self: _Owner, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        session = self.session
        session.enter()
        try:
            return method(self, *args, **kwargs)
        finally:
            session.leave()

    return step
