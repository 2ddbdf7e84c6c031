"""How a queue's callers wait and are woken: the one object readers share with the queue.

A :class:`~ledgerq.core.reader_handle.Reader` blocks in ``dequeue`` until a message is
available; an enqueue into a bounded queue blocks until there is room.  What they need
for it - the queue's lock and condition, how many are waiting (so that the appends and
acks wake only when somebody waits), the listeners of ``ledgerq.aio`` and the pools,
the queue's clock, a periodic job's next tick, and shared mode's last look before a
sleep - is here, owned by the queue and handed to each reader, so that a reader does
not reach into the queue's insides for it.

Everything is read and changed with :attr:`lock` held, but for :attr:`timer_ns` (one
word, read without the lock on the dequeue fast path: a stale value at worst fires a
tick a call later) and the clock (set once, at open).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ledgerq.core.clock import QueueClock

__all__ = ["Waits"]


def _never_look_again() -> bool:
    return False


def _no_timer() -> None:
    pass


class Waits:
    """The queue's lock, its waiters and wakers, and the times they wait for."""

    __slots__ = (
        "_next_listener",
        "clock",
        "cond",
        "fire_timer",
        "listeners",
        "lock",
        "monotonic_ns",
        "offset_ns",
        "prepare_wait",
        "room_waiting",
        "timer_ns",
        "waiting",
    )

    def __init__(self) -> None:
        self._new_lock()
        # Before a dequeue sleeps (lock held): True if it must look once more.  An
        # exclusive queue learns of every change through its own lock; a shared handle
        # starts watching the other processes' writes there (SharedQueueCore).
        self.prepare_wait: Callable[[], bool] = _never_look_again
        # A periodic job's next tick (queue time, ns; None: no job), and what fires it
        # (no lock held: it appends).  Kept by the Timer feature (core/feature.py).
        self.timer_ns: int | None = None
        self.fire_timer: Callable[[], None] = _no_timer

    def _new_lock(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.waiting = 0  # dequeues (and enqueues waiting for room) in cond.wait
        self.room_waiting = 0  # enqueues waiting for room in a bounded queue (also in waiting)
        self.listeners: dict[int, Callable[[], None]] = {}  # ledgerq.aio's and the pools'
        self._next_listener = 0

    def start_clock(self, clock: QueueClock) -> None:
        """The queue's clock, once it is started (at open).  The hot paths add the two
        inline: queue time = ``offset_ns + monotonic_ns()``."""
        self.clock = clock
        self.offset_ns = clock.offset_ns
        self.monotonic_ns = clock.monotonic_ns

    def after_fork(self) -> None:
        """In a forked child: a new lock (a thread of the parent may have held the old one
        at the fork, and it does not exist here to release it), nobody waiting."""
        self._new_lock()

    def wake(self) -> None:
        """Messages may have become available (or the queue closed): wake every waiter
        (lock held)."""
        self.cond.notify_all()
        for callback in list(self.listeners.values()):
            callback()

    def room_made(self) -> None:
        """Messages left the backlog (lock held): wake the enqueues waiting for room."""
        if self.room_waiting:
            self.wake()

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` at every :meth:`wake`; return a remover (takes the lock)."""
        with self.lock:
            key = self._next_listener
            self._next_listener += 1
            self.listeners[key] = callback

        def remove() -> None:
            with self.lock:
                self.listeners.pop(key, None)

        return remove

    def add_room_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """:meth:`add_listener` for a waiter of room: counted in :attr:`room_waiting`, so
        that messages leaving the backlog wake it too."""
        remove = self.add_listener(callback)
        with self.lock:
            self.room_waiting += 1
        removed = False

        def remove_room() -> None:
            nonlocal removed
            with self.lock:
                if removed:
                    return
                removed = True
                self.room_waiting -= 1
            remove()

        return remove_room
