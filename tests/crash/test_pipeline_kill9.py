"""kill -9 of the middle stage of examples/pipeline.py: nothing lost, nothing doubled.

The middle stage (``price``: one message per line item) runs as ``ledgerq worker ...
--forward-to`` in a child, killed with SIGKILL once the next queue holds a few hundred
of its results - at whatever instant of a forward that is.  Started again (in this
process) it finishes the rest; the last stage runs; every (order, fruit) line is in
the totals exactly once.  Both modes: the pools open their queues shared, or
``--exclusive``.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import ledgerq
import ledgerq.workers
from tests._child import REPO, Children, child_environment

ORDERS = 2000
SEEN_BEFORE_KILL = 300


def load_pipeline() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pipeline", REPO / "examples" / "pipeline.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_stage(
    root: Path, source: str, handler: Callable[..., Any], target: str, shared: bool
) -> None:
    """Run one stage of the pipeline under ``root``: a two-process pool over ``source``
    that forwards into ``target``, until ``source`` is empty."""
    ledgerq.workers.run(
        root / source,
        handler,
        processes=2,
        until_empty=True,
        shared=shared,
        forward_to=root / target,
    )


@pytest.mark.parametrize("mode", ["shared", "exclusive"])
def test_kill9_of_the_middle_stage(tmp_path: Path, children: Children, mode: str) -> None:
    pipeline = load_pipeline()
    shared = mode == "shared"
    root = tmp_path / "pipeline"
    root.mkdir()
    orders = [f"order-{n},apple:{1 + n % 3},plum:1".encode() for n in range(ORDERS)]
    with ledgerq.open(root / "orders", shared=shared) as q:
        q.enqueue_batch(orders)
    with ledgerq.open(root / "priced", shared=shared):
        pass  # there to be followed before the child writes into it
    run_stage(root, "orders", pipeline.parse, "parsed", shared)

    args = ["-m", "ledgerq.cli", "worker", str(root / "parsed"), "pipeline:price"]
    args += ["--forward-to", str(root / "priced"), "--processes", "2"]
    args += [] if shared else ["--exclusive"]
    env = child_environment({"PYTHONPATH": f"{REPO}:{REPO / 'examples'}"})
    child = children.start(args, env=env)
    # Wait (on the log, read without the queue's lock) for a few hundred results.
    seen = 0
    with ledgerq.follow(root / "priced", timeout=60) as results:
        for _ in results:
            seen += 1
            if seen >= SEEN_BEFORE_KILL:
                break
    assert seen >= SEEN_BEFORE_KILL, child.failure("the middle stage wrote too little")
    child.kill_and_drain()
    with ledgerq.open(root / "parsed", shared=shared) as parsed:
        left = parsed.stats()
        assert left.pending + left.in_flight > 0, "killed after the stage was done"

    # Started again: the messages the dead pool had leased are delivered again; those
    # whose items had landed only ack.
    run_stage(root, "parsed", pipeline.price, "priced", shared)
    with ledgerq.open(root / "parsed", shared=shared) as parsed:
        assert parsed.stats().pending == 0
        assert parsed.stats().in_flight == 0
    run_stage(root, "priced", pipeline.total, "totals", shared)
    with ledgerq.open(root / "totals", shared=shared) as totals:
        lines = Counter(m.payload.decode() for m in totals.peek(10 * ORDERS))
    expected = {f"order-{n} apple {3 * (1 + n % 3)}" for n in range(ORDERS)}
    expected |= {f"order-{n} plum 5" for n in range(ORDERS)}
    assert set(lines) == expected
    assert max(lines.values()) == 1, [line for line, n in lines.items() if n > 1]
