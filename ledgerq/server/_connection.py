"""One client connection: bytes from the transport through the parser, commands to queues.

A connection costs an ``asyncio.Protocol`` object and a parser while idle: the task
that executes commands exists only while there is something to execute (or a
request is waiting), so thousands of idle connections stay cheap.  Commands of one
connection run in order, one at a time; replies are written in the same order.

Flow control, so that a slow or stalled client only ever slows itself: when the
transport's write buffer is full the connection stops executing (and so stops
reading new commands) until the client reads; when commands pile up unexecuted
(pipelining behind a waiting ``get``) reading pauses.  And a busy client does not
hold up the others: most commands never wait (a take, a peek, a small write run
inline), so after every few of them - commands, or keys of one ``get`` - the
connection yields the event loop (:meth:`Connection._take_turns`).

Open reads (``get q/open``) belong to the connection: ``/close`` acks the oldest
one on that queue, ``/abort`` gives it back, and a connection that ends for any
reason gives back every read it still holds.  "Give back" is ``release``: the item
is the next one delivered (the FIFO serves given-back items first, lowest id first)
and it is not a failed delivery - its attempts stay as they were and it moves no
closer to the dead-letter queue (see docs/server.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import ledgerq
from ledgerq.server import protocol as p
from ledgerq.server._registry import ReaderSlot, ServerClosingError, Waiter

if TYPE_CHECKING:
    from ledgerq.server._server import Server

__all__ = ["FLAGS_HEADER", "Connection"]

logger = logging.getLogger("ledgerq.server")

T = TypeVar("T")

FLAGS_HEADER = "memcache.flags"  # the 32-bit flags of a set, when not 0
_READ_HIGH_WATER = 1 << 20  # unexecuted bytes buffered before reading pauses
_FLUSH_BYTES = 64 << 10  # replies gathered before a write() regardless
_STEPS_PER_TURN = 32  # commands (or get keys) run before letting other connections run
_ALREADY_EXPIRED_TTL = 1e-9  # an exptime in the past: stored, and expired at once
FLUSH_BATCH = 1000


def flags_of(message: ledgerq.Message) -> int:
    """The flags a ``set`` stored with the item (0 when none or not a number)."""
    text = message.headers.get(FLAGS_HEADER)
    if text is None or not text.isdigit():
        return 0
    value = int(text)
    return value if value <= p.MAX_FLAGS else 0


def drain(reader: ledgerq.Reader) -> int:
    """Remove the items pending for ``reader`` now (not leased ones); return how many."""
    remaining = len(reader)
    removed = 0
    while remaining > 0:
        batch = reader.dequeue_batch(min(FLUSH_BATCH, remaining), 0)
        if not batch:
            break
        for message in batch:
            reader.ack(message.id)
        removed += len(batch)
        remaining -= len(batch)
    return removed


def flush_expired(queue: ledgerq.Queue, scan_limit: int) -> int:
    """Remove the expired items among the first ``scan_limit`` pending ones; how many."""
    pending = len(queue)
    if not pending:
        return 0
    now = time.time_ns()
    expired = [
        m.id
        for m in queue.peek(min(pending, scan_limit))
        if m.expires_at is not None and m.expires_at <= now
    ]
    return queue.purge(expired) if expired else 0


@dataclass(slots=True)
class _OpenReads:
    """The reads one connection holds open on one reader, oldest first."""

    slot: ReaderSlot
    ids: deque[int] = field(default_factory=deque)


class Connection(asyncio.Protocol):
    """The server side of one client connection."""

    def __init__(self, server: Server) -> None:
        config = server.config
        self._server = server
        self._stats = server.stats
        self._registry = server.registry
        self._max_open = config.max_open_reads
        self._bare_keys = config.bare_keys
        self._inline_max = config.inline_max_bytes
        self._parser = p.Parser(max_item_size=config.max_item_size)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._is_closing = False  # no more commands will run
        self._is_rejected = False
        self._is_eof = False
        self._is_read_paused = False
        self._writable: asyncio.Future[None] | None = None  # set while writing is paused
        self._out: list[bytes] = []  # replies not written to the transport yet
        self._out_bytes = 0
        self._waiter: tuple[ReaderSlot, Waiter] | None = None
        self._opens: dict[tuple[str, str | None], _OpenReads] = {}
        self._steps = 0  # commands and get keys run since this connection last yielded
        self.done: asyncio.Future[None] = self._loop.create_future()

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        server = self._server
        refusal = server.admit(self)
        if refusal is not None:
            self._is_rejected = self._is_closing = True
            transport.write(refusal)
            transport.close()
            self.done.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._stats.bytes_read += len(data)
        if self._is_closing:
            return
        self._parser.feed(data)
        if self._task is None:
            self._task = self._loop.create_task(self._run())
        elif self._parser.buffered > _READ_HIGH_WATER and not self._is_read_paused:
            self._pause_reading()

    def eof_received(self) -> bool:
        # The client will send no more: answer what it sent without waiting (a
        # client that closed its socket cannot be told apart from one that only
        # shut down its sending side), then close.
        self._is_eof = True
        self._withdraw_waiter()
        if self._task is None:
            self.begin_close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._resume_writing()
        if self._is_rejected:
            return
        self.begin_close()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        self._resume_writing()

    def _resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def _pause_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()
            self._is_read_paused = True

    def _resume_reading(self) -> None:
        if self._is_read_paused and self._transport is not None:
            self._is_read_paused = False
            if not self._transport.is_closing():
                self._transport.resume_reading()

    # ------------------------------------------------------------------ lifecycle

    def begin_close(self) -> None:
        """Run no further commands; give back open reads and close (idempotent).

        A command already running finishes first (a waiting ``get`` is woken and
        answers what it has).
        """
        if not self._is_closing:
            self._is_closing = True
        self._withdraw_waiter()
        if self._task is None and not self.done.done():
            self._task = self._loop.create_task(self._finish())

    def abort(self) -> None:
        """Close the transport at once (shutdown past its grace period)."""
        if self._transport is not None:
            self._transport.abort()
        if self._task is not None:
            self._task.cancel()
        if not self.done.done():
            self.done.set_result(None)

    def _withdraw_waiter(self) -> None:
        if self._waiter is not None:
            slot, waiter = self._waiter
            slot.settle(waiter)

    async def _run(self) -> None:
        try:
            while not self._is_closing:
                command = self._parser.next_command()
                if command is None:
                    break
                await self._execute(command)
                if self._out_bytes and not self._parser.buffered:
                    self._flush()  # nothing pipelined behind it: answer now
                if self._writable is not None:
                    self._flush()
                    await self._writable
                await self._take_turns()
            self._flush()
        except Exception:
            logger.exception("ledgerq serve: connection failed")
            self._is_closing = True
        if self._is_closing:
            await self._finish()
            return
        self._task = None
        self._resume_reading()
        if self._is_eof:
            self.begin_close()

    async def _take_turns(self) -> None:
        """Count one step of work; every ``_STEPS_PER_TURN`` steps, let others run.

        A command that finds what it needs at once never suspends, so without this
        a long pipeline (or a ``get`` of thousands of keys) would run in one go and
        every other connection would wait for all of it.  The replies so far go out
        first, so the busy client is not held back either.
        """
        self._steps += 1
        if self._steps >= _STEPS_PER_TURN:
            self._steps = 0
            self._flush()
            await asyncio.sleep(0)

    async def _finish(self) -> None:
        try:
            self._flush()
            await self._give_back_all()
        finally:
            if self._transport is not None and not self._transport.is_closing():
                self._transport.close()
            self._server.forget(self)
            if not self.done.done():
                self.done.set_result(None)

    # ------------------------------------------------------------------ writing

    # Replies are gathered and sent with one write() per command (or per batch of
    # pipelined commands): a VALUE block and its END go out together.  Anything
    # that may wait flushes first, so a reply never waits behind a slow request.

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= _FLUSH_BYTES:
            self._flush()

    def _write_parts(self, parts: list[bytes]) -> None:
        for part in parts:
            self._write(part)

    def _flush(self) -> None:
        out = self._out
        if not out:
            return
        self._stats.bytes_written += self._out_bytes
        self._out = []
        self._out_bytes = 0
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        small: list[bytes] = []
        for part in out:
            if len(part) < _FLUSH_BYTES:
                small.append(part)
                continue
            if small:  # a large payload is written as it is, never copied into a join
                transport.write(b"".join(small))
                small = []
            transport.write(part)
        if small:
            transport.write(small[0] if len(small) == 1 else b"".join(small))

    async def _offload(self, func: Callable[..., T], *args: Any) -> T:
        """Run blocking ``func`` in the server's threads (replies so far go out first)."""
        self._flush()
        return await self._registry.run(func, *args)

    def _value(self, key: bytes, message: ledgerq.Message, with_cas: bool) -> None:
        self._write_parts(
            p.value_block(key, flags_of(message), message.payload, message.id if with_cas else None)
        )

    # ------------------------------------------------------------------ dispatch

    async def _execute(self, command: p.Command) -> None:
        noreply = bool(getattr(command, "noreply", False))
        try:
            await self._handle(command)
        except ServerClosingError:
            if not noreply:
                self._write(p.server_error("the server is shutting down"))
        except ledgerq.QueueLockedError as exc:
            if not noreply:
                name = os.path.basename(exc.path)
                self._write(p.server_error(f"queue {name} is locked by another process"))
        except ledgerq.MessageTooLargeError:
            if not noreply:
                self._write(p.TOO_LARGE)
        except (ledgerq.LedgerQError, OSError) as exc:
            logger.warning("ledgerq serve: %s failed: %s", type(command).__name__, exc)
            if not noreply:
                self._write(p.server_error(str(exc) or type(exc).__name__))
        except Exception:
            logger.exception("ledgerq serve: %s failed", type(command).__name__)
            if not noreply:
                self._write(p.server_error("internal error (logged by the server)"))

    async def _handle(self, command: p.Command) -> None:
        match command:
            case p.Get():
                await self._get(command)
            case p.Set():
                await self._set(command)
            case p.Reject():
                if not command.noreply:
                    self._write(command.reply)
            case p.Hangup():
                self._write(command.reply)
                self._is_closing = True
            case p.Quit():
                self._is_closing = True
            case p.Delete():
                await self._delete(command)
            case p.Flush():
                await self._flush_command(command)
            case p.FlushAll():
                await self._flush_all(command)
            case p.Version():
                self._write(p.version_line(ledgerq.__version__))
            case p.Stats():
                await self._stats_command(command)
            case p.Verbosity():
                if not command.noreply:
                    self._write(p.OK)
            case p.Shutdown():
                self._shutdown()
            case p.Confirm():
                await self._confirm(command)
            case p.Monitor():
                await self._monitor(command)
            case p.FlushExpired():
                await self._flush_expired(command)
            case p.FlushAllExpired():
                await self._flush_all_expired()
            case p.DumpStats():
                await self._dump_stats(command)

    def _shutdown(self) -> None:
        if not self._server.config.allow_shutdown:
            self._write(
                p.client_error("shutdown is disabled (start the server with --allow-shutdown)")
            )
            return
        # Kestrel: no reply; the connection closes and the server stops.
        self._is_closing = True
        self._server.request_shutdown()

    # ------------------------------------------------------------------ set

    async def _set(self, command: p.Set) -> None:
        try:
            key = p.parse_set_key(command.key)
        except p.KeyProblem as exc:
            if not command.noreply:
                self._write(p.client_error(str(exc)))
            return
        ttl = p.exptime_to_ttl(command.exptime, time.time())
        if ttl is not None and ttl <= 0:
            ttl = _ALREADY_EXPIRED_TTL
        headers = {FLAGS_HEADER: str(command.flags)} if command.flags else None
        for attempt in range(2):
            slot = await self._registry.queue(key.queue, create=True)
            assert slot is not None
            try:
                if slot.is_sync_always or key.sync or len(command.data) > self._inline_max:
                    await self._offload(_enqueue, slot.queue, command.data, headers, ttl, key.sync)
                else:  # a write() to the page cache: cheaper than a thread hop
                    _enqueue(slot.queue, command.data, headers, ttl, False)
                break
            except ledgerq.QueueClosedError:
                if not slot.is_dead or attempt:
                    raise  # closed by shutdown, not by a delete: nothing to retry
            except ledgerq.QueueFullError:
                # A bounded queue with no room: memcache's answer for an item not stored
                # (the client may retry later); a set never waits for room.
                self._stats.cmd_set += 1
                if not command.noreply:
                    self._write(p.NOT_STORED)
                return
        self._stats.cmd_set += 1
        self._stats.total_items += 1
        if not command.noreply:
            self._write(p.STORED)

    # ------------------------------------------------------------------ get

    def _open_reads(self, queue: str, reader: str | None) -> _OpenReads | None:
        entry = self._opens.get((queue, reader))
        if entry is not None and entry.slot.is_dead:
            # The queue or reader was deleted: its open reads went with it.
            entry.slot.open_reads -= len(entry.ids)
            del self._opens[(queue, reader)]
            return None
        return entry

    def _plan_problem(self, keys: list[p.GetKey]) -> str | None:
        """Why this request breaks the open-read rules (checked before doing anything)."""
        counts: dict[tuple[str, str | None], int] = {}
        for key in keys:
            where = (key.queue, key.reader)
            if where not in counts:
                entry = self._open_reads(*where)
                counts[where] = len(entry.ids) if entry is not None else 0
            held = counts[where]
            if key.close or key.abort:
                held = max(held - 1, 0)
            if key.open:
                if held >= self._max_open:
                    label = key.bare_key.decode("ascii")
                    return (
                        f"too many open reads on {label} (limit {self._max_open}); "
                        "close or abort one first"
                    )
                held += 1
            elif key.takes and held:
                return "close current item first"
            counts[where] = held
        return None

    async def _get(self, command: p.Get) -> None:
        try:
            keys = [p.parse_get_key(key) for key in command.keys]
        except p.KeyProblem as exc:
            self._write(p.client_error(str(exc)))
            return
        problem = self._plan_problem(keys)
        if problem is not None:
            self._write(p.client_error(problem))
            return
        # Open every queue first, so a failure answers SERVER_ERROR before any item
        # was taken.  A waiting request creates its queue (to wait on it), and so does
        # a reader's first reference (Kestrel: it subscribes from then on).
        slots = [
            await self._registry.reader(
                key.queue, key.reader, create=key.timeout_ms > 0 or key.reader is not None
            )
            for key in keys
        ]
        stats = self._stats
        for key, slot in zip(keys, slots, strict=True):
            await self._take_turns()  # a get of thousands of keys is a pipeline too
            if self._is_closing:
                break
            if key.close:
                await self._settle_oldest(key.queue, key.reader, give_back=False)
            elif key.abort:
                await self._settle_oldest(key.queue, key.reader, give_back=True)
            if not (key.peek or key.takes):
                continue
            stats.cmd_get += 1
            if key.peek:
                stats.cmd_peek += 1
            message = None
            if slot is not None and not slot.is_dead:
                message = await self._fetch(slot, key.timeout_ms / 1000, is_peek=key.peek)
            if message is None:
                stats.get_misses += 1
                continue
            stats.get_hits += 1
            if key.open:
                assert slot is not None
                self._hold(key.queue, key.reader, slot, message.id)
            elif not key.peek:
                assert slot is not None
                if self._is_closing:  # the client left while we waited: give it back
                    await self._give_back(slot, message.id)
                    break
                await self._ack(slot, message.id)
            self._value(key.bare_key if self._bare_keys else key.key, message, command.with_cas)
            if self._writable is not None:  # a slow reader: hold the next values back
                self._flush()
                await self._writable
        self._write(p.END)

    async def _fetch(
        self, slot: ReaderSlot, timeout_s: float, *, is_peek: bool
    ) -> ledgerq.Message | None:
        """Take (or peek) an item, waiting up to ``timeout_s`` on the reader's FIFO."""
        try:
            message = slot.peek_now() if is_peek else slot.take_now()
            if message is not None or timeout_s <= 0 or self._is_closing or self._is_eof:
                return message
            waiter = slot.park(is_peek=is_peek)
        except ledgerq.QueueClosedError:
            return None  # deleted under us
        timer = self._loop.call_later(timeout_s, slot.settle, waiter)
        self._waiter = (slot, waiter)
        self._flush()
        try:
            return await waiter.future
        finally:
            timer.cancel()
            self._waiter = None
            slot.settle(waiter)

    def _hold(self, queue: str, reader: str | None, slot: ReaderSlot, message_id: int) -> None:
        entry = self._opens.get((queue, reader))
        if entry is None or entry.slot is not slot:
            entry = self._opens[(queue, reader)] = _OpenReads(slot)
        entry.ids.append(message_id)
        slot.open_reads += 1

    async def _settle_oldest(self, queue: str, reader: str | None, *, give_back: bool) -> bool:
        """Ack (close) or give back (abort) the oldest open read on a reader; False if none."""
        entry = self._open_reads(queue, reader)
        if entry is None or not entry.ids:
            return False
        message_id = entry.ids.popleft()
        entry.slot.open_reads -= 1
        if not entry.ids:
            del self._opens[(queue, reader)]
        if give_back:
            entry.slot.aborted += 1
            await self._give_back(entry.slot, message_id)
        else:
            await self._ack(entry.slot, message_id)
        return True

    async def _ack(self, slot: ReaderSlot, message_id: int) -> None:
        try:
            if slot.queue_slot.is_sync_always:
                await self._offload(slot.reader.ack, message_id)
            else:  # a journal write(), no fsync: inline (see docs/server.md)
                slot.reader.ack(message_id)
        except (ledgerq.UnknownMessageError, ledgerq.QueueClosedError):
            # Its visibility timeout gave it to someone else, or the queue was
            # deleted: nothing of ours to confirm any more.
            pass

    async def _give_back(self, slot: ReaderSlot, message_id: int) -> None:
        try:
            if slot.queue_slot.is_sync_always:
                await self._offload(slot.reader.release, message_id)
            else:  # a journal write(), no fsync: inline, as an ack
                slot.reader.release(message_id)
        except (ledgerq.UnknownMessageError, ledgerq.QueueClosedError):
            pass

    async def _give_back_all(self) -> None:
        opens, self._opens = self._opens, {}
        for entry in opens.values():
            entry.slot.open_reads -= len(entry.ids)
            if entry.slot.is_dead:
                continue
            entry.slot.aborted += len(entry.ids)
            for message_id in entry.ids:
                try:
                    await self._give_back(entry.slot, message_id)
                except Exception:
                    logger.exception("ledgerq serve: giving back an open read failed")

    # ------------------------------------------------------------------ Kestrel extras

    def _queue_key(self, key: bytes, *, noreply: bool = False) -> tuple[str, str | None] | None:
        """The queue and reader ``key`` names, or None after answering CLIENT_ERROR.

        ``noreply`` (a command sent with it) suppresses the answer, not the refusal.
        """
        try:
            return p.parse_queue_key(key)
        except p.KeyProblem as exc:
            if not noreply:
                self._write(p.client_error(str(exc)))
            return None

    async def _confirm(self, command: p.Confirm) -> None:
        parsed = self._queue_key(command.key)
        if parsed is None:
            return
        queue, reader = parsed
        entry = self._open_reads(queue, reader)
        if (len(entry.ids) if entry is not None else 0) < command.count:
            self._write(p.ERROR)  # Kestrel: fewer open than asked, nothing confirmed
            return
        for _ in range(command.count):
            await self._settle_oldest(queue, reader, give_back=False)
        self._write(p.END)

    async def _monitor(self, command: p.Monitor) -> None:
        parsed = self._queue_key(command.key)
        if parsed is None:
            return
        queue, reader = parsed
        slot = await self._registry.reader(
            queue, reader, create=command.seconds > 0 or reader is not None
        )
        deadline = self._loop.time() + command.seconds
        sent = 0
        while slot is not None and not self._is_closing and not slot.is_dead:
            await self._take_turns()
            if command.max_items is not None and sent >= command.max_items:
                break
            entry = self._open_reads(queue, reader)
            if entry is not None and len(entry.ids) >= self._max_open:
                break
            message = await self._fetch(slot, deadline - self._loop.time(), is_peek=False)
            if message is None:
                break
            self._stats.cmd_get += 1
            self._stats.get_hits += 1
            self._hold(queue, reader, slot, message.id)
            self._value(command.key, message, False)
            self._write(p.END)
            self._flush()
            sent += 1
            if self._writable is not None:
                await self._writable
        self._write(p.END)

    async def _flush_expired(self, command: p.FlushExpired) -> None:
        parsed = self._queue_key(command.key)
        if parsed is None:
            return
        queue, reader = parsed
        if reader is not None:
            self._write(p.client_error("flush_expired works on queues, not on readers"))
            return
        slot = await self._registry.queue(queue, create=False)
        removed = 0
        if slot is not None:
            removed = await self._offload(
                flush_expired, slot.queue, self._server.config.expiry_scan_limit
            )
        self._write(b"%d\r\n" % removed)

    async def _flush_all_expired(self) -> None:
        removed = 0
        limit = self._server.config.expiry_scan_limit
        for slot in self._registry.slots():
            try:
                removed += await self._offload(flush_expired, slot.queue, limit)
            except ledgerq.QueueClosedError:
                continue
        self._write(b"%d\r\n" % removed)

    # ------------------------------------------------------------------ delete, flush, stats

    async def _delete(self, command: p.Delete) -> None:
        parsed = self._queue_key(command.key, noreply=command.noreply)
        if parsed is None:
            return
        queue, reader = parsed
        if reader == "default":
            if not command.noreply:
                self._write(p.client_error("the default reader cannot be deleted"))
            return
        await self._registry.delete(queue, reader)
        if not command.noreply:
            self._write(p.DELETED)

    async def _flush_command(self, command: p.Flush) -> None:
        parsed = self._queue_key(command.key, noreply=command.noreply)
        if parsed is None:
            return
        queue, reader = parsed
        slot = await self._registry.reader(queue, reader, create=False)
        if slot is not None:
            self._flush()
            try:
                await self._server.flush(slot)
            except ledgerq.QueueClosedError:
                pass  # deleted meanwhile: empty anyway
        if not command.noreply:
            self._write(p.END)

    async def _flush_all(self, command: p.FlushAll) -> None:
        if command.delay > 0:
            self._server.flush_all_later(command.delay)
        else:
            await self._server.flush_all()
        if not command.noreply:
            self._write(p.OK)

    async def _stats_command(self, command: p.Stats) -> None:
        if command.args:
            self._write(p.client_error("only plain 'stats' is supported"))
            return
        lines = await self._server.stat_lines()
        self._write(b"".join(lines) + p.END)

    async def _dump_stats(self, command: p.DumpStats) -> None:
        try:
            wanted = {p.parse_queue_key(key)[0] for key in command.keys}
        except p.KeyProblem as exc:
            self._write(p.client_error(str(exc)))
            return
        lines = await self._server.dump_stats_lines(wanted or None)
        self._write(b"".join(lines) + p.END)


def _enqueue(
    queue: ledgerq.Queue,
    data: bytes,
    headers: dict[str, str] | None,
    ttl: float | None,
    sync: bool,
) -> None:
    queue.enqueue(data, headers=headers, ttl=ttl)
    if sync:
        queue.sync()
