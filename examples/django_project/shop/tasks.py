"""The shop's background work."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django < 6: the backport
    from django_tasks import task


@task(queue_name="emails")
def send_receipt(order_id: int, email: str) -> dict[str, object]:
    # ... render and send the email ...
    return {"order": order_id, "to": email}


@task(priority=10)
def charge(order_id: int, cents: int) -> str:
    return f"charged order {order_id}: {cents / 100:.2f}"


@task(priority=-10)
def rebuild_search_index() -> int:
    return 42  # documents indexed


@task(takes_context=True)
def report(context: object, day: str) -> str:
    attempt = context.attempt  # type: ignore[attr-defined]
    return f"report for {day} (attempt {attempt})"


@task()
def refund(order_id: int) -> None:
    raise RuntimeError(f"order {order_id} was never charged")
