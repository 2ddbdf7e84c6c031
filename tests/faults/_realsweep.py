"""The real-ENOSPC sweep: every write site of a mixed workload meets a real full disk.

Beside the injected fault sweep (``_inject.py``: a fake ``os`` raises), this one runs
on a real tmpfs (``tests.realfs.SmallDisk``) and lets the kernel refuse: for each *n*,
a child process (``_realchild.py``) runs the workload and fills the disk to its last
byte just before its n-th call that can need space (a write, a creating open, a
mkdir); the disk stays full for a few steps, then the child either crashes at once or
frees the disk, goes on a few steps and crashes (``os._exit``: nothing closed).  The
parent then checks the files and reopens the queue.

Checked after every run (each a broken promise if it fails):

* ``ledgerq verify`` finds nothing: no write cut short by the full disk stayed in a
  file, no torn record, no damage (item 1);
* the queue opens, its invariants hold (``_check``) and ``corrupt_skipped`` is 0;
* every enqueue that returned is there - pending, in the DLQ, or acked by an ack that
  returned; an acked message is never pending again (a crash of the process loses no
  write that reached the OS, in every sync mode);
* a call that raised did not happen (item 3): a message whose ack raised is still
  there, the journal counts exactly the acks and nacks that returned, and no message
  was delivered more often than its dequeues returned it (a dequeue that raised leased
  nothing: after the crash, a lease is a failed delivery);
* every message carries the bytes it was enqueued with, under the id it was returned
  with; a new enqueue gets an id above every id returned (none reused).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ledgerq
from ledgerq import tools
from tests._child import REPO, child_environment
from tests.faults._reopen import reopen_and_check
from tests.realfs import SmallDisk
from tests.torture._payload import matches, mismatch, token_of

__all__ = ["OPTIONS", "RealRun", "count_sites", "run_at"]

# Small segments (a rotation every few messages), the DLQ after two failures, dedup,
# zstd: every file kind of a queue is written.  Retention deletes consumed segments.
OPTIONS: dict[str, Any] = {
    "segment_size": 2048,
    "index_interval": 256,
    "max_retries": 2,
    "dedup_window": 3600.0,
    "compression": "zstd",
    "compression_min_size": 64,
}
_EVERYTHING = 1_000_000


@dataclass
class RealRun:
    """One run: where the disk filled, what raised, and every broken promise."""

    nth: int
    crash_full: bool
    filled: bool = False
    errors: Counter[str] = field(default_factory=Counter)  # "Type errno" -> count
    problems: list[str] = field(default_factory=list)


class _Ledger:
    """The child's report lines, reduced to what the checks need."""

    def __init__(self) -> None:
        self.returned: dict[int, int] = {}  # id -> token of each enqueue that returned
        self.acked: set[int] = set()  # ids whose ack returned
        self.nacks = 0  # nacks that returned
        self.ack_raised: set[int] = set()  # ids whose ack raised
        self.leases: Counter[int] = Counter()  # id -> dequeues that returned it
        self.highest = 0
        self.dedup: dict[str, int] = {}  # dedup id -> the id its returned enqueue gave
        self.sites = 0
        self.filled = False
        self.crashed = False
        self.problems: list[str] = []
        self._op: list[str] = []

    def feed(self, lines: list[str], run: RealRun) -> None:
        for line in lines:
            kind, _, rest = line.partition(" ")
            words = rest.split(" ")
            if kind == "B":
                self._op = words
            elif kind == "Z":
                self._op = []
            elif kind == "F":
                run.errors[f"{words[0]} {words[1]}"] += 1
                if words[0] not in ("StorageError", "QueueClosedError"):
                    self.problems.append(f"a step raised {rest}")
                if self._op[:1] == ["ack"]:
                    self.ack_raised.add(int(self._op[1]))
                self._op = []
            elif kind == "E":
                message_id, token = int(words[0]), int(words[1])
                if words[3] != "-":
                    # A returned enqueue with a dedup id: honoured after any reopen (issue
                    # 25: a full disk then a crash forgot 2,890 of 3,200 such ids).
                    self.dedup.setdefault(words[3], message_id)
                if words[2] != "fresh":
                    continue
                if message_id in self.returned and self.returned[message_id] != token:
                    self.problems.append(f"id {message_id} returned for two messages")
                if message_id <= self.highest and message_id not in self.returned:
                    self.problems.append(f"id {message_id} returned after {self.highest}")
                self.highest = max(self.highest, message_id)
                self.returned[message_id] = token
            elif kind == "L":
                self.leases[int(words[0])] += 1
            elif kind == "A":
                self.acked.add(int(words[0]))
            elif kind == "N":
                self.nacks += 1
            elif kind == "X":
                self.problems.append(f"the child got a damaged message: {rest}")
            elif kind == "C":
                self.sites = int(words[0])
            elif kind == "K":
                self.filled = words[0] == "1"
                self.crashed = True


