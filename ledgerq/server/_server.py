"""The server: listening socket, connections, stats, and an orderly shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import ledgerq
from ledgerq.server import protocol as p
from ledgerq.server._connection import Connection, drain
from ledgerq.server._registry import QueueSlot, ReaderSlot, Registry

__all__ = ["DataDirLockedError", "Server", "ServerConfig", "ServerStats", "run"]

logger = logging.getLogger("ledgerq.server")

DEFAULT_PORT = 22133
LOCK_NAME = "~serve.lock"  # '~' never appears in a queue name


class DataDirLockedError(ledgerq.LedgerQError):
    """Another ``ledgerq serve`` already serves this data directory."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How ``ledgerq serve`` runs; the fields are its command-line flags.

    ``queue_options`` are keyword arguments of :func:`ledgerq.open` for every queue
    it opens, with ``max_message_size=max_item_size`` unless they say otherwise: they
    override what a queue stored, for this run only (they are not stored; see
    docs/server.md).  ``shared`` opens every queue in shared mode
    (``ledgerq.open(path, shared=True)``), so Python processes use the same queues
    directly while the server runs.
    """

    data_dir: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_item_size: int = p.DEFAULT_MAX_ITEM_SIZE
    max_connections: int = 4096
    max_open_reads: int = 1
    bare_keys: bool = False
    allow_shutdown: bool = False
    threads: int = 16
    # Out of repr(): it may hold the encryption_key, which is never shown.
    queue_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    shared: bool = False
    shutdown_grace: float = 10.0  # seconds running commands get to finish on shutdown
    # Writes of at most this many bytes run inline on the event loop when the queue
    # does not fsync on every write (sync != "always"); 0 sends every write to a thread.
    inline_max_bytes: int = 16 << 10
    expiry_scan_limit: int = 100_000  # pending items flush_expired looks at

    def __post_init__(self) -> None:
        for name in ("max_item_size", "max_connections", "max_open_reads", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")


@dataclass(slots=True)
class ServerStats:
    """Server-wide counters since start (the memcache ``stats`` names)."""

    started: float = field(default_factory=time.time)
    total_connections: int = 0
    cmd_get: int = 0
    cmd_set: int = 0
    cmd_peek: int = 0
    get_hits: int = 0
    get_misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    total_items: int = 0


class Server:
    """Serves the queues of ``config.data_dir`` over the memcache text protocol.

    ``await start()`` binds and returns the address; ``request_shutdown()`` (from
    any thread, or a signal) makes ``serve()`` stop: no new connections, running
    commands finish (waits answer what they have), open reads go back to their
    queues, every queue is synced and closed.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.stats = ServerStats()
        self._executor = ThreadPoolExecutor(
            max_workers=config.threads, thread_name_prefix="ledgerq-serve"
        )
        # The queue's own limit follows --max-item-size, so an item the protocol
        # accepts is one the queue stores (unless -o says otherwise).
        options = {"max_message_size": config.max_item_size, **config.queue_options}
        self.registry = Registry(
            config.data_dir, executor=self._executor, queue_options=options, shared=config.shared
        )
        self.address: tuple[str, int] = (config.host, config.port)
        self._connections: set[Connection] = set()
        self._listener: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._wants_stop = False  # a request before start()
        self._stopped: asyncio.Future[None] | None = None
        self._lock_fd: int | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.TimerHandle] = set()

    # ------------------------------------------------------------------ running

    async def start(self) -> tuple[str, int]:
        """Lock the data directory, open its queues, listen; return (host, port).

        Raises :class:`DataDirLockedError` if another server uses the directory,
        ``OSError`` if the address cannot be bound, and what ``ledgerq.open`` raises
        for an unusable data directory.
        """
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        if self._wants_stop:
            self._stop_requested.set()
        self._lock_data_dir()
        try:
            opened = await self.registry.open_existing()
            logger.info("ledgerq serve: %d queue(s) in %s", len(opened), self.registry.data_dir)
            try:
                self._listener = await self._loop.create_server(
                    lambda: Connection(self),
                    self.config.host,
                    self.config.port,
                    reuse_address=True,
                    backlog=1024,
                )
            except OSError as exc:
                where = f"{self.config.host}:{self.config.port}"
                raise OSError(
                    exc.errno, f"cannot listen on {where}: {exc.strerror or exc}"
                ) from exc
        except BaseException:
            await self.stop()
            raise
        host, port = self._listener.sockets[0].getsockname()[:2]
        self.address = (str(host), int(port))
        return self.address

    async def serve(self) -> None:
        """Serve until :meth:`request_shutdown`, then :meth:`stop`."""
        assert self._stop_requested is not None, "start() first"
        try:
            await self._stop_requested.wait()
        finally:
            await self.stop()

    def request_shutdown(self) -> None:
        """Ask :meth:`serve` to stop (safe from any thread and from signal handlers)."""
        self._wants_stop = True
        loop, event = self._loop, self._stop_requested
        if loop is None or event is None:
            return
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # the loop is already closed
            pass

    async def stop(self) -> None:
        """Stop serving: close connections, give back open reads, close the queues."""
        if self._stopped is not None:
            await asyncio.shield(self._stopped)
            return
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        try:
            await self._stop()
        finally:
            self._stopped.set_result(None)

    async def _stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        connections = list(self._connections)
        for connection in connections:
            connection.begin_close()
        pending = [c.done for c in connections if not c.done.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.config.shutdown_grace)
            for connection in connections:
                if not connection.done.done():
                    logger.warning("ledgerq serve: a command did not finish; closing anyway")
                    connection.abort()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.config.shutdown_grace)
            for task in self._tasks:
                task.cancel()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._listener.wait_closed(), 1.0)
        await self.registry.close_all()
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _lock_data_dir(self) -> None:
        path = self.registry.data_dir
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLockedError(
                f"{path} is already served by another ledgerq serve (it holds {LOCK_NAME})"
            ) from None
        self._lock_fd = fd

    # ------------------------------------------------------------------ connections

    def admit(self, connection: Connection) -> bytes | None:
        """Count a new connection in; or the reply that turns it away."""
        if self._stopped is not None:
            return p.server_error("the server is shutting down")
        if len(self._connections) >= self.config.max_connections:
            return p.server_error("too many open connections")
        self._connections.add(connection)
        self.stats.total_connections += 1
        return None

    def forget(self, connection: Connection) -> None:
        """A connection has ended."""
        self._connections.discard(connection)

    @property
    def connection_count(self) -> int:
        """Connections open now."""
        return len(self._connections)

    def _spawn(self, make: Callable[[], Any]) -> None:
        task = asyncio.get_running_loop().create_task(make())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ flushing

    async def flush(self, slot: ReaderSlot) -> int:
        """Remove the items pending for one reader now; return how many."""
        removed = await self.registry.run(drain, slot.reader)
        slot.flushes += 1
        return removed

    async def flush_all(self) -> int:
        """Flush every reader of every served queue; return the items removed."""
        removed = 0
        for slot in self.registry.slots():
            try:
                removed += await self.registry.run(_flush_queue, slot.queue)
            except ledgerq.QueueClosedError:
                continue  # deleted meanwhile
            for reader_slot in slot.readers.values():
                reader_slot.flushes += 1
        return removed

    def flush_all_later(self, delay: float) -> None:
        """``flush_all <delay>``: flush everything ``delay`` seconds from now."""
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.discard(timer)
            self._spawn(self._flush_all_logged)

        timer = loop.call_later(delay, fire)
        self._timers.add(timer)

    async def _flush_all_logged(self) -> None:
        try:
            await self.flush_all()
        except Exception:
            logger.exception("ledgerq serve: delayed flush_all failed")

    # ------------------------------------------------------------------ stats

    async def _snapshots(self, names: set[str] | None) -> list[tuple[QueueSlot, ledgerq.Stats]]:
        slots = [s for s in self.registry.slots() if names is None or s.name in names]
        results = await asyncio.gather(
            *(self.registry.run(s.queue.stats) for s in slots), return_exceptions=True
        )
        return [
            (slot, result)
            for slot, result in zip(slots, results, strict=True)
            if isinstance(result, ledgerq.Stats)
        ]

    async def stat_lines(self) -> list[bytes]:
        """The ``stats`` reply (without END): server-wide, then per queue and reader."""
        snapshots = await self._snapshots(None)
        now = time.time()
        s = self.stats
        server: list[tuple[str, object]] = [
            ("uptime", int(now - s.started)),
            ("time", int(now)),
            ("version", p.version_line(ledgerq.__version__)[8:-2].decode("ascii")),
            ("pid", os.getpid()),
            ("curr_items", sum(st.pending for _, st in snapshots)),
            ("total_items", s.total_items),
            ("bytes", sum(st.disk_bytes for _, st in snapshots)),
            ("curr_connections", len(self._connections)),
            ("total_connections", s.total_connections),
            ("cmd_get", s.cmd_get),
            ("cmd_set", s.cmd_set),
            ("cmd_peek", s.cmd_peek),
            ("get_hits", s.get_hits),
            ("get_misses", s.get_misses),
            ("bytes_read", s.bytes_read),
            ("bytes_written", s.bytes_written),
            ("queue_creates", self.registry.creates),
            ("queue_deletes", self.registry.deletes),
        ]
        lines = [p.stat_line(name, value) for name, value in server]
        for slot, stats in snapshots:
            for label, figures in _queue_figures(slot, stats):
                lines.extend(p.stat_line(f"queue_{label}_{k}", v) for k, v in figures)
        return lines

    async def dump_stats_lines(self, names: set[str] | None) -> list[bytes]:
        """The ``dump_stats`` reply (without END), Kestrel's ``queue 'q' { k=v }`` blocks."""
        lines = []
        for slot, stats in await self._snapshots(names):
            for label, figures in _queue_figures(slot, stats):
                lines.append(f"queue '{label}' {{\r\n".encode("ascii"))
                lines.extend(f"  {k}={v}\r\n".encode("ascii") for k, v in figures)
                lines.append(b"}\r\n")
        return lines


