"""The kombu transport ``ledgerq``: Celery's broker is a directory of ledgerq queues.

Built on kombu's virtual transport, as kombu's Redis, SQS and filesystem transports are:
kombu routes (exchanges, bindings) and this module stores.  Each kombu queue is the
ledgerq queue ``<root>/queues/<name>``, opened in shared mode (``ledgerq.open(...,
shared=True)``) by every process that uses it, so producers and workers in any number of
processes meet there; each exchange's bindings are a file under ``<root>/exchanges``
(:mod:`ledgerq.celery._bindings`) so a broadcast reaches every worker.

What kombu's verbs become (docs/celery.md says why):

=============================  ===========================================================
kombu                           ledgerq
=============================  ===========================================================
publish                         ``enqueue`` of the message dict (:mod:`ledgerq.celery._codec`);
                                a future ``eta`` header becomes ``delay=``
get / consume                   ``dequeue`` - a lease held by this connection's handle
ack                             ``ack``
reject(requeue=True)            ``nack``: a failed delivery (attempts + 1, the DLQ after
                                ``max_retries``), so a task that kills its worker every
                                time ends in the DLQ instead of looping
reject(requeue=False)           moved to the queue's DLQ (``dead_letter_rejected=False``:
                                ``ack``, dropped as AMQP drops it)
restore at shutdown / recover   ``release``: not a failure, attempts unchanged
purge / size                    ``purge`` / ``len``
queue delete                    the directory is removed when no other process has it
                                open, else purged
=============================  ===========================================================

A lease belongs to the handle that took it, and a handle to its connection: when the
process dies (SIGKILL, OOM) the shared queue gives its leases to the other processes
within a second, as failed deliveries - at-least-once for ``task_acks_late=True``.

With an encryption key (``encryption_key`` / ``encryption_key_file``:
:mod:`ledgerq.celery._keys`) every queue is opened - and so created - with it, and the
key is checked against the broker's queues when the connection is established.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import sys
import threading
import time
import uuid
from queue import Empty
from typing import Any, NamedTuple

from kombu.transport import virtual

import ledgerq
from ledgerq.celery import _codec as codec
from ledgerq.celery import _keys as keys
from ledgerq.celery._bindings import Binding, BindingTables
from ledgerq.celery._names import BrokerURLError, broker_root, check_name
from ledgerq.celery._temporary import TemporaryQueues
from ledgerq.celery._wakeup import Wakeup

__all__ = ["Channel", "QoS", "Transport"]

logger = logging.getLogger("ledgerq.celery")

QUEUES_DIR = "queues"
EXCHANGES_DIR = "exchanges"
_OPTION_NAMES = frozenset(field.name for field in dataclasses.fields(ledgerq.Options))


class _Lease(NamedTuple):
    queue: str
    message: ledgerq.Message


class QoS(virtual.QoS):
    """kombu's prefetch bookkeeping, settling each message in its ledgerq queue."""

    def ack(self, delivery_tag: str) -> None:
        """Ack the message in its queue, then forget the delivery."""
        self.channel.connection.settle(delivery_tag, "ack")
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Nack (``requeue``) or dead-letter the message, then forget the delivery.

        Not kombu's reject, which puts a copy of the message back: the queue still has
        the message itself.
        """
        self.channel.connection.settle(delivery_tag, "requeue" if requeue else "reject")
        self._quick_ack(delivery_tag)


class Channel(virtual.Channel):
    """A kombu channel over the ledgerq queues of one broker directory."""

    QoS = QoS
    # Every binding goes to the shared tables (not only fanout ones): replies and
    # broadcasts are bound in one process and published in another.
    supports_fanout = True

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._no_ack_queues: set[str] = set()

    @property
    def _broker(self) -> Transport:
        transport: Transport = self.connection
        return transport

    # -- queues
    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        auto_delete = bool(kwargs.get("auto_delete") or kwargs.get("exclusive"))
        arguments = kwargs.get("arguments") or {}
        expires_ms = arguments.get("x-expires") if isinstance(arguments, dict) else None
        expires_s = float(expires_ms) / 1000 if isinstance(expires_ms, int | float) else None
        self._broker.declare(queue, owned=auto_delete, expires_s=expires_s)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return self._broker.queue_exists(queue)

    def _size(self, queue: str) -> int:
        return self._broker.size(queue)

    def _purge(self, queue: str) -> int:
        return self._broker.purge(queue)

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> None:
        """Delete ``queue``: its bindings everywhere, and its messages."""
        # kombu's version deletes only the bindings this process made: the queue and its
        # bindings made elsewhere would stay.
        if if_empty and self._size(queue):
            return
        self.state.queue_bindings_delete(queue)
        self._broker.delete_queue(queue)

    # -- bindings, kept on disk
    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        owner = os.getpid() if queue in self._broker.owned_queues else None
        binding = Binding(routing_key or "", pattern or "", check_name("queue", queue))
        self._broker.bindings.bind(exchange, binding, owner)

    def queue_unbind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> None:
        """Remove the binding here and from the exchange's table on disk."""
        super().queue_unbind(queue, exchange, routing_key, arguments, **kwargs)
        if exchange:
            key, pattern, _ = self.typeof(exchange).prepare_bind(
                queue, exchange, routing_key, arguments
            )
            self._broker.bindings.unbind(exchange, Binding(key or "", pattern or "", queue))

    def get_table(self, exchange: str) -> list[Binding]:
        """Return the bindings of ``exchange`` made by any process."""
        return self._broker.route(exchange)

    # -- messages
    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self._broker.put(queue, message)

    def _put_fanout(
        self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any
    ) -> None:
        for binding in self._broker.route(exchange):
            self._broker.put(binding.queue, message)

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        payload = self._broker.take(queue, ack_now=queue in self._no_ack_queues)
        if payload is None:
            raise Empty()
        return payload

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> Any:
        """Consume ``queue``; with ``no_ack`` each message is acked as it is taken."""
        if no_ack:
            self._no_ack_queues.add(queue)
        self._broker.listen(queue)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        """Stop a consumer (its queue's no_ack mark goes with it)."""
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._no_ack_queues.discard(queue)
            if queue in self._broker.auto_delete_queues:
                # AMQP's auto-delete: its last consumer went away.
                self._broker.remove_temporary(queue)
        return result

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        """Take one message from ``queue`` now, or return None."""
        payload = self._broker.take(queue, ack_now=no_ack)
        if payload is None:
            return None
        message = self.Message(payload, channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def _restore(self, message: Any) -> None:
        # Unacked at shutdown, basic_recover: give the lease back (not a failure).
        self._broker.settle(message.delivery_tag, "release")

    def _restore_at_beginning(self, message: Any) -> None:
        self._restore(message)


class Transport(virtual.Transport):
    """The ``ledgerq`` transport: ``Celery(broker="ledgerq:///abs/dir")``.

    ``transport_options`` (Celery: ``broker_transport_options``):

    - ``queue_options``: a dict of :func:`ledgerq.open` options for every queue (e.g.
      ``{"sync": "always", "visibility_timeout": 3600, "max_retries": 5}``);
    - ``dead_letter_rejected`` (default True): a message rejected without requeue
      goes to its queue's DLQ; False acks (drops) it;
    - ``polling_interval`` (default 1.0): the longest a consumer waits without being
      woken - new messages wake it at once, from any process;
    - ``encryption_key`` (32 bytes, or 64 hex digits) or ``encryption_key_file`` (a
      path, read as ``ledgerq --key-file`` reads one): every queue is encrypted with
      it (:mod:`ledgerq.celery._keys`).
    """

    Channel = Channel
    can_parse_url = True
    driver_type = "ledgerq"
    driver_name = "ledgerq"
    polling_interval = 1.0
    implements = virtual.Transport.implements.extend(
        asynchronous=False,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
        heartbeats=False,
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        url = client.hostname or ""
        if "://" not in url:
            raise BrokerURLError(
                f"the ledgerq transport needs a broker URL ledgerq:///abs/dir, got {url!r}"
            )
        self.root = broker_root(url)
        options = dict(client.transport_options or {})
        self.queue_options = _queue_options(options.get("queue_options"))
        self.encryption_key = keys.broker_key(options, self.queue_options)
        if self.encryption_key is not None:
            self.queue_options["encryption_key"] = self.encryption_key
        self.dead_letter_rejected = bool(options.get("dead_letter_rejected", True))
        self.bindings = BindingTables(os.path.join(self.root, EXCHANGES_DIR))
        self.owned_queues: set[str] = set()
        # Temporary queues this process declared (temporary.py): removed when it stops
        # consuming them (auto-delete), or by whoever connects after it died.
        self.temporary = TemporaryQueues(self.root)
        self.auto_delete_queues: set[str] = set()
        self._temporary_queues: set[str] = set()
        self._pid = os.getpid()
        self._handles: dict[str, ledgerq.Queue] = {}
        self._readers: dict[str, ledgerq.Reader] = {}
        self._leases: dict[str, _Lease] = {}
        # Queues that another live process's consumer owns (a reply queue, another
        # worker's pidbox), learnt from the tables just before a publish to them.
        self._others_queues: set[str] = set()
        self._lock = threading.Lock()
        self._wakeup = Wakeup()
        # Set when Celery's worker begins its shutdown (worker_shutting_down): a drain
        # then returns at once instead of waiting out its timeout.
        self._stopping = False
        self._watch_for_shutdown()
        visibility = self.queue_options.get("visibility_timeout")
        self._touch_every = None if visibility is None else float(visibility) / 2
        self._touched_at = time.monotonic()

    # -- the connection
    def establish_connection(self) -> Any:
        """Create the broker directory if it is missing (the "connection")."""
        for sub in (QUEUES_DIR, EXCHANGES_DIR):
            path = os.path.join(self.root, sub)
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                raise ledgerq.StorageError(
                    "create the broker directory", path, exc, hint=_dir_hint(exc)
                ) from exc
        # Before any queue is opened: a key that does not fit stops the producer or
        # worker here, with the option to set, rather than at its first task.
        keys.check_broker(os.path.join(self.root, QUEUES_DIR), self.encryption_key)
        # Temporary queues of processes that died without removing them (kill -9, an
        # exit without closing): AMQP would have dropped them with their connection.
        for queue in self.temporary.stale():
            self.remove_temporary(queue)
        atexit.register(self._remove_own_temporary_queues)
        return super().establish_connection()

    def close_connection(self, connection: Any) -> None:
        """Close the channels (their unacked messages are released), then the queues."""
        try:
            super().close_connection(connection)
        finally:
            with self._lock:
                handles = list(self._handles.values())
                self._handles.clear()
                self._readers.clear()
            for handle in handles:
                try:
                    handle.close()
                except ledgerq.LedgerQError as exc:
                    logger.warning("closing %s: %s", handle.path, exc)
            self._remove_own_temporary_queues()
            self._wakeup.close()

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        """Return the broker URL as given (it has no password)."""
        return uri

    def driver_version(self) -> str:
        """Return ledgerq's version."""
        return ledgerq.__version__

    # -- queues
    def queue_path(self, queue: str) -> str:
        """Return the directory of kombu queue ``queue``."""
        return os.path.join(self.root, QUEUES_DIR, check_name("queue", queue))

    def handle(self, queue: str) -> ledgerq.Queue:
        """Return this connection's shared handle of ``queue``, opening it (creating it)."""
        handle = self._handles.get(queue)
        if handle is None:
            with self._lock:
                handle = self._handles.get(queue)
                if handle is None:
                    handle = self._open(self.queue_path(queue), shared=True)
                    self._handles[queue] = handle
        return handle

    def _open(self, path: str, **kwargs: Any) -> ledgerq.Queue:
        """``ledgerq.open(path)`` with this connection's options; a key that does not
        fit the queue raises ``ConfigError`` naming the transport option to set."""
        try:
            # Options are this connection's, not the queue's to keep: every process
            # says its own, and a stored copy would need the queue to itself to change.
            return ledgerq.open(path, remember_options=False, **self.queue_options, **kwargs)
        except ledgerq.ConfigError:
            keys.check_queue(path, self.encryption_key)  # says it in the broker's terms
            raise

    def declare(self, queue: str, *, owned: bool, expires_s: float | None = None) -> None:
        """Create ``queue`` if it is missing; ``owned``: it lives as long as this process
        consumes it (auto-delete, exclusive); ``expires_s``: it is removed that long
        after this process is gone (kombu's ``expires``)."""
        self.handle(queue)
        if owned:
            self.owned_queues.add(queue)
            self.auto_delete_queues.add(queue)
        if owned or expires_s is not None:
            self.temporary.record(queue, auto_delete=owned, expires_s=expires_s)
            self._temporary_queues.add(queue)

    def remove_temporary(self, queue: str) -> None:
        """Remove the temporary queue ``queue`` unless another process has it open (it
        is in use again: its record stays, for the next look)."""
        path = self.queue_path(queue)
        self.owned_queues.discard(queue)
        self.auto_delete_queues.discard(queue)
        self._temporary_queues.discard(queue)
        with self._lock:
            handle = self._handles.pop(queue, None)
            self._readers.pop(queue, None)
        if handle is not None:
            handle.close()
        if os.path.isdir(path):
            try:
                self._open(path).close()  # exclusive: no other process has it open
            except (ledgerq.QueueLockedError, ledgerq.ConfigError):
                return
            trash = os.path.join(self.root, QUEUES_DIR, f".deleted-{uuid.uuid4().hex}")
            try:
                os.rename(path, trash)
            except FileNotFoundError:
                pass  # removed meanwhile by another process
            else:
                shutil.rmtree(trash, ignore_errors=True)
        self.bindings.unbind_queue(queue)
        self.temporary.forget(queue)

    def _remove_own_temporary_queues(self) -> None:
        """Remove the auto-delete queues this process declared (at the connection's
        close and at exit: kombu clients often exit without closing)."""
        if os.getpid() != self._pid:
            return  # a forked child (a pool process): the queues are its parent's
        for queue in sorted(self.auto_delete_queues):
            try:
                self.remove_temporary(queue)
            except (ledgerq.LedgerQError, OSError) as exc:
                logger.warning("could not remove the temporary queue %s: %s", queue, exc)

    def queue_exists(self, queue: str) -> bool:
        """Whether ``queue`` has been created (by any process)."""
        return os.path.isdir(self.queue_path(queue))

    def size(self, queue: str) -> int:
        """Return the messages of ``queue`` waiting to be delivered."""
        return len(self.handle(queue))

    def purge(self, queue: str) -> int:
        """Remove the waiting (not leased) messages of ``queue``; return how many."""
        return self.handle(queue).purge()

    def delete_queue(self, queue: str) -> None:
        """Remove ``queue``'s bindings and the queue, or purge it if it is in use."""
        path = self.queue_path(queue)
        self.bindings.unbind_queue(queue)
        self.owned_queues.discard(queue)
        with self._lock:
            handle = self._handles.pop(queue, None)
            self._readers.pop(queue, None)
            for tag in [tag for tag, lease in self._leases.items() if lease.queue == queue]:
                del self._leases[tag]
        if handle is not None:
            handle.close()
        if not os.path.isdir(path):
            return
        try:
            # Exclusive, to learn that no other process has the queue open.
            self._open(path).close()
        except ledgerq.QueueLockedError:
            logger.info("queue %s is open in another process: purged, not removed", path)
            with self._open(path, shared=True) as shared:
                shared.purge()
            return
        # Renamed first, so that a process opening the queue now makes a new empty one
        # instead of finding half a directory.
        trash = os.path.join(self.root, QUEUES_DIR, f".deleted-{uuid.uuid4().hex}")
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def listen(self, queue: str) -> None:
        """Wake this connection's ``drain_events`` when ``queue`` may have messages."""
        with self._lock:
            if queue in self._readers:
                return
        handle = self.handle(queue)
        handle.add_listener(self._wakeup.set)
        with self._lock:
            self._readers[queue] = handle.reader("default")

    def route(self, exchange: str) -> list[Binding]:
        """Return the bindings of ``exchange``, noting which queues other processes own."""
        rows = self.bindings.table_with_owners(exchange)
        me = os.getpid()
        self._others_queues.update(b.queue for b, owner in rows if owner not in (None, me))
        return [binding for binding, _ in rows]

    # -- messages
    def put(self, queue: str, message: dict[str, Any]) -> None:
        """Enqueue kombu's ``message`` into ``queue``; a future ``eta`` delays it."""
        payload = codec.encode(message)
        delay = codec.eta_delay(message)
        if queue not in self._handles and (
            queue in self._others_queues or self._is_anothers_temporary(queue)
        ):
            self._others_queues.discard(queue)
            # Another process's temporary queue (a reply to `celery inspect`, a
            # broadcast to a worker): opened for this message only, so that a worker
            # does not keep a handle per client forever, and the owner can remove
            # the queue when it is done (docs/celery.md, "Limits").
            path = self.queue_path(queue)
            if not os.path.isdir(path):
                # Its owner removed it since the lookup (a client that stopped waiting
                # for replies): dropped, as AMQP drops a message to a deleted queue,
                # rather than made again for nobody.
                logger.debug("not publishing to %s: removed by its owner", path)
                return
            with self._open(path, shared=True) as transient:
                transient.enqueue(payload, delay=delay)
            return
        self.handle(queue).enqueue(payload, delay=delay)

    def _is_anothers_temporary(self, queue: str) -> bool:
        """Whether ``queue`` is a temporary queue another process declared (an rpc://
        client's reply queue, which results reach through the default exchange)."""
        if queue in self._temporary_queues:
            return False
        record = self.temporary.read(queue)
        return record is not None and record.owner_pid != os.getpid()

    def take(self, queue: str, *, ack_now: bool) -> dict[str, Any] | None:
        """Lease the next message of ``queue`` and return kombu's dict (None: none).

        ``ack_now`` (a no_ack consumer): acked as it is taken.  A payload that is not a
        kombu message goes to the queue's DLQ, logged once, and the next one is taken:
        kombu could not build a message from it, and a worker that raised instead would
        meet it again at every poll.
        """
        handle = self.handle(queue)
        while True:
            message = handle.dequeue(timeout=0)
            if message is None:
                return None
            try:
                payload = codec.decode(message.payload)
            except codec.UndecodableMessageError as exc:
                self._dead_letter(handle, message, str(exc))
                continue
            # Due by now (the broker held it until its eta): run at once, not after a
            # turn of the worker's timer (codec.clear_due_eta).
            codec.clear_due_eta(payload)
            if ack_now:
                handle.ack(message.id)
            # A fresh tag for each delivery: one message delivered twice to this
            # connection (a lease that expired, then came back) is two deliveries.
            tag = uuid.uuid4().hex
            properties = payload["properties"]
            properties["delivery_tag"] = tag
            info = properties.setdefault("delivery_info", {})
            info["redelivered"] = message.attempts > 1
            if not ack_now:
                with self._lock:
                    self._leases[tag] = _Lease(queue, message)
            return payload

    def settle(self, delivery_tag: str, how: str) -> None:
        """Settle a delivery: ``"ack"``, ``"release"``, ``"requeue"`` (nack) or
        ``"reject"`` (dead-letter, or ack).  A tag not leased here is ignored."""
        with self._lock:
            lease = self._leases.pop(delivery_tag, None)
            handle = None if lease is None else self._handles.get(lease.queue)
        if lease is None or handle is None:
            return
        message_id = lease.message.id
        try:
            if how == "ack":
                handle.ack(message_id)
            elif how == "release":
                handle.release(message_id)
            elif how == "requeue":
                handle.nack(message_id, "requeued by the consumer (reject with requeue)")
            elif self.dead_letter_rejected:
                self._dead_letter(handle, lease.message, "rejected by the consumer")
            else:
                handle.ack(message_id)
        except ledgerq.UnknownMessageError as exc:
            # The lease was lost (visibility timeout, or this handle was closed): the
            # message is or will be delivered again - at-least-once.
            logger.warning("could not %s message %d of %s: %s", how, message_id, handle.path, exc)
        except ledgerq.ForkedQueueError:
            pass  # a forked child's copy of the parent's connection: the leases are the parent's

    def _dead_letter(self, handle: ledgerq.Queue, message: ledgerq.Message, reason: str) -> None:
        headers = dict(message.headers)
        headers.update(
            {
                "dlq.original_id": str(message.id),
                "dlq.retry_count": str(message.attempts),
                "dlq.failure_reason": reason,
                "dlq.last_failure": str(time.time_ns()),
            }
        )
        # Written before the ack: a crash in between leaves the message in both queues,
        # never in neither.
        handle.dlq.enqueue(message.payload, headers=headers)
        handle.ack(message.id)
        logger.warning(
            "moved message %d of %s to its dead-letter queue: %s", message.id, handle.path, reason
        )

    # -- waiting
    def _watch_for_shutdown(self) -> None:
        """In a Celery worker, end the waits as its warm or cold shutdown begins.

        Celery's synloop calls ``drain_events(timeout=2.0)`` and looks at its shutdown
        flag between calls - and once more after it has seen the flag - so a wait that
        ran its course made every idle worker's shutdown take up to 4 s more.  Celery
        announces the shutdown (``celery.signals.worker_shutting_down``, sent by its
        signal handler in the main process); only a program that uses Celery has it.
        """
        signals = sys.modules.get("celery.signals")
        if signals is None:
            return
        signals.worker_shutting_down.connect(self._on_shutting_down, weak=True)

    def _on_shutting_down(self, *args: Any, **kwargs: Any) -> None:
        # Runs in a signal handler: a flag and a byte in a pipe, nothing that locks.
        self._stopping = True
        self._wakeup.set()

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> None:
        """Deliver one message to its consumer, waiting up to ``timeout`` seconds.

        kombu's version sleeps ``polling_interval`` between empty polls; this one waits
        for a consumed queue's wake-up (an enqueue, nack or returned lease in any
        process), for the next delayed message to fall due, or ``polling_interval``,
        whichever comes first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        cycle = self.cycle
        assert cycle is not None
        if self._stopping and timeout is not None:
            raise TimeoutError()  # the worker is shutting down: take nothing more
        while True:
            self._keep_leases()
            # Cleared before looking, so that a change after the look ends the wait.
            self._wakeup.clear()
            try:
                cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                pass
            wait = float(self.polling_interval)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError()  # socket.timeout, what kombu callers catch
                wait = min(wait, remaining)
            due = self._seconds_to_next_due()
            if due is not None:
                wait = min(wait, due)
            self._wakeup.wait(wait)
            if self._stopping and deadline is not None:
                raise TimeoutError()

    def _seconds_to_next_due(self) -> float | None:
        with self._lock:
            readers = list(self._readers.values())
        waits = []
        for reader in readers:
            try:
                seconds = reader.seconds_to_next_expiry()
            except ledgerq.QueueClosedError:
                continue
            if seconds is not None:
                waits.append(seconds)
        return min(waits, default=None)

    def _keep_leases(self) -> None:
        """Touch the leases this connection holds at half the visibility timeout, so
        that a task running longer than it is not delivered again to another worker."""
        if self._touch_every is None or time.monotonic() - self._touched_at < self._touch_every:
            return
        self._touched_at = time.monotonic()
        with self._lock:
            leases = [(self._handles.get(lease.queue), lease) for lease in self._leases.values()]
        for handle, lease in leases:
            if handle is None:
                continue
            try:
                handle.touch(lease.message.id)
            except ledgerq.UnknownMessageError:
                pass  # settled meanwhile, or already lost


def _queue_options(given: object) -> dict[str, Any]:
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise ledgerq.ConfigError(
            f"transport option queue_options must be a dict of ledgerq.open options, got {given!r}"
        )
    unknown = sorted(set(given) - _OPTION_NAMES)
    if unknown:
        raise ledgerq.ConfigError(
            f"transport option queue_options has unknown ledgerq options {unknown} "
            f"(known: {', '.join(sorted(_OPTION_NAMES))})"
        )
    return dict(given)


def _dir_hint(exc: OSError) -> str | None:
    if isinstance(exc, PermissionError):
        return "give this user write access there, or choose another broker directory"
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        return "a file is in the way: the broker URL must name a directory"
    return None
