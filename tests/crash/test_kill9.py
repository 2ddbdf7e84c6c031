"""kill -9 in the middle of real work: what a returned call promised must still hold.

The contract: in every sync mode a returned enqueue survives a crash of the process, ids
are strictly increasing and never reused, a batch is all-or-nothing, an ack that
returned is never undone by kill -9 (every ack reaches the OS before it returns), and a
lease lost to a crash is delivered again with its attempts incremented.

A child process (``_child.py``) works on the queue and reports each call after it
returns; the parent kills it with SIGKILL after a random number of reports, reopens the
queue and compares it with what the reports promise.  The only uncertainty is the one
call the child was inside when it died, and the checks allow exactly that much.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import ledgerq
from tests._child import Child
from tests.drain import drain

from ._harness import SYNC_MODES, Spawn
from ._payload import TOKEN_STRIDE, make_item, matches

ENQUEUE_ROUNDS = 20  # per sync mode, one fresh queue each
CUMULATIVE_ROUNDS = 8  # per sync mode, all on one queue
MIXED_ROUNDS = 8  # per sync mode, all on one queue
PREFILL = 150


@dataclass
class ChildLog:
    """What a child reported, in order, and the one call it may have been inside."""

    next_token: int
    events: list[tuple[str, ...]] = field(default_factory=list)
    enqueued: dict[int, int] = field(default_factory=dict)  # id -> token
    batch: int | None = None  # size of an announced enqueue whose ids were not reported
    count: int = 0  # E, L and A reports

    def feed(self, line: str) -> None:
        kind, *rest = line.split()
        if kind == "O":  # the child is about to open the queue
            return
        if kind == "B":
            assert self.batch is None, f"a new enqueue began before the last returned: {line}"
            self.batch = int(rest[0])
            return
        self.count += 1
        if kind == "E":
            message_id, token = int(rest[0]), int(rest[1])
            assert self.batch is not None, f"ids reported without an announced call: {line}"
            assert token == self.next_token
            if self.enqueued:
                assert message_id > max(self.enqueued), f"ids not increasing: {line}"
            self.enqueued[message_id] = token
            self.next_token += 1
            self.batch -= 1
            if self.batch == 0:
                self.batch = None
        elif kind == "L":
            assert rest[3] == "1", f"the child got a message with the wrong bytes: {line}"
        elif kind != "A":
            raise AssertionError(f"unexpected report {line!r}")
        self.events.append((kind, *rest))

    @property
    def pending_tokens(self) -> range:
        """Tokens of the enqueue the child was inside when killed (maybe empty)."""
        return range(self.next_token, self.next_token + (self.batch or 0))


def run_until_killed(child: Child, log: ChildLog, reports: int) -> None:
    """Read ``reports`` E/L/A reports, SIGKILL the child, then take the reports left."""
    while log.count < reports:
        log.feed(child.line())
    for line in child.kill_and_drain():
        log.feed(line)


def start_round(
    spawn: Spawn,
    program: str,
    path: Path,
    sync: str,
    rng: random.Random,
    round_no: int,
    segment_size: int,
) -> tuple[Child, ChildLog]:
    """Start round ``round_no``'s child, its tokens from ``round_no * TOKEN_STRIDE``."""
    base = round_no * TOKEN_STRIDE
    child = spawn(
        program,
        path,
        sync=sync,
        seed=rng.randrange(1 << 32),
        token_base=base,
        segment_size=segment_size,
    )
    return child, ChildLog(base)


def open_queue(path: Path, segment_size: int) -> ledgerq.Queue:
    return ledgerq.open(path, segment_size=segment_size, max_retries=0)


def check_extras(
    extras: list[ledgerq.Message], tokens: range, after_id: int, what: str
) -> dict[int, int]:
    """Messages found beyond the reports must be the whole unreported call, or nothing.

    Returns their id -> token.
    """
    if not extras:
        return {}
    ids = [m.id for m in extras]
    assert len(tokens) > 0, f"{what}: messages {ids} were never enqueued"
    assert len(extras) == len(tokens), (
        f"{what}: a batch of {len(tokens)} was cut to {len(extras)} messages {ids} "
        "(enqueue_batch must be all-or-nothing)"
    )
    assert ids[0] > after_id, f"{what}: unreported ids {ids} not after {after_id}"
    assert ids == list(range(ids[0], ids[0] + len(ids))), f"{what}: batch ids {ids} not consecutive"
    for msg, token in zip(extras, tokens, strict=True):
        assert matches(msg, token), f"{what}: message {msg.id} has the wrong bytes"
    return dict(zip(ids, tokens, strict=True))


