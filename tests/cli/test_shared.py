"""Every command on a queue that a live shared-mode process holds open.

Commands that read or change messages open the queue shared, so they run beside an
application that opened it with ``shared=True``: the application keeps its lease and
goes on without reopening.  Commands that need the queue to themselves say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import ledgerq
from tests._child import Children

from ._run import fails, ok, start_ready

# A live application: holds the queue open in shared mode with one message leased,
# and does what the test asks on stdin (one word a line), answering one line each.
_APPLICATION = """
import sys, ledgerq
q = ledgerq.open(sys.argv[1], shared=True)
leased = q.dequeue()
print("holding", leased.id, flush=True)
for line in sys.stdin:
    word = line.strip()
    if word == "stats":
        s = q.stats()
        print("stats", s.pending, s.in_flight, flush=True)
    elif word == "ack":
        q.ack(leased.id)
        print("acked", leased.id, flush=True)
    elif word == "take":
        m = q.dequeue(timeout=60)
        q.ack(m.id)
        print("took", m.id, m.payload.decode(), flush=True)
q.close()
"""


def _build(path: Path) -> None:
    """Ids 1-4 dead-lettered (max_retries=1), then 5, 6, 7 pending (a, b, c)."""
    with ledgerq.open(path, max_retries=1) as q:
        for i in range(4):
            q.enqueue(b"job %d" % i)
            message = q.dequeue()
            assert message is not None
            q.nack(message.id, "boom")
        q.enqueue_batch([b"a", b"b", b"c"])


def test_every_command_works_beside_a_live_shared_process(
    tmp_path: Path, children: Children
) -> None:
    q = tmp_path / "q"
    _build(q)
    app = children.start(["-c", _APPLICATION, str(q)])
    assert app.wait_for("holding") == "holding 5"

    figures = ok("stats", q, "--json").json()
    assert (figures["pending"], figures["in_flight"], figures["dlq"]) == (2, 1, 4)
    assert [m["id"] for m in ok("peek", q, "--json").json_lines()] == [6, 7]
    assert ok("enqueue", q, "d").out == "8\n"
    taken = ok("dequeue", q, "--json").json_lines()
    assert [m["id"] for m in taken] == [6]  # 5 is the application's: never leased twice
    assert [m["id"] for m in ok("dlq", "list", q, "--json").json_lines()] == [1, 2, 3, 4]
    assert ok("dlq", "requeue", q, "--id", "1", "--json").json()["requeued"] == 1
    assert ok("dlq", "purge", q, "--id", "2", "--yes", "--json").json()["purged"] == 1
    ok("compact", q, "--json")
    assert ok("verify", q).code == 0
    assert [m["id"] for m in ok("dump", q, "--json").json_lines()] == list(range(1, 10))  # the log

    # The application saw all of it and goes on with the lease it had, without reopening.
    app.send("stats")
    assert app.line() == "stats 3 1"  # 7, 8 and the requeued job 0 (9); its own lease
    app.send("ack")
    assert app.line() == "acked 5"
    app.send("take")
    assert app.line() == "took 7 c"
    app.expect_exit(0)

    with ledgerq.open(q) as queue:
        assert [(m.id, m.payload) for m in queue.peek(10)] == [(8, b"d"), (9, b"job 0")]
        assert [m.payload for m in queue.dlq.peek(10)] == [b"job 2", b"job 3"]
        assert queue.stats().in_flight == 0


def test_a_waiting_dequeue_is_woken_by_another_process_enqueue(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q):
        pass
    proc = start_ready("dequeue", q, "--timeout", "120", "--json")
    with ledgerq.open(q, shared=True) as producer:  # beside the waiting command
        producer.enqueue(b"wake up")
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (0, b"")
    assert json.loads(out)["payload"] == "wake up"


def test_commands_that_need_the_queue_alone_say_it_is_open_in_shared_mode(
    tmp_path: Path, children: Children
) -> None:
    q = tmp_path / "q"
    _build(q)
    stored_before = json.loads((q / "meta.json").read_text())["options"]
    app = children.start(["-c", _APPLICATION, str(q)])
    app.wait_for("holding")
    for args in (["config", q, "--set", "max_retries=9"], ["verify", q, "--repair"]):
        result = fails(*args, code=1)
        assert "open elsewhere" in result.err and str(q) in result.err, result
        assert "shared mode" in result.err and "needs the queue to itself" in result.err, result
    app.send("ack")
    assert app.line() == "acked 5"
    app.expect_exit(0)
    assert json.loads((q / "meta.json").read_text())["options"] == stored_before
