"""Another process on a shared queue, for the shared-mode fault sweep: it must go on.

Usage: ``python -m tests.faults._partner``; commands on stdin, one answer line each:

    open <path> <options json>   open the queue shared              -> OPEN
    step <token>                 enqueue the torture message of token, then lease one
                                 message of the named reader ``partner`` and ack it
                                                                      -> E <id> <token>
    close                        close the queue                    -> CLOSED

A call that raises answers ``X <type> <message>`` instead.  The faults of the sweep are
injected in the *other* process (this one has no interposer): whatever they leave
behind - a cut append with the ``writing`` word set, a torn journal record, a held
lock - must not stop this process.
"""

from __future__ import annotations

import json
import sys

import ledgerq
from tests.torture._payload import make

PARTNER = "partner"


def main() -> None:
    q: ledgerq.Queue | None = None
    for line in sys.stdin:
        command, *args = line.split(" ", 2)
        try:
            if command == "open":
                q = ledgerq.open(args[0], shared=True, **json.loads(args[1]))
                answer = "OPEN"
            elif command == "step":
                assert q is not None
                made = make(int(args[0]))
                message_id = q.enqueue(made.payload, headers=made.headers, priority=made.priority)
                reader = q.reader(PARTNER)
                msg = reader.dequeue()
                if msg is not None:
                    reader.ack(msg.id)
                answer = f"E {message_id} {made.token}"
            else:
                assert q is not None
                q.close()
                q = None
                answer = "CLOSED"
        except Exception as exc:
            answer = f"X {type(exc).__name__} {str(exc)[:300]}".replace("\n", " ")
        print(answer, flush=True)


if __name__ == "__main__":
    main()
