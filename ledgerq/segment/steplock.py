"""The locks of shared mode's steps: lock words in the state page, or flock files.

A shared-mode handle holds a lock for one *step* at a time - an append (the append
lock), a reader's catch-up, choice and record (that reader's lock) - for microseconds.
Two implementations, one interface (:class:`StepLock`); the session's first handle
picks one for every handle (the page's ``locking`` slot) and later handles follow it,
since the two do not exclude each other:

* :class:`WordLock` (``LOCKING_WORDS``): a *lock block* of the mapped page
  (``format.shared_state``) taken by compare-and-swap of its owner word from 0 to the
  handle's id (``atomicshm``: one atomic instruction, no system call), released by a
  store of 0.  A waiter spins a little, naps a little (the holder runs on), then
  sleeps on the block's sequence word (``segment.futex``), which a release bumps -
  and wakes a sleeper with - when the block counts waiters.  An owner that dies
  holding the word cannot release it: a waiter looks at the owner every so often
  and takes the word over (compare-and-swap from the dead owner's id to its own) once
  the owner is *provably* dead - its process gone, a zombie, or its pid reused by a
  process with another start time (:class:`Liveness`).  A live owner is never taken
  over (it would resume and write): a stopped one (SIGSTOP, a debugger) makes waiters
  wait until their deadline, then raise :class:`~ledgerq.QueueBusyError` naming it.
* :class:`FileStepLock` (``LOCKING_FLOCK``, where ``atomicshm`` cannot be imported):
  ``flock`` of the lock's file in ``shared/``, which the kernel releases when its
  process dies.  Polled with ``LOCK_NB`` (backing off from 20 us to 1 ms), so that a
  wait is bounded too; the page's lock block records the owner (plain stores under
  the lock) so that a waiter can name it and the next holder can tell that the last
  one did not release it cleanly.

Either way :meth:`StepLock.acquire` returns True when the holder before did not end its
step cleanly (it died, or released the lock as ``LOCK_SUSPECT`` because it could not
cut back a failed write): the new holder then repairs what a step of that lock can leave half
done, as after a crash (the append lock: the ``writing`` word's tail recovery; a
reader's lock: bytes of its journal past the published length are cut).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Protocol

from ledgerq._errors import QueueBusyError
from ledgerq.format.shared_state import (
    LOCK_OWNER,
    LOCK_SEQUENCE,
    LOCK_SUSPECT,
    LOCK_WAITERS,
)
from ledgerq.segment import futex
from ledgerq.segment.files import StorageError
from ledgerq.segment.lock import LockFile
from ledgerq.segment.shared_page import HAS_ATOMICS

__all__ = [
    "Alone",
    "Budget",
    "FileStepLock",
    "Liveness",
    "StepLock",
    "WordLock",
    "decode_liveness",
    "encode_liveness",
    "process_start_time",
    "wants_lock_words",
]

_U64 = struct.Struct("<Q")
_SPINS = 48  # compare-and-swap tries (yielding the CPU now and then) before sleeping
_LOOK_AT_OWNER_S = 0.05  # a sleeping waiter checks the owner's liveness this often ...
_LOOK_AGAIN_S = 0.2  # ... and then this often
# A waiter that spun in vain naps (50 us doubling to 1 ms) for up to 50 ms before it
# counts itself in and sleeps on the futex.  Measured (benchmarks/consumer_scaling.py,
# docs/benchmarks.md): woken by every release, waiters took the word in turns with its
# holder, so every step caught up with another process's records and paid a context
# switch - 2, 4 and 8 consumer processes drained at 20k, 11k and 7k messages/s, below
# the flock design's 41k, 26k and 14k; napping lets the holder run on through several
# steps (as a kernel mutex lets a running thread barge in): 49k, 28k and 15k.  The
# futex remains for long waits (a holder in an fsync, or stopped).
_NAP_S = (50e-6, 1e-3)
_NAP_BEFORE_SLEEP_S = 0.05
_FLOCK_BACKOFF_S = (20e-6, 1e-3)
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def wants_lock_words() -> bool:
    """Whether a session started now locks with lock words: where ``atomicshm`` can be
    imported, unless ``LEDGERQ_LOCKING=flock`` asks for the flock files (the test
    suite runs the shared-mode suites both ways)."""
    return HAS_ATOMICS and os.environ.get("LEDGERQ_LOCKING", "") != "flock"


class Budget:
    """How long a handle's current call may wait for a lock: ``lock_timeout`` from now,
    or less when the call has a timeout of its own (:meth:`limit`).

    One per handle; the limit a call sets is its thread's (a thread's call may wait on
    the handle's condition while another thread's call runs).
    """

    __slots__ = ("_calls", "lock_timeout")

    def __init__(self, lock_timeout: float) -> None:
        self.lock_timeout = lock_timeout
        self._calls = threading.local()

    def deadline(self) -> float:
        """The ``time.monotonic()`` by which a wait must give up."""
        limit = time.monotonic() + self.lock_timeout
        until = getattr(self._calls, "until", None)
        return limit if until is None or until > limit else until

    def limit(self, until: float | None) -> float | None:
        """Make this thread's waits give up by ``until`` too (None: lock_timeout only);
        return the limit before, for the caller to restore."""
        calls = self._calls
        before = getattr(calls, "until", None)
        calls.until = until
        return before


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc``), None where the
    system does not say; -1 for a process that is gone or a zombie (dead, not reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return -1 if os.path.isdir("/proc/self") else None
    except OSError:
        return None
    # "pid (comm) state ppid ... starttime(22nd field)": comm may hold spaces and ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return -1
    return int(fields[19])


def encode_liveness() -> bytes:
    """What a handle's ``.live`` file says of it: this process's pid and start time."""
    pid = os.getpid()
    started = process_start_time(pid)
    return f"{pid} {started if started is not None and started >= 0 else '-'}\n".encode()


def decode_liveness(data: bytes) -> tuple[int, int | None] | None:
    """``(pid, start time or None)`` from a ``.live`` file's bytes; None if unreadable
    (being written: the handle creating it holds no lock word yet)."""
    try:
        pid_text, started_text = data.decode().split()
        return int(pid_text), None if started_text == "-" else int(started_text)
    except ValueError:
        return None


class Liveness:
    """Whether a handle, known by its id, is alive: what a waiter asks before taking a
    lock over.

    ``describe(handle_id)`` returns the handle's ``(pid, start_time)`` as its liveness
    file recorded them when it opened, ``(0, None)`` when the file says nothing (a full
    disk took no bytes), None when there is no file (the handle is gone: it released
    its locks before removing it, or it died and its file was cleaned up).
    ``probe(handle_id)`` is True when the file's ``flock`` could be taken - its holder
    is dead, since the kernel drops it with the process.
    """

    def __init__(
        self,
        describe: Callable[[int], tuple[int, int | None] | None],
        probe: Callable[[int], bool],
    ) -> None:
        self._describe = describe
        self._probe = probe
        self._known: dict[int, tuple[int, int | None]] = {}

    def _record(self, handle_id: int) -> tuple[int, int | None] | None:
        known = self._known.get(handle_id)
        if known is None:
            known = self._describe(handle_id)
            if known is not None and known[0]:
                self._known[handle_id] = known  # (what a file says never changes)
        return known

    def pid_of(self, handle_id: int) -> int | None:
        """The process of ``handle_id`` (None: no record of it)."""
        known = self._record(handle_id)
        return known[0] or None if known is not None else None

    def is_dead(self, handle_id: int) -> bool:
        """True only when the handle is provably dead: no liveness file (it closed - and
        released its locks first - or it died and was cleaned up), its process gone or a
        zombie, its pid reused by a process that started at another time, or - when the
        file says nothing - its file's flock free."""
        known = self._record(handle_id)
        if known is None:
            return True
        pid, started = known
        if not pid:
            return self._probe(handle_id)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # another user's process: alive
        now_started = process_start_time(pid)
        if now_started == -1:
            return True
        return started is not None and now_started is not None and now_started != started


