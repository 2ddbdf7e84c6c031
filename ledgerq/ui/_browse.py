"""Messages as the console lists them: the next ones, one by id, and the dead letters.

Read from the log without the queue's lock (``QueueFiles.messages``: a log view,
``ledgerq.tools.iter_messages`` with the queue's key when it is encrypted - one the
console cannot open raises ``KeyNeeded`` instead), and judged against the reader's
replayed state (:class:`ReaderSnapshot`): a message below the head or acked out of
order is finished, a leased one in flight.
Every listing is bounded - a page of messages and a budget of entries read - so a
queue of millions answers as fast as one of ten: a page that runs out of budget says
where it stopped, and the next page goes on from there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import ledgerq
from ledgerq import tools
from ledgerq.ui._figures import DEFAULT_READER, DeliveryTimes, QueueFiles, ReaderSnapshot

__all__ = [
    "DeadLetterPage",
    "MessageView",
    "attempt_of",
    "dead_letter_page",
    "find_message",
    "in_flight_messages",
    "matching_dead_letters",
    "next_messages",
    "reader_statuses",
]

# Entries one page may read before it stops and offers to go on: bounds the time of a
# request whatever the queue holds (a filter that matches nothing in 100,000 dead
# letters reads 20,000 and says so, in about 0.1 s).
SCAN_BUDGET = 20_000


@dataclass(frozen=True, slots=True)
class MessageView:
    """A message and what a reader has done with it.

    ``status`` is ``"pending"``, ``"in flight"``, ``"finished"`` or ``"not retained"``
    (for the default reader); ``attempts`` is the delivery it is on, as
    ``Message.attempts`` and ``ledgerq peek`` count: for a pending message the one its
    next delivery will be (1 for one never delivered), for one in flight the one under
    way, None for a finished one (the journal keeps no count of those); ``group`` is
    its message group and ``not_before`` (ns) the time before which it will not be
    delivered (its retry delay, or the delay it was enqueued with) while that is
    ahead: None when it has none.
    """

    message: ledgerq.Message
    status: str
    attempts: int | None
    group: str | None
    not_before: int | None

    @property
    def id(self) -> int:
        """The message id."""
        return self.message.id


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    """One page of a dead-letter listing.

    ``messages``: the matches, by id.  ``next_after``: pass it as ``after`` for the next
    page (None: the listing is complete).  ``scanned_through``: the last id read, and
    ``budget_spent``: the page stopped because it read :data:`SCAN_BUDGET` entries,
    not because it was full.
    """

    messages: tuple[ledgerq.Message, ...]
    next_after: int | None
    scanned_through: int
    budget_spent: bool


def attempt_of(snapshot: ReaderSnapshot, message_id: int) -> int | None:
    """The delivery ``message_id`` is on for the reader (see :class:`MessageView`)."""
    status = snapshot.status(message_id)
    deliveries = snapshot.deliveries.get(message_id, 0)
    if status == "pending":
        return deliveries + 1
    if status == "in flight":
        return max(deliveries, 1)
    return None


def _view(message: ledgerq.Message, snapshot: ReaderSnapshot, times: DeliveryTimes) -> MessageView:
    status = snapshot.status(message.id)
    return MessageView(
        message,
        status,
        attempt_of(snapshot, message.id),
        message.group,
        times.not_before(message.id) if status == "pending" else None,
    )


def next_messages(files: QueueFiles, limit: int) -> list[MessageView]:
    """The next ``limit`` messages the default reader will deliver, in id order (a
    priority queue delivers by priority first), without leasing them."""
    snapshot = files.reader(DEFAULT_READER)
    times = files.delivery_times(DEFAULT_READER)  # once: not per message (issue 25)
    found: list[MessageView] = []
    for scanned, message in enumerate(files.messages(snapshot.head)):
        if scanned >= SCAN_BUDGET or len(found) >= limit:
            break
        if snapshot.status(message.id) == "pending":
            found.append(_view(message, snapshot, times))
    return found


def in_flight_messages(files: QueueFiles, limit: int) -> list[MessageView]:
    """Up to ``limit`` messages leased now, by id."""
    snapshot = files.reader(DEFAULT_READER)
    if not snapshot.leased:
        return []
    found: list[MessageView] = []
    times = DeliveryTimes({}, {}, 0)  # a leased message has no not-before time to show
    wanted = sorted(snapshot.leased)[:limit]
    for message in files.messages(wanted[0]):
        if message.id > wanted[-1]:
            break
        if message.id in snapshot.leased:
            found.append(_view(message, snapshot, times))
    return found


def find_message(files: QueueFiles, message_id: int) -> MessageView | None:
    """The message ``message_id`` if a segment still holds it (None otherwise)."""
    if message_id < 1:
        return None
    for message in files.messages(message_id):
        if message.id != message_id:
            return None  # not retained: the first one held is later
        return _view(message, files.reader(DEFAULT_READER), files.delivery_times(DEFAULT_READER))
    return None


def reader_statuses(files: QueueFiles, message_id: int) -> list[tuple[str, str, int | None]]:
    """(reader, status, attempt - as :class:`MessageView` counts it) of ``message_id``
    for every reader of the queue."""
    rows = []
    for name in files.reader_names():
        snapshot = files.reader(name)
        rows.append((name, snapshot.status(message_id), attempt_of(snapshot, message_id)))
    return rows


def _waiting_dead_letters(files: QueueFiles, after: int) -> Iterator[ledgerq.Message]:
    """Messages waiting in the dead-letter queue ``files`` (not yet requeued or purged:
    its default reader has not finished them), ids above ``after``, by id."""
    snapshot = files.reader(DEFAULT_READER)
    for message in files.messages(max(snapshot.head, after + 1)):
        if not snapshot.is_finished(message.id):
            yield message


def dead_letter_page(
    files: QueueFiles,
    chosen: tools.DeadLetterFilter,
    *,
    after: int = 0,
    limit: int = 50,
    budget: int = SCAN_BUDGET,
) -> DeadLetterPage:
    """The first ``limit`` dead letters above id ``after`` that ``chosen`` matches.

    ``files`` is the dead-letter queue's.  Reads at most ``budget`` entries (see
    :class:`DeadLetterPage`); never the whole queue.
    """
    now = time.time_ns()
    found: list[ledgerq.Message] = []
    scanned_through = after
    for read, message in enumerate(_waiting_dead_letters(files, after)):
        if len(found) >= limit:
            return DeadLetterPage(tuple(found), found[-1].id, scanned_through, False)
        if read >= budget:
            return DeadLetterPage(tuple(found), scanned_through, scanned_through, True)
        scanned_through = message.id
        if chosen.matches(message, now):
            found.append(message)
    return DeadLetterPage(tuple(found), None, scanned_through, False)


def matching_dead_letters(files: QueueFiles, chosen: tools.DeadLetterFilter) -> list[int]:
    """The ids of every waiting dead letter ``chosen`` matches (reads them all: for an
    action and its confirmation, not for a page)."""
    now = time.time_ns()
    return [m.id for m in _waiting_dead_letters(files, 0) if chosen.matches(m, now)]
