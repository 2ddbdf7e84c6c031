"""``ledgerq.tools``' dead-letter helpers: the filter both the CLI and the console use,
and the pacing of ``requeue --rate``."""

from __future__ import annotations

import pytest

import ledgerq
from ledgerq import tools

NOW = 1_700_000_000 * 10**9


def _dead(
    reason: str = "", *, age_s: float = 0, retries: str = "3", **headers: str
) -> ledgerq.Message:
    return ledgerq.Message(
        id=1,
        payload=b"",
        headers={"dlq.failure_reason": reason, "dlq.retry_count": retries, **headers},
        priority=ledgerq.Priority.MEDIUM,
        timestamp=NOW - int(age_s * 1e9),
        expires_at=None,
        attempts=0,
    )


def test_an_empty_filter_matches_everything() -> None:
    for empty in (tools.DeadLetterFilter(), tools.DeadLetterFilter(reason="")):
        assert empty.is_empty
        assert empty.matches(_dead(), NOW)
        assert empty.describe() == "every message"


def test_reason_is_a_regex_or_plain_text_and_ignores_case() -> None:
    regex = tools.DeadLetterFilter(reason=r"time(out)?\b")
    assert regex.matches(_dead("TimeOut talking to db"), NOW)
    assert not regex.matches(_dead("timeouts"), NOW)
    text = tools.DeadLetterFilter(reason="a.b (c)", regex=False)
    assert text.matches(_dead("error: A.B (C) failed"), NOW)
    assert not text.matches(_dead("axb (c)"), NOW)
    assert not text.matches(_dead(), NOW)
    with pytest.raises(ValueError, match="not a valid regular expression"):
        tools.DeadLetterFilter(reason="(")


def test_age_headers_and_attempts() -> None:
    older = tools.DeadLetterFilter(older_than=60)
    assert older.matches(_dead(age_s=61), NOW)
    assert not older.matches(_dead(age_s=60), NOW)  # more than, not as old as
    both = tools.DeadLetterFilter(headers=(("tenant", "a"), ("kind", "x")))
    assert both.matches(_dead(tenant="a", kind="x"), NOW)
    assert not both.matches(_dead(tenant="a"), NOW)
    assert not both.matches(_dead(tenant="a", kind="y"), NOW)
    attempts = tools.DeadLetterFilter(attempts_at_least=3)
    assert attempts.matches(_dead(retries="3"), NOW)
    assert not attempts.matches(_dead(retries="2"), NOW)
    assert not attempts.matches(_dead(retries="lots"), NOW)  # not a count: no match
    for bad in ({"older_than": -1.0}, {"older_than": float("nan")}, {"attempts_at_least": -1}):
        with pytest.raises(ValueError):
            tools.DeadLetterFilter(**bad)  # type: ignore[arg-type]
    described = tools.DeadLetterFilter(
        reason="x", older_than=600, headers=(("t", "a"),), attempts_at_least=2
    ).describe()
    assert described == (
        "reason matching /x/, dead-lettered more than 600s ago, header t=a, "
        "at least 2 failed deliveries"
    )


def test_header_conditions_parse() -> None:
    assert tools.parse_header_condition("tenant=a=b") == ("tenant", "a=b")
    assert tools.parse_header_condition("empty=") == ("empty", "")
    for bad in ("tenant", "=a"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            tools.parse_header_condition(bad)


class _FakeTime:
    """A monotonic clock that only moves when slept on (or when told)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_paced_slices_keep_to_the_rate_against_the_clock() -> None:
    fake = _FakeTime()
    calls: list[tuple[float, list[int]]] = []

    def apply(ids: list[int]) -> int:
        calls.append((fake.now, ids))
        fake.now += 0.01  # each slice takes a while: the schedule absorbs it
        return len(ids)

    done = tools.paced(range(1, 51), 100, apply, monotonic=fake.monotonic, sleep=fake.sleep)
    assert done == 50
    assert [ids for _, ids in calls] == [list(range(i, i + 10)) for i in range(1, 51, 10)]
    starts = [t - 100.0 for t, _ in calls]
    assert starts == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])


def test_paced_without_a_rate_is_one_call_and_a_slow_rate_one_id_at_a_time() -> None:
    fake = _FakeTime()
    seen: list[list[int]] = []
    assert tools.paced([3, 1], None, lambda ids: seen.append(ids) or 0) == 0
    assert seen == [[3, 1]]
    seen.clear()
    tools.paced(
        [1, 2, 3], 2, lambda ids: seen.append(ids) or 1, monotonic=fake.monotonic, sleep=fake.sleep
    )
    assert seen == [[1], [2], [3]]
    assert fake.now == pytest.approx(101.0)  # 3 ids at 2/s: the last starts after 1 s
    assert tools.paced([], 5, lambda ids: 1) == 0
    with pytest.raises(ValueError, match="rate"):
        tools.paced([1], 0, lambda ids: 1)


def test_paced_stops_when_asked() -> None:
    fake = _FakeTime()
    seen: list[list[int]] = []
    stop_after = iter([False, True])
    done = tools.paced(
        list(range(30)),
        10,
        lambda ids: seen.append(ids) or len(ids),
        should_stop=lambda: next(stop_after),
        monotonic=fake.monotonic,
        sleep=fake.sleep,
    )
    assert done == 2 and seen == [[0], [1]]
