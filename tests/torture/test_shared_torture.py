"""Crash torture in shared mode, short run (see ``_shared.py``), and its checker.

The long run is ``python -m tests.torture --shared --rounds N`` (docs/reliability.md).
Here one campaign of parent-driven kills, and one whose extra children kill themselves
inside the steps of the shared engine; seeds are fixed, the moments of the parent's
kills are not.  The checker's own tests feed it reports that break each promise.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.torture._model import ModelError
from tests.torture._shared import Ledger, Proc, run_shared_rounds


def test_random_kills_of_processes_sharing_a_queue(tmp_path: Path) -> None:
    totals = run_shared_rounds(tmp_path, 4, seed=3, per_campaign=4, target="random")
    assert totals.rounds == 4 and totals.processes >= 10
    assert sum(totals.kills.values()) >= 4
    assert totals.counts["enqueued"] > 200 and totals.counts["acked"] > 50
    assert totals.counts["dlq_moves"] > 0


def test_random_kills_with_leases_expiring_in_live_and_dead_hands(tmp_path: Path) -> None:
    # Issue 25 item 7's settings, shorter: consumers dawdle past the visibility timeout
    # now and then, so leases expire in live hands (their ack or nack then raises
    # UnknownMessageError, which the checker judges by the times) as well as dead ones;
    # with max_retries=0 nothing is dead-lettered: everything nacked or expired comes back.
    totals = run_shared_rounds(
        tmp_path,
        2,
        seed=9,
        per_campaign=2,
        target="random",
        overrides={"visibility_timeout": 0.25, "max_retries": 0},
    )
    assert totals.rounds == 2 and totals.counts["nack"] > 0
    assert totals.counts["expired_settles"] > 0, dict(totals.counts)
    assert totals.counts["dlq_moves"] == 0


@pytest.mark.parametrize("target", ["append", "compaction"])
def test_processes_killed_inside_the_shared_engine(tmp_path: Path, target: str) -> None:
    totals = run_shared_rounds(tmp_path, 2, seed=5, per_campaign=2, target=target)
    assert totals.rounds == 2
    landed = sum(n for kind, n in totals.kills.items() if kind.split("/")[0] == target)
    assert landed >= 1, f"no kill landed inside {target}: {dict(totals.kills)}"


# ---------------------------------------------------------------------- the checker


class _Dead:
    """A child's reports, as :meth:`Ledger.load` reads them (finished, unless ``alive``)."""

    def __init__(
        self, number: int, lines: list[str], death_ns: int = 10**12, *, alive: bool = False
    ) -> None:
        self.number = number
        self.role = "consumer"
        self.lines = lines
        self.death_ns = death_ns
        self.done = threading.Event()
        if not alive:
            self.done.set()

    @property
    def alive(self) -> bool:
        return not self.done.is_set()

    def last_stamp_ns(self) -> int:
        return Proc.last_stamp_ns(self)  # type: ignore[arg-type]


def _ledger(*procs: _Dead, visibility_timeout: float | None = None) -> Ledger:
    ledger = Ledger("test", visibility_timeout)
    ledger.load(list(procs), [(1, 1)])  # type: ignore[arg-type]
    return ledger


def test_the_checker_finds_a_message_leased_to_two_live_handles() -> None:
    first = _Dead(0, ["B 100 deq 1", "L 110 - 1 1 1", "Z 111", "B 300 ack - 1", "A 310 - 1"])
    second = _Dead(1, ["B 200 deq 1", "L 210 - 1 2 1", "Z 211"])
    with pytest.raises(ModelError, match="two live handles"):
        _ledger(first, second).check()


def test_the_checker_judges_a_live_holder_by_the_reports_read_so_far() -> None:
    # Its nack may be written and not read yet: held for certain only up to its last
    # report read (111), before the other lease (210).  A report at 300 without a
    # release proves the overlap.
    holder = _Dead(0, ["B 100 deq 1", "L 110 - 1 1 1", "Z 111"], alive=True)
    other = _Dead(1, ["B 200 deq 1", "L 210 - 1 2 1", "Z 211"])
    _ledger(holder, other).check()
    holder.lines += ["B 290 enq 7 -", "E 300 5 7 -", "Z 301"]
    with pytest.raises(ModelError, match="two live handles"):
        _ledger(holder, other).check()


def test_the_checker_accepts_a_lease_taken_after_the_holder_died() -> None:
    first = _Dead(0, ["B 100 deq 1", "L 110 - 1 1 1", "Z 111"], death_ns=150)
    second = _Dead(1, ["B 200 deq 1", "L 210 - 1 2 1", "Z 211", "B 300 ack - 1", "A 310 - 1"])
    _ledger(first, second).check()


def test_the_checker_finds_an_undone_ack_and_a_lost_failed_delivery() -> None:
    acked = _Dead(0, ["B 100 deq 1", "L 110 - 1 1 1", "Z 111", "B 120 ack - 1", "A 130 - 1"])
    again = _Dead(1, ["B 200 deq 1", "L 210 - 1 2 1", "Z 211"])
    with pytest.raises(ModelError, match="after its ack returned"):
        _ledger(acked, again).check()
    died = _Dead(0, ["B 100 deq 1", "L 110 - 1 1 1", "Z 111"], death_ns=150)
    same = _Dead(1, ["B 200 deq 1", "L 210 - 1 1 1", "Z 211"])
    with pytest.raises(ModelError, match="failed delivery"):
        _ledger(died, same).check()


