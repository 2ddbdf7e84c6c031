"""What the console changes: requeue and purge dead letters, each as a job.

An action opens the queue for what it does and closes it at once - never across a
request, never while the page is looked at.  It opens the queue in shared mode
(``ledgerq.open(path, shared=True)``: any number of processes at once), so it works
beside the application's shared handles; a queue another process holds exclusively is
refused with a message that says so, and nothing happens.

Every action runs as a :class:`Job` in a thread of its own: the request that starts
it waits a moment for it and reports the outcome, and a long one - a requeue paced at
a rate - goes on while the page shows its progress, and can be cancelled.  A paced
job opens the queue once per slice, so between slices the queue is free.

An encrypted queue is opened with the console's key (a plain one without it); one the
key does not open is refused before anything is opened (``_encryption``).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import ledgerq
from ledgerq import tools
from ledgerq.ui._browse import matching_dead_letters
from ledgerq.ui._catalog import Catalog
from ledgerq.ui._encryption import KeyNeeded
from ledgerq.ui._figures import QueueFiles

__all__ = [
    "Action",
    "ActionRefused",
    "Job",
    "JobBoard",
    "Scope",
    "Verb",
    "queue_for_action",
]

Verb: TypeAlias = Literal["requeue", "purge"]
Scope: TypeAlias = Literal["selected", "matching", "all"]
KEEP_JOBS = 100  # finished jobs remembered for their reports


class ActionRefused(Exception):
    """An action that cannot be done now; its text says why, for the page."""


@contextmanager
def queue_for_action(
    path: str, name: str, *, encryption_key: bytes | None = None
) -> Iterator[ledgerq.Queue]:
    """The queue at ``path`` opened for one action, closed when it ends.

    Shared (see the module); its stored options are used and left as they are;
    ``encryption_key`` for an encrypted queue.  Raises :class:`ActionRefused` when
    another process holds it exclusively (or keeps it locked past the open's
    ``lock_timeout``).
    """
    kwargs: dict[str, Any] = {
        "remember_options": False,
        "encryption_key": encryption_key,
        "shared": True,
    }
    try:
        queue = ledgerq.open(path, **kwargs)
    except ledgerq.QueueLockedError as exc:
        how = (
            "which holds it exclusively"
            if exc.held_by == "exclusive"
            else "which did not let it in within its lock timeout (stopped, or very slow)"
        )
        raise ActionRefused(
            f"the queue {name} is open in another process, {how}; "
            "nothing was changed - try again once it is closed"
        ) from None
    try:
        yield queue
    finally:
        queue.close()


@dataclass(frozen=True, slots=True)
class Action:
    """A requeue or purge of dead letters of the queue ``queue``.

    ``scope``: the ``ids`` given (``selected``), every one ``chosen`` matches when the
    job runs (``matching``), or every dead letter (``all``).  ``rate`` (messages per
    second) paces a requeue; ``delay`` (seconds) holds the requeued messages back.
    """

    queue: str
    verb: Verb
    scope: Scope
    ids: tuple[int, ...] = ()
    chosen: tools.DeadLetterFilter = field(default_factory=tools.DeadLetterFilter)
    rate: float | None = None
    delay: float | None = None

    def describe(self, count: int | None = None) -> str:
        """The action in words: ``"requeue 12 dead letters of orders (reason ...)"``."""
        what = "dead letters" if count is None else _plural(count, "dead letter")
        if self.scope == "all":
            picked = f"all {what}" if count is None else what
        elif self.scope == "selected":
            picked = f"the selected {what}" if count is None else f"{what} (selected)"
        else:
            picked = f"{what} with {self.chosen.describe()}"
        text = f"{self.verb} {picked} of {self.queue}"
        if self.rate is not None:
            text += f" at {self.rate:g} per second"
        if self.delay is not None:
            text += f", delivered no earlier than {self.delay:g}s from now"
        return text


def _key_for(files: QueueFiles, name: str) -> bytes | None:
    """The key to open the queue ``files`` with; :class:`ActionRefused` when the
    console's key does not open it (nothing opened, nothing written)."""
    try:
        return files.key_for_open()
    except KeyNeeded as exc:
        raise ActionRefused(f"the queue {name} was not changed: {exc}") from None


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