def check_same_messages(got: list[ledgerq.Message], expected: dict[int, int], what: str) -> None:
    ids = [m.id for m in got]
    assert ids == sorted(expected), (
        f"{what}: lost {sorted(set(expected) - set(ids))[:10]}, "
        f"unexpected {sorted(set(ids) - set(expected))[:10]}"
    )
    for msg in got:
        assert matches(msg, expected[msg.id]), f"{what}: message {msg.id} has the wrong bytes"


@pytest.mark.parametrize("sync", SYNC_MODES)
def test_returned_enqueues_survive_kill9(tmp_path: Path, spawn: Spawn, sync: str) -> None:
    rng = random.Random(f"enqueue-{sync}")
    for round_no in range(ENQUEUE_ROUNDS):
        what = f"sync={sync} round {round_no}"
        path = tmp_path / f"q{round_no}"
        segment_size = rng.choice((200, 1024, 4096))
        child, log = start_round(spawn, "enqueue", path, sync, rng, round_no, segment_size)
        run_until_killed(child, log, rng.randrange(1, 300))

        with open_queue(path, segment_size) as q:
            assert q.stats().corrupt_skipped == 0, f"{what}: kill -9 cannot corrupt entries"
            got = drain(q)
        ids = [m.id for m in got]
        assert ids == sorted(set(ids)), f"{what}: ids not strictly increasing: {ids}"
        assert all(m.attempts == 1 for m in got), what
        returned = [m for m in got if m.id in log.enqueued]
        check_same_messages(returned, log.enqueued, what)
        extras = [m for m in got if m.id not in log.enqueued]
        check_extras(extras, log.pending_tokens, max(log.enqueued), what)

        # Every id the reopened queue hands out is new.
        with open_queue(path, segment_size) as q:
            new_id = q.enqueue(b"after the crash")
            assert new_id > max(ids), f"{what}: id {new_id} reused"
            assert [m.payload for m in drain(q)] == [b"after the crash"]


@dataclass
class Uncertain:
    """An enqueue a killed child was inside: its ids fall in (after_id, before_id)."""

    tokens: range
    after_id: int
    before_id: int | None = None


@pytest.mark.parametrize("sync", SYNC_MODES)
def test_enqueues_accumulate_across_repeated_kill9(tmp_path: Path, spawn: Spawn, sync: str) -> None:
    """One queue, killed again and again; checked only every other round, so children
    also open a queue that the previous child left after kill -9."""
    rng = random.Random(f"cumulative-{sync}")
    path = tmp_path / "q"
    segment_size = 1024
    known: dict[int, int] = {}  # id -> token of every message that must be there
    uncertain: list[Uncertain] = []
    highest = 0  # highest id ever seen
    for round_no in range(CUMULATIVE_ROUNDS):
        what = f"sync={sync} round {round_no}"
        child, log = start_round(spawn, "enqueue", path, sync, rng, round_no, segment_size)
        if round_no % 3 == 2:
            # Killed as soon as it says it is opening the queue: likely inside recovery.
            assert child.line() == "O"
            run_until_killed(child, log, 0)
        else:
            run_until_killed(child, log, rng.randrange(1, 200))
        if log.enqueued:
            first_new = min(log.enqueued)
            assert first_new > highest, f"{what}: id {first_new} after {highest} (reused?)"
            for u in uncertain:
                if u.before_id is None:
                    u.before_id = first_new
            known.update(log.enqueued)
            highest = max(log.enqueued)
        if log.batch:
            uncertain.append(Uncertain(log.pending_tokens, highest))
        if round_no % 2 == 0 and round_no != CUMULATIVE_ROUNDS - 1:
            continue  # let the next child open the queue this one left behind

        with open_queue(path, segment_size) as q:
            got = q.peek(len(known) + 100)
            assert len(q) == len(got), what
        ids = [m.id for m in got]
        assert ids == sorted(set(ids)), f"{what}: ids not strictly increasing"
        assert all(m.attempts == 1 for m in got), what
        check_same_messages([m for m in got if m.id in known], known, what)
        extras = [m for m in got if m.id not in known]
        for u in uncertain:
            inside = [
                m
                for m in extras
                if m.id > u.after_id and (u.before_id is None or m.id < u.before_id)
            ]
            known.update(check_extras(inside, u.tokens, u.after_id, what))
        leftover = [m.id for m in extras if m.id not in known]
        assert not leftover, f"{what}: messages {leftover} were never enqueued"
        uncertain.clear()
        highest = max([highest, *ids])

    with open_queue(path, segment_size) as q:
        got = drain(q)
    check_same_messages(got, known, f"sync={sync} final drain")
    with open_queue(path, segment_size) as q:
        assert q.dequeue() is None
        assert len(q) == 0


