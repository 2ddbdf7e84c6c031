"""The short server soak (part of ``make test``) and the checks the soak relies on.

The long version is ``python -m tests.soak --seconds 300``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.soak._clients import ABUSES
from tests.soak._driver import SoakConfig, run_soak
from tests.soak._ledger import Ledger, account, item_name, parse_item, payload

SHORT_SECONDS = 20  # about 22 s in all with the start, drain and restart


def test_short_soak_keeps_every_promise(tmp_path: Path) -> None:
    report = run_soak(SoakConfig(SHORT_SECONDS, seed=3, idle_connections=200), tmp_path)
    summary = report.summary()
    assert report.ok, summary
    # The run did what it claims, so "no problem" means something.
    counts = report.tally.counts
    assert report.stored > 1000, summary
    assert report.closed >= report.stored, summary
    assert all(counts[kind] > 0 for kind in ABUSES), summary
    assert counts["vanished with an item open"] > 0, summary
    assert counts["aborts"] > 0 and counts["close/open chains"] > 0, summary
    assert counts["dribbled sets"] > 0, summary
    assert report.tally.latencies_s["set"] and report.tally.latencies_s["get"], summary


def test_payload_names_its_item_and_detects_a_changed_byte() -> None:
    name = item_name("soak-0", "producer1", 42, 7)
    data = payload(name, 300)
    parsed = parse_item(data)
    assert parsed is not None
    assert (parsed.name, parsed.queue, parsed.flags) == (name, "soak-0", 7)
    changed = data[:200] + bytes([data[200] ^ 1]) + data[201:]
    assert parse_item(changed) is None
    assert parse_item(data[:-1]) is None
    assert parse_item(b"not an item") is None


def test_accounting_reports_lost_duplicate_and_unknown_items() -> None:
    ledger = Ledger()
    for n in range(5):
        ledger.record_stored(f"q:p:{n}:0")
    ledger.record_maybe("q:ff:0:0")
    ledger.record_opened("q:p:0:0")  # opened, aborted, delivered again and closed: fine
    ledger.record_closed("q:p:0:0")
    ledger.record_closed("q:p:1:0")
    ledger.record_closed("q:p:2:0")
    ledger.record_closed("q:p:2:0")  # closed twice
    ledger.record_closed("q:never-1:0:0")  # never stored
    leftover = Counter({"q:p:3:0": 1})  # still queued: fine
    # q:p:4:0 is lost; the unconfirmed q:ff:0:0 may be missing.
    problems = account(ledger, leftover)
    assert len(problems) == 3, problems
    assert "lost" in problems[0] and "q:p:4:0" in problems[0]
    assert "more than once" in problems[1] and "q:p:2:0" in problems[1]
    assert "never stored" in problems[2] and "q:never-1:0:0" in problems[2]
    assert ledger.unclosed("q") == (2, 3)