@dataclass
class Job:
    """One action being done or done: ``done`` of ``total`` messages so far."""

    id: str
    action: Action
    total: int | None = None
    done: int = 0
    state: Literal["running", "finished", "failed", "cancelled"] = "running"
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def is_running(self) -> bool:
        """Whether it has not ended yet."""
        return self.state == "running"

    def report(self) -> str:
        """What it did (or is doing), in words."""
        queue = self.action.queue
        if self.action.verb == "requeue":
            did = f"requeued {_plural(self.done, 'message')} to {queue}"
        else:
            did = f"purged {_plural(self.done, 'message')} from the dead-letter queue of {queue}"
        if self.state == "running":
            of = "" if self.total is None else f" of {self.total:,}"
            verb = "requeued" if self.action.verb == "requeue" else "purged"
            return f"{verb} {self.done:,}{of} so far: {self.action.describe()}"
        if self.state == "failed":
            return f"{did}, then failed: {self.error}" if self.done else f"failed: {self.error}"
        if self.state == "cancelled":
            return f"cancelled: {did}"
        return did

    def as_json(self) -> dict[str, Any]:
        """The job for ``/api/jobs``."""
        return {
            "id": self.id,
            "queue": self.action.queue,
            "action": self.action.verb,
            "scope": self.action.scope,
            "state": self.state,
            "done": self.done,
            "total": self.total,
            "error": self.error,
            "report": self.report(),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


class JobBoard:
    """The jobs of one console: start them, find them, wait for them."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, action: Action) -> Job:
        """Start ``action`` in a thread of its own and return its job.

        Raises :class:`ActionRefused` before anything starts for a queue that is gone,
        and for an encrypted queue the console's key does not open.
        """
        files = self._catalog.get(action.queue)
        if files is None:
            raise ActionRefused(f"there is no queue {action.queue} (any more)")
        _key_for(files, action.queue)
        job = Job(secrets.token_urlsafe(9), action)
        with self._lock:
            self._jobs[job.id] = job
            finished = [j for j in self._jobs.values() if not j.is_running]
            for old in sorted(finished, key=lambda j: j.started_at)[:-KEEP_JOBS]:
                del self._jobs[old.id]
        thread = threading.Thread(
            target=self._run, args=(job, files), name=f"ledgerq-ui-job:{job.id}", daemon=True
        )
        thread.start()
        return job

    def get(self, job_id: str) -> Job | None:
        """The job ``job_id`` (None when unknown or forgotten)."""
        with self._lock:
            return self._jobs.get(job_id)

    def running(self, queue: str | None = None) -> list[Job]:
        """Jobs not ended yet (of ``queue``, when given), oldest first."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.is_running]
        return sorted(
            (j for j in jobs if queue is None or j.action.queue == queue),
            key=lambda j: j.started_at,
        )

    def all(self) -> list[Job]:
        """Every job remembered, newest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.started_at, reverse=True)

    def stop_all(self, timeout_s: float) -> None:
        """Cancel every running job and wait up to ``timeout_s`` for them to end (a
        paced one ends after its current slice; a single call finishes)."""
        jobs = self.running()
        for job in jobs:
            job.cancel.set()
        deadline = time.monotonic() + timeout_s
        for job in jobs:
            job.ended.wait(max(0.0, deadline - time.monotonic()))

    def _run(self, job: Job, files: QueueFiles) -> None:
        path = files.path
        try:
            self._do(job, files)
        except ActionRefused as exc:
            job.state, job.error = "failed", str(exc)
        except ledgerq.LedgerQError as exc:
            job.state, job.error = "failed", str(exc)
        except OSError as exc:
            job.state, job.error = "failed", f"{exc.strerror or exc}: {exc.filename or path}"
        else:
            job.state = "cancelled" if job.cancel.is_set() else "finished"
        finally:
            job.finished_at = time.time()
            # Before the job is seen as ended: the page that reports it shows figures
            # read after it, not ones the sampler took while it ran.
            self._catalog.changed(job.action.queue)
            job.ended.set()

    def _do(self, job: Job, files: QueueFiles) -> None:
        action = job.action
        name, path = action.queue, files.path
        key = _key_for(files, name)  # again: the queue may have changed since the start
        dlq_files = files.dlq()
        if dlq_files is None:
            job.total = 0
            return  # no dead-letter queue: nothing to do
        if action.scope == "selected":
            ids: list[int] | None = sorted(set(action.ids))
        elif action.scope == "matching":
            ids = matching_dead_letters(dlq_files, action.chosen)
        elif action.rate is not None:
            ids = matching_dead_letters(dlq_files, tools.DeadLetterFilter())
        else:
            ids = None  # everything, in one call (as Queue.requeue_dlq() does)
        job.total = dlq_files.pending_count() if ids is None else len(ids)
        if ids is None:
            with queue_for_action(path, name, encryption_key=key) as queue:
                job.done = self._apply(queue, action, None)
            return

        def apply(part: list[int]) -> int:
            with queue_for_action(path, name, encryption_key=key) as queue:
                done = self._apply(queue, action, part)
            job.done += done
            self._catalog.changed(name)  # a paced job's progress shows in the figures
            return done

        if action.rate is None:
            apply(ids)
        else:
            tools.paced(ids, action.rate, apply, should_stop=job.cancel.is_set)

    @staticmethod
    def _apply(queue: ledgerq.Queue, action: Action, ids: list[int] | None) -> int:
        if not tools.has_dlq(queue.path):
            return 0  # q.dlq would create one: looking must not
        if action.verb == "requeue":
            return tools.requeue_dead_letters(queue, ids, delay=action.delay)
        return queue.dlq.purge(ids)
