"""The parent's model of a tortured queue, built from the children's side logs.

Every report line of a child (see ``_child.py``) is checked against the model as it is
read - ids strictly increasing, leases only of live messages with the right attempt,
DLQ moves exactly when ``max_retries`` says, dedup hits returning the original id - and
then applied to it.  After a kill the one operation the child was inside is kept as
*uncertain*; :meth:`Model.reconcile` compares the reopened queue with the model,
allowing exactly what that operation may or may not have done, and then adopts what it
finds.

The invariants (the library's promises for kill -9, in every sync mode):

* a returned enqueue is never lost: each live message is in the main queue, or in the
  DLQ (possibly both only after a kill in the middle of that move);
* an acked message is never delivered again; a DLQ message settled by ``requeue_dlq``
  never comes back;
* ids are strictly increasing and never reused; a batch is all-or-nothing;
* attempts = deliveries so far + 1, where a lease lost to a crash counts as a
  delivery; no message is delivered more than ``max_retries`` times, and after that
  many failed deliveries (nacks or lost leases) it moves to the DLQ with the right
  ``dlq.*`` headers;
* a ``dedup_id`` seen (returned) inside the window is answered with the original id;
* the bytes (payload, headers, priority, TTL) of every message are the ones enqueued.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import ledgerq
from tests.torture._payload import make, matches, mismatch, token_of

__all__ = ["InFlight", "Model", "ModelError"]

LIVE, ACKED, DEAD, SETTLED = "live", "acked", "dead", "settled"
_LOST_LEASE = "lease_lost"
# A move finished by the next taker of a message whose nacker was killed before it.
_NACK_UNFINISHED = "nacked_(the_move_here"


class ModelError(AssertionError):
    """The queue broke one of its promises (or the side log is inconsistent)."""


@dataclass
class MainMsg:
    token: int
    deliveries: int = 0
    state: str = LIVE
    moved: bool = False  # written by requeue_dlq: the DLQ round trip drops the TTL


@dataclass
class DlqMsg:
    token: int
    orig: int
    state: str = LIVE


@dataclass
class InFlight:
    """An operation a child started: its ``B`` line and the reports that followed."""

    op: str
    args: list[str]
    lines: list[tuple[str, list[str]]] = field(default_factory=list)

    def reported(self, kind: str) -> list[list[str]]:
        return [rest for k, rest in self.lines if k == kind]


class Model:
    """What a queue must hold, given every report of every child so far."""

    def __init__(self, max_retries: int, *, where: str = "") -> None:
        self.max_retries = max_retries
        self.where = where
        self.main: dict[int, MainMsg] = {}
        self.dlq: dict[int, DlqMsg] = {}
        self.keys: dict[str, int] = {}  # dedup id -> the id it was first returned with
        # Dedup ids of messages found after a kill inside their enqueue: the dedup record
        # is written after the message, so the kill may have kept the message and lost
        # the record (documented: one retry may get through).
        self.maybe_keys: dict[str, int] = {}
        self.highest = 0
        self.highest_dlq = 0
        self.dup_ok: set[int] = set()  # tokens a kill mid-move may have left twice
        self.leased: dict[int, int] = {}  # id -> attempt, in the running child
        self.op: InFlight | None = None
        self.uncertain: list[InFlight] = []
        self.counts: Counter[str] = Counter()
        self.line = ""

    def fail(self, message: str) -> ModelError:
        return ModelError(f"{self.where}: {message} (at report {self.line!r})")

    def require(self, condition: bool, message: str) -> None:
        if not condition:
            raise self.fail(message)

    # ------------------------------------------------------------------ side log

    def start_child(self) -> None:
        """A new child: no leases held."""
        self.leased = {}
        self.op = None

    def killed(self) -> None:
        """The child died: the operation it was inside is uncertain; its leases are lost."""
        if self.op is not None:
            self.uncertain.append(self.op)
            self.counts[f"killed_in_{self.op.op}"] += 1
        self.op = None
        self.leased = {}

    def feed(self, line: str) -> None:
        """Check one report line against the model and apply it."""
        self.line = line
        kind, *rest = line.split(" ")
        if kind in ("O", "P"):
            return
        if kind == "B":
            self.require(self.op is None, "an operation began before the last one returned")
            self.op = InFlight(rest[0], rest[1:])
            return
        op = self.op
        self.require(op is not None, "a report outside any operation")
        assert op is not None
        if kind == "Z":
            self._finish(op)
            self.op = None
            return
        op.lines.append((kind, rest))
        handler = getattr(self, f"_on_{kind}", None)
        self.require(handler is not None, f"unknown report {kind!r}")
        handler(op, *rest)

    def _finish(self, op: InFlight) -> None:
        self.counts[f"op_{op.op}"] += 1
        if op.op == "reopen":
            self.leased = {}  # a clean close drops leases: each is a failed delivery
        elif op.op == "requeue":
            settled = {int(rest[0]) for rest in op.reported("S")}
            if op.args[0] == "all":
                wanted = {i for i, d in self.dlq.items() if d.state == LIVE} | settled
            else:
                wanted = {int(i) for i in op.args[0].split(",")}
            self.require(
                settled == wanted,
                f"requeue_dlq({op.args[0]}) settled DLQ ids {sorted(settled)}, "
                f"expected {sorted(wanted)}",
            )

    def _announced_tokens(self, op: InFlight) -> dict[int, str | None]:
        """Tokens an enq/batch operation was asked to write, with their dedup ids."""
        if op.op == "enq":
            return {int(op.args[0]): None if op.args[1] == "-" else op.args[1]}
        if op.op == "batch":
            first, n = int(op.args[0]), int(op.args[1])
            keys = [None if k == "-" else k for k in op.args[2].split(",")]
            return {first + i: keys[i] for i in range(n)}
        return {}

    def _on_E(self, op: InFlight, sid: str, stoken: str, fresh: str, key: str) -> None:
        message_id, token = int(sid), int(stoken)
        self.counts["enqueued"] += fresh == "fresh"
        self.counts["dedup_hits"] += fresh == "dup"
        if op.op in ("enq", "batch"):
            self.require(token in self._announced_tokens(op), f"enqueue of unannounced {token}")
        else:
            self.require(op.op == "requeue", f"an enqueue inside {op.op}")
            live_tokens = {d.token for d in self.dlq.values() if d.state == LIVE}
            self.require(token in live_tokens, f"requeue_dlq wrote {token}, not in the DLQ")
        if fresh == "fresh":
            self.require(
                message_id > self.highest,
                f"id {message_id} returned after id {self.highest} (ids must strictly "
                "increase and never be reused)",
            )
            if key != "-":
                self.maybe_keys.pop(key, None)
                self.require(
                    key not in self.keys,
                    f"dedup id {key!r} was returned as id {self.keys.get(key)} and is inside "
                    f"its window, but a new message {message_id} was written for it",
                )
                self.keys[key] = message_id
            self.main[message_id] = MainMsg(token, moved=op.op == "requeue")
            self.highest = message_id
        else:
            self.require(key != "-", f"id {message_id} reported as a duplicate without a key")
            if key in self.keys:
                self.require(
                    self.keys[key] == message_id,
                    f"dedup id {key!r} answered with {message_id}, first returned as "
                    f"{self.keys[key]}",
                )
            elif key in self.maybe_keys:
                self.require(
                    self.maybe_keys.pop(key) == message_id,
                    f"dedup id {key!r} answered with {message_id}, not the id it was "
                    "written with before the kill",
                )
                self.keys[key] = message_id
            else:
                # The original was written by an enqueue killed before it reported.
                self.keys[key] = message_id

    def _on_L(self, op: InFlight, sid: str, sattempt: str, stoken: str, ttl: str) -> None:
        message_id, attempt, token = int(sid), int(sattempt), int(stoken)
        self.counts["leased"] += 1
        self.require(op.op == "deq", f"a lease inside {op.op}")
        msg = self.main.get(message_id)
        self.require(msg is not None, f"leased unknown message {message_id}")
        assert msg is not None
        has_ttl = make(token).ttl is not None and not msg.moved
        self.require(ttl == str(int(has_ttl)), f"message {message_id} lost or gained its TTL")
        self.require(msg.token == token, f"message {message_id} carries {token}, not {msg.token}")
        self.require(msg.state != ACKED, f"acked message {message_id} was delivered again")
        self.require(msg.state != DEAD, f"dead-lettered message {message_id} was delivered")
        self.require(message_id not in self.leased, f"message {message_id} leased twice")
        self.require(
            attempt == msg.deliveries + 1,
            f"message {message_id} delivered with attempts={attempt} after "
            f"{msg.deliveries} deliveries",
        )
        self.require(
            attempt <= self.max_retries,
            f"message {message_id} delivered a {attempt}th time with max_retries="
            f"{self.max_retries} (it belongs in the DLQ)",
        )
        msg.deliveries = attempt
        self.leased[message_id] = attempt

    def _on_A(self, op: InFlight, sid: str) -> None:
        message_id = int(sid)
        self.require(message_id in self.leased, f"ack of {message_id} that is not leased")
        del self.leased[message_id]
        self.main[message_id].state = ACKED
        self.counts["acked"] += 1

    def _on_N(self, op: InFlight, sid: str) -> None:
        message_id = int(sid)
        self.require(message_id in self.leased, f"nack of {message_id} that is not leased")
        attempt = self.leased.pop(message_id)
        moved = any(int(rest[1]) == message_id for rest in op.reported("D"))
        expected = attempt >= self.max_retries
        self.require(
            moved == expected,
            f"nack of {message_id} at attempt {attempt} (max_retries={self.max_retries}) "
            f"{'moved' if moved else 'did not move'} it to the DLQ",
        )
        self.counts["nacked"] += 1

    def _on_D(
        self, op: InFlight, sdlq: str, sorig: str, stoken: str, sretries: str, reason: str
    ) -> None:
        dlq_id, orig, token, retries = int(sdlq), int(sorig), int(stoken), int(sretries)
        self.counts["dead_lettered"] += 1
        self.require(dlq_id > self.highest_dlq, f"DLQ id {dlq_id} after {self.highest_dlq}")
        msg = self.main.get(orig)
        self.require(msg is not None, f"unknown message {orig} moved to the DLQ")
        assert msg is not None
        self.require(msg.token == token, f"DLQ copy of {orig} carries {token}, not {msg.token}")
        self.require(msg.state == LIVE, f"{msg.state} message {orig} moved to the DLQ")
        self.require(
            retries == msg.deliveries and retries >= self.max_retries,
            f"message {orig} moved to the DLQ with dlq.retry_count={retries} after "
            f"{msg.deliveries} deliveries (max_retries={self.max_retries})",
        )
        if op.op == "nack":
            self.require(
                reason == f"nack:{orig}:{op.args[1]}" and int(op.args[0]) == orig,
                f"DLQ move of {orig} inside nack({op.args[0]}) has reason {reason!r}",
            )
        else:
            self.require(
                op.op == "deq"
                and reason.startswith((_LOST_LEASE, _NACK_UNFINISHED))
                and orig not in self.leased,
                f"DLQ move of {orig} inside {op.op} with reason {reason!r}",
            )
        msg.state = DEAD
        self.dlq[dlq_id] = DlqMsg(token, orig)
        self.highest_dlq = dlq_id

    def _on_S(self, op: InFlight, sdlq: str, settled: str) -> None:
        dlq_id = int(sdlq)
        self.require(op.op == "requeue", f"a DLQ settle inside {op.op}")
        entry = self.dlq.get(dlq_id)
        self.require(entry is not None, f"requeue_dlq settled unknown DLQ id {dlq_id}")
        assert entry is not None
        self.require(settled == "1" and entry.state == LIVE, f"DLQ id {dlq_id} settled twice")
        # requeue_dlq writes a batch of copies, then settles each of them in the DLQ.
        enqueued = {int(rest[1]) for rest in op.reported("E")}
        self.require(
            entry.token in enqueued,
            f"DLQ id {dlq_id} settled before its message was written to the main queue",
        )
        entry.state = SETTLED
        self.counts["requeued"] += 1

    # ------------------------------------------------------------------ reopened queue

    def reconcile(self, main: list[ledgerq.Message], dlq: list[ledgerq.Message]) -> None:
        """Compare what a reopened queue holds with the model; then adopt it."""
        self.line = "<reopened queue>"
        new_tokens: dict[int, str | None] = {}
        requeue_tokens: Counter[int] = Counter()
        maybe_acked: set[int] = set()
        maybe_dead: set[int] = set()
        maybe_settled: set[int] = set()
        extra_leases = 0
        batches: list[InFlight] = []
        moving: set[int] = set()  # tokens of messages whose move was in flight
        for op in self.uncertain:
            announced = self._announced_tokens(op)
            written = {int(rest[1]) for rest in op.reported("E")}
            new_tokens.update({t: k for t, k in announced.items() if t not in written})
            if op.op == "batch" and not written:
                batches.append(op)
            if op.op == "ack":
                maybe_acked.add(int(op.args[0]))
            if op.op == "nack" and int(op.args[1]) >= self.max_retries:
                maybe_dead.add(int(op.args[0]))
            if op.op == "deq":
                extra_leases += int(op.args[0]) - len(op.reported("L"))
                maybe_dead.update(
                    i
                    for i, m in self.main.items()
                    if m.state == LIVE and m.deliveries >= self.max_retries
                )
            maybe_dead.update(int(rest[1]) for rest in op.reported("D"))
            if op.op == "requeue":
                live = {i: d for i, d in self.dlq.items() if d.state == LIVE}
                wanted = (
                    set(live) if op.args[0] == "all" else {int(i) for i in op.args[0].split(",")}
                )
                maybe_settled.update(wanted & set(live))
                requeue_tokens.update(live[i].token for i in wanted & set(live))
                # A message written to the main queue whose DLQ copy was not settled yet.
                settled_tokens = {self.dlq[int(r[0])].token for r in op.reported("S")}
                for rest in op.reported("E"):
                    if int(rest[1]) not in settled_tokens:
                        moving.add(int(rest[1]))
        moving.update(self.main[i].token for i in maybe_dead if i in self.main)
        moving.update(requeue_tokens)

        seen: Counter[int] = Counter()
        observed_main: dict[int, ledgerq.Message] = {}
        adopted: dict[int, int] = {}  # token -> new id
        for msg in main:
            self.require(msg.id not in observed_main, f"message {msg.id} present twice")
            observed_main[msg.id] = msg
            token = token_of(msg.payload)
            seen[token] += 1
            known = self.main.get(msg.id)
            moved = known.moved if known is not None else token not in new_tokens
            self.require(
                matches(msg, token, moved=moved), f"message {msg.id}: {mismatch(msg, token)}"
            )
            if known is None:
                self.require(
                    msg.id > self.highest,
                    f"unknown message {msg.id} (token {token}) at or below the highest "
                    f"returned id {self.highest}",
                )
                if token in new_tokens and token not in adopted:
                    adopted[token] = msg.id
                elif requeue_tokens[token] > 0:
                    requeue_tokens[token] -= 1
                else:
                    raise self.fail(f"message {msg.id} (token {token}) was never enqueued")
                self.require(msg.attempts == 1, f"new message {msg.id} has attempts={msg.attempts}")
                continue
            self.require(
                known.token == token, f"message {msg.id} carries {token}, not {known.token}"
            )
            if known.state == ACKED:
                self.require(
                    msg.id in maybe_acked, f"acked message {msg.id} is pending again after a kill"
                )
            if known.state == DEAD:
                self.require(
                    msg.id in maybe_dead,
                    f"message {msg.id} moved to the DLQ is still in the main queue",
                )
            want = known.deliveries + 1
            if msg.attempts == want + 1 and extra_leases > 0:
                extra_leases -= 1  # a lease written by the dequeue the kill interrupted
            else:
                self.require(
                    msg.attempts == want,
                    f"message {msg.id} shows attempts={msg.attempts} after "
                    f"{known.deliveries} deliveries",
                )
        # A batch is all-or-nothing (its items whose dedup id is already known excepted).
        for op in batches:
            announced = self._announced_tokens(op)
            keys_in_batch: set[str] = set()
            required, forbidden = set(), set()
            for token, key in announced.items():
                if key is not None and (key in self.keys or key in keys_in_batch):
                    forbidden.add(token)  # a duplicate: must not have been written
                elif key is None or key not in self.maybe_keys:
                    required.add(token)  # (a key in maybe_keys may or may not hit)
                if key is not None:
                    keys_in_batch.add(key)
            found = {t for t in announced if t in adopted}
            self.require(
                not found & forbidden,
                f"batch of tokens {sorted(announced)} wrote {sorted(found & forbidden)}, "
                "whose dedup ids were already taken",
            )
            self.require(
                not found or required <= found,
                f"batch of tokens {sorted(announced)} was cut to {sorted(found)} "
                "(enqueue_batch is all-or-nothing)",
            )

        observed_dlq: dict[int, ledgerq.Message] = {}
        for msg in dlq:
            observed_dlq[msg.id] = msg
            token = token_of(msg.payload)
            self.require(
                matches(msg, token, moved=True), f"DLQ message {msg.id}: {mismatch(msg, token)}"
            )
            seen[token] += 1
            orig = int(msg.headers.get("dlq.original_id", "0"))
            retries = int(msg.headers.get("dlq.retry_count", "-1"))
            self.require(
                retries >= self.max_retries,
                f"DLQ message {msg.id} has dlq.retry_count={retries}",
            )
            known_dlq = self.dlq.get(msg.id)
            if known_dlq is None:
                self.require(msg.id > self.highest_dlq, f"unknown DLQ message {msg.id}")
                self.require(
                    orig in maybe_dead and self.main[orig].token == token,
                    f"DLQ message {msg.id} (original id {orig}) was never moved there",
                )
                continue
            self.require(
                known_dlq.token == token and known_dlq.orig == orig,
                f"DLQ message {msg.id} is not the copy of {known_dlq.orig}",
            )
            self.require(
                known_dlq.state != SETTLED,
                f"DLQ message {msg.id} came back after requeue_dlq settled it",
            )

        # Nothing lost: every live message is somewhere.
        dlq_origs = {int(m.headers.get("dlq.original_id", "0")) for m in dlq}
        for message_id, known in self.main.items():
            if known.state != LIVE or message_id in observed_main:
                continue
            if message_id in maybe_acked:
                continue
            self.require(
                message_id in maybe_dead and message_id in dlq_origs,
                f"message {message_id} (token {known.token}, {known.deliveries} deliveries) "
                "was LOST: in neither the main queue nor the DLQ",
            )
        for dlq_id, known_dlq in self.dlq.items():
            if known_dlq.state != LIVE or dlq_id in observed_dlq:
                continue
            self.require(
                dlq_id in maybe_settled and seen[known_dlq.token] > 0,
                f"DLQ message {dlq_id} (token {known_dlq.token}) was LOST",
            )
        for token, n in seen.items():
            if n > 1:
                self.require(
                    token in self.dup_ok or token in moving,
                    f"token {token} is present {n} times without a kill in the middle of a move",
                )
                self.dup_ok.add(token)

        self._adopt(observed_main, observed_dlq, adopted, new_tokens)
        self.uncertain = []

    def _adopt(
        self,
        observed_main: dict[int, ledgerq.Message],
        observed_dlq: dict[int, ledgerq.Message],
        adopted: dict[int, int],
        new_tokens: dict[int, str | None],
    ) -> None:
        for message_id, known in self.main.items():
            msg = observed_main.get(message_id)
            if msg is not None:
                known.state = LIVE
                known.deliveries = msg.attempts - 1
            elif known.state == LIVE:
                known.state = DEAD if message_id in self._dlq_origs(observed_dlq) else ACKED
        for message_id, msg in observed_main.items():
            if message_id not in self.main:
                token = token_of(msg.payload)
                self.main[message_id] = MainMsg(token, moved=adopted.get(token) != message_id)
                key = new_tokens.get(token)
                if key is not None and adopted.get(token) == message_id and key not in self.keys:
                    self.maybe_keys.setdefault(key, message_id)
                self.highest = max(self.highest, message_id)
                self.counts["adopted"] += 1
        for dlq_id, known_dlq in self.dlq.items():
            if dlq_id not in observed_dlq and known_dlq.state == LIVE:
                known_dlq.state = SETTLED
        for dlq_id, msg in observed_dlq.items():
            if dlq_id not in self.dlq:
                orig = int(msg.headers["dlq.original_id"])
                self.dlq[dlq_id] = DlqMsg(token_of(msg.payload), orig)
                self.highest_dlq = max(self.highest_dlq, dlq_id)
                self.counts["adopted_dlq"] += 1

    @staticmethod
    def _dlq_origs(observed_dlq: dict[int, ledgerq.Message]) -> set[int]:
        return {int(m.headers["dlq.original_id"]) for m in observed_dlq.values()}

    # ------------------------------------------------------------------ the end

    def check_drain(self, delivered: list[ledgerq.Message], dlq: list[ledgerq.Message]) -> None:
        """After a final reopen: dequeue+ack of everything, then the DLQ's content."""
        self.line = "<final drain>"
        live = {i for i, m in self.main.items() if m.state == LIVE}
        got = set()
        for msg in delivered:
            known = self.main.get(msg.id)
            self.require(known is not None and known.state == LIVE, f"drain got {msg.id}")
            assert known is not None
            self.require(
                matches(msg, known.token, moved=known.moved), f"drained {msg.id}: wrong bytes"
            )
            self.require(msg.attempts == known.deliveries + 1, f"drained {msg.id} attempts")
            self.require(msg.attempts <= self.max_retries, f"drained {msg.id} too often")
            self.require(msg.id not in got, f"drain delivered {msg.id} twice")
            got.add(msg.id)
        moved = live - got
        for message_id in moved:
            self.require(
                self.main[message_id].deliveries >= self.max_retries,
                f"message {message_id} was neither delivered nor dead-lettered by the drain",
            )
        live_dlq = {i for i, d in self.dlq.items() if d.state == LIVE}
        new_origs: Counter[int] = Counter()
        for msg in dlq:
            if msg.id in self.dlq:
                self.require(msg.id in live_dlq, f"settled DLQ message {msg.id} came back")
                live_dlq.discard(msg.id)
            else:
                orig = int(msg.headers["dlq.original_id"])
                self.require(orig in moved, f"DLQ message {msg.id} of {orig} unexpected")
                new_origs[orig] += 1
        self.require(not live_dlq, f"DLQ messages {sorted(live_dlq)} were lost")
        self.require(
            set(new_origs) == moved and all(n == 1 for n in new_origs.values()),
            f"drain moved {sorted(moved)} but the DLQ gained copies of {dict(new_origs)}",
        )
