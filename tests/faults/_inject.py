"""Injecting ENOSPC and EIO at a chosen file-system call of a workload, and judging it.

A *site* is the ``nth`` call of one *family* of calls (``write``: write/writev/pwrite,
``fsync``: fsync/fdatasync, ``rename``: replace/rename, ``open``, ``truncate``,
``unlink``, ``mkdir``) made on the queue's files.  The workload is deterministic (a
seeded ``tests.torture._child.Workload`` with ``sync="always"`` or ``"never"``: no
background thread), so a dry run lists every site and a run with a fault at site *k*
meets exactly that call.  Three kinds of fault:

* ``once``: that one call fails; the disk is fine afterwards (a transient EIO);
* ``sticky``: that call and every later write-like call (write, fsync, creating open,
  mkdir, rename) fail until the fault is *cleared* (a full disk, a dying device);
* ``short``: a write writes half its bytes and returns the short count, and the next
  write-like call fails (how a disk that fills up mid-write behaves).

The fault never performs the failed call, except ``short`` (the half it wrote stays).

Judging a run: every operation either returns or raises a :class:`ledgerq.LedgerQError`
(a ``StorageError`` naming a file under the queue and carrying the injected errno when
it is an OS error); after the fault clears, a few more operations run (they may succeed
or refuse clearly); ``close()`` releases the lock even if it fails; the queue reopens;
and then nothing that was acknowledged is missing - every message whose enqueue
returned and whose ack did not return is in the main queue or the DLQ (an ack that
raised did not happen, unless an fsync failed after its write) - no acked message is
pending again, every message carries exactly the bytes it was enqueued with,
and a new enqueue gets an id above every id returned before.
"""

from __future__ import annotations

import errno as errno_codes
import json
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ledgerq
from tests.faults._reopen import reopen_and_check
from tests.faults._shim import FAMILIES, Interposer
from tests.torture._child import Workload
from tests.torture._payload import matches, mismatch, token_of

__all__ = [
    "ERRNOS",
    "KNOWN_BUGS",
    "MODES",
    "Fault",
    "FaultInjector",
    "FaultRun",
    "Partner",
    "all_faults",
    "classify",
    "list_sites",
    "run_with_fault",
    "sort_problems",
]

ERRNOS = {"ENOSPC": errno_codes.ENOSPC, "EIO": errno_codes.EIO}
MODES = ("once", "sticky", "short")
_STICKY = frozenset(("write", "fsync", "open", "mkdir", "rename"))
_EVERYTHING = 1_000_000


@dataclass(frozen=True)
class Fault:
    """Fail the ``nth`` call of ``family`` with ``errno`` (see the module docstring)."""

    family: str
    nth: int
    errno: int
    mode: str = "once"
    match: str = ""  # count only calls on paths ending with this

    def __str__(self) -> str:
        where = f"{self.family}#{self.nth}" + (f"[{self.match}]" if self.match else "")
        return f"{errno_codes.errorcode[self.errno]}@{where}/{self.mode}"


