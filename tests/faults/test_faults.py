"""ENOSPC and EIO at the queue's write, fsync, rename, open, truncate, unlink and mkdir
calls (see ``_inject.py`` for the method and what is checked).

The short run here takes a seeded sample of the sites of each sync mode; the long run,
every site with both errnos and every mode, is ``python -m tests.faults``.  A problem
that matches an open known bug (``KNOWN_BUGS``, each shown by an xfail test) is
counted, not failed; any other problem fails the sweep.  Below the sweep, one
deterministic test per bug it found (docs/reliability.md, bugs 7-11, all fixed).
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
    Fault,
    FaultInjector,
    all_faults,
    list_sites,
    run_with_fault,
    sort_problems,
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
        sort_problems(run, str(fault), known, unknown)
    assert fired == len(faults), "a fault never fired: the workload is not deterministic"
    assert not unknown, "\n".join(unknown[:20])


# ---------------------------------------------------------------------- bugs found
#
# One deterministic reproduction per class of bug the sweep found.  The injector is
# installed before the queue opens (it must see the descriptors) and armed when the
# fault is due.


@contextmanager
def injector(path: Path) -> Iterator[FaultInjector]:
    inj = FaultInjector(path)
    with inj.installed():
        yield inj


def _open(path: Path, **options: object) -> ledgerq.Queue:
    return ledgerq.open(path, **{"sync": "always", **options})  # type: ignore[arg-type]


def _assert_storage_error(error: BaseException, code: int, path: Path) -> None:
    """``error`` is a StorageError carrying ``code`` and naming a file of the queue."""
    assert isinstance(error, ledgerq.StorageError), repr(error)
    assert error.errno == code
    assert str(path) in str(error)


@pytest.mark.parametrize(
    "where", ["open-mkdir", "open-journal", "ack-fsync", "checkpoint-open", "close-dedup-fsync"]
)
def test_os_errors_are_storage_errors(tmp_path: Path, where: str) -> None:
    path = tmp_path / "q"
    with injector(path) as inj:
        if where.startswith("open-"):
            site = "mkdir" if where == "open-mkdir" else "open"
            inj.arm(Fault(site, 1, errno.EIO, match="" if site == "mkdir" else ".state.tmp"))
            with pytest.raises(ledgerq.LedgerQError) as caught:
                _open(path)
            _assert_storage_error(caught.value, errno.EIO, path)
            return
        q = _open(path, dedup_window=60.0)
        try:
            q.enqueue(b"x", dedup_id="a")
            msg = q.dequeue()
            assert msg is not None
            if where == "ack-fsync":
                inj.arm(Fault("fsync", 1, errno.EIO, match="readers/default.state"))
                with pytest.raises(ledgerq.LedgerQError) as caught:
                    q.ack(msg.id)
            elif where == "checkpoint-open":
                inj.arm(Fault("open", 1, errno.EIO, match="readers/default.state.tmp"))
                with pytest.raises(ledgerq.LedgerQError) as caught:
                    q.compact()
            else:
                inj.arm(Fault("fsync", 1, errno.ENOSPC, match="features/dedup.log"))
                with pytest.raises(ledgerq.LedgerQError) as caught:
                    q.close()
            assert inj.fault is not None
            _assert_storage_error(caught.value, inj.fault.errno, path)
        finally:
            inj.clear()
            q.close()


@pytest.mark.parametrize("where", ["open", "close"])
def test_failed_open_or_close_releases_the_lock(tmp_path: Path, where: str) -> None:
    path = tmp_path / "q"
    with injector(path) as inj:
        if where == "open":
            # DirLock truncates LOCK to write the pid in after taking the flock.
            inj.arm(Fault("truncate", 1, errno.EIO))
            with pytest.raises(ledgerq.StorageError):
                _open(path)
        else:
            q = _open(path, max_retries=1, dedup_window=60.0)
            q.enqueue(b"kept")
            q.dlq.stats()  # the DLQ is open too
            inj.arm(Fault("fsync", 1, errno.EIO, match="features/dedup.log"))
            with pytest.raises(ledgerq.StorageError):
                q.close()
            assert q.closed
        inj.clear()
    with _open(path) as q:  # raised QueueLockedError (for the queue, or for its DLQ)
        assert [m.payload for m in q.peek(10)] == ([] if where == "open" else [b"kept"])
        assert len(q.dlq) == 0


# Each step of a rotation that can fail: (sync mode, fault).  The queue holds two
# entries of 100 bytes; the third crosses segment_size=300: segment 1 is sealed and
# segment 4 created.
ROTATION_STEPS = {
    "sync-sealed-log": ("always", Fault("fsync", 1, errno.EIO, match="00000001.log")),
    "seal-index": ("always", Fault("rename", 1, errno.EIO, match="00000001.idx")),
    "seal-directory-sync": ("always", Fault("fsync", 1, errno.EIO, match="/segments")),
    "create-log": ("always", Fault("open", 1, errno.EIO, match="00000004.log")),
    "create-index": ("never", Fault("open", 1, errno.ENOSPC, match="00000004.idx.tmp")),
    "create-directory-sync": ("always", Fault("fsync", 2, errno.EIO, match="/segments")),
    "open-new-log": ("never", Fault("open", 2, errno.EIO, match="00000004.log")),
}


@pytest.mark.parametrize("step", sorted(ROTATION_STEPS))
def test_failed_rotation_leaves_the_queue_usable(tmp_path: Path, step: str) -> None:
    sync, fault = ROTATION_STEPS[step]
    path = tmp_path / "q"
    a, b, c, d, e = (letter * 100 for letter in (b"a", b"b", b"c", b"d", b"e"))
    # Only the fsync that makes c durable is part of c's enqueue: if it fails, the enqueue
    # raises.  Any later step of the rotation failing does not undo c, which is in the log
    # (and synced): the enqueue returns, and the next append finishes the rotation.
    raises = step == "sync-sealed-log"
    with injector(path) as inj, _open(path, segment_size=300, sync=sync) as q:
        ids = [q.enqueue(a), q.enqueue(b)]
        inj.arm(fault)
        if raises:
            with pytest.raises(ledgerq.StorageError):
                q.enqueue(c)
        else:
            ids.append(q.enqueue(c))
        assert inj.fired == 1
        inj.clear()
        ids += [q.enqueue(d), q.enqueue(e)]  # the rotation is finished on the way
        assert q.stats().segments >= 2
        q._check()
    with _open(path) as q:
        found = [(m.id, m.payload) for m in q.peek(10)]
    if not raises:
        assert found == list(zip(ids, [a, b, c, d, e], strict=True))
        return
    # c's enqueue raised, so c may or may not be there; everything else is, in order,
    # under the ids returned.
    assert [entry for entry in found if entry[1] != c] == list(zip(ids, [a, b, d, e], strict=True))
    assert len(found) - 4 <= 1


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
        assert q.enqueue(b"e") > returned
    assert found.get(returned) == b"d" * 100, f"id {returned} was returned for d; found {found}"


@pytest.mark.parametrize("where", ["retry-tracker", "dlq-move"])
def test_failed_nack_keeps_the_message(tmp_path: Path, where: str) -> None:
    path = tmp_path / "q"
    moves = where == "dlq-move"
    with injector(path) as inj, _open(path, max_retries=1 if moves else 3) as q:
        q.dlq.stats()  # the DLQ exists: the move's first write is its entry
        message_id = q.enqueue(b"keep me")
        leased = q.dequeue()
        assert leased is not None and leased.id == message_id
        target = "dlq/segments/00000000000000000001.log" if moves else "features/retries.log"
        inj.arm(Fault("write", 1, errno.ENOSPC, match=target))
        # The failure is counted in the journal: the nack happened, and returns.  Its
        # reason, which retries.log could not take, is kept and saved at the next sync; a
        # move the DLQ refused is redone before the message could be delivered again.
        q.nack(message_id, "failed")
        inj.clear()
        if moves:
            # The move is done before the message could be delivered again.
            assert q.dequeue() is None
            assert [m.headers["dlq.failure_reason"] for m in q.dlq.peek(10)] == ["failed"]
        else:
            again = q.dequeue()
            assert again is not None and (again.id, again.attempts) == (message_id, 2)
    with _open(path) as q:
        main, dlq = [m.payload for m in q.peek(10)], [m.payload for m in q.dlq.peek(10)]
    assert (main, dlq) == (([], [b"keep me"]) if moves else ([b"keep me"], []))


@pytest.mark.parametrize(
    "fault",
    [
        Fault("open", 1, errno.EIO, match="default.state.tmp"),
        Fault("rename", 1, errno.EIO, match="default.state"),
        Fault("fsync", 1, errno.EIO, match="/readers"),  # after the rename
    ],
    ids=str,
)
def test_failed_checkpoint_keeps_later_acks(tmp_path: Path, fault: Fault) -> None:
    # The journal goes on appending to whichever file holds its name: an ack after a
    # failed rewrite must not go to a replaced file, where a reopen would not find it.
    path = tmp_path / "q"
    with injector(path) as inj, _open(path) as q:
        ids = [q.enqueue(b"m%d" % i) for i in range(3)]
        leased = q.dequeue_batch(3)
        inj.arm(fault)
        with pytest.raises(ledgerq.StorageError):
            q.compact()
        assert inj.fired == 1
        inj.clear()
        q.ack(leased[0].id)
    with _open(path) as q:
        assert [m.id for m in q.peek(10)] == ids[1:]