def _run_child(config: dict[str, Any]) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "tests.faults._realchild", json.dumps(config)],
        capture_output=True,
        cwd=REPO,
        env=child_environment(),
        timeout=120,
        check=False,
    )
    lines = result.stdout.decode(errors="replace").splitlines()
    if result.returncode != 0:
        stderr = result.stderr.decode(errors="replace")
        lines.append(f"X the child exited {result.returncode}: {stderr[-2000:]}")
    return lines


def _config(
    disk: SmallDisk, path: Path, sync: str, seed: int, steps: int, nth: int, crash_full: bool
) -> dict[str, Any]:
    return {
        "path": str(path),
        "options": {**OPTIONS, "sync": sync},
        "seed": seed,
        "token_base": 1_000_000,
        "steps": steps,
        "nth": nth,
        "hold": 10,
        "compact_bytes": 512,  # journal compaction every few dozen records
        "after": 4,
        "crash_full": crash_full,
        "disk": str(disk.path),
    }


def count_sites(disk: SmallDisk, sync: str, *, seed: int, steps: int) -> int:
    """How many space-needing calls the workload makes (a run without a fill)."""
    path = disk.path / "dry"
    ledger = _Ledger()
    run = RealRun(0, crash_full=False)
    ledger.feed(_run_child(_config(disk, path, sync, seed, steps, 0, False)), run)
    shutil.rmtree(path)
    if ledger.problems or run.errors or not ledger.crashed:
        raise AssertionError(f"the workload fails without a full disk: {ledger.problems} {run}")
    return ledger.sites


def run_at(
    disk: SmallDisk, sync: str, nth: int, *, seed: int, steps: int, crash_full: bool
) -> RealRun:
    """Run the workload with the disk filled at its ``nth`` site; crash (with the disk
    still full, or after freeing it and a few more steps); check."""
    run = RealRun(nth, crash_full)
    path = disk.path / f"run{nth}"
    ledger = _Ledger()
    try:
        ledger.feed(_run_child(_config(disk, path, sync, seed, steps, nth, crash_full)), run)
        disk.free()
        run.filled = ledger.filled
        run.problems.extend(ledger.problems)
        if not ledger.crashed:
            run.problems.append("the child did not reach its crash")
        _check(path, ledger, run)
    finally:
        disk.free()
        shutil.rmtree(path, ignore_errors=True)
    return run


def _check(path: Path, ledger: _Ledger, run: RealRun) -> None:
    report = tools.verify(path)
    for problem in report.problems:
        run.problems.append(f"verify after the crash: {problem}")
    reopen_and_check(path, {}, run.problems, lambda q: _check_contents(q, ledger, run))


def _check_contents(q: ledgerq.Queue, ledger: _Ledger, run: RealRun) -> None:
    q._check()
    stats = q.stats()
    if stats.corrupt_skipped:
        run.problems.append(f"{stats.corrupt_skipped} corrupt regions after reopen")
    # The journal counts what happened: an ack or a nack that raised must not be there.
    if stats.acked != len(ledger.acked):
        run.problems.append(f"{stats.acked} acks recorded, {len(ledger.acked)} returned")
    if stats.nacked != ledger.nacks:
        run.problems.append(f"{stats.nacked} nacks recorded, {ledger.nacks} returned")
    main, dlq = q.peek(_EVERYTHING), q.dlq.peek(_EVERYTHING)
    present: set[int] = set()
    for message in main:
        token = token_of(message.payload)
        present.add(token)
        if not matches(message, token, moved=message.expires_at is None):
            run.problems.append(f"message {message.id} is damaged: {mismatch(message, token)}")
        if ledger.returned.get(message.id, token) != token:
            run.problems.append(f"message {message.id} carries {token}, returned with another")
        if message.id in ledger.acked:
            run.problems.append(f"acked message {message.id} is pending again")
        if message.attempts > ledger.leases[message.id] + 1:
            run.problems.append(
                f"message {message.id} is at attempt {message.attempts} after "
                f"{ledger.leases[message.id]} deliveries (a dequeue that raised leased it)"
            )
    for message in dlq:
        token = token_of(message.payload)
        present.add(token)
        if not matches(message, token, moved=True):
            run.problems.append(f"DLQ message {message.id} is damaged: {mismatch(message, token)}")
    acked_tokens = {ledger.returned.get(i, -1) for i in ledger.acked}
    lost = sorted(set(ledger.returned.values()) - acked_tokens - present)
    if lost:
        run.problems.append(f"enqueued messages LOST (tokens): {lost[:8]}")
    undone = sorted(i for i in ledger.ack_raised if ledger.returned.get(i) not in present)
    if undone:
        run.problems.append(f"acks that raised were done: ids {undone[:8]}")
    forgotten = sorted(
        key
        for key, message_id in ledger.dedup.items()
        if q.enqueue(b"dedup probe", dedup_id=key) != message_id
    )
    if forgotten:
        run.problems.append(f"returned dedup ids forgotten: {forgotten[:8]}")
    new_id = q.enqueue(b"after the crash")
    if new_id <= ledger.highest:
        run.problems.append(f"new id {new_id} is not above {ledger.highest} (reused)")
