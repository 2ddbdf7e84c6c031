"""The three append paths (one plain payload, a plain batch, drafts with features) fail alike.

A queue reserves ids in ``meta.json`` before it writes them, so that ids lost with a torn
tail are never given again.  When saving that reservation fails, the append must leave
nothing appended, no id consumed, no dedup id remembered - and must try the reservation
again next time rather than write ids that no durable record covers.

The save is made to fail for real: a directory where the temporary ``meta.json.tmp``
must be created (EISDIR).  Reaching the end of a reservation block takes a million ids,
so the tests move the in-memory edge of the reservation instead (``_append_gate``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from ledgerq import Item
from ledgerq.segment.meta import ID_BLOCK

Append = Callable[[ledgerq.Queue], list[int]]

PATHS: dict[str, tuple[dict[str, Any], Append]] = {
    "plain": ({}, lambda q: [q.enqueue(b"m")]),
    "delayed": ({}, lambda q: [q.enqueue(b"m", delay=1e-6)]),  # due by the reopen
    "plain batch": ({}, lambda q: q.enqueue_batch([b"m", b"n"])),
    "features": (
        {"dedup_window": 60.0},
        lambda q: q.enqueue_batch([Item(b"m", dedup_id="d-m"), Item(b"n", dedup_id="d-n")]),
    ),
}


def _meta(path: Path) -> dict[str, Any]:
    return json.loads((path / "meta.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", PATHS)
def test_a_failed_reservation_appends_nothing_and_is_retried(tmp_path: Path, kind: str) -> None:
    options, append = PATHS[kind]
    path = tmp_path / "q"
    with ledgerq.open(path, **options) as q:
        assert q.enqueue(b"first") == 1
        # The next append must reserve ids first (the durable reservation, and the gate).
        q._append_gate = q._ids_reserved_until = q.stats().next_id
        saved = _meta(path)
        blocker = path / "meta.json.tmp"
        blocker.mkdir()  # where the meta save writes its temporary file

        with pytest.raises(ledgerq.StorageError, match=r"meta\.json"):
            append(q)
        stats = q.stats()
        assert (stats.next_id, stats.enqueued, stats.duplicates, len(q)) == (2, 1, 0, 1)
        assert _meta(path) == saved, "nothing was saved"

        blocker.rmdir()
        ids = append(q)
        assert ids == list(range(2, 2 + len(ids))), "the failed append consumed no id"
        assert q.stats().duplicates == 0, "the failed append left no dedup id behind"
        # The retry saved its reservation before writing: ids beyond the last durable
        # reservation would be given again after a crash that cuts the log's tail.
        assert _meta(path)["reserved_until"] == 2 + len(ids) + ID_BLOCK
        q._check()
    with ledgerq.open(path) as q:
        payloads = [m.payload for m in q.dequeue_batch(10)]
    assert payloads == [b"first", b"m", b"n"][: 1 + len(ids)]