@pytest.mark.parametrize("sync", SYNC_MODES)
def test_acks_and_leases_across_kill9(tmp_path: Path, spawn: Spawn, sync: str) -> None:
    """A child enqueues, dequeues and acks some leases; kill -9; compare with a model.

    An ack that returned before the kill is never undone (ledgerq writes every ack to
    the OS before returning, so this holds in every sync mode); a lease that was not
    acked comes back with attempts + 1.
    """
    rng = random.Random(f"mixed-{sync}")
    path = tmp_path / "q"
    segment_size = 1024
    live: dict[int, int] = {}  # id -> token of every message not acked
    deliveries: dict[int, int] = {}  # id -> deliveries so far
    acked: set[int] = set()
    with open_queue(path, segment_size) as q:
        ids = q.enqueue_batch([make_item(t) for t in range(PREFILL)])
        live.update(zip(ids, range(PREFILL), strict=True))

    for round_no in range(1, MIXED_ROUNDS + 1):
        what = f"sync={sync} round {round_no}"
        child, log = start_round(spawn, "mixed", path, sync, rng, round_no, segment_size)
        run_until_killed(child, log, rng.randrange(1, 150))

        # Replay the reports against the model.
        leased_now: set[int] = set()
        ack_in_flight: int | None = None
        for kind, *rest in log.events:
            message_id = int(rest[0])
            if kind == "E":
                live[message_id] = int(rest[1])
            elif kind == "L":
                attempts, token, intent = int(rest[1]), int(rest[2]), rest[4]
                assert message_id not in acked, f"{what}: acked message {message_id} redelivered"
                assert live.get(message_id) == token, f"{what}: lease of unknown {message_id}"
                want = deliveries.get(message_id, 0) + 1
                assert attempts == want, (
                    f"{what}: message {message_id} delivered with attempts {attempts}, "
                    f"expected {want}"
                )
                deliveries[message_id] = attempts
                leased_now.add(message_id)
                ack_in_flight = message_id if intent == "ack" else None
            else:  # "A"
                assert ack_in_flight == message_id
                ack_in_flight = None
                acked.add(message_id)
                del live[message_id]
                deliveries.pop(message_id, None)
        if log.batch:
            ack_in_flight = None  # the child was inside an enqueue, not an ack

        with open_queue(path, segment_size) as q:
            got = q.peek(len(live) + 100)
            assert len(q) == len(got), f"{what}: len() disagrees with peek()"
            assert q.stats().in_flight == 0, what
        ids = [m.id for m in got]
        assert ids == sorted(set(ids)), f"{what}: ids not in order"
        redelivered = sorted(set(ids) & acked)
        assert not redelivered, f"{what}: acked messages {redelivered} came back"
        if ack_in_flight is not None and ack_in_flight not in ids:
            acked.add(ack_in_flight)  # the ack reached the OS before the kill
            del live[ack_in_flight]
            deliveries.pop(ack_in_flight, None)
        check_same_messages([m for m in got if m.id in live], live, what)
        extras = [m for m in got if m.id not in live]
        after = max(live) if live else 0
        new = check_extras(extras, log.pending_tokens, after, what)
        live.update(new)

        # Attempts: one more than the deliveries so far.  The exception is the message
        # a dequeue in flight had leased (its lease reached the OS, the report did not):
        # the first one this child had not leased yet.
        in_flight_target = next((i for i in ids if i not in leased_now), None)
        for msg in got:
            want = deliveries.get(msg.id, 0) + 1
            if msg.attempts == want + 1 and msg.id == in_flight_target and not log.batch:
                want += 1
            assert msg.attempts == want, (
                f"{what}: message {msg.id} would be delivered with attempts {msg.attempts}, "
                f"expected {want}"
            )
            deliveries[msg.id] = want - 1

    with open_queue(path, segment_size) as q:
        final = drain(q)
        assert len(q) == 0
    check_same_messages(final, live, f"sync={sync} final drain")
    for msg in final:
        assert msg.attempts == deliveries.get(msg.id, 0) + 1, f"message {msg.id}"
    with open_queue(path, segment_size) as q:
        assert q.dequeue() is None


def test_enqueued_counter_survives_kill9(tmp_path: Path, spawn: Spawn) -> None:
    """stats().enqueued counts messages, not ids skipped over after a crash."""
    path = tmp_path / "q"
    child = spawn("enqueue", path, sync="never", seed=7, segment_size=4096)
    log = ChildLog(0)
    run_until_killed(child, log, 50)
    with open_queue(path, 4096) as q:
        present = len(q.peek(1000))
        assert present >= len(log.enqueued)
        assert q.stats().enqueued == present
    with open_queue(path, 4096) as q:
        assert q.stats().enqueued == present
