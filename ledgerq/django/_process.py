"""Which process ran an attempt, and whether it still lives.

A worker id (``TaskResult.worker_ids``) is ``host:ns:pid:start``: the host name, the
process's PID namespace (the inode of ``/proc/self/ns/pid``: a container of the same host
name may see other pids), the process id and the process's start time in clock ticks
since boot (``/proc/<pid>/stat``, field 22).  With the start time, a process id the
kernel handed out again is not taken for the process that ran the attempt; where
``/proc`` is missing, the namespace and the start are 0 and only the id is checked.
A reader of a result marked ``RUNNING`` asks :func:`is_gone` about its last worker: a
task whose process is gone is not running, whatever the database says (it is delivered
again, or it went to the dead-letter queue).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket

__all__ = ["die_with_parent", "is_gone", "worker_id"]

_MAX_WORKER_ID = 64  # what Django allows a worker id
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_mine: tuple[int, str] | None = None


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces and parentheses: cut at the last.
    return data[data.rfind(b")") + 2 :].decode("ascii", "replace").split()


def _start_ticks(pid: int) -> int:
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return 0
    return int(fields[19])  # field 22 of the whole line: starttime


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def worker_id() -> str:
    """This process's worker id (computed once per process)."""
    global _mine
    pid = os.getpid()
    if _mine is None or _mine[0] != pid:
        tail = f":{_pid_namespace()}:{pid}:{_start_ticks(pid)}"
        host = socket.gethostname()[: _MAX_WORKER_ID - len(tail)]
        _mine = (pid, host + tail)
    return _mine[1]


def is_gone(worker: str) -> bool:
    """Whether the process of ``worker`` (a worker id) has ended.

    False when it may live, and for an id of another host, another PID namespace or
    another form: only the processes this one can see are looked at.
    """
    parts = worker.rsplit(":", 3)
    if len(parts) != 4 or not all(part.isdigit() for part in parts[1:]):
        return False
    host, ns_text, pid_text, start_text = parts
    if host != socket.gethostname()[: len(host)] or not host:
        return False
    if int(ns_text) != _pid_namespace():
        return False
    pid, start = int(pid_text), int(start_text)
    fields = _stat_fields(pid)
    if fields is None:
        if os.path.isdir("/proc/self"):
            return True  # no such process
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    if fields[0] in ("Z", "X"):  # exited, not yet reaped by its parent
        return True
    return start != 0 and len(fields) >= 20 and int(fields[19]) != start


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` (its parent's pid) dies
    (Linux; elsewhere only the check below).  A pool under the ``ledgerq_worker``
    process goes with it, even on kill -9."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the signal was armed
