"""ENOSPC and EIO at the queue's write, fsync, rename, open, truncate, unlink and mkdir
calls (see ``_inject.py`` for the method and what is checked).

The short run here takes a seeded sample of the sites of each sync mode; the long run,
every site with both errnos and every mode, is ``python -m tests.faults``.  A problem
that matches a known bug (each shown by an xfail test below) is counted, not failed;
any other problem fails the sweep.
"""

from __future__ import annotations

import errno
import random
import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import ledgerq
from tests.faults._inject import (
    KNOWN_BUGS,
    Fault,
    FaultInjector,
    all_faults,
    classify,
    list_sites,
    run_with_fault,
)
from tests.faults._shim import quiet_ledgerq, scratch_dir

SAMPLE = {"always": 220, "never": 160}
OPTIONS = {
    "segment_size": 800,
    "index_interval": 128,
    "max_retries": 2,
    "dedup_window": 3600.0,
    "compression": "zstd",
    "compression_min_size": 64,
}


@pytest.mark.parametrize("sync", ["always", "never"])
def test_fault_sweep(tmp_path: Path, sync: str) -> None:
    with scratch_dir(tmp_path) as scratch:
        _sweep(scratch, sync)


def _sweep(tmp_path: Path, sync: str) -> None:
    options = {**OPTIONS, "sync": sync}
    sites = list_sites(tmp_path / "dry", options=options)
    assert {family for family, _, _ in sites} >= {"write", "fsync", "rename", "open", "mkdir"}
    faults = random.Random(f"faults-{sync}").sample(all_faults(sites), SAMPLE[sync])
    unknown: list[str] = []
    known: Counter[str] = Counter()
    fired = 0
    for n, fault in enumerate(faults):
        with quiet_ledgerq():
            run, _ = run_with_fault(tmp_path / f"run{n}", fault, options=options)
        shutil.rmtree(tmp_path / f"run{n}")
        fired += run.fired > 0
        for problem in run.problems:
            bug = classify(problem, run)
            if bug is None:
                unknown.append(f"{fault}: {problem}")
            else:
                known[bug] += 1
    assert fired == len(faults), "a fault never fired: the workload is not deterministic"
    assert not unknown, "\n".join(unknown[:20])


# ---------------------------------------------------------------------- known bugs
#
# One deterministic reproduction per class of KNOWN_BUGS.  The injector is installed
# before the queue opens (it must see the descriptors) and armed when the fault is due.


@contextmanager
def injector(path: Path) -> Iterator[FaultInjector]:
    inj = FaultInjector(path)
    with inj.installed():
        yield inj


def _open(path: Path, **options: object) -> ledgerq.Queue:
    return ledgerq.open(path, **{"sync": "always", **options})  # type: ignore[arg-type]


@pytest.mark.xfail(strict=True, reason="bug: " + KNOWN_BUGS["raw-oserror"])
@pytest.mark.parametrize("where", ["open-mkdir", "ack-fsync", "close-dedup-fsync"])
def test_os_errors_are_storage_errors(tmp_path: Path, where: str) -> None:
    path = tmp_path / "q"
    with injector(path) as inj:
        if where == "open-mkdir":
            inj.arm(Fault("mkdir", 1, errno.EIO))
            with pytest.raises(ledgerq.LedgerQError):
                _open(path)
            return
        q = _open(path, dedup_window=60.0)
        try:
            q.enqueue(b"x", dedup_id="a")
            msg = q.dequeue()
            assert msg is not None
            if where == "ack-fsync":
                inj.arm(Fault("fsync", 1, errno.EIO, match="readers/default.state"))
                with pytest.raises(ledgerq.LedgerQError):
                    q.ack(msg.id)
            else:
                inj.arm(Fault("fsync", 1, errno.ENOSPC, match="features/dedup.log"))
                with pytest.raises(ledgerq.LedgerQError):
                    q.close()
        finally:
            inj.clear()
            q.close()


@pytest.mark.xfail(strict=True, reason="bug: " + KNOWN_BUGS["lock-leak"])
@pytest.mark.parametrize("where", ["open", "close"])
def test_failed_open_or_close_releases_the_lock(tmp_path: Path, where: str) -> None:
    path = tmp_path / "q"
    with injector(path) as inj:
        if where == "open":
            # DirLock truncates LOCK to write the pid in after taking the flock.
            inj.arm(Fault("truncate", 1, errno.EIO))
            with pytest.raises(OSError):
                _open(path)
        else:
            q = _open(path, max_retries=1, dedup_window=60.0)
            q.dlq.stats()  # the DLQ is open too
            inj.arm(Fault("fsync", 1, errno.EIO, match="features/dedup.log"))
            with pytest.raises(OSError):
                q.close()
        inj.clear()
    with _open(path) as q:  # raises QueueLockedError (for the queue, or for its DLQ)
        assert len(q) == 0


@pytest.mark.xfail(strict=True, reason="bug: " + KNOWN_BUGS["broken-after-rotation"])
def test_failed_rotation_leaves_the_queue_usable(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with injector(path) as inj:
        q = _open(path, segment_size=300)
        try:
            q.enqueue(b"a" * 100)
            q.enqueue(b"b" * 100)
            # The third enqueue crosses segment_size: creating the next segment fails.
            inj.arm(Fault("open", 1, errno.EIO, match=".log"))
            with pytest.raises(ledgerq.LedgerQError):
                q.enqueue(b"c" * 100)
            inj.clear()
            q.enqueue(b"d" * 100)  # raises AssertionError('segment manager is closed')
        finally:
            q.close()


@pytest.mark.xfail(strict=True, reason="bug: " + KNOWN_BUGS["id-reuse-after-rotation"])
def test_failed_rotation_does_not_reuse_ids(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with injector(path) as inj, _open(path, segment_size=300) as q:
        q.enqueue(b"a" * 100)
        q.enqueue(b"b" * 100)
        # The third enqueue crosses segment_size; the fsync sealing the segment fails
        # after the entry was written.
        inj.arm(Fault("fsync", 1, errno.EIO, match="00000000000000000001.log"))
        with pytest.raises(ledgerq.LedgerQError):
            q.enqueue(b"c" * 100)
        inj.clear()
        returned = q.enqueue(b"d" * 100)
    with _open(path) as q:
        found = {m.id: m.payload for m in q.peek(10)}
    assert found.get(returned) == b"d" * 100, f"id {returned} was returned for d; found {found}"


@pytest.mark.xfail(strict=True, reason="bug: " + KNOWN_BUGS["nack-drops-message"])
def test_failed_nack_keeps_the_message(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with injector(path) as inj, _open(path, max_retries=3) as q:
        message_id = q.enqueue(b"keep me")
        assert q.dequeue() is not None
        inj.arm(Fault("write", 1, errno.ENOSPC, match="features/retries.log"))
        with pytest.raises(ledgerq.LedgerQError):
            q.nack(message_id, "failed")
        inj.clear()
    with _open(path) as q:
        assert [m.payload for m in q.peek(10)] == [b"keep me"]
