"""``ledgerq ui`` in a real browser: headless Chromium (Debian's) driven by Playwright,
against a real console process over real queues - one of them busy in another process.

The overview lists the queues (an encrypted one, the console has no key for, marked
as such), a DLQ filter narrows the list, "requeue all matching"
moves exactly those messages back (checked through the Python API), and purge asks for
confirmation (nothing is deleted until it is given); the page each action lands on
counts what is left; a dead letter's own page says when it failed and requeues it; a
waiting message is on attempt 1 and its headers' control characters show as escapes.
The same run takes the screenshots of docs/ui.md: into ``tmp_path``, or into
``docs/img/`` when ``LEDGERQ_UPDATE_SCREENSHOTS=1`` asks for it.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from tests._child import REPO, Children

from ._console import start_console

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright for Python is not installed (pip install playwright)"
)
pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"no Chromium at {CHROMIUM} (apt-get install chromium); the browser tests need it",
)

# Headers that would rewrite the page around them if shown as they are (issue 25).
EVIL_HEADERS = {"evil\u202ekey": "val\u202eue \x1b[31m"}

REASONS = [
    "TimeoutError: payment gateway took 30s",
    "CardDeclined: insufficient funds",
    "ValueError: unknown currency 'XYZ'",
]

# A service at work on "orders": its producer's and consumer's rates swing (so pending
# rises and falls), a few leases stay out, and every 23rd message fails for good.
_WORKLOAD = """
import json, math, sys, threading, time, ledgerq
q = ledgerq.open(sys.argv[1], max_retries=1)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
order, started, held = 0, time.monotonic(), []
while not stop.is_set():
    t = time.monotonic() - started
    produce = int(7 + 5 * math.sin(t / 2.0))
    q.enqueue_batch([json.dumps({"order": order + i, "sku": "SKU-%d" % ((order + i) % 17)}).encode()
                     for i in range(produce)])
    order += produce
    for m in held:
        q.ack(m.id)
    held = []
    for m in q.dequeue_batch(int(7 + 4 * math.cos(t / 3.0))):
        if m.id % 23 == 0:
            q.nack(m.id, "KeyError: 'sku'")
        elif len(held) < 3:
            held.append(m)
        else:
            q.ack(m.id)
    if order == produce:
        print("running", flush=True)
    time.sleep(0.05)
