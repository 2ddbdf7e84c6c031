"""The multi-process benchmark harness (benchmarks/multiprocess.py) counts what it claims.

Benchmarks are not run by the test suite; these check, in about a second, that the
producer/consumer scenario runs end to end with real processes on the stdlib-only peer
(plain SQLite) and that its delivery check tells lost, repeated and foreign messages apart.
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path

from benchmarks.multiprocess import verify
from tests._child import run_python


def test_producer_and_consumer_processes_on_plain_sqlite_deliver_every_message_once(
    tmp_path: Path,
) -> None:
    spec = {
        "kind": "mp_pc",
        "adapter": "sqlite",
        "dir": str(tmp_path / "q"),
        "level": "kill9",
        "size": 100,
        "producers": 2,
        "consumers": 2,
        "per_producer": 300,
        "cap_seconds": 30.0,
    }
    proc = run_python("-m", "benchmarks.multiprocess", json.dumps(spec))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["produced"] == result["consumed"] == result["distinct"] == 600
    assert (result["missing"], result["duplicated"], result["unexpected"]) == (0, 0, 0)
    assert result["errors"] == 0
    assert not result["timed_out"]
    assert result["enqueue_rate"] > 0
    assert result["dequeue_rate"] > 0
    counts = sorted((p["role"], p["count"]) for p in result["per_process"])
    assert counts[2:] == [("producer", 300), ("producer", 300)]
    assert sum(n for role, n in counts if role == "consumer") == 600


def test_delivery_check_counts_lost_repeated_and_unknown_messages() -> None:
    # Producer 0 made 3 messages, producer 1 made 2.  Consumed: 0/0 twice, 0/1, 1/0,
    # a tag of producer 1 beyond its count and one of a producer that never ran.
    consumed = array(
        "Q", [0 << 32 | 0, 0 << 32 | 0, 0 << 32 | 1, 1 << 32 | 0, 1 << 32 | 5, 7 << 32]
    )
    check = verify({0: 3, 1: 2}, consumed)
    assert check == {
        "produced": 5,
        "consumed": 6,
        "distinct": 3,
        "missing": 2,  # 0/2 and 1/1
        "duplicated": 1,
        "unexpected": 2,
    }
