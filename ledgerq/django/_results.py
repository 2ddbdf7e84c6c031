"""Task results in one SQLite database beside the queues (``<path>/results.sqlite3``).

Why SQLite (docs/dependencies.md says it at length): a result is read by id, from any
process, while workers in other processes change it - a keyed record with
multi-process transactions, which is what SQLite is, in the standard library.  The
database is in WAL mode: readers never wait for a writer and a writer never waits
for readers; writers take turns (``BEGIN IMMEDIATE``; a busy one waits up to 30 s).
Every committed change survives a kill -9 of its process (it is in the WAL, in the
page cache); ``synchronous=NORMAL`` (the queues' default ``sync="interval"``) may
lose the last transactions to a power cut, ``synchronous=FULL`` (``sync="always"``)
not.

One row per result.  ``expires_ns`` is when :meth:`ResultStore.prune` may delete it:
``result_ttl`` after it finished, or after the last of its enqueue, ``run_after`` and
last attempt while it has not (so a task waiting a month for its ``run_after`` keeps
its result).  A change of a row is one ``UPDATE`` conditioned on the row being as the
writer last saw it (the common cases: a first attempt, the end of an attempt), or else
a read, then a write, in one transaction: two processes never lose each other's change
(a worker's start, the keeper marking a dead letter).

Connections belong to one thread of one process: a forked child opens its own (SQLite
connections must not cross a fork) and never touches its parent's.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ledgerq.django._errors import WorkerLostError, class_path
from ledgerq.django._payload import TaskMessage

__all__ = ["FINISHED", "ResultStore", "StoredResult"]

READY, RUNNING, SUCCESSFUL, FAILED = "READY", "RUNNING", "SUCCESSFUL", "FAILED"
FINISHED = frozenset({SUCCESSFUL, FAILED})
_SCHEMA_VERSION = 1
_BUSY_TIMEOUT_S = 30.0
_LOST = class_path(WorkerLostError)
_COLUMNS = (
    "id, backend, queue, task_path, priority, run_after_ns, arguments, status, "
    "enqueued_ns, started_ns, finished_ns, last_attempt_ns, worker_ids, errors, "
    "return_value, message_id, expires_ns"
)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS results (
    id TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    queue TEXT NOT NULL,
    task_path TEXT NOT NULL,
    priority INTEGER NOT NULL,
    run_after_ns INTEGER,
    arguments TEXT NOT NULL,        -- JSON: {{"args": [...], "kwargs": {{...}}}}
    status TEXT NOT NULL,
    enqueued_ns INTEGER NOT NULL,
    started_ns INTEGER,
    finished_ns INTEGER,
    last_attempt_ns INTEGER,
    worker_ids TEXT NOT NULL,       -- JSON list, one per attempt
    errors TEXT NOT NULL,           -- JSON list of [exception class path, traceback]
    return_value TEXT,              -- JSON
    message_id INTEGER,             -- the ledgerq message of the last attempt
    expires_ns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS results_by_expiry ON results (expires_ns);
PRAGMA user_version = {_SCHEMA_VERSION};
"""


