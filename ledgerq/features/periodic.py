"""Periodic jobs: ``q.add_periodic(name, payload, every=|cron=)`` enqueues a message on
every tick of a schedule, exactly once per tick whatever number of handles have the
queue open.

A schedule's ticks are ``anchor + k * every`` (k >= 1; the anchor is the time it was
added) or the minutes its cron expression matches (UTC, core/cron.py).  A tick is
*fired* - its message enqueued - by whichever handle first finds it due: at open, on a
dequeue (or a wait for one: the wait ends at the next tick), and in shared mode by the
process's housekeeper every 0.25 s.  Only the latest due tick is fired: ticks missed
while no handle had the queue open (or while none looked) give one message, for the
latest of them, not one each.

State.  ``features/periodic.log`` (segment/naming.PERIODIC_NAME; framed msgpack
records, format/feature_state.py, spec in docs/format.md; its protocol - loading,
damage, the version upgrade, shared mode - is segment/feature_log.py's) holds ADD records (a
schedule, its payload and headers - sealed on an encrypted queue - and, in a rewrite,
its last tick), REMOVE records, FIRE records ``[revision, tick, id, timestamp]`` and
DONE records ``[revision, tick]``.  The file is created by the first ``add_periodic``:
a queue without periodic jobs has none, reads nothing and does no work on any call.

Exactly once.  A fire is an append (one message, built as a :class:`Draft`, with this
feature's hooks registered for that append only: ``_FireHooks``) whose admission -
under the queue lock, and in shared mode under the append lock after
reading the other handles' records (``catch_up``) - checks that the tick is still due.
``before_append`` writes the FIRE record *before* the message and ``appended`` the DONE
record after it, all under that lock.  So two handles firing the same tick write it
once (the second finds it fired), and a kill -9 never leaves a message without its
record.  A FIRE record without its DONE (the writer died between them) is checked
against the log by the next handle that fires (under the append lock, where a dead
appender's whole messages are kept, and before any later fire): its message is there
with the record's id, timestamp and ``periodic.*`` headers - fired, and a DONE is
written - or it is not: never written, and the tick is due again.  (The one case this
gets wrong: the dead writer's message taken, acked and its segment deleted by another
process in the instant before that check - it is then fired again: docs/usage.md.)

Why not unique keys (``enqueue(..., unique_key=)``) for this: a unique key frees once
its message is acked, so a late second firer would enqueue the tick again; the FIRE
record, decided under the append lock, is what a late firer finds, and it makes a key
redundant.

The file is rewritten (temp file, rename; the others read it again whole) as ADD
records holding each schedule's last tick when it holds 64 records more than four per
schedule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import msgpack

from ledgerq._errors import CorruptionError, LedgerQError, QueueFullError
from ledgerq._types import PeriodicJob, Priority
from ledgerq.core.cron import CronSchedule
from ledgerq.core.feature import Draft, Feature, FeatureWithLog
from ledgerq.format.entry import encode_headers
from ledgerq.format.feature_state import encode_feature_record
from ledgerq.format.sealing import EntrySealer
from ledgerq.segment.feature_log import FeatureLog, read_feature_values
from ledgerq.segment.files import StorageError
from ledgerq.segment.naming import PERIODIC_NAME, feature_log_path

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["NAME_HEADER", "PERIODIC_MAGIC", "TICK_HEADER", "PeriodicFeature", "read_jobs"]

logger = logging.getLogger("ledgerq")

PERIODIC_MAGIC = b"LQPJ"
NAME_HEADER = "periodic.name"  # headers every fired message carries
TICK_HEADER = "periodic.tick"
ADD, REMOVE, FIRE, DONE = 1, 2, 3, 4  # the record kinds (a record's first value)
_REWRITE_SLACK = 64
_SEAL_PREFIX = b"periodic:"  # associated data of a sealed body: the schedule's name follows


class _NotDue(Exception):
    """Raised by admit: the tick being fired is not due any more (another handle fired
    it, or the schedule was removed or replaced meanwhile); nothing is written."""


@dataclasses.dataclass(slots=True, eq=False)
class _Schedule:
    """One periodic job, as the file says (mutable: its last tick moves)."""

    name: str
    revision: int
    every_ns: int
    cron: CronSchedule | None
    anchor_ns: int
    priority: int
    headers: dict[str, str] | None
    payload: bytes
    fired_ns: int | None  # the last tick fired (a message written), or None
    # A FIRE record read back and not yet verified: (tick, id, timestamp, the last tick
    # before it).  While there is one the schedule counts as due, so that the next fire
    # verifies it under the append lock.
    pending: tuple[int, int, int, int | None] | None = None

    def next_run_ns(self) -> int:
        """The tick the next message is for (a pending record's own tick: due)."""
        if self.pending is not None:
            return self.pending[0]
        base = self.anchor_ns if self.fired_ns is None else self.fired_ns
        if self.cron is None:
            return base + self.every_ns
        return self.cron.next_after(base)

    def due_tick(self, now_ns: int) -> int | None:
        """The latest tick at or before ``now_ns`` if one is due, else None (verified)."""
        assert self.pending is None
        if now_ns < self.next_run_ns():
            return None
        if self.cron is None:
            return self.anchor_ns + (now_ns - self.anchor_ns) // self.every_ns * self.every_ns
        return self.cron.last_at_or_before(now_ns)

    def job(self) -> PeriodicJob:
        """The public view (a pending record's tick shown as fired: it almost surely is)."""
        last = self.fired_ns if self.pending is None else self.pending[0]
        return PeriodicJob(
            name=self.name,
            every=self.every_ns / 1e9 if self.cron is None else None,
            cron=None if self.cron is None else self.cron.text,
            next_run_ns=self._after(last),
            last_run_ns=last,
            payload=self.payload,
            headers=dict(self.headers or {}),
            priority=Priority(self.priority),
        )

    def _after(self, tick: int | None) -> int:
        """The first tick after ``tick`` (None: after the anchor)."""
        base = self.anchor_ns if tick is None else tick
        return base + self.every_ns if self.cron is None else self.cron.next_after(base)


def _exact(value: Any, *types: type) -> bool:
    """Whether ``value`` is a list whose items have exactly ``types`` (hostile files)."""
    return (
        type(value) is list
        and len(value) == len(types)
        and all(type(v) is t for v, t in zip(value, types, strict=True))
    )


class PeriodicFeature(FeatureWithLog):
    """Durable periodic jobs (always on; costs nothing until the first add_periodic)."""

    name = "periodic"

    def __init__(self) -> None:
        self._queue: QueueCore | None = None
        self._sealer: EntrySealer | None = None
        self._detached = False  # read_jobs: a file read without the queue (nor its key)
        self._schedules: dict[str, _Schedule] = {}
        self._by_revision: dict[int, _Schedule] = {}
        self._revision = 0  # the largest revision the file has used
        # The fire under way: (its draft, the schedule's name, its revision).
        self._firing: tuple[Draft, str, int] | None = None
        self._fire_lock = threading.Lock()  # one fire at a time in this handle
        self._provisional: tuple[_Schedule, int, int, int] | None = None
        # The enqueue hooks of a fire, registered with the queue only while it fires.
        self._hooks = _FireHooks(self)

    def attach(self, queue: QueueCore) -> None:
        # Nothing is read here: opened() loads the file, under the locks, if it exists.
        self._queue = queue
        self._sealer = queue._sealer
        path = feature_log_path(queue.path, PERIODIC_NAME)
        self._log = FeatureLog(path, PERIODIC_MAGIC, "periodic jobs", queue, self)
        queue.set_timer(self)

    # ------------------------------------------------------------------ the file

    def _seal(self, name: str, headers: dict[str, str] | None, payload: bytes) -> bytes:
        body: bytes = msgpack.packb([headers, payload], use_bin_type=True)
        sealer = self._sealer
        if sealer is None:
            return body
        return sealer.seal(_SEAL_PREFIX + name.encode(), body)

    def _unseal(self, name: str, body: bytes) -> tuple[dict[str, str] | None, bytes] | None:
        sealer = self._sealer
        try:
            if sealer is not None:
                body = sealer.unseal(_SEAL_PREFIX + name.encode(), body)
            value = msgpack.unpackb(body, raw=False)
        except Exception:  # a bad seal (CorruptRecord) or body: the schedule is skipped
            return None
        if type(value) is not list or len(value) != 2 or type(value[1]) is not bytes:
            return None
        headers = value[0]
        if headers is not None and not (
            type(headers) is dict
            and all(type(k) is str and type(v) is str for k, v in headers.items())
        ):
            return None
        return headers, value[1]

    def _add_record(self, sched: _Schedule, *, with_last: bool) -> bytes:
        cron = "" if sched.cron is None else sched.cron.text
        fired = sched.fired_ns if with_last and sched.fired_ns is not None else -1
        return encode_feature_record(
            [
                ADD,
                sched.revision,
                sched.name,
                sched.every_ns,
                cron,
                sched.anchor_ns,
                sched.priority,
                self._seal(sched.name, sched.headers, sched.payload),
                fired,
            ]
        )

    def apply_record(self, value: Any) -> bool:
        """Apply one record read back; False if it is not one this library writes."""
        if type(value) is not list or not value or type(value[0]) is not int:
            return False
        kind = value[0]
        if kind == ADD and _exact(value, int, int, str, int, str, int, int, bytes, int):
            _, revision, name, every_ns, cron_text, anchor, priority, body, fired = value
            content = self._unseal(name, body)
            if content is None and self._detached:
                content = (None, b"")  # sealed (read_jobs has no key): the rest is readable
            if content is None or not 0 <= priority <= 2:
                return False
            try:
                cron = CronSchedule(cron_text) if cron_text else None
            except ValueError:
                return False
            if cron is None and every_ns <= 0:
                return False
            old = self._schedules.get(name)
            if old is not None:
                self._by_revision.pop(old.revision, None)
            sched = _Schedule(
                name,
                revision,
                every_ns,
                cron,
                anchor,
                priority,
                content[0],
                content[1],
                None if fired < 0 else fired,
            )
            self._schedules[name] = sched
            self._by_revision[revision] = sched
            self._revision = max(self._revision, revision)
            return True
        if kind == REMOVE and _exact(value, int, str):
            old = self._schedules.pop(value[1], None)
            if old is not None:
                self._by_revision.pop(old.revision, None)
            return True
        if kind == FIRE and _exact(value, int, int, int, int, int):
            _, revision, tick, message_id, timestamp = value
            fired = self._by_revision.get(revision)
            if fired is not None:
                # The last tick believed so far is the fallback if the message of this
                # record is not found (and if it is, the next tick is found from it).
                before = fired.fired_ns if fired.pending is None else fired.pending[0]
                fired.pending = (tick, message_id, timestamp, before)
            return True
        if kind == DONE and _exact(value, int, int, int):
            _, revision, tick = value
            done = self._by_revision.get(revision)
            if done is not None:
                done.fired_ns = tick
                done.pending = None
            return True
        return False

    def clear_table(self) -> None:
        self._schedules.clear()
        self._by_revision.clear()

    def table_records(self) -> Iterator[bytes]:
        """One ADD record per schedule, holding its last tick (a rewrite)."""
        for sched in self._schedules.values():
            yield self._add_record(sched, with_last=True)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """The file's lock (shared mode's append lock), for the calls outside a fire."""
        assert self._log is not None
        return self._log.locked()

    def _refresh(self, *, create: bool = False) -> FeatureLog | None:
        """Bring the schedules up to date with the file (queue lock and, in shared mode,
        the append lock held); None if there is no file (not created)."""
        log = self._log
        assert log is not None
        return log if log.current(create=create) else None

    def _verify(self, sched: _Schedule) -> None:
        """Settle a pending FIRE record: its message is in the log, or it never fired
        (queue lock and, in shared mode, the append lock with the log's tail held)."""
        pending = sched.pending
        if pending is None:
            return
        queue = self._queue
        assert queue is not None
        tick, message_id, timestamp, before = pending
        entry = queue.entry_of(message_id)
        fired = False
        if entry is not None and entry.timestamp == timestamp:
            try:
                plain, _ = queue._restore_entry(entry)
            except CorruptionError:
                pass  # skipped by every reader: as if never written
            else:
                headers = plain.headers or {}
                fired = headers.get(NAME_HEADER) == sched.name and headers.get(TICK_HEADER) == str(
                    tick
                )
        # Not in the log: never written.  (A written message is found: a FIRE record
        # without its DONE is read back before its message can have been consumed and
        # its segment deleted - at the next open, or under the append lock by a handle
        # beside the dead writer - but for a consumer in another process that takes it
        # and has its segment deleted in the instant before: docs/usage.md.)
        sched.fired_ns = tick if fired else before
        sched.pending = None
        if fired and self._log is not None:
            # Found now; said in the file, so that no later reader needs the message
            # (consumed and deleted by then).  Not found: the fire that follows says it.
            try:
                self._log.append(encode_feature_record([DONE, sched.revision, tick]))
            except StorageError as exc:
                logger.warning("ledgerq: %s; the periodic tick is checked again later", exc)

    def _sync_if_always(self, log: FeatureLog) -> None:
        """With ``sync="always"``, a record reaches the disk before what follows it: a
        FIRE record before its message's fsync, so a power loss never keeps a message
        whose tick is then fired again (one fsync per tick, not per enqueue)."""
        queue = self._queue
        assert queue is not None
        if queue._sync_always:
            log.sync()

    def _publish(self) -> None:
        """Tell the queue when the next tick is due (queue lock held)."""
        queue = self._queue
        assert queue is not None
        schedules = self._schedules
        queue.waits.timer_ns = (
            min(s.next_run_ns() for s in schedules.values()) if schedules else None
        )

    # ------------------------------------------------------------------ the API

    def add(
        self,
        name: str,
        payload: bytes,
        every_ns: int,
        cron: CronSchedule | None,
        headers: Mapping[str, str] | None,
        priority: int,
    ) -> None:
        """Add (or replace) a schedule; durable as an enqueue is (it reached the OS)."""
        queue = self._queue
        assert queue is not None
        with queue._lock:
            queue._ensure_open()
            with self._locked():
                log = self._refresh(create=True)
                assert log is not None
                now = queue._clock.now_ns()
                sched = _Schedule(
                    name,
                    self._revision + 1,
                    every_ns,
                    cron,
                    now,
                    priority,
                    None if headers is None else dict(headers),
                    payload,
                    None,
                )
                log.append(self._add_record(sched, with_last=False))
                self._sync_if_always(log)
                self._apply_new(sched)
            self._publish()

    def _apply_new(self, sched: _Schedule) -> None:
        old = self._schedules.get(sched.name)
        if old is not None:
            self._by_revision.pop(old.revision, None)
        self._schedules[sched.name] = sched
        self._by_revision[sched.revision] = sched
        self._revision = sched.revision

    def remove(self, name: str) -> bool:
        """Remove a schedule; True if there was one (durable as an enqueue is)."""
        queue = self._queue
        assert queue is not None
        with queue._lock:
            queue._ensure_open()
            with self._locked():
                log = self._refresh()
                if log is None or name not in self._schedules:
                    return False
                log.append(encode_feature_record([REMOVE, name]))
                self._sync_if_always(log)
                old = self._schedules.pop(name)
                self._by_revision.pop(old.revision, None)
            self._publish()
        return True

    def jobs(self) -> list[PeriodicJob]:
        """The schedules, by name."""
        queue = self._queue
        assert queue is not None
        with queue._lock:
            queue._ensure_open()
            with self._locked():
                self._refresh()
            self._publish()
            return [self._schedules[n].job() for n in sorted(self._schedules)]

    # ------------------------------------------------------------------ firing

    def poll(self) -> None:
        """Read the other handles' changes if the file changed, then fire what is due
        (the housekeeper, every 0.25 s; at open).  No lock when nothing changed."""
        queue, log = self._queue, self._log
        assert queue is not None
        assert log is not None
        if log.has_news():
            try:
                with queue._lock:
                    if queue._closed:
                        return
                    with self._locked():
                        self._refresh()
                    self._publish()
            except LedgerQError as exc:  # (an open must not fail for it: logged)
                logger.warning("ledgerq: reading %s failed: %s", log.path, exc)
                return
        due = queue.waits.timer_ns
        if due is not None and due <= queue._clock.now_ns():
            self.fire_due()

    def fire_due(self) -> None:
        """Fire every schedule due now, once each (no lock held by the caller).

        Another thread of this handle firing (a dequeue's, the housekeeper's) is waited
        for, not skipped: the caller's dequeue must find the tick that was due at its
        call in the log - a skip let it look before that fire had published its message
        and return nothing.  The wait ends by the call's lock budget, as the append
        lock's does.
        """
        queue = self._queue
        assert queue is not None
        if not self._fire_lock.acquire(
            timeout=max(0.0, queue._budget.deadline() - time.monotonic())
        ):
            return  # the other thread waits for a stopped process: its fire is logged
        try:
            for _ in range(len(self._schedules) + 1):
                with queue._lock:
                    if queue._closed:
                        return
                    now = queue._clock.now_ns()
                    due = [s for s in self._schedules.values() if s.next_run_ns() <= now]
                    if not due:
                        self._publish()
                        return
                    sched = min(due, key=_Schedule.next_run_ns)
                    draft = Draft(sched.payload, None, sched.priority, None, None)
                    self._firing = (draft, sched.name, sched.revision)
                try:
                    with queue.extra_hooks(self._hooks):
                        queue._append([draft], [len(sched.payload)])
                except _NotDue:
                    pass  # fired elsewhere, or changed: looked at again next round
                except QueueFullError:
                    return  # a full bounded queue: the tick stays due
                finally:
                    self._firing = None
            with queue._lock:
                self._publish()
        except LedgerQError as exc:  # a full disk, a stopped process: the next look retries
            if not queue.closed:
                logger.warning(
                    "ledgerq: firing the periodic jobs of %s failed: %s", queue.path, exc
                )
        finally:
            self._fire_lock.release()

    def hook_catch_up(self) -> None:
        if self._firing is not None and self._log is not None:
            self._log.catch_up()

    def hook_admit(self, draft: Draft, now_ns: int, candidate_id: int) -> int | None:
        firing = self._firing
        if firing is None or draft is not firing[0]:
            return None
        sched = self._schedules.get(firing[1])
        if sched is None or sched.revision != firing[2]:
            raise _NotDue
        self._verify(sched)
        tick = sched.due_tick(now_ns)
        if tick is None:
            raise _NotDue
        headers = dict(sched.headers or {})
        headers[NAME_HEADER] = sched.name
        headers[TICK_HEADER] = str(tick)
        draft.headers_blob = encode_headers(headers)
        self._provisional = (sched, tick, candidate_id, now_ns)
        return None

    def hook_unadmit(self, draft: Draft) -> None:
        if self._firing is not None and draft is self._firing[0]:
            self._provisional = None

    def hook_before_append(self) -> None:
        provisional = self._provisional
        if provisional is None:
            return
        log = self._log
        assert log is not None
        sched, tick, message_id, now_ns = provisional
        log.append_ahead(encode_feature_record([FIRE, sched.revision, tick, message_id, now_ns]))
        self._sync_if_always(log)

    def hook_appended(self, drafts: list[Draft], first_id: int, now_ns: int) -> None:
        provisional = self._provisional
        if provisional is None:
            return
        sched, tick, _, _ = provisional
        sched.fired_ns = tick
        self._provisional = None
        log = self._log
        assert log is not None
        log.keep_ahead()
        try:
            # The message is written: say so, so that nobody needs to find it in the
            # log later (it may be consumed and its segment deleted by then).
            log.append(encode_feature_record([DONE, sched.revision, tick]))
            self._sync_if_always(log)
        except StorageError as exc:
            # The FIRE record stays without it: a reader of the file finds the message.
            logger.warning("ledgerq: %s; the periodic tick is checked in the log later", exc)
        if log.should_compact(len(self._schedules), factor=4, slack=_REWRITE_SLACK):
            # Under the append lock with the tail current (this is an append): every
            # pending record can be settled first, so the rewrite keeps only facts.
            for other in self._schedules.values():
                self._verify(other)
            log.compact()

    def hook_rollback(self) -> None:
        self._provisional = None
        if self._log is not None:
            # The FIRE record is written, its message not: cut it back.  If that fails
            # it stays, unverifiable (no message has its id and timestamp): not fired.
            self._log.undo_ahead()


class _FireHooks(Feature):
    """The enqueue hooks of :class:`PeriodicFeature`'s fires: a feature of their own,
    which the queue calls only during a fire (``QueueCore.extra_hooks``) - so no other
    enqueue, plain or not, pays a call for periodic jobs."""

    name = "periodic fire"

    def __init__(self, owner: PeriodicFeature) -> None:
        self._owner = owner

    def catch_up(self) -> None:
        self._owner.hook_catch_up()

    def admit(self, draft: Draft, now_ns: int, candidate_id: int) -> int | None:
        return self._owner.hook_admit(draft, now_ns, candidate_id)

    def unadmit(self, draft: Draft) -> None:
        self._owner.hook_unadmit(draft)

    def before_append(self) -> None:
        self._owner.hook_before_append()

    def appended(self, drafts: list[Draft], first_id: int, now_ns: int) -> None:
        self._owner.hook_appended(drafts, first_id, now_ns)

    def rollback(self) -> None:
        self._owner.hook_rollback()


def read_jobs(queue_dir: str) -> list[PeriodicJob]:
    """The periodic jobs of the queue at ``queue_dir``, read without its lock (tools,
    the console): beside the processes that have it open, a snapshot.  A tick whose
    FIRE record has no DONE yet counts as fired.  On an encrypted queue (no key here)
    each job's payload and headers are left out (``b""``, ``{}``).  ``[]`` when the
    queue has no periodic job or the file is unreadable."""
    reader = PeriodicFeature()
    reader._detached = True
    for value in read_feature_values(feature_log_path(queue_dir, PERIODIC_NAME), PERIODIC_MAGIC):
        reader.apply_record(value)
    return [reader._schedules[name].job() for name in sorted(reader._schedules)]
