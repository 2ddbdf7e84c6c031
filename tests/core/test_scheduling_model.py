"""Scheduled delivery against an in-memory model, driven by hypothesis, on a clock the
test moves (``ledgerq.open(clock=)``: no sleeping).

The model: each message has a not-before time (its delay; a failed delivery's retry
time, or a delayed release's) and maybe a group.  A dequeue first expires the leases
whose deadline passed (failed deliveries: they wait the retry policy), then delivers the
smallest id that is due and is its group's first unfinished message; a failure found
only then (a lease lost to a reopen) waits the policy first.  Touch moves a lease's
deadline; release gives it back unused.  Stats agree after every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import invariant, precondition, rule

import ledgerq
from tests.clocks import SECOND, SteppedClock
from tests.machines import TempQueueMachine, delivered_as_expected

VISIBILITY = 30.0


@dataclass
class Msg:
    payload: bytes
    group: str | None
    deliver_at: int  # 0: no delay
    state: str = "available"  # available, leased, acked
    deliveries: int = 0
    not_before: int | None = None  # journalled retry/release time, void once leased
    deadline: int = 0  # lease deadline (ns)
    unreported: bool = False  # a failure a reopen left to be found at the next take

    def due(self) -> int:
        return max(self.deliver_at, self.not_before or 0)


def policy_ns(failures: int) -> int:
    return int(min(2.0 * 2.0 ** (failures - 1), 10.0) * SECOND)


class SchedulingMachine(TempQueueMachine):
    visibility: ClassVar[float] = VISIBILITY
    options: ClassVar[dict[str, Any]] = {
        "segment_size": 700,
        "index_interval": 128,
        "sync": "never",
        "max_retries": 0,
        "retry_delay": 2.0,
        "retry_backoff": 2.0,
        "retry_delay_max": 10.0,
        "visibility_timeout": VISIBILITY,
    }

    tmp_prefix = "ledgerq-sched-model-"

    def __init__(self) -> None:
        super().__init__()
        self.clock = SteppedClock()
        self.q = ledgerq.open(self.path, clock=self.clock, **self.options)
        self.msgs: dict[int, Msg] = {}

    @property
    def now(self) -> int:
        return self.clock.wall_ns

    def _ids(self, state: str) -> list[int]:
        return sorted(i for i, m in self.msgs.items() if m.state == state)

    def _live_lease(self, data: st.DataObject) -> tuple[int, Msg] | None:
        """A leased message drawn from the model, or None when its lease has expired
        (another take may have it now: the step is skipped)."""
        message_id = data.draw(st.sampled_from(self._ids("leased")))
        m = self.msgs[message_id]
        return None if m.deadline <= self.now else (message_id, m)

    def _group_first(self, group: str) -> int:
        return min(i for i, m in self.msgs.items() if m.group == group and m.state != "acked")

    def _expected(self) -> int | None:
        now = self.now
        for message_id in self._ids("leased"):
            m = self.msgs[message_id]
            if m.deadline <= now:  # the visibility timeout passed: a failed delivery
                m.state = "available"
                m.not_before = now + policy_ns(m.deliveries)
        for message_id in self._ids("available"):
            m = self.msgs[message_id]
            if m.due() > now:
                continue
            if m.group is not None and self._group_first(m.group) != message_id:
                continue
            if m.unreported:
                m.unreported = False
                m.not_before = now + policy_ns(m.deliveries)
                continue
            return message_id
        return None

    # ---------------------------------------------------------------- rules

    @rule(
        payload=st.binary(max_size=40),
        delay=st.sampled_from([None, None, 0, 1.0, 5.0, 40.0]),
        group=st.sampled_from([None, None, "a", "b"]),
    )
    def enqueue(self, payload: bytes, delay: float | None, group: str | None) -> None:
        message_id = self.q.enqueue(payload, delay=delay, group=group)
        deliver_at = self.now + int(delay * SECOND) if delay else 0
        self.msgs[message_id] = Msg(payload, group, deliver_at)

    @rule()
    def dequeue(self) -> None:
        if (msg := delivered_as_expected(self.q.dequeue(), self._expected())) is None:
            return
        m = self.msgs[msg.id]
        assert (msg.payload, msg.group) == (m.payload, m.group)
        m.deliveries += 1
        assert msg.attempts == m.deliveries
        m.state = "leased"
        m.not_before = None
        m.deadline = self.now + int(self.visibility * SECOND)

    @precondition(lambda self: self._ids("leased"))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        message_id = data.draw(st.sampled_from(self._ids("leased")))
        m = self.msgs[message_id]
        if m.deadline <= self.now:
            return  # its lease may be gone (the queue notices at the next take)
        self.q.ack(message_id)
        m.state = "acked"

    @precondition(lambda self: self._ids("leased"))
    @rule(data=st.data(), delay=st.sampled_from([None, None, 3.0]))
    def nack(self, data: st.DataObject, delay: float | None) -> None:
        if (lease := self._live_lease(data)) is None:
            return
        message_id, m = lease
        self.q.nack(message_id, "model", delay=delay)
        m.state = "available"
        m.not_before = self.now + (int(delay * SECOND) if delay else policy_ns(m.deliveries))

    @precondition(lambda self: self._ids("leased"))
    @rule(data=st.data(), delay=st.sampled_from([None, 4.0]))
    def release(self, data: st.DataObject, delay: float | None) -> None:
        if (lease := self._live_lease(data)) is None:
            return
        message_id, m = lease
        self.q.release(message_id, delay=delay)
        m.state = "available"
        m.deliveries -= 1
        if delay:
            m.not_before = self.now + int(delay * SECOND)
        elif m.deliveries:
            m.not_before = 0  # no wait, journalled: its failures were reported

    @precondition(lambda self: self._ids("leased"))
    @rule(data=st.data(), seconds=st.sampled_from([None, 50.0]))
    def touch(self, data: st.DataObject, seconds: float | None) -> None:
        if (lease := self._live_lease(data)) is None:
            return
        message_id, m = lease
        self.q.touch(message_id, seconds)
        m.deadline = self.now + int((seconds or self.visibility) * SECOND)

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 4.0, 15.0, 31.0]))
    def elapse(self, seconds: float) -> None:
        self.clock.elapse(seconds)

    @rule()
    def reopen(self) -> None:
        self.q.close()
        self.q = ledgerq.open(self.path, clock=self.clock, **self.options)
        for m in self.msgs.values():
            if m.state == "leased":
                m.state = "available"
            # A lease lost to the reopen is found at the next take (a nack or a release
            # leaves a journalled not-before behind, if only one of no wait).
            if m.state == "available" and m.deliveries and m.not_before is None:
                m.unreported = True

    # ---------------------------------------------------------------- invariants

    @invariant()
    def figures_agree(self) -> None:
        stats = self.q.stats()
        now = self.now
        available = [m for m in self.msgs.values() if m.state == "available"]
        assert stats.pending == len(available) == len(self.q)
        assert stats.in_flight == len(self._ids("leased"))
        assert stats.delayed == sum(1 for m in available if m.due() > now), stats
        assert stats.acked == len(self._ids("acked"))
        self.q._check()


SchedulingMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None
)
TestSchedulingModel = SchedulingMachine.TestCase


class SharedSchedulingMachine(SchedulingMachine):
    """The same model through a shared-mode handle (``shared=True``): the schedule lives
    in the shared journal and state page instead of one process's memory."""

    options: ClassVar[dict[str, Any]] = {**SchedulingMachine.options, "shared": True}


SharedSchedulingMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestSharedSchedulingModel = SharedSchedulingMachine.TestCase


class TwoHandleSchedulingMachine(SchedulingMachine):
    """The same model through two shared-mode handles on one clock: each rule acts
    through one of them (a lease through the handle that holds it), and both must show
    the same figures.  A handle parks what it read before its time; the other may take
    it when it falls due - its lease, nack, lost lease and release must leave the first
    handle's park behind without a trace (taken twice, counted twice).
    A timed-out lease is taken back by whichever handle looks first, its holder or
    the other: both settle it alike (its retry delay starts then).
    """

    options: ClassVar[dict[str, Any]] = {**SchedulingMachine.options, "shared": True}

    def __init__(self) -> None:
        super().__init__()
        self.handles = [self.q, ledgerq.open(self.path, clock=self.clock, **self.options)]
        self.owner: dict[int, int] = {}  # leased id -> the index of its handle

    @rule(handle=st.sampled_from([0, 1]))
    def switch(self, handle: int) -> None:
        self.q = self.handles[handle]

    def _through_owner(self, message_id: int) -> None:
        self.q = self.handles[self.owner[message_id]]

    def _live_lease(self, data: st.DataObject) -> tuple[int, Msg] | None:
        lease = super()._live_lease(data)
        if lease is not None:
            self._through_owner(lease[0])
        return lease

    @rule()
    def dequeue(self) -> None:
        before = set(self._ids("leased"))
        super().dequeue()
        for message_id in set(self._ids("leased")) - before:
            self.owner[message_id] = self.handles.index(self.q)

    @precondition(lambda self: self._ids("leased"))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        if (lease := self._live_lease(data)) is None:
            return
        self.q.ack(lease[0])
        lease[1].state = "acked"

    @rule()
    def reopen(self) -> None:
        # This handle closes (its leases lost: found at the next take, as after a
        # reopen) and opens again; the other stays open.
        index = self.handles.index(self.q)
        self.q.close()
        self.q = self.handles[index] = ledgerq.open(self.path, clock=self.clock, **self.options)
        for message_id, m in self.msgs.items():
            if m.state == "leased" and self.owner.get(message_id) == index:
                m.state = "available"
                if m.not_before is None:
                    m.unreported = True

    @invariant()
    def figures_agree(self) -> None:
        for handle in self.handles:
            self.q, current = handle, self.q
            try:
                super().figures_agree()
            finally:
                self.q = current

    def open_handles(self) -> list[ledgerq.Queue]:
        return self.handles


TwoHandleSchedulingMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestTwoHandleSchedulingModel = TwoHandleSchedulingMachine.TestCase


_PRIORITY_ORDER = {"priorities": True, "starvation_after": None}


class PrioritySchedulingMachine(SchedulingMachine):
    """The model with the priority order on (every message of one priority, no
    promotion: the order is the model's).  That order reads the log ahead of its takes,
    so a delayed message waits unparked in its column; stats must count it delayed."""

    options: ClassVar[dict[str, Any]] = {**SchedulingMachine.options, **_PRIORITY_ORDER}


PrioritySchedulingMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestPrioritySchedulingModel = PrioritySchedulingMachine.TestCase


class TwoHandlePrioritySchedulingMachine(TwoHandleSchedulingMachine):
    """Two handles with the priority order on (as above)."""

    options: ClassVar[dict[str, Any]] = {**TwoHandleSchedulingMachine.options, **_PRIORITY_ORDER}


TwoHandlePrioritySchedulingMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestTwoHandlePrioritySchedulingModel = TwoHandlePrioritySchedulingMachine.TestCase