class StepLock(Protocol):
    """A lock held for one step of a shared-mode handle (see the module)."""

    what: str  # for errors: "the append lock", "reader 'default'"

    def acquire(self) -> bool:
        """Wait for the lock (up to the handle's budget) and take it; True when the
        holder before did not end cleanly (repair what it may have left).

        Raises :class:`~ledgerq.QueueBusyError` when the budget runs out first.
        """
        ...

    def release(self) -> None:
        """Release the lock (held by this handle)."""
        ...

    def mark_suspect(self) -> None:
        """The guarded file may hold bytes past its published length (a failed write
        could not be cut back): the release leaves the lock ``LOCK_SUSPECT``, so that the
        next holder cuts them (lock held)."""
        ...

    def close(self) -> None:
        """Let go of what this object holds open (not the lock: release it first)."""
        ...


class LockHolder:
    """The handle a step lock is taken for: its id (the owner word's value), the queue's
    path (for errors), its call's wait :class:`Budget` and how it tells that another
    holder is dead (:class:`Liveness`).  One per handle, shared by all its locks."""

    __slots__ = ("budget", "handle_id", "liveness", "path")

    def __init__(self, handle_id: int, path: str, budget: Budget, liveness: Liveness) -> None:
        self.handle_id = handle_id
        self.path = path
        self.budget = budget
        self.liveness = liveness