def test_the_checker_finds_reused_ids_and_split_dedup_ids() -> None:
    with pytest.raises(ModelError, match="returned twice"):
        _ledger(_Dead(0, ["B 1 enq 5 -", "E 2 1 5 -", "Z 3"])).check()
    split = _Dead(0, ["B 1 enq 5 k1", "E 2 7 5 k1", "Z 3", "B 4 enq 6 k1", "E 5 8 6 k1", "Z 6"])
    with pytest.raises(ModelError, match="dedup id k1"):
        _ledger(split).check()


def test_the_checker_finds_a_lost_enqueue() -> None:
    ledger = _ledger(_Dead(0, ["B 1 enq 5 -", "E 2 9 5 -", "Z 3"]))
    with pytest.raises(ModelError, match="lost on reader -"):
        ledger.check_final({"-": [], "audit": []}, [], [9])


def test_the_checker_accepts_a_lease_that_expired_in_a_live_holder() -> None:
    # A 100 ms timeout.  The holder dawdles; the other takes the message after the
    # earliest moment its deadline could pass; the holder's ack then raises.
    ms = 1_000_000
    holder = _Dead(
        0,
        [
            *("B 0 deq 1", f"L {ms} - 1 1 1", f"Z {ms}"),
            *(f"B {2 * ms} dawdle 300", f"Z {300 * ms}"),
            *(f"B {301 * ms} ack - 1", f"U {302 * ms} - 1", f"Z {302 * ms}"),
        ],
        alive=True,
    )
    other = _Dead(1, [f"B {200 * ms} deq 1", f"L {201 * ms} - 1 2 1", f"Z {201 * ms}"])
    ledger = _ledger(holder, other, visibility_timeout=0.1)
    ledger.check()
    assert ledger.counts["expired_settles"] == 1
    # Without a timeout the refused ack is a lost lease; with one, a lease taken (or an
    # ack refused) before the timeout could have passed is a broken promise too.
    with pytest.raises(ModelError, match="before its visibility timeout"):
        _ledger(holder, other).check()
    early = _Dead(1, [f"B {50 * ms} deq 1", f"L {51 * ms} - 1 2 1", f"Z {51 * ms}"])
    with pytest.raises(ModelError, match="two live handles"):
        _ledger(holder, early, visibility_timeout=0.1).check()
    refused = _Dead(0, ["B 0 deq 1", f"L {ms} - 1 1 1", f"Z {ms}"])
    refused.lines += [f"B {2 * ms} nack - 1", f"U {3 * ms} - 1", f"Z {3 * ms}"]
    with pytest.raises(ModelError, match="before its visibility timeout"):
        _ledger(refused, visibility_timeout=0.1).check()


def test_the_checker_finds_an_ack_that_returned_after_another_lease() -> None:
    # An ack that returned decided while the lease was held: another handle must not
    # have leased the message before that ack began, visibility timeout or not.
    ms = 1_000_000
    holder = _Dead(0, ["B 0 deq 1", f"L {ms} - 1 1 1", f"Z {ms}"], alive=True)
    holder.lines += [f"B {400 * ms} ack - 1", f"A {401 * ms} - 1", f"Z {401 * ms}"]
    other = _Dead(1, [f"B {200 * ms} deq 1", f"L {201 * ms} - 1 2 1", f"Z {201 * ms}"])
    with pytest.raises(ModelError, match="two live handles"):
        _ledger(holder, other, visibility_timeout=0.1).check()


def test_the_checker_finds_a_nacked_message_never_delivered_again() -> None:
    # Issue 25 item 7: dequeued, nacked (the nack returned), with max_retries=0 never
    # dead-lettered: it must be leased again, or be in the final drain.
    nacked = _Dead(0, ["B 1 enq 5 -", "E 2 9 5 -", "Z 3", "B 4 deq 1", "L 5 - 9 1 5", "Z 6"])
    nacked.lines += ["B 7 nack - 9", "N 8 - 9", "Z 9"]
    ledger = _ledger(nacked, visibility_timeout=0.5)
    with pytest.raises(ModelError, match="lost on reader -"):
        ledger.check_final({"-": [], "audit": []}, [], [1, 9])


def test_the_checker_orders_expiring_leases_by_their_attempts() -> None:
    # A dequeue that decided (attempt 3) and was preempted for more than the timeout
    # returns after the lease decided once its own had expired (attempt 4).
    ms = 1_000_000
    slow = _Dead(0, ["B 0 deq 1", f"L {700 * ms} - 1 3 1", f"Z {700 * ms}"])
    slow.lines += [f"B {701 * ms} ack - 1", f"U {702 * ms} - 1", f"Z {702 * ms}"]
    other = _Dead(1, [f"B {600 * ms} deq 1", f"L {601 * ms} - 1 4 1", f"Z {601 * ms}"])
    _ledger(slow, other, visibility_timeout=0.1).check()
    again = _Dead(1, [f"B {600 * ms} deq 1", f"L {601 * ms} - 1 3 1", f"Z {601 * ms}"])
    with pytest.raises(ModelError, match="failed delivery"):
        _ledger(slow, again, visibility_timeout=0.1).check()
