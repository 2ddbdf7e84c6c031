"""Sleeping on a 32-bit word of shared memory until another process changes it.

A waiter for a lock word (``segment.steplock``) that spun without getting it sleeps
here.  On Linux that is the kernel's ``futex(FUTEX_WAIT)`` on the word's address, the
primitive every mutex of the platform is made of: the sleeper costs no CPU and the
releaser's ``futex(FUTEX_WAKE)`` wakes it at once, across processes (the futex is not
``FUTEX_PRIVATE``: the word lives in a ``MAP_SHARED`` mapping, which the kernel keys by
file and offset, so every process's mapping of ``shared/state`` is the same futex).
Elsewhere :func:`wait` sleeps a little instead (growing from 50 us to 2 ms) and
:func:`wake` does nothing: slower hand-offs, the same correctness - the waiter looks at
the word again after every sleep.

Called through ``ctypes`` (which releases the GIL), only on the slow path: a lock taken
without contention never gets here.
"""

from __future__ import annotations

import ctypes
import os
import platform
import time

__all__ = ["HAS_FUTEX", "wait", "wake"]

_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
# syscall numbers of futex(2) by machine (the generic table: aarch64, riscv64, ...).
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98, "riscv64": 98, "i686": 240}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load() -> tuple[object, int] | None:
    if platform.system() != "Linux" or os.environ.get("LEDGERQ_NO_FUTEX"):
        return None
    number = _SYS_FUTEX.get(platform.machine())
    if number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    return syscall, number


_FUTEX = _load()
HAS_FUTEX = _FUTEX is not None


def wait(address: int, expected: int, timeout_s: float, backoff: list[float]) -> None:
    """Sleep while the u32 at ``address`` holds ``expected``, at most ``timeout_s``.

    May return early (a wake-up, a signal, a spurious return): the caller looks again.
    ``backoff`` is the caller's one-element list holding its current sleep where there
    is no futex (it grows at each call).
    """
    if timeout_s <= 0:
        return
    if _FUTEX is None:
        pause = min(backoff[0], timeout_s)
        backoff[0] = min(backoff[0] * 2, 0.002)
        time.sleep(pause)
        return
    syscall, number = _FUTEX
    whole = int(timeout_s)
    spec = _Timespec(whole, int((timeout_s - whole) * 1e9))
    syscall(  # type: ignore[operator]
        number,
        ctypes.c_void_p(address),
        _FUTEX_WAIT,
        ctypes.c_uint32(expected),
        ctypes.byref(spec),
        None,
        0,
    )


def wake(address: int, count: int = 1) -> None:
    """Wake up to ``count`` sleepers of the u32 at ``address`` (nothing without a futex)."""
    if _FUTEX is None:
        return
    syscall, number = _FUTEX
    syscall(number, ctypes.c_void_p(address), _FUTEX_WAKE, count, None, None, 0)  # type: ignore[operator]