class _HeldForAHandle:
    """What both kinds of step lock keep of their :class:`LockHolder`, bound to slots of
    their own for the acquire path, and the suspect mark their release leaves."""

    __slots__ = ("_alive", "_budget", "_leave_as", "_me", "_path", "what")

    def __init__(self, holder: LockHolder, what: str) -> None:
        self._me = holder.handle_id
        self._path = holder.path
        self._budget = holder.budget
        self._alive = holder.liveness
        self.what = what
        self._leave_as = 0

    def mark_suspect(self) -> None:
        self._leave_as = LOCK_SUSPECT

    def _busy(self, holder: int, waited: float) -> QueueBusyError:
        """The error of a wait that ran out of budget while ``holder`` held the lock."""
        pid = self._alive.pid_of(holder)
        by = f"process {pid} (handle {holder:016x})" if pid else f"handle {holder:016x}"
        return QueueBusyError(
            f"{self._path}: {self.what} is held by {by}, which did not release it in "
            f"{waited:.1f} s - it is stopped (SIGSTOP, Ctrl-Z, a debugger) or very slow, "
            "and a live process's step is never taken over; nothing was done. Resume or "
            "end that process, or open the queue with a larger lock_timeout",
            holder_pid=pid,
            held=self.what,
        )


class Alone:
    """The lock of a handle no other handle can be beside (the first of a session, while
    it recovers the queue under the exclusive lock): nothing to take."""

    what = "no lock"

    def acquire(self) -> bool:
        return False

    def release(self) -> None:
        pass

    def mark_suspect(self) -> None:
        pass

    def close(self) -> None:
        pass