def _flush_queue(queue: ledgerq.Queue) -> int:
    return sum(drain(queue.reader(name)) for name in queue.stats().readers)


def _queue_figures(
    slot: QueueSlot, stats: ledgerq.Stats
) -> list[tuple[str, list[tuple[str, object]]]]:
    """(label, [(stat, value)]) for the queue's default reader, then each named reader."""
    out = []
    for name in sorted(stats.readers, key=lambda n: (n != "default", n)):
        reader = stats.readers[name]
        key = None if name == "default" else name
        served = slot.readers.get(key)
        label = slot.name if key is None else f"{slot.name}+{name}"
        figures: list[tuple[str, object]] = [
            ("items", reader.pending),
            ("bytes", stats.disk_bytes),
            ("total_items", stats.enqueued),
            ("logsize", stats.disk_bytes),
            ("expired_items", reader.expired),
            ("age", int(reader.oldest_pending_age * 1000)),
            ("discarded", stats.dropped),
            ("waiters", served.waiting if served else 0),
            ("open_transactions", served.open_reads if served else 0),
            ("canceled_transactions", served.aborted if served else 0),
            ("total_flushes", served.flushes if served else 0),
            ("in_flight", reader.in_flight),
            ("acked", reader.acked),
            ("dead_lettered", reader.dead_lettered),
        ]
        out.append((label, figures))
    return out


# ---------------------------------------------------------------------- process entry


def _raise_fd_limit(wanted: int) -> None:
    # Thousands of connections need as many descriptors: raise the soft limit
    # towards the hard one (never above it; no privilege needed).
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


def run(config: ServerConfig, *, on_ready: Callable[[str, int], None] | None = None) -> None:
    """Run a server in this process until SIGTERM/SIGINT or ``shutdown``; shut down cleanly.

    ``on_ready(host, port)`` is called once the socket listens (``--port 0`` picks a
    free port: this tells which).  Raises what :meth:`Server.start` raises.
    """
    _raise_fd_limit(config.max_connections + 256)
    asyncio.run(_main(config, on_ready))


async def _main(config: ServerConfig, on_ready: Callable[[str, int], None] | None) -> None:
    server = Server(config)
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_shutdown)
            installed.append(sig)
    try:
        host, port = await server.start()
        if on_ready is not None:
            on_ready(host, port)
        await server.serve()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
