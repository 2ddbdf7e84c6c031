"""A task as a ledgerq message: JSON that names the task and holds its arguments.

The payload is everything a worker needs without the results database (which it
also updates): if a result was pruned, or its database lost, the message alone still
runs the task and writes a new result.  Headers repeat what an operator looks for
with ``ledgerq peek``/``ledgerq dlq list`` (the task, its result id, its exact priority).

The ledgerq priority level is the sign of the Tasks priority (-100..100): positive
is ``HIGH``, 0 (the default) ``MEDIUM``, negative ``LOW``.  docs/django.md says what
that keeps of the order and what it does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import ledgerq

__all__ = [
    "HEADER_PRIORITY",
    "HEADER_RESULT",
    "HEADER_TASK",
    "PayloadError",
    "TaskMessage",
    "decode",
    "level_of",
]

FORMAT_VERSION = 1
HEADER_TASK = "django.task"
HEADER_RESULT = "django.result_id"
HEADER_PRIORITY = "django.priority"


class PayloadError(ValueError):
    """A message that is not a task of this backend (not its JSON, another version)."""


# The fields of a task message in its JSON, in their order there: the key, the
# TaskMessage attribute it holds, and the types its value may have (what decode checks).
_FIELDS: tuple[tuple[str, str, type | tuple[type, ...]], ...] = (
    ("id", "result_id", str),
    ("task", "task_path", str),
    ("args", "args", list),
    ("kwargs", "kwargs", dict),
    ("backend", "backend", str),
    ("queue", "queue", str),
    ("priority", "priority", int),
    ("enqueued_ns", "enqueued_ns", int),
    ("run_after_ns", "run_after_ns", (int, type(None))),
)


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """One enqueued task, as stored in its message."""

    result_id: str
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    backend: str
    queue: str
    priority: int
    enqueued_ns: int
    run_after_ns: int | None

    def encode(self) -> bytes:
        """The payload (UTF-8 JSON).  Raises ``ValueError`` for a float that JSON has no
        spelling for (NaN, infinity): nothing else reaches here unchecked."""
        fields = {key: getattr(self, attribute) for key, attribute, _ in _FIELDS}
        return json.dumps(
            {"v": FORMAT_VERSION, **fields}, allow_nan=False, separators=(",", ":")
        ).encode()

    def headers(self) -> dict[str, str]:
        """The message's headers."""
        return {
            HEADER_TASK: self.task_path,
            HEADER_RESULT: self.result_id,
            HEADER_PRIORITY: str(self.priority),
        }


def level_of(priority: int) -> ledgerq.Priority:
    """The ledgerq priority level of a Tasks priority."""
    if priority > 0:
        return ledgerq.Priority.HIGH
    if priority < 0:
        return ledgerq.Priority.LOW
    return ledgerq.Priority.MEDIUM


def decode(payload: bytes) -> TaskMessage:
    """The task a payload holds; :class:`PayloadError` saying why when it holds none."""
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"not a task message (not JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("v") != FORMAT_VERSION:
        version = data.get("v") if isinstance(data, dict) else None
        raise PayloadError(f"not a task message of format {FORMAT_VERSION} (v={version!r})")
    try:
        values = {attribute: data[key] for key, attribute, _ in _FIELDS}
    except KeyError as exc:
        raise PayloadError(f"task message without {exc.args[0]!r}") from None
    if not all(isinstance(values[attribute], kinds) for _, attribute, kinds in _FIELDS):
        raise PayloadError("task message with a field of the wrong type")
    return TaskMessage(**values)