@dataclass(slots=True)
class StoredResult:
    """One row: a result as the database keeps it (times in ns since the epoch)."""

    id: str
    backend: str
    queue: str
    task_path: str
    priority: int
    run_after_ns: int | None
    args: list[Any]
    kwargs: dict[str, Any]
    status: str
    enqueued_ns: int
    started_ns: int | None = None
    finished_ns: int | None = None
    last_attempt_ns: int | None = None
    worker_ids: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    return_json: str | None = None
    message_id: int | None = None

    @classmethod
    def of_message(cls, message: TaskMessage) -> StoredResult:
        """The result of a task just enqueued (``READY``)."""
        return cls(
            id=message.result_id,
            backend=message.backend,
            queue=message.queue,
            task_path=message.task_path,
            priority=message.priority,
            run_after_ns=message.run_after_ns,
            args=message.args,
            kwargs=message.kwargs,
            status=READY,
            enqueued_ns=message.enqueued_ns,
        )

    def note_lost_attempts(self, why: str) -> None:
        """Give every attempt that ended without an error a :class:`WorkerLostError`."""
        for attempt in range(len(self.errors) + 1, len(self.worker_ids) + 1):
            self.errors.append((_LOST, f"attempt {attempt} of the task: {why}"))

    def expires_ns(self, ttl_ns: int) -> int:
        """When the row may be pruned."""
        if self.status in FINISHED and self.finished_ns is not None:
            return self.finished_ns + ttl_ns
        times = (self.enqueued_ns, self.run_after_ns or 0, self.last_attempt_ns or 0)
        return max(times) + ttl_ns

    def _row(self, ttl_ns: int) -> tuple[Any, ...]:
        return (
            self.id,
            self.backend,
            self.queue,
            self.task_path,
            self.priority,
            self.run_after_ns,
            json.dumps({"args": self.args, "kwargs": self.kwargs}, separators=(",", ":")),
            self.status,
            self.enqueued_ns,
            self.started_ns,
            self.finished_ns,
            self.last_attempt_ns,
            json.dumps(self.worker_ids),
            json.dumps(self.errors),
            self.return_json,
            self.message_id,
            self.expires_ns(ttl_ns),
        )

    @classmethod
    def _of_row(cls, row: tuple[Any, ...]) -> StoredResult:
        arguments = json.loads(row[6])
        return cls(
            id=row[0],
            backend=row[1],
            queue=row[2],
            task_path=row[3],
            priority=row[4],
            run_after_ns=row[5],
            args=arguments["args"],
            kwargs=arguments["kwargs"],
            status=row[7],
            enqueued_ns=row[8],
            started_ns=row[9],
            finished_ns=row[10],
            last_attempt_ns=row[11],
            worker_ids=json.loads(row[12]),
            errors=[(path, text) for path, text in json.loads(row[13])],
            return_json=row[14],
            message_id=row[15],
        )