class WordLock(_HeldForAHandle):
    """A lock block of the state page, taken by compare-and-swap (see the module).

    ``view`` is the page's ``atomicshm.AtomicView``, ``offset`` the block's, ``address``
    the page's address in this process (the futex); the owner word holds the
    ``holder``'s handle id (non-zero) while it has the lock.
    """

    __slots__ = ("_owner", "_seq", "_seq_address", "_waiters")

    def __init__(
        self, view: object, address: int, offset: int, holder: LockHolder, *, what: str
    ) -> None:
        super().__init__(holder, what)
        cell_u64 = view.cell_u64  # type: ignore[attr-defined]
        cell_u32 = view.cell_u32  # type: ignore[attr-defined]
        self._owner = cell_u64(offset + LOCK_OWNER)
        self._seq = cell_u32(offset + LOCK_SEQUENCE)
        self._waiters = cell_u32(offset + LOCK_WAITERS)
        self._seq_address = address + offset + LOCK_SEQUENCE

    def acquire(self) -> bool:
        holder = self._owner.cas(0, self._me)
        if holder == 0:
            return False
        return self._contended(holder)

    def _contended(self, holder: int) -> bool:
        owner, me = self._owner, self._me
        for spin in range(_SPINS):
            if holder == LOCK_SUSPECT and owner.cas(LOCK_SUSPECT, me) == LOCK_SUSPECT:
                return True
            holder = owner.load()
            if holder == 0 and (holder := owner.cas(0, me)) == 0:
                return False
            if spin & 7 == 7:
                os.sched_yield()  # let the holder (maybe on this CPU) run
        deadline = self._budget.deadline()
        started = time.monotonic()
        look_at = started + _LOOK_AT_OWNER_S
        nap_until = started + _NAP_BEFORE_SLEEP_S
        nap = [_NAP_S[0]]
        backoff = [50e-6]
        counted = False  # in the waiter count, which makes every release wake us
        try:
            while True:
                sequence = self._seq.load()
                holder = owner.cas(0, me)
                if holder == 0:
                    return False
                if holder == LOCK_SUSPECT and owner.cas(LOCK_SUSPECT, me) == LOCK_SUSPECT:
                    return True
                assert holder != me, "a handle took its own step lock twice"
                now = time.monotonic()
                if now >= look_at:
                    if self._alive.is_dead(holder) and owner.cas(holder, me) == holder:
                        return True  # taken over: repair what the dead holder left
                    look_at = now + _LOOK_AGAIN_S
                if now >= deadline:
                    raise self._busy(holder, now - started)
                if now < nap_until:
                    # Short naps first, uncounted: the holder goes on without waking
                    # anyone and takes the word again for its next step (see _NAP_S).
                    time.sleep(min(nap[0], nap_until - now, deadline - now))
                    nap[0] = min(nap[0] * 2, _NAP_S[1])
                    continue
                if not counted:
                    self._waiters.fetch_add(1)
                    counted = True
                    continue  # look again: a release before the count did not wake us
                futex.wait(self._seq_address, sequence, min(look_at, deadline) - now, backoff)
        finally:
            if counted:
                self._waiters.fetch_sub(1)

    def release(self) -> None:
        leave_as, self._leave_as = self._leave_as, 0
        self._owner.store(leave_as)
        if self._waiters.load():
            self._seq.fetch_add(1)
            futex.wake(self._seq_address)

    def close(self) -> None:
        pass


class FileStepLock(_HeldForAHandle):
    """``flock`` of a file in ``shared/``, polled up to the budget (see the module).

    ``memory`` and ``offset`` locate the lock's block in the page, where the owner is
    recorded (plain stores: only the holder writes them).
    """

    __slots__ = ("_file", "_memory", "_offset")

    def __init__(
        self, lock_file: LockFile, memory: object, offset: int, holder: LockHolder, *, what: str
    ) -> None:
        super().__init__(holder, what)
        self._file = lock_file
        self._memory = memory
        self._offset = offset

    def acquire(self) -> bool:
        fd = self._file.fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in _BUSY:
                raise StorageError("lock", self._file.path, exc) from exc
            self._wait(fd)
        memory, at = self._memory, self._offset + LOCK_OWNER
        before = int(_U64.unpack_from(memory, at)[0])  # type: ignore[arg-type]
        _U64.pack_into(memory, at, self._me)  # type: ignore[arg-type]
        # An owner still recorded: the holder before died holding it (the kernel let go),
        # or released it LOCK_SUSPECT.
        return before != 0

    def _wait(self, fd: int) -> None:
        deadline = self._budget.deadline()
        started = time.monotonic()
        pause, longest = _FLOCK_BACKOFF_S
        while True:
            now = time.monotonic()
            if now >= deadline:
                at = self._offset + LOCK_OWNER
                holder = _U64.unpack_from(self._memory, at)[0]  # type: ignore[arg-type]
                raise self._busy(holder, now - started)
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, longest)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in _BUSY:
                    raise StorageError("lock", self._file.path, exc) from exc

    def release(self) -> None:
        leave_as, self._leave_as = self._leave_as, 0
        _U64.pack_into(self._memory, self._offset + LOCK_OWNER, leave_as)  # type: ignore[arg-type]
        self._file.release()

    def close(self) -> None:
        self._file.close()
