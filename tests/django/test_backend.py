"""The backend in this process, as a web process uses it: what ``enqueue`` stores where,
what it refuses before writing anything, and what the settings may not say."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import override_settings
from django.utils import timezone

import ledgerq
from ledgerq.django import LedgerQBackend
from ledgerq.django._compat import (
    FRAMEWORK,
    InvalidTaskError,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
)
from tests.django._project import Site


def tasks():  # type: ignore[no-untyped-def]
    import tasksapp.tasks

    return tasksapp.tasks


def test_the_backend_says_what_it_supports(site: Site) -> None:
    backend = task_backends["default"]
    assert isinstance(backend, LedgerQBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task


def test_enqueue_stores_a_ready_result_and_a_message_in_the_queue_of_the_task(
    site: Site,
) -> None:
    result = tasks().add.using(priority=42).enqueue(1, b=2)
    assert result.status == TaskResultStatus.READY
    assert result.args == [1] and result.kwargs == {"b": 2}
    assert result.enqueued_at is not None and result.enqueued_at.tzinfo is not None
    email = tasks().send_email.enqueue("x@y")
    read = site.result(result.id)
    assert read.status == TaskResultStatus.READY and read.attempts == 0
    assert read.task.func is tasks().add.func and read.task.priority == 42
    assert read.enqueued_at == result.enqueued_at
    assert tasks().add.get_result(result.id).args == [1]
    with ledgerq.open(site.dir / "queues" / "default", shared=True) as queue:
        (message,) = queue.peek()
        assert message.priority == ledgerq.Priority.HIGH
        assert message.headers == {
            "django.task": "tasksapp.tasks.add",
            "django.result_id": result.id,
            "django.priority": "42",
        }
    with ledgerq.open(site.dir / "queues" / "emails", shared=True) as queue:
        assert queue.peek()[0].headers["django.result_id"] == email.id


def test_run_after_becomes_a_delay_the_queue_holds(site: Site) -> None:
    later = timezone.now() + datetime.timedelta(hours=1)
    result = tasks().add.using(run_after=later).enqueue(1, 2)
    assert site.result(result.id).task.run_after == later
    with ledgerq.open(site.dir / "queues" / "default", shared=True) as queue:
        assert queue.stats().delayed == 1 and queue.peek() == []


def test_arguments_that_are_not_json_are_refused_before_anything_is_written(site: Site) -> None:
    with pytest.raises(TypeError, match=r"tasksapp\.tasks\.add are not JSON"):
        tasks().add.enqueue(object(), 1)
    with pytest.raises(ValueError, match="not JSON"):
        tasks().add.enqueue(float("nan"), 1)
    with ledgerq.open(site.dir / "queues" / "default", shared=True) as queue:
        assert queue.stats().enqueued == 0
    backend = task_backends["default"]
    assert backend.store.prune(2**62) == 0  # no result was stored either


def test_a_queue_name_not_in_queues_is_refused(site: Site) -> None:
    with pytest.raises(InvalidTaskError, match="Queue 'nope' is not valid"):
        tasks().add.using(queue_name="nope")
    with pytest.raises(InvalidTaskError, match="priority must be a whole number"):
        tasks().add.using(priority=101)


def test_any_queue_name_with_queues_empty_must_still_be_a_directory_name(site: Site) -> None:
    setting = site.tasks_setting()
    setting["default"]["QUEUES"] = []
    with override_settings(TASKS=setting):
        assert tasks().add.using(queue_name="anything").enqueue(1, 2).status == "READY"
        with pytest.raises(InvalidTaskError, match="cannot be a directory name"):
            tasks().add.using(queue_name="../escape").enqueue(1, 2)
        assert not (site.root / "escape").exists()


def test_an_unknown_result_id_raises_task_result_does_not_exist(site: Site) -> None:
    with pytest.raises(TaskResultDoesNotExist, match="no result 'nope'"):
        site.result("nope")
    with pytest.raises(TaskResultDoesNotExist):
        tasks().add.get_result("")


def test_aenqueue_and_aget_result(site: Site) -> None:
    async def both() -> tuple[object, object]:
        result = await tasks().async_add.aenqueue(2, 3)
        return result, await tasks().async_add.aget_result(result.id)

    sent, read = asyncio.run(both())
    assert read.id == sent.id and read.args == [2, 3]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"path": "relative/dir"}, "relative path: give an absolute one"),
        ({}, "'path'\\] is missing"),
        ({"path": "/abs", "max_retriez": 3}, "unknown keys \\['max_retriez'\\]"),
        ({"path": "/abs", "max_retries": -1}, "max_retries"),
        ({"path": "/abs", "result_ttl": 0}, "result_ttl'\\] must be > 0"),
        ({"path": "/abs", "priorities": False}, "always orders tasks by priority"),
        ({"path": "/abs", "encryption_key_file": "/nonexistent/key"}, "cannot read key file"),
    ],
)
def test_bad_options_raise_improperly_configured_naming_the_setting(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        LedgerQBackend("default", {"QUEUES": ["default"], "OPTIONS": options})


def test_bad_queue_names_in_queues_are_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="'a/b' cannot be a directory name"):
        LedgerQBackend("default", {"QUEUES": ["a/b"], "OPTIONS": {"path": "/abs"}})


def test_a_path_that_cannot_be_created_fails_the_check_and_the_first_enqueue(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with Site(tmp_path, {"path": str(blocked / "tasks")}):
        with pytest.raises(SystemCheckError, match="cannot be created: Not a directory"):
            call_command("check")
        with pytest.raises(ImproperlyConfigured, match="cannot be created"):
            tasks().add.enqueue(1, 2)
        with pytest.raises(CommandError, match="cannot be created"):
            call_command("ledgerq_worker")


def test_the_worker_command_refuses_unknown_queues_and_other_backends(site: Site) -> None:
    with pytest.raises(CommandError, match="'nope' not in TASKS\\['default'\\]\\['QUEUES'\\]"):
        call_command("ledgerq_worker", queue_names=["nope"])
    immediate = f"{FRAMEWORK}.backends.immediate.ImmediateBackend"
    with (
        override_settings(TASKS={"default": {"BACKEND": immediate}}),
        pytest.raises(CommandError, match=r"not ledgerq\.django\.LedgerQBackend"),
    ):
        call_command("ledgerq_worker")
