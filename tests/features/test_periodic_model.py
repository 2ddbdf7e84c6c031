"""Periodic jobs against a model, driven by hypothesis on a clock the test moves.

The model: a job added at time ``a`` with period ``p`` has ticks ``a + k*p`` (k >= 1);
replacing it starts again from the time of the replacement.  Whenever a handle looks
(it opens, or - exclusive mode - dequeues; a shared handle is also told to poll, as its
housekeeper does every 0.25 s), each job whose next tick has come gets one message, for
the latest tick that has come.  So downtime (every handle closed) gives one catch-up
message at the next open, and however many handles look at a tick, it has one message.

The shared variant keeps 1 to 3 handles open at once and has any of them look; its
housekeeper threads are kept from polling on their own (they run on real time, which
would fire ticks at moments the model does not know): the test's ``look`` is theirs.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import invariant, precondition, rule

import ledgerq
from ledgerq.features.periodic import NAME_HEADER, TICK_HEADER
from tests.clocks import SECOND, SteppedClock
from tests.machines import TempQueueMachine

NAMES = ("a", "b", "c")
names = st.sampled_from(NAMES)
periods = st.sampled_from([1, 2, 5, 7])
# Steps of the clock: whole seconds and halves, so ticks are met exactly and passed.
steps = st.sampled_from([0.5, 1, 2, 3, 7, 30])


class PeriodicMachine(TempQueueMachine):
    shared: ClassVar[bool] = False
    tmp_prefix = "ledgerq-periodic-model-"

    def __init__(self) -> None:
        super().__init__()
        self.clock = SteppedClock()
        self.handles: list[ledgerq.Queue] = []
        self.jobs: dict[str, tuple[int, int, int | None]] = {}  # name -> (anchor, period, last)
        self.expected: Counter[tuple[str, int]] = Counter()  # fired, not yet drained
        self._open()

    def open_handles(self) -> list[ledgerq.Queue]:
        return self.handles

    # ------------------------------------------------------------------ the model

    def _look(self) -> None:
        now = self.clock.wall_ns
        for name, (anchor, period, last) in self.jobs.items():
            if now >= (anchor if last is None else last) + period:
                tick = anchor + (now - anchor) // period * period
                self.jobs[name] = (anchor, period, tick)
                self.expected[(name, tick)] += 1

    def _open(self) -> None:
        self.handles.append(ledgerq.open(self.path, clock=self.clock, shared=self.shared))
        self._look()  # an open fires what is due

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: self.handles)
    @rule(name=names, period=periods, which=st.integers(0, 2))
    def add(self, name: str, period: int, which: int) -> None:
        q = self.handles[which % len(self.handles)]
        q.add_periodic(name, name.encode(), every=period)
        self.jobs[name] = (self.clock.wall_ns, period * SECOND, None)

    @precondition(lambda self: self.handles)
    @rule(name=names, which=st.integers(0, 2))
    def remove(self, name: str, which: int) -> None:
        q = self.handles[which % len(self.handles)]
        assert q.remove_periodic(name) == (name in self.jobs)
        self.jobs.pop(name, None)

    @rule(seconds=steps)
    def elapse(self, seconds: float) -> None:
        self.clock.elapse(seconds)

    @precondition(lambda self: self.handles)
    @rule(which=st.integers(0, 2), looks=st.lists(st.booleans(), max_size=3))
    def drain(self, which: int, looks: list[bool]) -> None:
        """Handles look at the same instant - shared mode: each dequeues (firing what its
        own, maybe stale, view says is due) or polls as its housekeeper does - then one
        polls and drains the queue."""
        got: Counter[tuple[str, int]] = Counter()

        def take(q: ledgerq.Queue) -> None:
            while (msg := q.dequeue()) is not None:
                assert msg.payload == msg.headers[NAME_HEADER].encode()
                got[(msg.headers[NAME_HEADER], int(msg.headers[TICK_HEADER]))] += 1
                q.ack(msg.id)

        q = self.handles[which % len(self.handles)]
        if self.shared:
            for n, polls in enumerate(looks, 1):
                other = self.handles[(which + n) % len(self.handles)]
                if polls:
                    other.poll_timer()
                else:
                    take(other)
            q.poll_timer()
        self._look()  # (exclusive mode: the first dequeue below looks)
        take(q)
        assert got == self.expected
        self.expected.clear()

    @rule()
    def reopen_all_later(self) -> None:
        """Every handle closes; time passes with the queue closed; one opens."""
        for q in self.handles:
            q.close()
        self.handles.clear()
        self.clock.elapse(13)
        self._open()

    @precondition(lambda self: self.shared and len(self.handles) < 3)
    @rule()
    def open_another(self) -> None:
        self._open()

    @precondition(lambda self: self.shared and len(self.handles) > 1)
    @rule(which=st.integers(0, 2))
    def close_one(self, which: int) -> None:
        self.handles.pop(which % len(self.handles)).close()

    @invariant()
    def listed(self) -> None:
        if not self.handles:
            return
        jobs = self.handles[-1].periodic()
        assert [j.name for j in jobs] == sorted(self.jobs)
        for job in jobs:
            anchor, period, last = self.jobs[job.name]
            assert job.every == period / SECOND
            assert job.last_run_ns == last
            assert job.next_run_ns == (anchor if last is None else last) + period


class SharedPeriodicMachine(PeriodicMachine):
    shared = True


_SETTINGS = {
    False: settings(max_examples=25, stateful_step_count=30, deadline=None),
    True: settings(max_examples=12, stateful_step_count=30, deadline=None),
}


@pytest.mark.parametrize(
    "machine", [PeriodicMachine, SharedPeriodicMachine], ids=["exclusive", "shared"]
)
def test_periodic_jobs_follow_the_model(
    machine: type[PeriodicMachine], monkeypatch: pytest.MonkeyPatch
) -> None:
    if machine.shared:
        # The housekeeper's own polls run on real time: the test looks for it instead.
        monkeypatch.setattr(
            "ledgerq.core.shared_process.Housekeeper._poll_timers", lambda self, handles: None
        )
    machine.TestCase.settings = _SETTINGS[machine.shared]
    machine.TestCase().runTest()
