"""A write the OS refuses (here: a file-size limit, like a full disk) loses nothing.

The child process sets RLIMIT_FSIZE so that real writes past a size fail with EFBIG,
exactly as they would with ENOSPC on a full disk: no mocks, real files.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import ledgerq
from tests._child import run_python

CHILD = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    import ledgerq
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
    path = sys.argv[1]
    out = {}
    with ledgerq.open(path, sync="never") as q:
        ids = [q.enqueue(b"before-%d" % i) for i in range(5)]
        segment = sorted(os.listdir(os.path.join(path, "segments")))[0]
        size = os.path.getsize(os.path.join(path, "segments", segment))
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 1000, resource.RLIM_INFINITY))
        try:
            q.enqueue(b"x" * 5000)
        except ledgerq.LedgerQError as exc:
            out["error"] = type(exc).__name__
            out["message"] = str(exc)
            out["is_oserror"] = isinstance(exc, OSError)
        out["len_after_error"] = len(q)
        out["small_id"] = q.enqueue(b"small fits")
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        out["ids"] = ids
    print(json.dumps(out))
    """
)


def test_refused_write_raises_clearly_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "q"
    result = run_python("-c", CHILD, str(path))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["error"] == "StorageError"
    assert out["is_oserror"]
    assert "could not append to" in out["message"] and ".log" in out["message"]
    assert out["len_after_error"] == 5, "the failed message must not be counted"
    with ledgerq.open(path) as q:
        got = [m.payload for m in q.dequeue_batch(10)]
        assert got == [b"before-%d" % i for i in range(5)] + [b"small fits"]
        assert q.stats().corrupt_skipped == 0
        assert out["small_id"] == out["ids"][-1] + 1