class FaultInjector(Interposer):
    """Count the calls of each family under ``root``; fail the one a :class:`Fault` names."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        fault: Fault | None = None,
        *,
        main_thread_only: bool = False,
    ) -> None:
        super().__init__(root)
        self.fault = fault
        # Shared mode: the housekeeper thread's calls (probing other handles' liveness
        # files) come when its timer says, so they would make the sites' numbering
        # differ from run to run: leave them alone, fault and count the caller's only.
        self.main_thread_only = main_thread_only
        self.counts: Counter[str] = Counter()
        # family, nth, function, path, whether it can need space (ENOSPC applies)
        self.sites: list[tuple[str, int, str, str, bool]] = []
        self.sites_in_phase_a = 0
        self.fired = 0
        self.fired_paths: list[str] = []
        self.fired_families: set[str] = set()
        self.matched = 0
        self.cleared = False
        self._failing = False  # a sticky or short fault is in force

    def arm(self, fault: Fault) -> None:
        """Start counting calls for ``fault`` now (install first, before the queue opens)."""
        self.fault = fault
        self.counts.clear()
        self.matched = 0
        self.cleared = False

    def clear(self) -> None:
        """The disk is fine again."""
        self.cleared = True
        self._failing = False

    def _raise(self, path: str, family: str) -> None:
        assert self.fault is not None
        self.fired += 1
        self.fired_paths.append(path)
        self.fired_families.add(family)
        code = self.fault.errno
        raise OSError(code, os.strerror(code), path)

    def around(self, name: str, path: str, call: Callable[[], Any], args: tuple[Any, ...]) -> Any:
        if self.main_thread_only and threading.current_thread() is not threading.main_thread():
            return call()
        family = FAMILIES[name]  # opens for reading are sites too (EIO)
        self.counts[family] += 1
        nth = self.counts[family]
        creating = family != "open" or bool(args[1] & os.O_CREAT)
        self.sites.append((family, nth, name, path, creating))
        fault = self.fault
        if fault is None or self.cleared:
            return call()
        if self._failing and family in _STICKY and creating:
            self._raise(path, family)
        if family != fault.family:
            return call()
        if fault.match:
            if not path.endswith(fault.match):
                return call()
            self.matched += 1
            nth = self.matched
        if nth != fault.nth:
            return call()
        if fault.errno == errno_codes.ENOSPC and not creating:
            return call()  # opening an existing file needs no space
        if fault.mode == "short" and family == "write":
            return self._short_write(name, args)
        if fault.mode in ("sticky", "short"):
            self._failing = True
        self._raise(path, family)
        return None  # pragma: no cover - _raise always raises

    def _short_write(self, name: str, args: tuple[Any, ...]) -> int:
        fd = args[0]
        data = b"".join(bytes(b) for b in args[1]) if name == "writev" else bytes(args[1])
        half = len(data) // 2
        self._failing = True
        self.fired += 1
        self.fired_paths.append(self.fds.get(fd, "?"))
        if half == 0:
            code = self.fault.errno if self.fault else errno_codes.ENOSPC
            raise OSError(code, os.strerror(code))
        if name == "pwrite":
            written: int = self.real["pwrite"](fd, data[:half], args[2])
        else:
            written = self.real["write"](fd, data[:half])
        return written


@dataclass
class FaultRun:
    """What happened in one run; ``problems`` lists every broken promise."""

    fault: Fault | None
    fired: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # exception type -> count
    usable_after: bool = True  # every operation after the fault cleared succeeded
    corrupt_skipped: int = 0
    problems: list[str] = field(default_factory=list)
    failed_in: set[str] = field(default_factory=set)  # ledgerq functions errors came from
    fired_paths: list[str] = field(default_factory=list)
    fired_families: set[str] = field(default_factory=set)  # of the calls that failed


class _Ledger:
    """The side log of the workload, reduced to what the checks need."""

    def __init__(self) -> None:
        self.returned: dict[int, int] = {}  # id -> token of every enqueue that returned
        self.acked: set[int] = set()
        self.acked_tokens: set[int] = set()
        self.ack_tried: set[int] = set()  # tokens whose ack was called (returned or not)
        self.dlq: dict[int, int] = {}
        self.tried: set[int] = set()  # tokens the workload tried to enqueue
        self.highest = 0
        self.problems: list[str] = []
        self.requeued: set[int] = set()
        self._op = ""

    def feed(self, text: str) -> None:
        for line in text.splitlines():
            kind, *rest = line.split(" ")
            if kind == "B":
                self._op = rest[0]
                if rest[0] == "ack":
                    self.ack_tried.add(self.returned.get(int(rest[1]), -1))
                if rest[0] == "enq":
                    self.tried.add(int(rest[1]))
                elif rest[0] == "batch":
                    first, n = int(rest[1]), int(rest[2])
                    self.tried.update(range(first, first + n))
            elif kind == "E" and rest[2] == "fresh":
                message_id, token = int(rest[0]), int(rest[1])
                if message_id <= self.highest:
                    self.problems.append(f"id {message_id} returned after {self.highest}")
                self.highest = max(self.highest, message_id)
                self.returned[message_id] = token
                if self._op == "requeue":
                    self.requeued.add(message_id)
            elif kind == "A":
                self.acked.add(int(rest[0]))
                self.acked_tokens.add(self.returned.get(int(rest[0]), -1))
            elif kind == "D":
                self.dlq[int(rest[0])] = int(rest[2])


def _workload_config(
    path: Path, options: dict[str, Any], seed: int, token_base: int
) -> dict[str, Any]:
    return {"path": str(path), "options": options, "seed": seed, "token_base": token_base}


def _judge_error(run: FaultRun, what: str, exc: BaseException, path: Path) -> None:
    run.errors[type(exc).__name__] += 1
    tb = exc.__traceback__
    frames: list[str] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if "/ledgerq/" in code.co_filename:
            run.failed_in.add(code.co_name)
            where = code.co_filename.rsplit("/ledgerq/", 1)[-1]
            frames.append(f"{where}:{tb.tb_lineno} {code.co_name}")
        tb = tb.tb_next
    innermost = " < ".join(reversed(frames[-5:]))
    if not isinstance(exc, ledgerq.LedgerQError):
        run.problems.append(
            f"{what} raised {type(exc).__name__} (not a LedgerQError) in {innermost}: {exc}"
        )
        return
    if isinstance(exc, OSError) and run.fault is not None:
        if exc.errno != run.fault.errno:
            run.problems.append(f"{what}: {type(exc).__name__} has errno {exc.errno}: {exc}")
        if str(path) not in str(exc):
            run.problems.append(f"{what}: {type(exc).__name__} names no queue file: {exc}")


class Partner:
    """A second process on the queue in shared mode (``_partner.py``), driven in step."""

    def __init__(self, stderr_path: Path) -> None:
        from tests._child import Child

        self.child = Child(["-m", "tests.faults._partner"], stderr_path=stderr_path)
        self.token = 5_000_000
        self.steps = 0

    def ask(self, command: str) -> str:
        self.child.send(command)
        return self.child.line()

    def step(self, run: FaultRun, ledger: _Ledger, when: str) -> None:
        """Enqueue one message and consume one on its own reader; it must not fail."""
        self.token += 1
        answer = self.ask(f"step {self.token}")
        if answer.startswith("X "):
            run.problems.append(f"the other process failed {when}: {answer[2:]}")
            return
        self.steps += 1
        _, message_id, token = answer.split()
        ledger.tried.add(int(token))
        ledger._op = "partner"
        ledger.feed(f"E {message_id} {token} fresh -")

    def close(self) -> None:
        self.child.close()


def run_with_fault(
    root: Path,
    fault: Fault | None,
    *,
    options: dict[str, Any],
    seed: int = 7,
    steps: int = 30,
    after: int = 6,
    partner: Partner | None = None,
) -> tuple[FaultRun, FaultInjector]:
    """Run the workload with ``fault``, clear it, go on, reopen, check (module docstring).

    Phase A (the sites): open, ``steps`` operations, close.  Three operations after the
    fault fired it is cleared, and the rest of phase A runs on the same queue object.
    Phase B: reopen, ``after`` operations, close - all must succeed.  Then the checks.

    With a ``partner`` (``options`` then open the queue shared), another process opens
    the queue after the workload and, after each of its operations, enqueues a message
    and consumes one on a reader of its own: every one of its calls must succeed,
    whatever the fault did to this process; it closes before phase B.
    """
    path = root / "q"
    run = FaultRun(fault)
    ledger = _Ledger()
    injector = FaultInjector(path, fault, main_thread_only=partner is not None)
    work: Workload | None = None
    fired_at: int | None = None
    with injector.installed():
        try:
            work = Workload(_workload_config(path, options, seed, 1_000_000), ledger.feed)
        except Exception as exc:
            _judge_error(run, "open", exc, path)
        if partner is not None:
            # (also after a failed open here: what it left must not stop the other)
            partner_options = {k: v for k, v in options.items() if k != "shared"}
            answer = partner.ask(f"open {path} {json.dumps(partner_options)}")
            if answer != "OPEN":
                run.problems.append(f"the other process could not open the queue: {answer}")
                partner = None
            elif work is None:
                partner.step(run, ledger, "after the failed open")
        for step in range(steps if work is not None else 0):
            if injector.fired and fired_at is None:
                fired_at = step
            if fired_at is not None and step >= fired_at + 3 and not injector.cleared:
                injector.clear()
            try:
                assert work is not None
                work.step()
            except Exception as exc:
                if injector.cleared:
                    run.usable_after = False
                _judge_error(run, f"step {step}", exc, path)
            if partner is not None:
                partner.step(run, ledger, f"after step {step} (fault fired: {injector.fired})")
        if partner is not None and (answer := partner.ask("close")) != "CLOSED":
            run.problems.append(f"the other process could not close the queue: {answer}")
        if work is not None:
            try:
                work.q.close()
            except Exception as exc:
                _judge_error(run, "close", exc, path)
        injector.sites_in_phase_a = len(injector.sites)
        injector.clear()
    run.fired = injector.fired
    run.fired_paths = list(injector.fired_paths)
    run.fired_families = set(injector.fired_families)
    try:
        work = Workload(_workload_config(path, options, seed + 1, 2_000_000), ledger.feed)
        for _ in range(after):
            work.step()
        work.q.close()
    except Exception as exc:
        run.problems.append(f"after the fault cleared, reopen and work failed: {exc!r}")
    run.problems.extend(ledger.problems)
    reopen_and_check(path, options, run.problems, lambda q: _check_contents(q, ledger, run))
    return run, injector


def _check_contents(q: ledgerq.Queue, ledger: _Ledger, run: FaultRun) -> None:
    if True:
        q._check()
        run.corrupt_skipped = q.stats().corrupt_skipped
        main = q.peek(_EVERYTHING)
        dlq = q.dlq.peek(_EVERYTHING)
        present: set[int] = set()
        for msg in main:
            token = token_of(msg.payload)
            present.add(token)
            if token not in ledger.tried:
                run.problems.append(f"message {msg.id} carries {token}, never enqueued")
            elif not matches(msg, token, moved=msg.expires_at is None):
                run.problems.append(f"message {msg.id} is served damaged: {mismatch(msg, token)}")
            if msg.id in ledger.acked:
                run.problems.append(f"acked message {msg.id} is pending again")
            if msg.id in ledger.returned and ledger.returned[msg.id] != token:
                run.problems.append(f"message {msg.id} carries {token}, returned with another")
        for msg in dlq:
            token = token_of(msg.payload)
            present.add(token)
            if not matches(msg, token, moved=True):
                run.problems.append(f"DLQ message {msg.id} is damaged: {mismatch(msg, token)}")
        # An ack that raised did not happen (issue 15 item 3) - except when an fsync
        # failed (the fault's own call, or one failed by a sticky or short fault after
        # it) with sync="always": the ACK reached the OS, its durability is unknown.
        done = ledger.acked_tokens
        if run.fault is not None and "fsync" in run.fired_families:
            done = done | ledger.ack_tried
        lost = sorted(set(ledger.returned.values()) - done - present)
        if lost:
            run.problems.append(f"acknowledged messages LOST (tokens): {lost[:8]}")
        new_id = q.enqueue(b"after the fault")
        highest = max([ledger.highest, *(m.id for m in main)])
        if new_id <= highest:
            run.problems.append(f"new id {new_id} is not above {highest} (reused)")


def list_sites(
    root: Path,
    *,
    options: dict[str, Any],
    seed: int = 7,
    steps: int = 30,
    partner: Partner | None = None,
) -> list[tuple[str, int, bool]]:
    """Every (family, nth, needs_space) site of the workload, from a dry run."""
    run, injector = run_with_fault(
        root, None, options=options, seed=seed, steps=steps, partner=partner
    )
    if run.problems or run.errors:
        raise AssertionError(f"the workload fails without a fault: {run.problems} {run.errors}")
    return [
        (family, nth, space)
        for family, nth, _, _, space in injector.sites[: injector.sites_in_phase_a]
    ]


# ---------------------------------------------------------------------- known bugs
#
# Each class here is a bug found by this sweep and not fixed yet, shown by its own
# xfail test in test_faults.py: problem text -> class name (a key of KNOWN_BUGS).  The
# sweep fails on any problem that is not one of them.  The five classes it found
# (docs/reliability.md, bugs 7-11) are fixed; none is open.

KNOWN_BUGS: dict[str, str] = {}


def classify(problem: str, run: FaultRun) -> str | None:
    """The known bug a problem of ``run`` is an instance of, or None if it is new."""
    return None


def sort_problems(run: FaultRun, label: str, known: Counter[str], unknown: list[str]) -> None:
    """Count each problem of ``run`` under the known bug it is an instance of in
    ``known``, or add it, after ``label``, to ``unknown``."""
    for problem in run.problems:
        bug = classify(problem, run)
        if bug is None:
            unknown.append(f"{label}: {problem}")
        else:
            known[bug] += 1


def all_faults(sites: list[tuple[str, int, bool]]) -> list[Fault]:
    """Every fault of every site: both errnos (ENOSPC where space is needed), each mode."""
    faults = []
    for family, nth, needs_space in sites:
        for code in ERRNOS.values():
            if code == errno_codes.ENOSPC and not needs_space:
                continue
            for mode in MODES:
                if mode == "short" and family != "write":
                    continue
                faults.append(Fault(family, nth, code, mode))
    return faults
