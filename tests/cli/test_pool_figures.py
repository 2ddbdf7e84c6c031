"""``ledgerq stats`` shows what worker pools left: the rate limit and task progress."""

from __future__ import annotations

import time
from pathlib import Path

import ledgerq
from ledgerq.segment.progress import write_progress
from ledgerq.segment.ratelimit import RateLimiter

from ._run import ok


def test_stats_shows_the_rate_limit_and_in_flight_progress(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q) as queue:
        queue.enqueue_batch([b"a", b"b"])
    plain = ok("stats", q, "--json").json()
    assert plain["rate_limit"] is None and plain["progress"] == []
    assert "rate limit" not in ok("stats", q).out
    # As a pool with rate_limit="20/s" that started three tasks, one of which reported.
    limiter = RateLimiter(str(q), 20, 10**9, time.monotonic_ns)
    for _ in range(3):
        limiter.acquire()
    limiter.close()
    write_progress(str(q), "default", 2, 1, 0.375, "resizing", 1_750_000_000 * 10**9)
    stats = ok("stats", q, "--json").json()
    rate = stats["rate_limit"]
    assert (rate["limit"], rate["count"], rate["period"], rate["starts"]) == ("20/s", 20, 1.0, 3)
    assert 0 <= rate["current_rate"] <= 3
    assert stats["progress"] == [
        {
            "reader": "default",
            "id": 2,
            "attempts": 1,
            "fraction": 0.375,
            "note": "resizing",
            "updated": 1_750_000_000.0,
        }
    ]
    table = ok("stats", q).out
    assert "rate limit" in table and "20/s" in table
    assert "in-flight progress" in table and "37.5%" in table and "resizing" in table
