"""One small, uniform face over ledgerq and each peer queue, configured per durability level.

Every adapter has the same six calls - ``open(path, level)``, ``put(bytes)``,
``put_batch(list)``, ``get_and_ack() -> bytes | None``, ``get_batch_and_ack(n)`` and
``close()`` - and states, per level, how it is configured and what that configuration
really survives.  The two levels:

``kill9``  the queue's default mode, meant to survive a crash of the process (kill -9):
           a returned put has reached the OS (page cache), no fsync per call.
``power``  meant to survive power loss / a kernel crash: a returned put (and ack) has
           been fsynced (ledgerq ``sync="always"``, SQLite ``synchronous=FULL``).

A peer that cannot be configured for a level has ``None`` there and is not run at it.  A
peer that is run at a level it does not really survive says so in ``Level.survives_kill9``
/ ``Level.survives_power``; ``Level.is_kill9_safe`` decides whether it counts as a
"crash-safe peer" in the targets.  ``semantics`` says what a get does: a *lease + ack*
queue redelivers a message whose consumer died before the ack (at-least-once); a
*delete on get* queue removes it when it is handed out (a consumer that dies with it
loses it), which is one write per message instead of two; ``Adapter.keeps_unacked`` is
False for those, and they do not count as crash-safe peers for dequeue + ack.

Imports of the peers are lazy (inside ``open``), so a missing peer only disables itself.

The multi-process face (``benchmarks/multiprocess.py``): ``open_shared(path, level)`` opens
the queue as one of several processes that have it open at the same time, and
``get_and_ack_shared()`` takes one message while other processes take from it too.  Both
default to the single-process calls; an adapter overrides them where several processes
need something else (ledgerq's ``shared=True``, a claim in ``BEGIN IMMEDIATE``, a count
that only sees this process).  ``Adapter.multiprocess`` says what the library itself
promises about several processes; None: the adapter is not run with several processes.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass
from importlib import import_module
from typing import Any, ClassVar

__all__ = ["ADAPTERS", "LEVELS", "Adapter", "Level", "get_adapter"]

LEVELS = {
    "kill9": "default sync (meant to survive kill -9)",
    "power": 'sync="always" (meant to survive power loss)',
}

# SQLite settings shared by the SQLite-backed peers whose library lets us (or does) choose
# them.  In WAL mode a commit appends to the -wal file: with synchronous=NORMAL the WAL is
# fsynced only at checkpoints, so a killed process loses nothing (its writes are in the
# OS) but a power cut can roll back the last commits (the database stays consistent);
# with synchronous=FULL every commit fsyncs the WAL, so it survives power loss.
_SQLITE_SYNC = {"kill9": "NORMAL", "power": "FULL"}

_WAL_NORMAL = "consistent, but commits since the last WAL checkpoint can be lost"


@dataclass(frozen=True, slots=True)
class Level:
    """How an adapter is configured for one durability level, and what that survives."""

    config: str
    survives_kill9: str
    survives_power: str
    is_kill9_safe: bool
    is_power_safe: bool


class Adapter:
    """The uniform queue face.  Subclasses set the class attributes and the six calls."""

    key: ClassVar[str]
    label: ClassVar[str]
    distribution: ClassVar[str]  # the PyPI name, for its version
    semantics: ClassVar[str]
    batch_note: ClassVar[str]
    levels: ClassVar[dict[str, Level | None]]
    is_thread_safe: ClassVar[bool] = False
    note: ClassVar[str] = ""  # what a reader of the numbers should know
    # Whether a message handed out survives its consumer being killed before the ack
    # (lease + ack, get + task_done in an open transaction, pop + done).  A *delete on
    # get* queue loses it: such a peer does not count as crash-safe for dequeue + ack.
    keeps_unacked: ClassVar[bool] = True
    # What the library promises when several processes open one queue (None: not run so).
    multiprocess: ClassVar[str | None] = None

    def open(self, path: str, level: str) -> None:
        raise NotImplementedError

    def open_shared(self, path: str, level: str) -> None:
        """Open the queue as one of several processes that have it open at once."""
        self.open(path, level)

    def get_and_ack_shared(self) -> bytes | None:
        """Take one message (get + ack) while other processes take from the queue too."""
        return self.get_and_ack()

    def put(self, payload: bytes) -> None:
        raise NotImplementedError

    def put_batch(self, payloads: list[bytes]) -> None:
        for payload in payloads:
            self.put(payload)

    def get_and_ack(self) -> bytes | None:
        raise NotImplementedError

    def get_batch_and_ack(self, n: int) -> list[bytes]:
        out: list[bytes] = []
        for _ in range(n):
            payload = self.get_and_ack()
            if payload is None:
                break
            out.append(payload)
        return out

    def close(self) -> None:
        raise NotImplementedError

    @classmethod
    def is_available(cls) -> str | None:
        """Return None when the library imports, else why not."""
        try:
            import_module(cls.module)
        except ImportError as exc:
            return f"not installed ({exc})"
        return None

    module: ClassVar[str]


# --------------------------------------------------------------------------- ledgerq


class LedgerQ(Adapter):
    key = "ledgerq"
    label = "ledgerq"
    distribution = "ledgerq"
    module = "ledgerq"
    semantics = "lease + ack (at-least-once)"
    batch_note = "`enqueue_batch` (one write); `dequeue_batch(n)` then one `ack_batch` (one write)"
    is_thread_safe = True
    levels: ClassVar[dict[str, Level | None]] = {
        "kill9": Level(
            'sync="interval" (the default: write per call, fsync every 1 s)',
            "yes: every returned enqueue/ack reached the OS",
            "loses at most the last sync_interval (1 s)",
            is_kill9_safe=True,
            is_power_safe=False,
        ),
        "power": Level(
            'sync="always" (fsync before enqueue/ack returns; concurrent callers share one)',
            "yes",
            "yes",
            is_kill9_safe=True,
            is_power_safe=True,
        ),
    }

    multiprocess = (
        "`ledgerq.open(path, shared=True)` in every process: the documented multi-process "
        "mode (leases owned by a handle, ids unique across processes)"
    )

    def open(self, path: str, level: str) -> None:
        import ledgerq

        self.q = ledgerq.open(path, sync="interval" if level == "kill9" else "always")

    def open_shared(self, path: str, level: str) -> None:
        import ledgerq

        # A tree without shared mode raises TypeError ("unknown option") here.
        self.q = ledgerq.open(path, shared=True, sync="interval" if level == "kill9" else "always")

    def put(self, payload: bytes) -> None:
        self.q.enqueue(payload)

    def put_batch(self, payloads: list[bytes]) -> None:
        self.q.enqueue_batch(payloads)

    def get_and_ack(self) -> bytes | None:
        msg = self.q.dequeue()
        if msg is None:
            return None
        self.q.ack(msg.id)
        return msg.payload

    def get_batch_and_ack(self, n: int) -> list[bytes]:
        msgs = self.q.dequeue_batch(n)
        if msgs:
            self.q.ack_batch([msg.id for msg in msgs])
        return [msg.payload for msg in msgs]

    def close(self) -> None:
        self.q.close()


# ---------------------------------------------------------------------- persist-queue


class PersistQueueFile(Adapter):
    key = "pq-file"
    label = "persist-queue Queue (file)"
    distribution = "persist-queue"
    module = "persistqueue"
    semantics = "get + task_done (at-least-once: autosave=False persists the get on task_done)"
    batch_note = "no batch API: a loop of put; n gets then n task_done (one info save)"
    note = (
        "every put (and the task_done after a get) pickles the whole info dict into a new "
        "temp file and renames it over the old one: that rename dominates its cost"
    )
    is_thread_safe = True
    levels: ClassVar[dict[str, Level | None]] = {
        "kill9": Level(
            "Queue(path, autosave=False); put writes the chunk and renames a new info file",
            "yes: each put/task_done reached the OS before it returns",
            "no: nothing is fsynced (info file replaced by rename without fsync)",
            is_kill9_safe=True,
            is_power_safe=False,
        ),
        # No option fsyncs a put or a task_done: it cannot be made power-loss safe.
        "power": None,
    }

    def open(self, path: str, level: str) -> None:
        import persistqueue

        self.q = persistqueue.Queue(path, autosave=False)

    def put(self, payload: bytes) -> None:
        self.q.put(payload)

    def get_and_ack(self) -> bytes | None:
        if self.q.qsize() == 0:
            return None
        payload: bytes = self.q.get(block=False)
        self.q.task_done()
        return payload

    def get_batch_and_ack(self, n: int) -> list[bytes]:
        q = self.q
        out = [q.get(block=False) for _ in range(min(n, q.qsize()))]
        for _ in out:
            q.task_done()
        return out

    def close(self) -> None:
        # persist-queue's file Queue has no close(): its files close when it is collected.
        self.q.headf.close()
        self.q.tailf.close()
        del self.q


def _sqlite_levels(how: str, default_note: str) -> dict[str, Level | None]:
    return {
        "kill9": Level(
            f"WAL, synchronous=NORMAL ({how})",
            "yes: every commit reached the OS",
            _WAL_NORMAL,
            is_kill9_safe=True,
            is_power_safe=False,
        ),
        "power": Level(
            f"WAL, synchronous=FULL ({default_note})",
            "yes",
            "yes: every commit fsyncs the WAL",
            is_kill9_safe=True,
            is_power_safe=True,
        ),
    }


class PersistQueueSQLite(Adapter):
    key = "pq-sqlite"
    label = "persist-queue SQLiteQueue"
    distribution = "persist-queue"
    module = "persistqueue"
    semantics = "get + task_done (at-least-once with auto_commit=False: task_done deletes)"
    batch_note = "no batch put: a loop of put (one commit each); n gets then one task_done"
    is_thread_safe = True
    levels = _sqlite_levels(
        "set on its two connections through the private _putter/_getter",
        "its default",
    )

    def open(self, path: str, level: str) -> None:
        import persistqueue

        self.q = persistqueue.SQLiteQueue(path, auto_commit=False, multithreading=True)
        for conn in {
            id(self.q._putter): self.q._putter,
            id(self.q._getter): self.q._getter,
        }.values():
            conn.execute(f"PRAGMA synchronous={_SQLITE_SYNC[level]}")

    def put(self, payload: bytes) -> None:
        self.q.put(payload)

    def get_and_ack(self) -> bytes | None:
        payload = self.q.get(block=False) if self.q.qsize() else None
        if payload is None:
            return None
        self.q.task_done()
        return payload  # type: ignore[no-any-return]

    def get_batch_and_ack(self, n: int) -> list[bytes]:
        q = self.q
        out = [q.get(block=False) for _ in range(min(n, q.qsize()))]
        if out:
            q.task_done()
        return out

    def close(self) -> None:
        self.q.close()


class PersistQueueSQLiteAck(Adapter):
    key = "pq-sqlite-ack"
    label = "persist-queue SQLiteAckQueue"
    distribution = "persist-queue"
    module = "persistqueue"
    semantics = "get (marks unack) + ack (marks acked) - at-least-once, two commits"
    batch_note = (
        "no batch API: a loop of get + ack; acked rows removed by clear_acked_data every 100 acks"
    )
    note = "acked rows stay in the table until clear_acked_data(), which we call every 100 acks"
    is_thread_safe = True
    multiprocess = (
        "documented thread-safe, not process-safe: its maintainer says multiprocessing "
        '"is not supported and verified" (persist-queue #132); opened with '
        "`multithreading=True`; its `qsize()` counts this process's puts only (#76), so a "
        "consumer process calls `get(block=False)` and catches `Empty`"
    )
    levels = _sqlite_levels(
        "set on its two connections through the private _putter/_getter",
        "its default",
    )

    def open(self, path: str, level: str) -> None:
        import persistqueue

        self.q = persistqueue.SQLiteAckQueue(path, multithreading=True)
        for conn in {
            id(self.q._putter): self.q._putter,
            id(self.q._getter): self.q._getter,
        }.values():
            conn.execute(f"PRAGMA synchronous={_SQLITE_SYNC[level]}")
        self._acked = 0

    def put(self, payload: bytes) -> None:
        self.q.put(payload)

    def get_and_ack(self) -> bytes | None:
        if self.q.qsize() == 0:
            return None
        return self._ack(self.q.get(block=False, raw=True))

    def get_and_ack_shared(self) -> bytes | None:
        from persistqueue.exceptions import Empty

        # qsize() is this process's own count (its puts minus its gets): another
        # process's puts never show in it, so ask the table instead.
        try:
            item = self.q.get(block=False, raw=True)
        except Empty:
            return None
        return self._ack(item)

    def _ack(self, item: dict[str, Any]) -> bytes:
        self.q.ack(id=item["pqid"])
        self._acked += 1
        if self._acked % 100 == 0:
            # Acked rows stay in the table until cleared; every get scans past them.
            self.q.clear_acked_data(max_delete=0, keep_latest=0)
        return item["data"]  # type: ignore[no-any-return]

    def close(self) -> None:
        self.q.close()


# -------------------------------------------------------------------------- diskcache


class DiskcacheDeque(Adapter):
    key = "diskcache"
    label = "diskcache Deque"
    distribution = "diskcache"
    module = "diskcache"
    semantics = "delete on get (popleft; no ack)"
    keeps_unacked = False
    batch_note = "`with deque.transact():` around 100 appends / 100 poplefts (one commit)"
    note = "Deque's own Cache settings (eviction_policy='none'); values < 32 KiB live in SQLite"
    is_thread_safe = True
    multiprocess = (
        "documented thread-safe and process-safe; Deque is its cross-process deque "
        "(popleft in one SQLite transaction)"
    )
    levels: ClassVar[dict[str, Level | None]] = {
        "kill9": Level(
            "Cache(sqlite_synchronous=1): diskcache's default WAL + synchronous=NORMAL",
            "yes: every commit reached the OS",
            _WAL_NORMAL,
            is_kill9_safe=True,
            is_power_safe=False,
        ),
        "power": Level(
            "Cache(sqlite_synchronous=2): WAL + synchronous=FULL",
            "yes",
            "yes: every commit fsyncs the WAL",
            is_kill9_safe=True,
            is_power_safe=True,
        ),
    }

    def open(self, path: str, level: str) -> None:
        import diskcache

        self.cache = diskcache.Cache(
            path, eviction_policy="none", sqlite_synchronous=1 if level == "kill9" else 2
        )
        self.q = diskcache.Deque.fromcache(self.cache)

    def put(self, payload: bytes) -> None:
        self.q.append(payload)

    def put_batch(self, payloads: list[bytes]) -> None:
        with self.q.transact():
            for payload in payloads:
                self.q.append(payload)

    def get_and_ack(self) -> bytes | None:
        try:
            return self.q.popleft()  # type: ignore[no-any-return]
        except IndexError:
            return None

    def get_batch_and_ack(self, n: int) -> list[bytes]:
        out: list[bytes] = []
        with self.q.transact():
            for _ in range(n):
                try:
                    out.append(self.q.popleft())
                except IndexError:
                    break
        return out

    def close(self) -> None:
        self.cache.close()


# -------------------------------------------------------------------------- litequeue


class LiteQueueAdapter(Adapter):
    key = "litequeue"
    label = "litequeue LiteQueue"
    distribution = "litequeue"
    module = "litequeue"
    semantics = "pop (marks LOCKED) + done (marks DONE) - two commits; no automatic redelivery"
    batch_note = (
        "100 puts in `with q.transaction()`; 100 pops (one transaction each) then 100 done "
        "in one transaction; DONE rows pruned every 100"
    )
    note = (
        "its pop query sorts every READY row by message_id (SQLite picks the status index), "
        "so a pop costs time in proportion to the messages waiting: its dequeue rate falls "
        "as the queue grows"
    )
    is_thread_safe = True
    multiprocess = (
        'its maintainer: "Yes, this can be used across processes" (litequeue #5); '
        "pop claims a row in BEGIN IMMEDIATE"
    )
    levels: ClassVar[dict[str, Level | None]] = {
        "kill9": Level(
            "litequeue's own WAL + synchronous=NORMAL",
            "yes: every commit reached the OS",
            _WAL_NORMAL,
            is_kill9_safe=True,
            is_power_safe=False,
        ),
        "power": Level(
            "WAL + PRAGMA synchronous=FULL on its public conn",
            "yes",
            "yes: every commit fsyncs the WAL",
            is_kill9_safe=True,
            is_power_safe=True,
        ),
    }

    def open(self, path: str, level: str) -> None:
        import litequeue

        os.makedirs(path, exist_ok=True)
        self.q = litequeue.LiteQueue(os.path.join(path, "queue.sqlite3"))
        self.q.conn.execute(f"PRAGMA synchronous={_SQLITE_SYNC[level]}")
        self._done = 0

    def put(self, payload: bytes) -> None:
        self.q.put(payload)  # stored as a BLOB in its TEXT column

    def put_batch(self, payloads: list[bytes]) -> None:
        with self.q.transaction():
            for payload in payloads:
                self.q.put(payload)

    def _count_done(self, n: int) -> None:
        self._done += n
        if self._done >= 100:
            self._done = 0
            self.q.prune()  # DONE rows stay in the table until pruned

    def get_and_ack(self) -> bytes | None:
        msg = self.q.pop()
        if msg is None:
            return None
        self.q.done(msg.message_id)
        self._count_done(1)
        return msg.data  # type: ignore[no-any-return]

    def get_batch_and_ack(self, n: int) -> list[bytes]:
        msgs = []
        for _ in range(n):
            msg = self.q.pop()
            if msg is None:
                break
            msgs.append(msg)
        if msgs:
            with self.q.transaction():
                for msg in msgs:
                    self.q.done(msg.message_id)
            self._count_done(len(msgs))
        return [msg.data for msg in msgs]

    def close(self) -> None:
        self.q.close()


# --------------------------------------------------------------------------- queuelib


class QueuelibFifoDisk(Adapter):
    key = "queuelib-disk"
    label = "queuelib FifoDiskQueue"
    distribution = "queuelib"
    module = "queuelib"
    semantics = "delete on get (pop)"
    keeps_unacked = False
    batch_note = "no batch API: a loop of push / pop"
    note = "only head/tail counters in memory until close(): fast because nothing is recorded"
    levels: ClassVar[dict[str, Level | None]] = {
        "kill9": Level(
            "FifoDiskQueue(path) as shipped (no options)",
            "NO: head/tail positions are saved only by close(); after kill -9 every push "
            "since the last open is lost and every pop is replayed",
            "no",
            is_kill9_safe=False,
            is_power_safe=False,
        ),
        "power": None,  # nothing is ever fsynced
    }

    def open(self, path: str, level: str) -> None:
        from queuelib import FifoDiskQueue

        self.q = FifoDiskQueue(path)

    def put(self, payload: bytes) -> None:
        self.q.push(payload)

    def get_and_ack(self) -> bytes | None:
        return self.q.pop()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.q.close()


class QueuelibFifoSQLite(Adapter):
    key = "queuelib-sqlite"
    label = "queuelib FifoSQLiteQueue"
    distribution = "queuelib"
    module = "queuelib"
    semantics = "delete on get (pop: SELECT + DELETE in one transaction)"
    keeps_unacked = False
    batch_note = "no batch API: a loop of push / pop (one transaction each)"
    levels = _sqlite_levels(
        "journal_mode and synchronous set through the private _db connection; queuelib "
        "itself uses a rollback journal",
        "set through _db; queuelib's own default, a rollback journal + FULL, is also "
        "power-loss safe but slower",
    )

    def open(self, path: str, level: str) -> None:
        from queuelib.queue import FifoSQLiteQueue

        os.makedirs(path, exist_ok=True)
        self.q = FifoSQLiteQueue(os.path.join(path, "queue.sqlite3"))
        self.q._db.execute("PRAGMA journal_mode=WAL")
        self.q._db.execute(f"PRAGMA synchronous={_SQLITE_SYNC[level]}")

    def put(self, payload: bytes) -> None:
        self.q.push(payload)

    def get_and_ack(self) -> bytes | None:
        return self.q.pop()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.q.close()


# -------------------------------------------------------------------- plain SQLite


class PlainSQLite(Adapter):
    """The baseline: the queue anyone would write on sqlite3 in twenty lines."""

    key = "sqlite"
    label = "plain SQLite (WAL)"
    distribution = "sqlite3"
    module = "sqlite3"
    semantics = "delete on get (DELETE ... RETURNING)"
    keeps_unacked = False
    batch_note = "executemany INSERT in one transaction; one DELETE ... LIMIT 100 RETURNING"
    is_thread_safe = True  # one connection, guarded by a lock
    levels = _sqlite_levels("set at open", "set at open")
    multiprocess = (
        "one connection per process on the same file; SQLite's file locks serialise the "
        "writers; the claim (`DELETE ... RETURNING`) runs in `BEGIN IMMEDIATE`"
    )

    def open(self, path: str, level: str) -> None:
        os.makedirs(path, exist_ok=True)
        self.db = sqlite3.connect(
            os.path.join(path, "queue.sqlite3"), isolation_level=None, check_same_thread=False
        )
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={_SQLITE_SYNC[level]}")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS q (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)"
        )
        self.lock = threading.Lock()

    def put(self, payload: bytes) -> None:
        with self.lock:
            self.db.execute("INSERT INTO q (payload) VALUES (?)", (payload,))

    def put_batch(self, payloads: list[bytes]) -> None:
        with self.lock:
            self.db.execute("BEGIN")
            self.db.executemany("INSERT INTO q (payload) VALUES (?)", [(p,) for p in payloads])
            self.db.execute("COMMIT")

    def get_and_ack(self) -> bytes | None:
        with self.lock:
            row = self.db.execute(
                "DELETE FROM q WHERE id = (SELECT id FROM q ORDER BY id LIMIT 1) RETURNING payload"
            ).fetchone()
        return None if row is None else row[0]  # type: ignore[no-any-return]

    def get_and_ack_shared(self) -> bytes | None:
        # BEGIN IMMEDIATE takes the write lock before the SELECT inside the DELETE reads:
        # two processes never claim the same row, and the busy handler (the connection's
        # 5 s timeout) makes the other process wait for the lock instead of failing.
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                rows = self.db.execute(
                    "DELETE FROM q WHERE id = (SELECT id FROM q ORDER BY id LIMIT 1) "
                    "RETURNING payload"
                ).fetchall()  # all rows: the statement is done before the COMMIT
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return rows[0][0] if rows else None

    def get_batch_and_ack(self, n: int) -> list[bytes]:
        with self.lock:
            rows = self.db.execute(
                "DELETE FROM q WHERE id IN (SELECT id FROM q ORDER BY id LIMIT ?) "
                "RETURNING id, payload",
                (n,),
            ).fetchall()
        rows.sort()
        return [payload for _, payload in rows]

    def close(self) -> None:
        self.db.close()


ADAPTERS: dict[str, type[Adapter]] = {
    cls.key: cls
    for cls in (
        LedgerQ,
        PersistQueueFile,
        PersistQueueSQLite,
        PersistQueueSQLiteAck,
        DiskcacheDeque,
        LiteQueueAdapter,
        QueuelibFifoDisk,
        QueuelibFifoSQLite,
        PlainSQLite,
    )
}


def get_adapter(key: str) -> Adapter:
    """Return a fresh adapter instance by key."""
    return ADAPTERS[key]()


def describe(key: str) -> dict[str, Any]:
    """Return an adapter's documentation as plain data (for the report)."""
    cls = ADAPTERS[key]
    return {
        "label": cls.label,
        "semantics": cls.semantics,
        "batch": cls.batch_note,
        "note": cls.note,
        "levels": {
            name: None
            if level is None
            else {
                "config": level.config,
                "survives_kill9": level.survives_kill9,
                "survives_power": level.survives_power,
                "is_kill9_safe": level.is_kill9_safe,
                "is_power_safe": level.is_power_safe,
            }
            for name, level in cls.levels.items()
        },
    }
