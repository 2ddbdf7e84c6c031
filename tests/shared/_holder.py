"""A process that takes a step lock of a shared queue and dies, or stops, holding it.

Usage: python -m tests.shared._holder PATH WHAT THEN

``WHAT`` is the lock: ``append`` (the append lock) or ``reader`` (the default
reader's, after leasing one message - reported ``L <id>``).  ``THEN`` is what the
process does holding it: ``die`` (SIGKILL itself), ``tear`` (write half a journal
record past the published length, then SIGKILL: the bytes a holder killed mid-write
leaves), ``stop`` (SIGSTOP itself; once continued, end the step, ack what it leased,
enqueue ``after-stop`` and report ``DONE``).  It reports ``HELD`` with its pid just
before it dies or stops.
"""

from __future__ import annotations

import os
import signal
import sys

import ledgerq
from ledgerq.format.reader_state import StateRecordType, encode_id_record


def _say(text: str) -> None:
    os.write(1, (text + "\n").encode())


def main(path: str, what: str, then: str) -> None:
    q = ledgerq.open(path, shared=True)
    leased = None
    if what == "reader":
        leased = q.dequeue()
        assert leased is not None, "the test enqueues a message first"
        _say(f"L {leased.id}")
        core = q._default._core  # type: ignore[attr-defined]
        core.session.enter()
        if then == "tear":  # the first half of the ACK this step would have written
            record = encode_id_record(StateRecordType.ACK, leased.id)
            os.write(core._shared_journal._fd, record[: len(record) // 2])
        leave = core.session.leave
    else:
        manager = q._manager  # type: ignore[attr-defined]
        manager.lock_appends()
        leave = manager.unlock_appends
    _say(f"HELD {os.getpid()}")
    if then in ("die", "tear"):
        os.kill(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGSTOP)
    # Continued: the step ends as it would have, and the handle goes on.
    leave()
    if leased is not None:
        q.ack(leased.id)
    q.enqueue(b"after-stop")
    q.close()
    _say("DONE")


if __name__ == "__main__":
    main(*sys.argv[1:])
