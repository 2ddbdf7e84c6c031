"""A three-stage pipeline: each stage's worker pool hands its results to the next queue
exactly once (``forward_to``), so a stage killed at any instant - kill -9 - and started
again neither loses nor doubles an item.

    orders --parse--> parsed --price--> priced --total--> totals

``parse`` turns a CSV line into JSON, ``price`` adds the price of each line item (and
fans out: one message per item), ``total`` keeps the amounts.  The handlers return what
goes on (bytes, an ``Item``, a list of them); the pools ``forward`` it and ack the
message in one step.  The same from a shell::

    ledgerq worker ROOT/orders pipeline:parse --forward-to ROOT/parsed --until-empty

Run: python examples/pipeline.py [ROOT_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import ledgerq
import ledgerq.workers

ORDERS = 200
PRICES = {"apple": 3, "pear": 4, "plum": 5}


def parse(message: ledgerq.Message) -> bytes:
    """Stage 1: ``order-7,apple:2,plum:1`` -> ``{"order": "order-7", "items": {...}}``."""
    order, *items = message.payload.decode().split(",")
    counts = {name: int(n) for name, n in (item.split(":") for item in items)}
    return json.dumps({"order": order, "items": counts}).encode()


def price(message: ledgerq.Message) -> list[ledgerq.Item]:
    """Stage 2: one priced message per line item, the order in a header."""
    order = json.loads(message.payload)
    return [
        ledgerq.Item(
            json.dumps({"fruit": fruit, "amount": n * PRICES[fruit]}).encode(),
            headers={"order": order["order"]},
        )
        for fruit, n in sorted(order["items"].items())
    ]


def total(message: ledgerq.Message) -> bytes:
    """Stage 3: the amount, as text, for the report."""
    line = json.loads(message.payload)
    return f"{message.headers['order']} {line['fruit']} {line['amount']}".encode()


def order_lines() -> list[bytes]:
    """The orders the example starts from: each has one to three fruits."""
    fruits = sorted(PRICES)
    lines = []
    for n in range(ORDERS):
        chosen = fruits[: 1 + n % 3]
        lines.append(",".join([f"order-{n}"] + [f"{f}:{1 + n % 4}" for f in chosen]).encode())
    return lines


def expected_amount() -> int:
    """The total of every order, computed without the pipeline."""
    total_amount = 0
    for n in range(ORDERS):
        for fruit in sorted(PRICES)[: 1 + n % 3]:
            total_amount += (1 + n % 4) * PRICES[fruit]
    return total_amount


STAGES = (("orders", parse, "parsed"), ("parsed", price, "priced"), ("priced", total, "totals"))


def main(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with ledgerq.open(root / "orders", shared=True) as orders:
        orders.enqueue_batch(order_lines())
        print(f"enqueued {len(orders)} orders")
    for source, handler, target in STAGES:
        report = ledgerq.workers.run(
            root / source, handler, processes=2, until_empty=True, forward_to=root / target
        )
        print(f"{handler.__name__}: {source} -> {target}: {report.processed} forwarded")
    with ledgerq.open(root / "totals", shared=True) as totals:
        lines = [m.payload.decode() for m in totals.peek(10_000)]
    amount = sum(int(line.split()[2]) for line in lines)
    print(f"totals: {len(lines)} priced lines, amount {amount}")
    assert len(lines) == len(set(lines)) == sum(1 + n % 3 for n in range(ORDERS))
    assert amount == expected_amount()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "pipeline")