class ResultStore:
    """The results database of one backend directory (thread- and fork-safe to share)."""

    def __init__(self, path: str, *, ttl_s: float, durable: bool) -> None:
        self.path = path
        self.ttl_ns = int(ttl_s * 1e9)
        self._synchronous = "FULL" if durable else "NORMAL"
        self._local = threading.local()

    # -- connections

    def _connection(self) -> sqlite3.Connection:
        pid = os.getpid()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == pid:
            return conn
        # A connection inherited through fork is left alone (not closed: closing it
        # here could act on the parent's locks); this process opens its own.
        conn = sqlite3.connect(
            self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=True
        )
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")  # stored in the file: once per database
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            if conn.execute("PRAGMA user_version").fetchone()[0] != _SCHEMA_VERSION:
                conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        self._local.conn, self._local.pid = conn, pid
        return conn

    def close(self) -> None:
        """Close this thread's connection (others close when their thread's ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local.conn = None

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: taken at once (``BEGIN IMMEDIATE``), so the reads in it
        see what it then writes over."""
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _load(self, conn: sqlite3.Connection, result_id: str) -> StoredResult | None:
        row = conn.execute(f"SELECT {_COLUMNS} FROM results WHERE id = ?", (result_id,)).fetchone()
        return None if row is None else StoredResult._of_row(row)

    def _save(self, conn: sqlite3.Connection, result: StoredResult) -> None:
        conn.execute(
            f"INSERT OR REPLACE INTO results ({_COLUMNS}) VALUES ({', '.join('?' * 17)})",
            result._row(self.ttl_ns),
        )

    # -- what the backend and the workers do

    def add(self, result: StoredResult) -> None:
        """Store a new result (an enqueue)."""
        conn = self._connection()
        conn.execute(
            f"INSERT INTO results ({_COLUMNS}) VALUES ({', '.join('?' * 17)})",
            result._row(self.ttl_ns),
        )

    def remove(self, result_id: str) -> None:
        """Delete a result (an enqueue that failed after storing it)."""
        self._connection().execute("DELETE FROM results WHERE id = ?", (result_id,))

    def get(self, result_id: str) -> StoredResult | None:
        """The result ``result_id``, or None."""
        return self._load(self._connection(), result_id)

    def begin_attempt(
        self, message: TaskMessage, message_id: int, worker: str, now_ns: int
    ) -> StoredResult | None:
        """Mark the task ``RUNNING`` for a new attempt by ``worker``; return the result, or
        None when the delivery is one of a message that already finished the task (its
        ack was lost: the task is not run twice for it).

        An attempt before this one that ended without an error (its process died) gets a
        :class:`WorkerLostError`.  A missing row (pruned, or its database lost) is made
        again from the message.
        """
        # The common case in one statement: the first attempt at a task enqueued here
        # (its row, never attempted, holds what the message holds).
        first = StoredResult.of_message(message)
        first.status, first.worker_ids, first.message_id = RUNNING, [worker], message_id
        first.started_ns = first.last_attempt_ns = now_ns
        updated = self._connection().execute(
            "UPDATE results SET status = ?, started_ns = ?, last_attempt_ns = ?, "
            "worker_ids = ?, message_id = ?, expires_ns = ? "
            "WHERE id = ? AND status = 'READY' AND worker_ids = '[]'",
            (
                RUNNING,
                now_ns,
                now_ns,
                json.dumps(first.worker_ids),
                message_id,
                first.expires_ns(self.ttl_ns),
                message.result_id,
            ),
        )
        if updated.rowcount == 1:
            return first
        with self._write() as conn:
            result = self._load(conn, message.result_id) or StoredResult.of_message(message)
            if result.status in FINISHED and result.message_id == message_id:
                return None
            result.note_lost_attempts(
                "its worker process ended before the task did (killed, crashed, past "
                "--task-timeout, or stopped at once)"
            )
            result.worker_ids.append(worker)
            result.status = RUNNING
            result.started_ns = result.started_ns or now_ns
            result.last_attempt_ns = now_ns
            result.finished_ns = None
            result.return_json = None
            result.message_id = message_id
            self._save(conn, result)
            return result

    def finish(
        self,
        running: StoredResult,
        *,
        now_ns: int,
        return_json: str | None = None,
        error: tuple[str, str] | None = None,
        ready_again: bool = False,
    ) -> StoredResult | None:
        """End the attempt :meth:`begin_attempt` returned ``running`` for:
        ``SUCCESSFUL`` with ``return_json``, ``FAILED`` with ``error``, or -
        ``ready_again`` - back to ``READY`` with ``error`` (the task is delivered again).
        Returns the result, or None if its row is gone."""

        def end(result: StoredResult) -> StoredResult:
            if error is not None:
                result.errors.append(error)
            if ready_again:
                result.status = READY
            else:
                result.status = FAILED if error is not None else SUCCESSFUL
                result.finished_ns = now_ns
                result.return_json = return_json
            return result

        # No one else writes the row of a running attempt: written in one statement from
        # what this attempt holds, unless the row changed after all (then read again).
        final = end(replace(running, errors=list(running.errors)))
        updated = self._connection().execute(
            "UPDATE results SET status = ?, finished_ns = ?, return_value = ?, errors = ?, "
            "expires_ns = ? WHERE id = ? AND message_id = ? AND status = 'RUNNING' "
            "AND worker_ids = ?",
            (
                final.status,
                final.finished_ns,
                final.return_json,
                json.dumps(final.errors),
                final.expires_ns(self.ttl_ns),
                final.id,
                final.message_id,
                json.dumps(final.worker_ids),
            ),
        )
        if updated.rowcount == 1:
            return final
        with self._write() as conn:
            result = self._load(conn, running.id)
            if result is None:
                return None
            self._save(conn, end(result))
            return result

    def dead_lettered(self, result_id: str, message_id: int, reason: str, now_ns: int) -> bool:
        """Mark ``FAILED`` the task whose message ``message_id`` went to the dead-letter
        queue after its last failed delivery (``reason``).  False when there is nothing
        to do: no such result, already finished, or run since by another message (a
        requeue of the dead letter)."""
        with self._write() as conn:
            result = self._load(conn, result_id)
            if result is None or result.status in FINISHED:
                return False
            if result.message_id not in (None, message_id):
                return False
            result.note_lost_attempts(f"{reason} (then moved to the dead-letter queue)")
            result.status = FAILED
            result.finished_ns = now_ns
            self._save(conn, result)
            return True

    def prune(self, now_ns: int) -> int:
        """Delete every result past its expiry; return how many."""
        with self._write() as conn:
            return conn.execute("DELETE FROM results WHERE expires_ns < ?", (now_ns,)).rowcount
