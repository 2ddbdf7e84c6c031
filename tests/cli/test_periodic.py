"""``ledgerq periodic list|add|remove QUEUE`` and the jobs under ``ledgerq stats``."""

from __future__ import annotations

from pathlib import Path

import ledgerq

from ._run import fails, ok


def test_add_list_remove_beside_a_live_shared_holder(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as holder:
        added = ok(
            "periodic", "add", path, "report", "make-report", "--cron", "0 3 * * *",
            "--header", "kind=nightly", "--priority", "high", "--json",
        ).json()  # fmt: skip
        assert added["added"]["name"] == "report"
        assert added["added"]["cron"] == "0 3 * * *"
        assert added["added"]["payload"] == "make-report"
        assert ok("periodic", "add", path, "beat", "x", "--every", "30").out.startswith(
            "periodic job beat of"
        )
        listed = ok("periodic", "list", path, "--json").json()["periodic"]
        assert [(j["name"], j["schedule"], j["priority"]) for j in listed] == [
            ("beat", "every 30s", "medium"),
            ("report", "cron 0 3 * * *", "high"),
        ]
        assert listed[1]["headers"] == {"kind": "nightly"} and listed[1]["last_run"] is None
        # The holder's handle sees what the command added.
        assert [j.name for j in holder.periodic()] == ["beat", "report"]
        table = ok("periodic", "list", path).out
        assert "report" in table and "cron 0 3 * * *" in table and "next run" in table
        stats = ok("stats", path, "--json").json()
        assert [j["name"] for j in stats["periodic"]] == ["beat", "report"]
        assert "periodic jobs" in ok("stats", path).out
        assert ok("periodic", "remove", path, "beat", "--json").json() == {
            "queue": str(path),
            "removed": True,
        }
        assert [j.name for j in holder.periodic()] == ["report"]
        assert "no periodic job 'beat'" in fails("periodic", "remove", path, "beat", code=1).err


def test_bad_schedules_are_usage_or_argument_errors(tmp_path: Path) -> None:
    path = tmp_path / "q"
    ledgerq.open(path).close()
    assert (
        "exactly one of --every and --cron" in fails("periodic", "add", path, "j", "x", code=2).err
    )
    assert (
        "exactly one"
        in fails(
            "periodic", "add", path, "j", "x", "--every", "5", "--cron", "* * * * *", code=2
        ).err
    )
    assert "> 0" in fails("periodic", "add", path, "j", "x", "--every", "0", code=2).err
    assert "minute field" in fails("periodic", "add", path, "j", "x", "--cron", "99 * * * *").err
    assert "5 fields" in fails("periodic", "add", path, "j", "x", "--cron", "* *").err
    assert ok("periodic", "list", path, "--json").json()["periodic"] == []
    fails("periodic", "list", tmp_path / "missing", code=1)  # a reading command creates nothing
    assert not (tmp_path / "missing").exists()
