"""Durations everywhere: NaN refused, an infinite timeout waits forever, TTLs bounded.

Issue 15 item 13.  Every public call that takes seconds gets the same rule, checked on
real queues: a ``timeout`` of NaN is a ``ValueError`` (a wait of NaN seconds spun a core
at 100%), a ``timeout`` of infinity (or more than 100 years) waits like ``None`` (it
raised ``OverflowError`` from deep inside a wait), a ``ttl`` or a duration option beyond
100 years - infinity included - is refused before anything is written.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerq
import ledgerq.aio
import ledgerq.workers
from ledgerq import Item
from tests.workers import _handlers

MAX_SECONDS = 3_155_760_000.0  # 100 years of 365.25 days: the documented bound
_HUGE_INT = 10**400  # float() of it overflows


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[ledgerq.Queue]:
    with ledgerq.open(tmp_path / "q", sync="never") as q:
        yield q


# ---------------------------------------------------------------- ttl


_TTL_CALLS: list[tuple[str, Callable[[ledgerq.Queue, Any], object]]] = [
    ("Queue.enqueue", lambda q, v: q.enqueue(b"p", ttl=v)),
    ("Queue.enqueue_batch", lambda q, v: q.enqueue_batch([Item(b"p", ttl=v)])),
    (
        "AsyncQueue.enqueue",
        lambda q, v: asyncio.run(ledgerq.aio.AsyncQueue(q).enqueue(b"p", ttl=v)),
    ),
    (
        "AsyncQueue.enqueue_batch",
        lambda q, v: asyncio.run(ledgerq.aio.AsyncQueue(q).enqueue_batch([Item(b"p", ttl=v)])),
    ),
]


@pytest.mark.parametrize(("name", "call"), _TTL_CALLS, ids=[n for n, _ in _TTL_CALLS])
@pytest.mark.parametrize(
    "ttl", [math.inf, 1e300, MAX_SECONDS * 1.01, _HUGE_INT, math.nan, -math.inf, 0, -1]
)
def test_a_ttl_out_of_bounds_is_a_value_error_and_writes_nothing(
    queue: ledgerq.Queue, name: str, call: Callable[[ledgerq.Queue, Any], object], ttl: object
) -> None:
    with pytest.raises(ValueError, match="ttl must be a number of seconds > 0 and at most") as info:
        call(queue, ttl)
    assert type(info.value) is ValueError
    assert "100 years" in str(info.value)
    assert queue.stats().enqueued == 0
    assert queue.enqueue(b"ok") == 1, "a refused ttl consumed no id"


def test_a_sharded_queue_bounds_ttls_like_a_queue(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "s", 2, sync="never") as sharded:
        for ttl in (math.inf, 1e300, math.nan):
            with pytest.raises(ValueError, match="100 years"):
                sharded.enqueue(b"p", ttl=ttl)
            with pytest.raises(ValueError, match="100 years"):
                sharded.enqueue_batch([Item(b"p", ttl=ttl)])
        assert sharded.stats().enqueued == 0


def test_the_longest_ttl_is_accepted_and_stored(queue: ledgerq.Queue) -> None:
    queue.enqueue(b"a century", ttl=MAX_SECONDS)
    queue.enqueue(b"an int", ttl=3600)
    first, second = queue.dequeue_batch(2)
    assert first.expires_at is not None and second.expires_at is not None
    assert first.expires_at - first.timestamp == int(MAX_SECONDS * 10**9)
    assert second.expires_at - second.timestamp == 3600 * 10**9


# ---------------------------------------------------------------- timeouts


@pytest.mark.parametrize("timeout", [math.nan, -math.inf, -1])
def test_a_nan_or_negative_timeout_is_refused_by_every_wait(
    queue: ledgerq.Queue, tmp_path: Path, timeout: float
) -> None:
    calls: list[Callable[[], object]] = [
        lambda: queue.dequeue(timeout),
        lambda: queue.dequeue_batch(3, timeout),
        lambda: queue.reader("other").dequeue(timeout),
        lambda: asyncio.run(ledgerq.aio.AsyncQueue(queue).dequeue(timeout)),
        lambda: ledgerq.follow(queue.path, timeout=timeout),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
            call()


def _until(condition: Callable[[], object]) -> None:
    """Poll ``condition`` (the state of another thread) until it holds; fail after 30 s."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "the other thread never got there"
        time.sleep(0.001)


@pytest.mark.parametrize("timeout", [math.inf, 1e300, _HUGE_INT])
def test_an_infinite_timeout_waits_until_a_message_comes(
    queue: ledgerq.Queue, timeout: float
) -> None:
    got: list[object] = []

    def consume() -> None:
        try:
            got.append(queue.dequeue_batch(1, timeout))
        except Exception as exc:  # the failure before the fix: OverflowError
            got.append(exc)

    worker = threading.Thread(target=consume)
    worker.start()
    _until(lambda: queue._waits.waiting or not worker.is_alive())  # blocked in its wait
    queue.enqueue(b"late")
    worker.join(30)
    assert not worker.is_alive()
    [result] = got
    assert isinstance(result, list), result
    assert [m.payload for m in result] == [b"late"]


def test_an_infinite_timeout_on_a_sharded_queue_waits(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "s", 2, sync="never") as sharded:
        got: list[object] = []

        def consume() -> None:
            try:
                got.append(sharded.dequeue(math.inf))
            except Exception as exc:
                got.append(exc)

        worker = threading.Thread(target=consume)
        worker.start()
        _until(lambda: sharded._cond._waiters or not worker.is_alive())  # type: ignore[attr-defined]
        sharded.enqueue(b"late")
        worker.join(30)
        [result] = got
        assert isinstance(result, ledgerq.Message), result
        assert result.payload == b"late"