q.close()
"""


def _payments(path: Path) -> None:
    """Thirty failed payments in the DLQ (every third a timeout), 20 still waiting."""
    with ledgerq.open(path, max_retries=1) as q:
        q.enqueue_batch(
            [
                ledgerq.Item(
                    json.dumps({"payment": i, "amount": 10 + i}).encode(),
                    headers={"tenant": ("acme", "globex")[i % 2], "kind": "card", **extra},
                )
                for i, extra in enumerate([{}] * 49 + [EVIL_HEADERS])
            ]
        )
        for i in range(30):
            m = q.dequeue()
            assert m is not None
            q.nack(m.id, REASONS[i % 3])


def _tree(root: Path) -> None:
    _payments(root / "payments")
    for name, count in (("emails/eu", 140), ("emails/us", 75), ("reports", 0)):
        with ledgerq.open(root / name) as q:
            if count:
                q.enqueue_batch([b"mail %d" % i for i in range(count)])
                for m in q.dequeue_batch(count // 3):
                    q.ack(m.id)
    with ledgerq.open(root / "vault", encryption_key=bytes(range(32))) as q:
        q.enqueue_batch([b"sealed %d" % i for i in range(12)])  # the console has no key


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _shots_dir(tmp_path: Path) -> Path:
    if os.environ.get("LEDGERQ_UPDATE_SCREENSHOTS") == "1":
        return REPO / "docs" / "img"
    return tmp_path / "shots"


def _dead_payloads(path: Path) -> tuple[list[bytes], list[str]]:
    """(payloads requeued into the queue, failure reasons still in its DLQ)."""
    with ledgerq.open(path) as q:
        waiting = [m.payload for m in q.peek(100)]
        dead = [m.headers["dlq.failure_reason"] for m in q.dlq.peek(100)]
    return waiting, dead


def test_the_console_in_a_browser(tmp_path: Path, children: Children, browser: Any) -> None:
    root = tmp_path / "queues"
    _tree(root)
    workload = children.start(["-c", _WORKLOAD, str(root / "orders")])
    workload.wait_for("running")
    _, base = start_console(children, root, "--interval", "0.25", "--history", "30")
    page = browser.new_page(viewport={"width": 1280, "height": 760})
    page.set_default_timeout(10_000)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

    # The overview lists every queue, the busy one marked open.
    page.goto(base + "/")
    names = page.locator("table.queues td.name a").all_inner_texts()
    assert names == ["emails/eu", "emails/us", "orders", "payments", "reports", "vault"]
    assert page.locator("table.queues tr", has_text="orders").locator(".dot.open").count() == 1
    vault = page.locator("table.queues tr", has_text="vault")
    sync_api.expect(vault.locator(".sealed.locked")).to_have_text("encrypted: key needed")
    sync_api.expect(vault.locator("td.num.strong")).to_have_text("12")  # its figures stay

    # A filter narrows the dead letters to the timeouts.
    page.click("text=payments")
    page.click("text=Dead letters (30)")
    assert page.locator("table.dead tbody tr").count() == 30
    page.fill("input[name=reason]", "timeout")
    page.click("button:has-text('Filter')")
    rows = page.locator("table.dead tbody tr")
    assert rows.count() == 10
    assert set(page.locator("table.dead td.reason").all_inner_texts()) == {REASONS[0]}
    # The count arrives by the page's own script (a locator expectation, not a string
    # predicate: Playwright evaluates those with eval, which the console's CSP refuses).
    sync_api.expect(page.locator("[data-count-url]")).to_contain_text("10 dead")

    # "Requeue all matching" asks, then moves exactly those four back.
    page.click("button:has-text('Requeue all matching')")
    assert page.locator("h1").inner_text() == "Requeue 10 dead letters?"
    assert _dead_payloads(root / "payments")[0] == [  # asking changed nothing
        json.dumps({"payment": i, "amount": 10 + i}).encode() for i in range(30, 50)
    ]
    page.click("button:has-text('Requeue 10 messages')")
    assert "requeued 10 messages to payments" in page.locator("[role=status]").inner_text()
    badge = page.locator("[data-live=dlq-count]")
    sync_api.expect(badge).to_have_text("20 waiting")  # what is left, not what was
    waiting, dead = _dead_payloads(root / "payments")
    assert waiting[-10:] == [
        json.dumps({"payment": i, "amount": 10 + i}).encode() for i in range(0, 30, 3)
    ]
    assert len(waiting) == 30 and sorted(set(dead)) == sorted(REASONS[1:]) and len(dead) == 20

    # Purge needs a selection, then asks; cancelling deletes nothing.
    page.click("text=Clear")
    purge = page.locator("button[value='purge:selected']")
    sync_api.expect(purge).to_be_disabled()  # the script enables it on a selection
    boxes = page.locator("table.dead tbody input[type=checkbox]")
    boxes.nth(0).check()
    boxes.nth(1).check()
    sync_api.expect(purge).to_have_text("Purge 2 selected")
    sync_api.expect(purge).to_be_enabled()
    purge.click()
    assert page.locator("h1").inner_text() == "Purge 2 dead letters?"
    assert "deleted for good" in page.locator(".confirm").inner_text()
    page.click("text=Cancel")
    assert len(_dead_payloads(root / "payments")[1]) == 20
    page.locator("[data-select-all]").check()
    sync_api.expect(boxes.nth(19)).to_be_checked()
    page.locator("[data-select-all]").uncheck()
    boxes.nth(0).check()
    page.click("button:has-text('Purge 1 selected')")
    page.click("button:has-text('Purge 1 message')")
    assert (
        "purged 1 message from the dead-letter queue of payments"
        in page.locator("[role=status]").inner_text()
    )
    assert len(_dead_payloads(root / "payments")[1]) == 19
    sync_api.expect(badge).to_have_text("19 waiting")

    # One dead letter's own page: when it failed (a time, not nanoseconds), and its
    # own requeue, confirmed like the others.
    page.locator("table.dead tbody td.num a").first.click()
    failed = page.locator("table.failure tr", has_text="Failed").locator("td")
    sync_api.expect(failed).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"))
    page.click("button:has-text('Requeue this message')")
    assert page.locator("h1").inner_text() == "Requeue 1 dead letter?"
    page.click("button:has-text('Requeue 1 message')")
    assert "requeued 1 message to payments" in page.locator("[role=status]").inner_text()
    sync_api.expect(badge).to_have_text("18 waiting")
    assert len(_dead_payloads(root / "payments")[1]) == 18
    assert dialogs == []  # every confirmation is a page of the console, not a pop-up

    # A waiting message: on attempt 1 (as `ledgerq peek` says), its headers' override
    # and escape characters shown, not obeyed.
    page.goto(base + "/queue?q=payments")
    sync_api.expect(
        page.locator("table.messages tbody tr").first.locator("td").nth(3)
    ).to_have_text("1")
    page.goto(base + "/message?q=payments&id=50")
    sync_api.expect(page.locator("table.headers th", has_text="evil")).to_have_text(
        "evil\\u202ekey"
    )
    sync_api.expect(page.locator("table.headers td", has_text="val")).to_have_text(
        "val\\u202eue \\x1b[31m"
    )

    # The three pages, with the charts filled by the workload meanwhile.  For the docs'
    # copies the workload runs on long enough to fill the charts (not a synchronisation:
    # the pictures only look better for it).
    shots = _shots_dir(tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    if os.environ.get("LEDGERQ_UPDATE_SCREENSHOTS") == "1":
        time.sleep(25)
    page.goto(base + "/")
    page.screenshot(path=str(shots / "ui-overview.png"), full_page=True)
    page.goto(base + "/queue?q=orders")
    assert page.locator("svg.chart path.series").count() >= 2
    page.screenshot(path=str(shots / "ui-queue.png"), full_page=True)
    page.goto(base + "/dlq?q=payments&reason=declined")
    sync_api.expect(page.locator("[data-count-url]")).to_contain_text("dead")
    boxes.nth(1).check()
    boxes.nth(2).check()
    page.screenshot(path=str(shots / "ui-dlq.png"), full_page=True)
    page.locator("table.dead tbody td.num a").first.click()
    sync_api.expect(page.locator("button", has_text="Requeue this message")).to_be_visible()
    page.screenshot(path=str(shots / "ui-dead-letter.png"), full_page=True)
    for name in ("ui-overview.png", "ui-queue.png", "ui-dlq.png", "ui-dead-letter.png"):
        assert (shots / name).stat().st_size > 10_000, name
    workload.finish()
