"""Exchange bindings kept on disk, so every process routes with the same tables.

kombu's virtual transport keeps bindings in each process's memory: enough for a
direct exchange whose producer declared the queue itself, not for Celery's broadcast
and replies - ``celery inspect`` publishes to the fanout exchange ``celery.pidbox``,
bound by each *worker* process to its own queue, and a worker replies through the
``reply.celery.pidbox`` exchange, bound by the *client*.  So every binding is written to
``<root>/exchanges/<exchange>.json`` and every lookup reads that file.

A table is replaced whole (temporary file, fsync, rename), so a reader never sees half a
table and needs no lock; writers take ``<root>/exchanges/LOCK`` (``flock``) so two
processes' updates never lose each other's bindings.

A binding of a queue declared ``auto_delete`` or ``exclusive`` (pidbox, reply and event
queues: they live as long as their consumer) records the declaring process's id.
AMQP deletes such a queue when its consumer goes away; a process killed with SIGKILL
deletes nothing, so lookups skip a binding whose process is gone (and the next update of
the table drops it): broadcasts stop piling up in a dead worker's queue.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import NamedTuple

from ledgerq.celery._names import check_name
from ledgerq.celery._owners import process_is_alive

__all__ = ["Binding", "BindingTables"]

logger = logging.getLogger("ledgerq.celery")


class Binding(NamedTuple):
    """One row of an exchange's table, as kombu's virtual exchanges read it."""

    routing_key: str
    pattern: str
    queue: str


class BindingTables:
    """The exchange tables of one broker directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _path(self, exchange: str) -> str:
        return os.path.join(self.directory, check_name("exchange", exchange) + ".json")

    def _read(self, exchange: str) -> list[dict[str, object]]:
        path = self._path(exchange)
        try:
            with open(path, "rb") as file:
                data = json.load(file)
            rows = data["bindings"]
            if not isinstance(rows, list):
                raise TypeError("bindings is not a list")
        except FileNotFoundError:
            return []
        except (ValueError, TypeError, KeyError) as exc:
            # Written by rename only, so this is damage from outside: say so and route
            # as if unbound, rather than stop every publish to the exchange.
            logger.error("ignoring the damaged exchange table %s: %s", path, exc)
            return []
        return [row for row in rows if isinstance(row, dict)]

    @staticmethod
    def _is_live(row: dict[str, object]) -> bool:
        owner = row.get("owner_pid")
        return not isinstance(owner, int) or process_is_alive(owner)

    def table(self, exchange: str) -> list[Binding]:
        """Return the live bindings of ``exchange`` (none when it has no table)."""
        return [binding for binding, _ in self.table_with_owners(exchange)]

    def table_with_owners(self, exchange: str) -> list[tuple[Binding, int | None]]:
        """Return the live bindings of ``exchange``, each with the id of the process
        its queue lives as long as (None: a durable queue)."""
        rows = []
        for row in self._read(exchange):
            if self._is_live(row):
                owner = row.get("owner_pid")
                binding = Binding(str(row["routing_key"]), str(row["pattern"]), str(row["queue"]))
                rows.append((binding, owner if isinstance(owner, int) else None))
        return rows

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(os.path.join(self.directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _write(self, exchange: str, rows: list[dict[str, object]]) -> None:
        path = self._path(exchange)
        temporary = f"{path}.tmp-{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump({"bindings": rows}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        # The rename is durable once the directory is: a binding must not vanish at a
        # power cut after the worker that made it announced itself.
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def bind(self, exchange: str, binding: Binding, owner_pid: int | None) -> None:
        """Add ``binding`` to ``exchange`` (replacing the same binding, and dead ones)."""
        row: dict[str, object] = binding._asdict()
        row["owner_pid"] = owner_pid
        with self._locked():
            rows = [
                old
                for old in self._read(exchange)
                if self._is_live(old) and tuple(old.get(k) for k in Binding._fields) != binding
            ]
            rows.append(row)
            self._write(exchange, rows)

    def unbind(self, exchange: str, binding: Binding) -> None:
        """Remove ``binding`` from ``exchange`` (nothing when it is not there)."""
        self._remove(exchange, lambda row: tuple(row.get(k) for k in Binding._fields) == binding)

    def unbind_queue(self, queue: str) -> None:
        """Remove every binding of ``queue``, from every exchange."""
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(".json") and not name.startswith("."):
                self._remove(name[: -len(".json")], lambda row: row.get("queue") == queue)

    def _remove(self, exchange: str, matches: Callable[[dict[str, object]], bool]) -> None:
        with self._locked():
            rows = self._read(exchange)
            kept = [row for row in rows if self._is_live(row) and not matches(row)]
            if len(kept) != len(rows):
                self._write(exchange, kept)