def test_an_infinite_timeout_in_asyncio_waits(queue: ledgerq.Queue) -> None:
    async def scenario() -> ledgerq.Message | None:
        aq = ledgerq.aio.AsyncQueue(queue)
        waiting = asyncio.ensure_future(aq.dequeue(math.inf))
        while not queue._waits.listeners and not waiting.done():
            await asyncio.sleep(0)  # let the dequeue reach its wait
        await aq.enqueue(b"late")
        return await asyncio.wait_for(waiting, 30)

    message = asyncio.run(scenario())
    assert message is not None and message.payload == b"late"


def test_a_follower_with_an_infinite_timeout_waits(tmp_path: Path) -> None:
    path = tmp_path / "owned"
    with ledgerq.open(path, sync="never") as owner:
        owner.enqueue(b"first")
        with ledgerq.follow(path, timeout=math.inf) as follower:
            assert next(follower).payload == b"first"
            watcher = follower._watcher
            assert watcher is not None
            waiting = threading.Event()
            real_wait = watcher.wait

            def noted_wait(timeout: float | None) -> bool:
                waiting.set()
                return real_wait(timeout)

            watcher.wait = noted_wait  # type: ignore[method-assign]
            got: list[object] = []

            def follow_one() -> None:
                try:
                    got.append(next(follower))
                except Exception as exc:  # before the fix: OverflowError from poll()
                    got.append(exc)
                    waiting.set()

            worker = threading.Thread(target=follow_one)
            worker.start()
            assert waiting.wait(30)
            owner.enqueue(b"second")
            worker.join(30)
            [result] = got
            assert isinstance(result, ledgerq.Message), result
            assert result.payload == b"second"


def test_a_worker_pool_with_an_infinite_task_timeout_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "done.log"
    monkeypatch.setenv(_handlers.DONE_LOG, str(log))
    path = tmp_path / "jobs"
    with ledgerq.open(path) as q:
        q.enqueue_batch([b"1", b"2", b"3"])
    report = ledgerq.workers.run(
        path, _handlers.mixed, processes=1, task_timeout=math.inf, until_empty=True
    )
    assert report.processed == 3
    assert report.timed_out == 0


@pytest.mark.parametrize("value", [math.nan, "5", True, 0, -1])
def test_a_worker_pool_refuses_a_task_timeout_that_is_no_duration(
    tmp_path: Path, value: object
) -> None:
    with pytest.raises((TypeError, ValueError), match="task_timeout must be"):
        ledgerq.workers.run(tmp_path / "jobs", print, task_timeout=value)  # type: ignore[arg-type]


# ---------------------------------------------------------------- options


_DURATION_OPTIONS = {
    # option -> (the bound its message states, whether None disables it)
    "sync_interval": (">= 0", False),
    "starvation_after": ("> 0", True),
    "visibility_timeout": ("> 0", True),
    "dedup_window": (">= 0", True),
    "retention_max_age": (">= 0", True),
}


@pytest.mark.parametrize("option", sorted(_DURATION_OPTIONS))
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e300, _HUGE_INT, -1])
def test_a_duration_option_out_of_bounds_is_a_config_error_stating_its_bound(
    tmp_path: Path, option: str, value: object
) -> None:
    bound, disables = _DURATION_OPTIONS[option]
    with pytest.raises(ledgerq.ConfigError) as info:
        ledgerq.open(tmp_path / "q", **{option: value})  # type: ignore[misc]
    message = str(info.value)
    assert f"option {option} must be a number of seconds {bound} and at most" in message
    assert "100 years" in message
    assert ("or None to disable" in message) is disables
    assert not (tmp_path / "q").exists(), "nothing created for a refused option"


@pytest.mark.parametrize("option", ["starvation_after", "visibility_timeout"])
def test_zero_is_refused_where_the_message_says_above_zero(tmp_path: Path, option: str) -> None:
    with pytest.raises(
        ledgerq.ConfigError, match=f"option {option} must be a number of seconds > 0"
    ):
        ledgerq.Options(**{option: 0})  # type: ignore[arg-type]


@pytest.mark.parametrize("option", sorted(_DURATION_OPTIONS))
def test_the_longest_duration_option_opens(tmp_path: Path, option: str) -> None:
    with ledgerq.open(tmp_path / "q", sync="never", **{option: MAX_SECONDS}) as q:  # type: ignore[misc]
        q.enqueue(b"x", dedup_id="d" if option == "dedup_window" else None)
        message = q.dequeue()
        assert message is not None
        q.ack(message.id)
    with ledgerq.open(tmp_path / "q") as q:
        assert getattr(q.options, option) == MAX_SECONDS, "stored and read back"


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("compression_level", 23, "option compression_level must be an int from -131072 to 22"),
        ("max_message_size", 0, "option max_message_size must be an int from 1 to 1073741824"),
        ("max_message_size", (1 << 30) + 1, "from 1 to 1073741824"),
        ("segment_size", 0, "option segment_size must be an int >= 1"),
        ("max_retries", -1, "option max_retries must be an int >= 0"),
    ],
)
def test_integer_options_state_their_real_bounds(option: str, value: int, expected: str) -> None:
    with pytest.raises(ledgerq.ConfigError, match=expected):
        ledgerq.Options(**{option: value})  # type: ignore[arg-type]
